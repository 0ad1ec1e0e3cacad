"""Does an outer optimizer close the model-averaging gap? The embedded Transformer (or ResNet under
stragglers), each model-averaging optimizer without and with SlowMo, the DiLoCo preset, and Allreduce-SGD:
steps and training time to the target, one Markdown table (docs/outer-optimizers.md).

    .venv/bin/python reproduce/outer/compare.py [--workload transformer|resnet] [--seeds 1] [--out DIR]
                                                [--only NAME,...] [-- more overrides]

Runs `wagma-bench run workload=W launcher.nproc=4 seed=S <config>` one after another (a run whose summary
exists is not repeated), then prints the table: per configuration the median steps to the target over the
seeds, the olympic mean of the time to target (the training clock, evaluation excluded) and the runs that
missed it. Measure on a quiet machine (every rank shares the CPU) and say its load next to the figures.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from wagma_bench.analysis.report import median, olympic_mean
from wagma_bench.campaign.runs import run_unless_done

ROOT = Path(__file__).resolve().parents[2]
SLOWMO = [
    "optimizer.outer=slowmo"
]  # alpha 1, beta 0.5; every global average (local SGD, WAGMA) or 12 rounds (SGP)
CONFIGS = {  # name: overrides
    "allreduce": ["optimizer=allreduce"],
    "local_sgd": ["optimizer=local_sgd"],
    "local_sgd+slowmo": ["optimizer=local_sgd", *SLOWMO],
    "wagma": ["optimizer=wagma"],
    "wagma+slowmo": ["optimizer=wagma", *SLOWMO],
    "sgp": ["optimizer=sgp"],
    "sgp+slowmo": ["optimizer=sgp", *SLOWMO],
    "diloco": ["experiment=diloco"],
    # SlowMo's step with alpha / (1 - beta) = 1: the same long-run step size as the base, momentum smoothing
    # only
    "local_sgd+slowmo-a0.5": ["optimizer=local_sgd", *SLOWMO, "optimizer.outer_lr=0.5"],
}
WORKLOADS = {
    "transformer": ["workload=transformer", "launcher.nproc=4", "logger.progress=off"],
    "resnet": [
        "workload=resnet",
        "imbalance=shared_draw",
        "launcher.nproc=4",
        "eval.every_rounds=10",
        "logger.progress=off",
    ],
}


def run(out: Path, name: str, seed: int, common: list[str], extra: list[str]) -> dict:
    return run_unless_done(out / f"{name}-s{seed}", [*common, *CONFIGS[name], f"seed={seed}", *extra], ROOT)


def row(name: str, runs: list[dict], base_steps: float | None) -> str:
    reached = [r for r in runs if r.get("reached")]
    steps = median([r["rounds_to_target"] for r in reached]) if reached else None
    secs = olympic_mean([r["time_to_target_s"] for r in reached]) if reached else None
    ratio = f"{steps / base_steps:.2f}x" if steps and base_steps else "-"
    per_seed = " / ".join(str(r.get("rounds_to_target") or "missed") for r in runs)
    return (
        f"| {name} | {per_seed} | {'-' if steps is None else f'{steps:.0f}'} | {ratio} | "
        f"{'-' if secs is None else f'{secs:.1f}'} | {len(runs) - len(reached)} |"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="transformer")
    p.add_argument("--seeds", default="1")
    p.add_argument("--only", default=",".join(CONFIGS))
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("extra", nargs="*", help="more overrides (after --)")
    args = p.parse_args(argv)
    out = args.out or ROOT / "multirun" / f"outer_{args.workload}"
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.only.split(",")
    results = {n: [run(out, n, s, WORKLOADS[args.workload], args.extra) for s in seeds] for n in names}
    base = results.get("allreduce")
    base_steps = median([r["rounds_to_target"] for r in base if r.get("reached")]) if base else None
    print(
        f"| configuration | steps to target, seeds {' / '.join(map(str, seeds))} | median | vs allreduce | "
        "time to target (s, olympic mean) | missed |"
    )
    print("|---|---|---|---|---|---|")
    for n in names:
        print(row(n, results[n], base_steps))


if __name__ == "__main__":
    main()
