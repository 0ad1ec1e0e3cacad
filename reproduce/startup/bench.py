"""A run's start against its floor: a one-step run of the embedded default (4 local ranks) side by side with
one process importing torch and torchvision, which is what any run pays at least once.

    .venv/bin/python reproduce/startup/bench.py [--repeats 3] [--label TEXT] [--out runs/startup-bench]
    .venv/bin/python reproduce/startup/bench.py --table RESULT.json [RESULT.json ...]   (the README's table)

The two commands alternate (import, run, import, run, ...) so that a change in the machine's load falls on
both; each figure is the median of ``--repeats``, wall-clock from the command to its exit. The run's own
breakdown (``summary.json``'s ``startup``, see ``wagma_bench/runtime/startup.py``) is given as the median of
each phase. Run it on an idle machine (``flock /tmp/wagma-measure.lock``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent / "wagma-bench"
IMPORT = [sys.executable, "-c", "import torch, torchvision"]
RUN = [str(BIN), "run", "train.max_rounds=1", "logger.progress=off"]
PHASES = ("launcher_s", "ranks_s", "imports_s", "world_s", "data_s", "setup_s", "first_step_s")
GOAL = 2.5  # the goal: a one-step run within 2.5x of one import (README, start-up)


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def measure(repeats: int, out: Path, label: str) -> dict:
    imports, runs, breakdowns = [], [], []
    for i in range(repeats):
        imports.append(timed(IMPORT))
        run_dir = out / f"run{i}"
        shutil.rmtree(run_dir, ignore_errors=True)
        runs.append(timed([*RUN, f"hydra.run.dir={run_dir}"]))
        breakdowns.append(
            json.loads((run_dir / "summary.json").read_text()).get("startup")
        )  # None before 2026-12-02
        print(
            f"repeat {i + 1}/{repeats}: import {imports[-1]:.2f} s, one-step run {runs[-1]:.2f} s", flush=True
        )
    run_s, import_s = statistics.median(runs), statistics.median(imports)
    return {
        "label": label,
        "import_s": imports,
        "run_s": runs,
        "median_import_s": round(import_s, 3),
        "median_run_s": round(run_s, 3),
        "ratio": round(run_s / import_s, 2),
        "goal": GOAL,
        "startup_median_s": (
            {p: round(statistics.median(b[p] for b in breakdowns), 3) for p in PHASES}
            if all(breakdowns)
            else None
        ),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}",
        "python": platform.python_version(),
        "command": " ".join(["wagma-bench", *RUN[1:]]),
        "floor": "python -c 'import torch, torchvision'",
    }


def table(results: list[dict]) -> str:
    """The README's table of committed results, a row each."""
    lines = [
        (
            "| code | one-step run, 4 ranks (s) | one import of torch + torchvision (s) | ratio (goal: at "
            f"most {GOAL:g}x) | the run's start (s, medians) |"
        ),
        "|---|---|---|---|---|",
    ]
    for result in results:
        phases = (
            ", ".join(
                f"{p.removesuffix('_s').replace('_', ' ')} {result['startup_median_s'][p]:.2f}"
                for p in PHASES
            )
            if result["startup_median_s"]
            else "not recorded"
        )
        lines.append(
            f"| {result['label']} | {result['median_run_s']:.2f} | {result['median_import_s']:.2f} | "
            f"{result['ratio']:.2f}x | {phases} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("runs/startup-bench"))
    ap.add_argument("--label", default="this checkout", help="what was measured (the table's first column)")
    ap.add_argument("--table", type=Path, nargs="+", help="print the table of finished results, run nothing")
    args = ap.parse_args()
    if args.table:
        print(table([json.loads(path.read_text()) for path in args.table]))
        return
    result = measure(args.repeats, args.out, args.label)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table([result]))


if __name__ == "__main__":
    main()
