"""AD-PSGD's exchange cost c measured directly: what one second of the gossip thread's exchange takes from the
rank's compute (the simulator's ``gossip_cost``, wagma_bench/simulate/des.py ``sim_adpsgd``).

    .venv/bin/python reproduce/scaling/adpsgd_cost/measure_c.py --out FILE [--pairs 40] [--units 4]
        [--unit-s 0.25] [--mb 102]
    .venv/bin/python reproduce/scaling/adpsgd_cost/measure_c.py --show FILE

Two gloo ranks on this host run the suite's AD-PSGD (wagma_bench/optim/adpsgd.py, rank 0 active, rank 1
passive) over one flat buffer of ``--mb`` MB (the ResNet-50 model is 102 MB). The compute thread runs units of
a fixed amount of work (single-threaded matrix products, about ``--unit-s`` seconds each, calibrated once), in
blocks of ``--units`` units. In an *on* block the rank calls the algorithm's ``step`` after each unit, so the
active's thread starts one exchange per unit (paced as in a run); in an *off* block it does not, and the
thread idles. Blocks come in pairs, on-off and off-on alternately, so a drift of the machine's speed (other
work, frequency) moves both halves of a pair alike. Every exchange's begin and end are recorded on both ranks;
only the units' work is timed (``step`` itself, the suite's per-step correction, is outside the timed unit).

Per pair and rank: the mean unit time on and off and the mean seconds of exchange inside an on unit (its
overlap with the rank's exchanges); c = (on - off) / overlap. The value is the ratio of the sums over all
pairs and both ranks; its 95% interval a bootstrap over the pairs (2,000 resamples), the active and the
passive also apart. A value outside the model's range [0, 1] is written as unmeasured, with the raw figure
(never held to 0 or 1). The machine's load (``/proc/loadavg``) is written before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np

FORMAT = "wagma-bench gossip cost 1"
RESAMPLES = 2000


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def _work(n: int, a, b) -> None:
    for _ in range(n):
        a.mm(b)


def _calibrate(unit_s: float, a, b) -> int:
    """Matrix products in one unit of about ``unit_s`` seconds (the fastest of three tries of 4)."""
    best = min(_timed(lambda: _work(4, a, b)) for _ in range(3)) / 4
    return max(1, round(unit_s / best))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _rank(rank: int, port: int, ns: argparse.Namespace, queue) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from wagma_bench.comm.torch_dist import TorchComm
    from wagma_bench.optim.adpsgd import ADPSGD
    from wagma_bench.optim.specs import ADPSGDSpec

    class Timed(ADPSGD):
        """The suite's AD-PSGD, each exchange's begin and end recorded (perf_counter, this process)."""

        def __init__(self, *args, **kw):
            self.spans: list[tuple[float, float]] = []
            self.busy = False
            super().__init__(*args, **kw)

        def _exchange(self, peer, first, header):
            self.busy = True
            t0 = time.perf_counter()
            try:
                super()._exchange(peer, first, header)
            finally:
                self.spans.append((t0, time.perf_counter()))
                self.busy = False

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=120))
    comm = TorchComm.init("gloo", rank, 2, store, 300.0, torch.device("cpu"))
    model = nn.Module()
    model.w = nn.Parameter(torch.zeros(int(ns.mb * 1e6 / 4)))
    algo = Timed(ADPSGDSpec.Settings(), model, lambda p: torch.optim.SGD(p, lr=0.0), comm, seed=1)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    n = torch.tensor([_calibrate(ns.unit_s, a, b)])
    comm.broadcast(n, 0)  # both ranks run the same work per unit
    flag = torch.zeros(1)
    blocks = []
    for pair in range(ns.pairs):
        for on in (True, False) if pair % 2 == 0 else (False, True):
            comm.allreduce(flag)  # both ranks start the block together
            units = []
            for _ in range(ns.units):
                t0 = time.perf_counter()
                _work(int(n), a, b)
                units.append((t0, time.perf_counter()))
                if on:
                    algo.step()  # the active's thread starts one exchange (outside the timed unit)
            while algo.busy or (on and rank == 0 and algo._stepped.is_set()):
                time.sleep(0.005)  # the block's last exchange done before the next block starts
            comm.allreduce(flag)
            while algo.busy:
                time.sleep(0.005)
            blocks.append({"pair": pair, "on": on, "units": units})
    algo.close()
    queue.put((rank, {"work_per_unit": int(n), "blocks": blocks, "exchanges": algo.spans}))
    comm.close()


def overlap(units: list, spans: list) -> list[float]:
    """Seconds of exchange inside each unit."""
    return [sum(max(0.0, min(u1, e1) - max(u0, e0)) for e0, e1 in spans) for u0, u1 in units]


def per_pair(data: dict) -> list[dict]:
    """Per pair: mean unit time on and off, mean exchange seconds inside an on unit."""
    pairs: dict[int, dict] = {}
    for blk in data["blocks"]:
        length = [u1 - u0 for u0, u1 in blk["units"]]
        row = pairs.setdefault(blk["pair"], {"pair": blk["pair"]})
        if blk["on"]:
            row["on_s"] = float(np.mean(length))
            row["overlap_s"] = float(np.mean(overlap(blk["units"], data["exchanges"])))
        else:
            row["off_s"] = float(np.mean(length))
    return [pairs[k] for k in sorted(pairs)]


def estimate(rows: list[dict], rng: np.random.Generator) -> dict:
    """c as the ratio of the sums over the pairs, and its bootstrap over the pairs."""
    gain = np.array([r["on_s"] - r["off_s"] for r in rows])
    busy = np.array([r["overlap_s"] for r in rows])
    if busy.sum() <= 0:
        return {"raw": None, "interval": None, "replicates": []}
    reps = []
    for _ in range(RESAMPLES):
        pick = rng.integers(len(rows), size=len(rows))
        reps.append(float(gain[pick].sum() / max(1e-12, busy[pick].sum())))
    lo, hi = np.percentile(reps, [2.5, 97.5])
    return {"raw": float(gain.sum() / busy.sum()), "interval": [float(lo), float(hi)], "replicates": reps}


def summarise(results: dict[int, dict], ns: argparse.Namespace, load: list[str], took: float) -> dict:
    rows = {r: per_pair(results[r]) for r in results}
    both = [
        {k: rows[0][i][k] + rows[1][i][k] for k in ("on_s", "off_s", "overlap_s")}
        for i in range(len(rows[0]))
    ]
    rng = np.random.default_rng(1)
    c, active, passive = estimate(both, rng), estimate(rows[0], rng), estimate(rows[1], rng)
    raw = c["raw"]
    measured = raw is not None and 0.0 <= raw <= 1.0
    exch = [e1 - e0 for e0, e1 in results[0]["exchanges"]]
    return {
        "format": FORMAT,
        "source": (
            "reproduce/scaling/adpsgd_cost/measure_c.py "
            f"--pairs {ns.pairs} --units {ns.units} --unit-s {ns.unit_s} --mb {ns.mb}: 2 gloo ranks, "
            f"the suite's AD-PSGD, {os.cpu_count()} CPUs, {took:.0f} s"
        ),
        "loadavg": {"before": load[0], "after": load[1]},
        "gossip_cost": {
            "value": raw if measured else None,
            "unmeasured": None if measured else f"c = {raw} is outside the model's range [0, 1]",
            "raw": raw,
            "interval": [min(1.0, max(0.0, x)) for x in c["interval"]] if measured else None,
            "raw_interval": c["interval"],
            # what simulate --interval draws from (held to the model's range, as a prediction reads it)
            "replicates": [round(min(1.0, max(0.0, x)), 6) for x in c["replicates"][:200]]
            if measured
            else [],
        },
        "active": {"c": active["raw"], "interval": active["interval"]},
        "passive": {"c": passive["raw"], "interval": passive["interval"]},
        "exchange_s": {"median": float(np.median(exch)) if exch else None, "count": len(exch)},
        "work_per_unit": results[0]["work_per_unit"],
        "pairs": {"active": rows[0], "passive": rows[1]},
    }


def run(ns: argparse.Namespace) -> dict:
    import multiprocessing as mp

    import torch.distributed as dist

    load = [loadavg()]
    t0 = time.perf_counter()
    server = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, server.port, ns, queue), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + ns.timeout_s
    try:
        while len(results) < 2:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the ranks did not finish within {ns.timeout_s:.0f} s")
            try:
                rank, data = queue.get(timeout=min(left, 5.0))
            except Exception:  # noqa: BLE001 - queue.Empty: check the ranks are alive
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError(f"a rank failed: exit codes {[p.exitcode for p in procs]}") from None
                continue
            results[rank] = data
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    load.append(loadavg())
    return summarise(results, ns, load, time.perf_counter() - t0)


def show(data: dict) -> str:
    c = data["gossip_cost"]
    ex = data["exchange_s"]
    lines = [
        f"source: {data['source']}",
        f"load before/after: {data['loadavg']['before']} / {data['loadavg']['after']}",
    ]
    if c["value"] is None:
        lines.append(f"c unmeasured: {c['unmeasured']} (raw interval {c['raw_interval']})")
    else:
        lines.append(f"c = {c['value']:.3f} [{c['interval'][0]:.3f}, {c['interval'][1]:.3f}] (95% bootstrap)")
    for side in ("active", "passive"):
        iv = data[side]["interval"] or [float("nan")] * 2
        lines.append(f"  {side}: {data[side]['c']:.3f} [{iv[0]:.3f}, {iv[1]:.3f}]")
    lines.append(f"  exchanges: {ex['count']}, median {ex['median']:.3f} s each")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from wagma_bench.record.files import write_text_atomic

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--show", type=Path, metavar="FILE")
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--units", type=int, default=4)
    ap.add_argument("--unit-s", type=float, default=0.25)
    ap.add_argument("--mb", type=float, default=102.0)
    ap.add_argument("--timeout-s", type=float, default=1800.0)
    ns = ap.parse_args(argv)
    if ns.show:
        print(show(json.loads(ns.show.read_text())))
        return 0
    if not ns.out or ns.pairs < 2 or ns.units < 1:
        ap.error("--out FILE is needed, with --pairs >= 2 and --units >= 1 (or --show FILE)")
    data = run(ns)
    write_text_atomic(ns.out, json.dumps(data, indent=1) + "\n")
    print(show(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
