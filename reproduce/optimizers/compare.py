"""Every optimizer on the embedded default, without and with injected stragglers: time-to-target and
throughput in one table (the README's optimizer table).

Runs `wagma-bench run workload=resnet optimizer=X imbalance=I` (4 local ranks, ResNet-20 on the embedded
MNIST subset, target 97% validation top-1) for every X and I, one after another, then prints a Markdown
table from the runs' summary.json files. Runs whose summary already exists are not repeated, so an
interrupted comparison continues where it stopped. Measure on a quiet machine: every rank shares the CPU.

    .venv/bin/python reproduce/optimizers/compare.py [--out DIR] [--optimizers a,b] [--imbalances none,paper]
                                                     [--max-steps N] [-- more overrides]

`--max-steps 8` checks the pipeline in a minute (the target is then not reached).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent / "wagma-bench"
OPTIMIZERS = ["allreduce", "wagma", "local_sgd", "dpsgd", "adpsgd", "sgp", "eager"]
PAPERS = {
    "allreduce": "Allreduce-SGD (synchronous data parallelism)",
    "wagma": "WAGMA-SGD, Li et al., TPDS 2020",
    "local_sgd": "PR-SGD / local SGD, Yu, Yang & Zhu, AAAI 2019",
    "dpsgd": "D-PSGD, Lian et al., NeurIPS 2017",
    "adpsgd": "AD-PSGD, Lian et al., ICML 2018",
    "sgp": "SGP, Assran et al., ICML 2019",
    "eager": "eager-SGD, Li et al., PPoPP 2020",
}
# Evaluate every 10 rounds (rounded up to the optimizer's sync period), so time-to-target is resolved
# finely; evaluation time is excluded from the training clock.
COMMON = ["workload=resnet", "launcher.nproc=4", "eval.every_steps=10", "logger.progress=off"]


def key_hyperparameters(optimizer: str) -> str:
    conf = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "optimizer" / f"{optimizer}.yaml"))
    return ", ".join(f"{k}={v}" for k, v in conf.items() if k != "name") or "-"


def run(out: Path, optimizer: str, imbalance: str, extra: list[str]) -> dict:
    run_dir = out / f"{optimizer}-{imbalance}"
    summary = run_dir / "summary.json"
    if not summary.exists():
        cmd = [str(BIN), "run", *COMMON, f"optimizer={optimizer}", f"imbalance={imbalance}", *extra,
               f"hydra.run.dir={run_dir}"]
        print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, cwd=ROOT, check=False)
        print(f"  exit {done.returncode} after {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        if not summary.exists():
            return {"status": f"failed (exit {done.returncode})"}
    return json.loads(summary.read_text())


def fmt(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[tuple[str, str, dict]]) -> str:
    header = ("| optimizer | paper | key hyperparameters | imbalance | reached | time-to-target (s) "
              "| steps | throughput (samples/s) | best top-1 | eval model | status |")
    lines = [header, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for optimizer, imbalance, s in rows:
        lines.append(f"| {optimizer} | {PAPERS.get(optimizer, '')} | {key_hyperparameters(optimizer)} | {imbalance} "
                     f"| {'yes' if s.get('reached') else 'no'} | {fmt(s.get('time_to_target_s'))} "
                     f"| {s.get('steps_to_target') or s.get('steps', '-')} "
                     f"| {fmt(s.get('throughput_samples_per_s'))} | {fmt(s.get('best_metric'), '.4f')} "
                     f"| {s.get('eval_model', '-')} | {s.get('status', '-')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "optimizers-compare")
    ap.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    ap.add_argument("--imbalances", default="none,paper")
    ap.add_argument("--max-steps", type=int, default=None, help="cap every run (a quick check of the pipeline)")
    ap.add_argument("overrides", nargs="*", help="more Hydra overrides for every run (after --)")
    args = ap.parse_args()
    extra = list(args.overrides) + ([f"train.max_steps={args.max_steps}"] if args.max_steps else [])
    rows = [(o, i, run(args.out, o, i, extra)) for i in args.imbalances.split(",")
            for o in args.optimizers.split(",")]
    text = table(rows)
    (args.out / "table.md").parent.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    print(f"\n(table also in {args.out / 'table.md'})", file=sys.stderr)


if __name__ == "__main__":
    main()
