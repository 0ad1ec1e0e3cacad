"""AD-PSGD's samples to the target as a function of its exchanges per local step, measured in the suite's own
AD-PSGD on the embedded ResNet-20 / mnist5k workload (4 local gloo ranks): the convergence input of the
simulator's time to target when its exchanges do not keep up with the steps
(wagma_bench/simulate/mixing.py).

    .venv/bin/python reproduce/scaling/adpsgd_convergence/measure.py --runs DIR --out FILE \\
        [--every 1,2,4,8] [--seeds 1,2]
    .venv/bin/python reproduce/scaling/adpsgd_convergence/measure.py --show FILE

Each run is ``wagma-bench run workload=resnet optimizer=adpsgd optimizer.exchange_every=K seed=S
eval.every_rounds=5``: an active's thread starts at most one exchange per K local steps (K = 1: the paper's
one averaging per gradient). The runs are interleaved (every K for seed 1, then every K for seed 2, ...), so
that the machine's load moves every K alike; each run's load (``/proc/loadavg``) is written beside it. Per K:
the median over the seeds of the global samples at the first evaluation at the target, and its ratio to K =
1's (what the simulator multiplies the samples to target by, at 1/K exchanges per step: the model is small, so
the thread keeps up with every K here).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

FORMAT = "wagma-bench adpsgd mixing 1"
BOUND = " at least (a run stopped short of the target)"
OVERRIDES = ["workload=resnet", "optimizer=adpsgd", "eval.every_rounds=5", "logger.progress=off"]


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def run_one(runs: Path, every: int, seed: int) -> dict:
    """One run, or the row of one finished there before (rows.jsonl: each finished run's row, as it ends)."""
    out = runs / f"k{every}_seed{seed}"
    done = [r for r in read_rows(runs) if r["dir"] == out.name]
    if done and (out / "summary.json").exists():
        return done[-1]
    cmd = [
        sys.executable, "-m", "wagma_bench", "run", *OVERRIDES, f"optimizer.exchange_every={every}",
        f"seed={seed}", f"hydra.run.dir={out}",
    ]  # fmt: skip
    before = loadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    row = {"every": every, "seed": seed, "dir": out.name, "wall_s": time.perf_counter() - t0,
           "loadavg": [before, loadavg()]}  # fmt: skip
    with open(runs / "rows.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def read_rows(runs: Path) -> list[dict]:
    path = runs / "rows.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def read_run(runs: Path, row: dict) -> dict:
    from wagma_bench.record.events import RunEvents

    record = RunEvents.read(runs / row["dir"])
    hit = record.first_at_target
    summary = json.loads((runs / row["dir"] / "summary.json").read_text())
    # a run stopped before the target: its last evaluation's samples, a lower bound of its samples to target
    last = max((e.samples for e in record.evaluations), default=None) if hit is None else None
    return {**row, "samples_to_target": None if hit is None else float(hit.samples),
            "at_least": None if last is None else float(last), "status": summary.get("status")}  # fmt: skip


def summarise(rows: list[dict], command: str) -> dict:
    by_k: dict[int, list[float]] = {}
    for r in rows:  # a run stopped short counts with its lower bound (said in the row: "bound")
        if r["samples_to_target"] is not None or r.get("at_least") is not None:
            by_k.setdefault(r["every"], []).append(r["samples_to_target"] or r["at_least"])
    if 1 not in by_k:
        raise SystemExit("no run with exchange_every=1 reached the target: nothing to compare with")
    base = statistics.median(by_k[1])
    table = [
        {"exchange_every": k, "exchanges_per_step": 1.0 / k, "samples_to_target": statistics.median(v),
         "relative": statistics.median(v) / base, "runs": len(v),
         "bound": any(r["every"] == k and r["samples_to_target"] is None for r in rows)}
        for k, v in sorted(by_k.items())
    ]  # fmt: skip
    return {"format": FORMAT, "command": command, "cpus": os.cpu_count(), "overrides": OVERRIDES,
            "table": table, "runs": rows}  # fmt: skip


def show(data: dict) -> str:
    lines = [
        f"command: {data['command']}",
        "| exchange_every | exchanges per step | samples to target | relative |",
        "|---|---|---|---|",
    ]
    for r in data["table"]:
        lines.append(
            f"| {r['exchange_every']} | {r['exchanges_per_step']:.3f} | {r['samples_to_target']:.0f} "
            f"| {r['relative']:.2f}{BOUND if r.get('bound') else ''} |"
        )
    loads = [float(x.split()[0]) for r in data["runs"] for x in r["loadavg"] if x[:1].isdigit()]
    if loads:
        lines.append(f"load (1-minute average) read around the runs: {min(loads):.1f} to {max(loads):.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from wagma_bench.record.files import write_text_atomic

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, help="where the runs go")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--every", default="1,2,4,8")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--show", type=Path, metavar="FILE")
    ns = ap.parse_args(argv)
    if ns.show:
        print(show(json.loads(ns.show.read_text())))
        return 0
    if not (ns.runs and ns.out):
        ap.error("--runs DIR and --out FILE are needed (or --show FILE)")
    every = [int(k) for k in ns.every.split(",")]
    seeds = [int(s) for s in ns.seeds.split(",")]
    rows = [run_one(ns.runs, k, s) for s in seeds for k in every]
    data = summarise([read_run(ns.runs, r) for r in rows], " ".join(["measure.py", *sys.argv[1:]]))
    write_text_atomic(ns.out, json.dumps(data, indent=1) + "\n")
    print(show(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
