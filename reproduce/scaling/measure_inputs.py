"""The simulator's inputs measured in the suite's own runs, as the file `wagma-bench simulate --measured FILE`
reads (wagma_bench/simulate/measured.py): what AD-PSGD's exchanges cost the compute, the ranks' compute spread
with its persistence, and the link the ranks share.

    .venv/bin/python reproduce/scaling/measure_inputs.py GOSSIP_DIR COMM_BENCH_JSON --out FILE [--table]
        [--measured-on cpu|gpu] [--skipped WHAT ...]
    .venv/bin/python reproduce/scaling/measure_inputs.py --show FILE       # the table of a written file

`make gpu-check` runs it on its own pairs (reproduce/gpu/check.py); on this machine the pairs of validate.sh.

GOSSIP_DIR holds the interleaved pairs that `GOSSIP_PAIRS=N reproduce/scaling/validate.sh` runs:
`adpsgd_pP_pairI` (AD-PSGD, its gossip thread exchanging) and `nothread_pP_pairI` (local SGD with period =
AD-PSGD's sync_every: the same compute path and the same barrier every 10 rounds, no thread), P = 4 and 8,
imbalance none. Per pair:

- c_on, c_off: the median compute time per step (forward + backward as the trainer timed it; the warm-up steps
  of the calibration left out) over all ranks of each run; also over AD-PSGD's actives and passives apart;
- b: the seconds per step that the rank's gossip thread spends exchanging while the rank computes, from the
  simulator's replay of the AD-PSGD run (its own compute times, the network fitted from COMM_BENCH_JSON) with
  a free exchange: gossip_busy_share x c_on;
- c: the model's exchange cost (the seconds of compute each second of exchange takes, simulate/des.py
  sim_adpsgd), from c_on - c_off = c b: per pair (c_on - c_off) / b, which the machine's drift between the two
  runs of a pair moves by far more than b where b is a small share of the step.

The file's value is the median of the pairs' c, held to the model's range [0, 1]: a median, because one pair's
drift moves its c without bound (the ratio of the sums, sum (c_on - c_off) / sum b, is written beside it as
`ratio_of_sums`); its replicates (for `simulate --interval`) and its 95% interval are a bootstrap over the
pairs (2,000 resamples) of the same median, held alike. Also written: the persistent compute spread
(sigma_rank, sigma, rho; wagma_bench/simulate/spread.py) fitted over the thread-off runs, and the link (alpha,
bandwidth) fitted to COMM_BENCH_JSON, which measures the ranks of one host: the intra-node link. `--table`
prints the per-pair table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import statistics
import sys
from pathlib import Path

import numpy as np

from wagma_bench.analysis.tables import markdown_table
from wagma_bench.record.files import write_text_atomic
from wagma_bench.simulate.calibrate import (
    SKIP_STEPS,
    cycle_compute_by_rank,
    fit_network,
    fit_run,
)
from wagma_bench.simulate.compare import replay_run
from wagma_bench.simulate.measured import FORMAT, PLACES
from wagma_bench.simulate.spread import fit_spread

PAIR = re.compile(r"(adpsgd|nothread)_p(\d+)_pair(\d+)")
RESAMPLES = 2000


def compute_medians(run: Path) -> dict[str, float]:
    fit = fit_run(run)
    by_rank = [seq[SKIP_STEPS + 1 :] for seq in fit.trace]
    pooled = [c for seq in by_rank for c in seq]
    return {
        "all": statistics.median(pooled),
        "actives": statistics.median([c for r, seq in enumerate(by_rank) if r % 2 == 0 for c in seq]),
        "passives": statistics.median([c for r, seq in enumerate(by_rank) if r % 2 == 1 for c in seq]),
    }


def busy_share(run: Path, network) -> float:
    """The simulator's replay of an AD-PSGD run (its own compute times and delays) with a free exchange: the
    share of compute time exchanging."""
    fit, replayed = fit_run(run), []
    replay_run(
        fit, dataclasses.replace(fit.to_workload(compute="trace"), gossip_cost=0.0), network, keep=replayed
    )
    return float(replayed[0].extra["gossip_busy_share"])


def measure(gossip_dir: Path, bench: Path) -> tuple[list[dict], dict, dict]:
    """(the per-pair rows, the network fit's report, the persistent spread fitted over the thread-off
    runs)."""
    network, report = fit_network([json.loads(bench.read_text())])
    runs: dict[tuple[int, int], dict[str, Path]] = {}
    for d in sorted(gossip_dir.iterdir()):
        m = PAIR.fullmatch(d.name)
        if m and d.is_dir():
            runs.setdefault((int(m.group(2)), int(m.group(3))), {})[m.group(1)] = d
    rows = []
    for (p, i), pair in sorted(runs.items()):
        if set(pair) != {"adpsgd", "nothread"}:
            print(f"pair {i} at P={p} is missing a run: {sorted(pair)}", file=sys.stderr)
            continue
        on, off = compute_medians(pair["adpsgd"]), compute_medians(pair["nothread"])
        share = busy_share(pair["adpsgd"], network)
        busy = share * on["all"]
        rows.append(
            {
                "world_size": p,
                "pair": i,
                "compute_on_s": on["all"],
                "compute_off_s": off["all"],
                "slowdown": on["all"] / off["all"] - 1,
                "actives": on["actives"] / off["all"] - 1,
                "passives": on["passives"] / off["all"] - 1,
                "busy_share": share,
                "busy_s": busy,
                "c": (on["all"] - off["all"]) / busy if busy > 0 else None,
            }
        )
    spread = fit_spread(
        [
            list(cycle_compute_by_rank(pair["nothread"]).values())
            for pair in runs.values()
            if "nothread" in pair
        ]
    )
    return rows, report, spread.row()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gossip_dir", type=Path, nargs="?")
    ap.add_argument("comm_bench", type=Path, nargs="?")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--show", type=Path, metavar="FILE", help="print the table of a written file and exit")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--measured-on", choices=PLACES, default="cpu")
    ap.add_argument("--skipped", nargs="*", default=[], help="what the writer could not measure here")
    ap.add_argument("--source", default="", help="where the runs ran (the file's source line)")
    ap.add_argument(
        "--gossip-cost", type=Path, metavar="C_FILE", help="c measured directly (adpsgd_cost/measure_c.py)"
    )
    ns = ap.parse_args(argv)
    if ns.show:
        print(table(json.loads(ns.show.read_text())))
        return 0
    if not (ns.gossip_dir and ns.comm_bench and ns.out):
        ap.error("GOSSIP_DIR, COMM_BENCH_JSON and --out are needed (or --show FILE)")
    rows, network, spread = measure(ns.gossip_dir, ns.comm_bench)
    gain = np.array([r["compute_on_s"] - r["compute_off_s"] for r in rows])
    busy = np.array([r["busy_s"] for r in rows])
    if not len(rows) or busy.sum() <= 0:
        print(f"no exchange time in the pairs of {ns.gossip_dir}", file=sys.stderr)
        return 1

    pairs_c = end_to_end_c(gain, busy)
    direct = json.loads(ns.gossip_cost.read_text()) if ns.gossip_cost else None
    data = {
        "format": FORMAT,
        "measured_on": ns.measured_on,
        "source": (
            f"reproduce/scaling/measure_inputs.py {ns.gossip_dir} {ns.comm_bench}: {len(rows)} interleaved "
            f"pairs of AD-PSGD and local SGD (period 10){'; ' + ns.source if ns.source else ''}"
        ),
        "skipped": ns.skipped,
        "gossip_cost": direct_c(direct, ns.gossip_cost) if direct else pairs_c,
        "gossip_cost_end_to_end": pairs_c,
        "network": (
            {"intra": {k: network["levels"]["intra"][k] for k in ("alpha_s", "bandwidth_GBps")}}
            if math.isfinite(network["levels"]["intra"]["bandwidth_GBps"])
            else None
        ),
        "compute": {k: spread[k] for k in ("sigma_rank", "sigma", "rho")},
        "pairs": rows,
        "network_fit": network,
        "compute_fit": spread,
    }
    write_text_atomic(ns.out, json.dumps(data, indent=1) + "\n")
    print(f"wrote {ns.out}")
    if ns.table:
        print(table(data))
    return 0


def end_to_end_c(gain: np.ndarray, busy: np.ndarray) -> dict:
    """c from the pairs: their median, with a bootstrap over the pairs; unmeasured (value None, the raw
    per-pair values kept) when the median lies outside the model's range [0, 1], which a drift larger than the
    exchange time gives: never held to 0 or 1 with an interval of zero width."""
    per_pair = gain / busy
    raw = [float(c) for c in per_pair]
    median = float(np.median(per_pair))
    section = {"raw": raw, "ratio_of_sums": float(gain.sum() / busy.sum())}
    if not 0.0 <= median <= 1.0:
        why = f"the pairs' median c = {median:.4g} is outside the model's range [0, 1]"
        return {"value": None, "unmeasured": why, "interval": None, "replicates": [], **section}

    def held(pick: np.ndarray) -> float:  # a resample's median, in the model's range
        return float(min(1.0, max(0.0, np.median(per_pair[pick]))))

    rng = np.random.default_rng(1)
    replicates = [held(rng.integers(len(raw), size=len(raw))) for _ in range(RESAMPLES)]
    lo, hi = np.percentile(replicates, [2.5, 97.5])
    return {"value": median, "interval": [float(lo), float(hi)],
            "replicates": [round(r, 6) for r in replicates[:200]], **section}  # fmt: skip


def direct_c(data: dict, path: Path) -> dict:
    """The c measured directly (reproduce/scaling/adpsgd_cost/measure_c.py's file), as this file carries
    it."""
    c = data.get("gossip_cost") if isinstance(data, dict) else None
    if not isinstance(c, dict) or "value" not in c:
        raise SystemExit(f"--gossip-cost {path}: not a file of reproduce/scaling/adpsgd_cost/measure_c.py")
    keep = ("value", "unmeasured", "interval", "replicates", "raw", "raw_interval")
    return {**{k: c.get(k) for k in keep}, "source": f"{path}: {data.get('source', '')}"}


def table(data: dict) -> str:
    """The per-pair table and the value with its interval, in Markdown (``--table``; the README's block)."""
    c = data["gossip_cost"]
    rows = [
        {
            **r,
            **{k: f"{100 * r[k]:+.1f}%" for k in ("slowdown", "actives", "passives")},
            "busy_share": f"{100 * r['busy_share']:.1f}%",
        }
        for r in data["pairs"]
    ]
    head = markdown_table(
        rows,
        [
            ("world_size", "P", ""),
            ("pair", "pair", ""),
            ("compute_on_s", "compute per step, thread on (s)", "metric"),
            ("compute_off_s", "thread off (s)", "metric"),
            ("slowdown", "slowdown", ""),
            ("actives", "actives", ""),
            ("passives", "passives", ""),
            ("busy_share", "time exchanging", ""),
            ("c", "c of the pair", "sig"),
        ],
    )
    spread = data["compute"]
    pairs = data.get("gossip_cost_end_to_end", c)
    said = (
        f"c = {pairs['value']:.2f} [{pairs['interval'][0]:.2f}, {pairs['interval'][1]:.2f}] (the pairs' "
        "median; 95% bootstrap over the pairs, each resample held to [0, 1])"
        if pairs["value"] is not None
        else f"c unmeasured: {pairs['unmeasured']} (per pair: {', '.join(f'{x:.3g}' for x in pairs['raw'])})"
    )
    if "source" in c:  # the file's c measured directly (--gossip-cost)
        direct = f"c = {c['value']:.2f}" if c["value"] is not None else f"c unmeasured ({c['unmeasured']})"
        said = f"The pairs: {said}. The file's c, measured directly: {direct} ({c['source'].split(':')[0]})"
    return (
        f"{head}\n\n{said}; the ratio of the sums is {pairs['ratio_of_sums']:.2f}. The thread-off runs' "
        f"compute spread: sigma_rank {spread['sigma_rank']:.3f}, sigma {spread['sigma']:.3f}, "
        f"rho {spread['rho']:.3f}."
    )


if __name__ == "__main__":
    sys.exit(main())
