"""WAGMA-SGD vs Allreduce-SGD under injected stragglers, against the throughput bounds.

Let k of P ranks be delayed by d per step and c be the step time without imbalance. Allreduce-SGD cannot
do better than one step per c + d; no optimizer can do better than the mean-speed bound, one step per
c + (k/P) d on each rank. This script measures c (an imbalance=none run), sets d = 3c, and runs both
optimizers with `imbalance=shared_draw` (k ranks drawn per step with a shared seed; named `paper` when the
committed results-*.json were made), on the embedded ResNet.

    .venv/bin/python reproduce/imbalance/bench.py [--steps 110] [--settings 4:1,8:2] [--out DIR]
    .venv/bin/python reproduce/imbalance/bench.py --table results-....json     (the table of a committed run)

Throughput is samples per second of training time (evaluation off), from each run's summary.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from wagma_bench.campaign.runs import run_unless_done

COMMON = [
    "workload=resnet",
    "eval.target=null",
    "eval.every_rounds=100000",
    "logger.progress=off",
    "checkpoint.every_s=1e9",
]


def run(out: Path, name: str, args: list[str]) -> dict:
    summary = run_unless_done(out / name, [*COMMON, *args])
    if summary["status"].startswith("failed"):
        raise SystemExit(f"{name}: {summary['status']}")
    return summary


def table(rows: list[dict]) -> str:
    """The Markdown table of a run's rows (bench.json)."""
    lines = [
        "| P | k | c (ms) | d (ms) | run | samples/s | of its bound | vs Allreduce-SGD |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        head = f"| {r['P']} | {r['k']} | {1e3 * r['c_s']:.0f} | {1e3 * r['delay_s']:.0f} |"
        lines += [
            f"{head} no imbalance (Allreduce-SGD) | {r['none_throughput']:.0f} | | |",
            (
                f"{head} Allreduce-SGD | {r['allreduce_throughput']:.0f} | {r['allreduce_of_its_bound']:.2f} "
                "(c + d) | 1.00 |"
            ),
            (
                f"{head} WAGMA-SGD, `catch_up=replay` (default) | {r['wagma_throughput']:.0f} | "
                f"{r['wagma_of_mean_bound']:.2f} (mean-speed) | {r['wagma_over_allreduce']:.2f} |"
            ),
            (
                f"{head} WAGMA-SGD, `catch_up=skip` | {r['wagma_skip_throughput']:.0f} | "
                f"{r['wagma_skip_of_mean_bound']:.2f} (mean-speed) | {r['wagma_skip_over_allreduce']:.2f} |"
            ),
            f"{head} mean-speed bound | {r['mean_speed_bound']:.0f} | | {r['bound_ratio']:.2f} |",
        ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=110, help="rounds per run (a multiple of tau+1=11)")
    ap.add_argument("--settings", default="4:1", help="P:k pairs, e.g. 4:1,8:2")
    ap.add_argument("--delay-factor", type=float, default=3.0, help="d = factor x c")
    ap.add_argument("--out", type=Path, default=Path("runs/imbalance-bench"))
    ap.add_argument("--table", type=Path, help="print the table of a finished run's bench.json, run nothing")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    rows = []
    for setting in args.settings.split(","):
        p, k = map(int, setting.split(":"))
        base = [f"launcher.nproc={p}", f"train.max_rounds={args.steps}"]
        none = run(args.out, f"P{p}_none_allreduce", base + ["optimizer=allreduce", "imbalance=none"])
        batch = none["samples"] / none["rounds"] / p
        c = none["train_s"] / none["rounds"]
        d = args.delay_factor * c
        slow = ["imbalance=shared_draw", f"imbalance.num_slow={k}", f"imbalance.delay_s={d:.4f}"]
        ar = run(args.out, f"P{p}_k{k}_allreduce", base + ["optimizer=allreduce"] + slow)
        wg = run(args.out, f"P{p}_k{k}_wagma", base + ["optimizer=wagma"] + slow)
        sk = run(
            args.out, f"P{p}_k{k}_wagma_skip", base + ["optimizer=wagma", "optimizer.catch_up=skip"] + slow
        )
        mean_bound = p * batch / (c + k / p * d)
        ar_bound = p * batch / (c + d)
        rows.append(
            {
                "P": p,
                "k": k,
                "c_s": c,
                "delay_s": d,
                "batch": batch,
                "none_throughput": none["throughput_samples_per_s"],
                "allreduce_throughput": ar["throughput_samples_per_s"],
                "wagma_throughput": wg["throughput_samples_per_s"],
                "wagma_skip_throughput": sk["throughput_samples_per_s"],
                "wagma_skip_of_mean_bound": sk["throughput_samples_per_s"] / mean_bound,
                "wagma_skip_over_allreduce": sk["throughput_samples_per_s"] / ar["throughput_samples_per_s"],
                "mean_speed_bound": mean_bound,
                "allreduce_bound": ar_bound,
                "wagma_of_mean_bound": wg["throughput_samples_per_s"] / mean_bound,
                "allreduce_of_its_bound": ar["throughput_samples_per_s"] / ar_bound,
                "wagma_over_allreduce": wg["throughput_samples_per_s"] / ar["throughput_samples_per_s"],
                "bound_ratio": mean_bound / ar_bound,
            }
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(rows, indent=2))
    print(table(rows))


if __name__ == "__main__":
    main()
