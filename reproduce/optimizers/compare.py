"""Every optimizer on the embedded default, without and with injected stragglers: time-to-target and
throughput in one table (the optimizer table of docs/optimizers.md).

Runs `wagma-bench run workload=resnet optimizer=X imbalance=I seed=S` (4 local ranks, ResNet-20 on the
embedded MNIST subset, target 97% validation top-1) for every X, I and S, one after another, then prints a
Markdown table from the runs' summary.json files: per optimizer and imbalance, the time-to-target as
MLPerf's olympic mean over the seeds (with 3 or more: drop the fastest and the slowest), the other columns
as medians. Runs whose summary already exists are not repeated, so an interrupted comparison continues
where it stopped. Measure on a quiet machine: every rank shares the CPU.

    .venv/bin/python reproduce/optimizers/compare.py [--out DIR] [--optimizers a,b]
                                                     [--imbalances none,shared_draw] [--seeds 1,2,3]
                                                     [--max-rounds N] [-- more overrides]

`--max-rounds 8` checks the pipeline in a minute (the target is then not reached). `--max-steps`, its old
spelling, is read as `--max-rounds` with one line, as every old name (docs/configuration.md).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from omegaconf import OmegaConf

from wagma_bench.analysis.report import median, olympic_mean
from wagma_bench.campaign.runs import run_unless_done
from wagma_bench.config.renamed import renamed_flags
from wagma_bench.optim import OPTIMIZERS

ROOT = Path(__file__).resolve().parents[2]
# Evaluate every 10 rounds (rounded up to the optimizer's sync period), so time-to-target is resolved
# finely; evaluation time is excluded from the training clock.
COMMON = ["workload=resnet", "launcher.nproc=4", "eval.every_rounds=10", "logger.progress=off"]


def key_hyperparameters(optimizer: str) -> str:
    conf = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "optimizer" / f"{optimizer}.yaml"))
    return ", ".join(f"{k}={v}" for k, v in conf.items() if k != "name") or "-"


def run(out: Path, optimizer: str, imbalance: str, seed: int, extra: list[str]) -> dict:
    return run_unless_done(
        out / f"{optimizer}-{imbalance}-s{seed}",
        [*COMMON, f"optimizer={optimizer}", f"imbalance={imbalance}", f"seed={seed}", *extra],
        ROOT,
    )


def fmt(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def aggregate(seeds: list[dict]) -> dict:
    """One row from the seeds' summaries: TTT olympic mean (a seed that missed the target counts as
    infinitely slow), medians of the rest."""
    ttt = [s["time_to_target_s"] if s.get("reached") else math.inf for s in seeds]
    values = lambda key: [s[key] for s in seeds if s.get(key) is not None]
    return {
        "reached": f"{sum(bool(s.get('reached')) for s in seeds)}/{len(seeds)}",
        "ttt": olympic_mean(ttt),
        "ttt_all": sorted(ttt),
        "steps": median(values("rounds_to_target") or values("rounds")),
        "throughput": median(values("throughput_samples_per_s")),
        "best": median(values("best_metric")),
        "eval_model": seeds[0].get("eval_model", "-"),
        "status": ",".join(sorted({s.get("status", "-") for s in seeds})),
    }


def table(rows: list[tuple[str, str, dict]]) -> str:
    header = (
        "| optimizer | paper | key hyperparameters | imbalance | reached | time-to-target (s), olympic mean "
        "| per seed | steps | throughput (samples/s) | best top-1 | eval model | status |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for optimizer, imbalance, a in rows:
        seeds = " / ".join("-" if math.isinf(v) else f"{v:.1f}" for v in a["ttt_all"])
        lines.append(
            f"| {optimizer} | {OPTIMIZERS[optimizer].paper} | {key_hyperparameters(optimizer)} | {imbalance} "
            f"| {a['reached']} | {fmt(a['ttt'])} | {seeds} | {fmt(a['steps'], '.0f')} "
            f"| {fmt(a['throughput'])} | {fmt(a['best'], '.4f')} | {a['eval_model']} | {a['status']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "optimizers-compare")
    ap.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    ap.add_argument("--imbalances", default="none,shared_draw")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument(
        "--max-rounds", type=int, default=None, help="cap every run (a quick check of the pipeline)"
    )
    ap.add_argument("overrides", nargs="*", help="more Hydra overrides for every run (after --)")
    args = ap.parse_args(renamed_flags(sys.argv[1:]))
    unknown = sorted(set(args.optimizers.split(",")) - set(OPTIMIZERS))
    if unknown:
        ap.error(f"--optimizers: unknown {', '.join(unknown)}; choose from: {', '.join(OPTIMIZERS)}")
    extra = list(args.overrides) + ([f"train.max_rounds={args.max_rounds}"] if args.max_rounds else [])
    seeds = [int(v) for v in args.seeds.split(",")]
    rows = [
        (o, i, aggregate([run(args.out, o, i, seed, extra) for seed in seeds]))
        for i in args.imbalances.split(",")
        for o in args.optimizers.split(",")
    ]
    text = table(rows)
    (args.out / "table.md").parent.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    print(f"\n(table also in {args.out / 'table.md'})", file=sys.stderr)


if __name__ == "__main__":
    main()
