"""Where the embedded Transformer's run-to-run spread comes from (issue 54): one configuration, Allreduce-SGD
at its tuned winner (reproduce/tuning/results-2core-20261202/transformer: lr 0.00404411, warm-up 0.687 epochs,
the claim's target BLEU 80, cap 150 s, 4 ranks), varied one source at a time, five levels each:

- ``repeat``: nothing varied (seed 4, batch order 4): what the machine's timing alone spreads;
- ``seed``: the run's seed (model initialisation and dropout), the batch order held at 4;
- ``order``: the batch order (``workload.shuffle_seed``), the seed held at 4;
- ``lr``: the learning rate, x0.5 to x2 of the winner's (the tuning's search space spans x0.31 to x4.9 of it).

The runs are interleaved (round k runs level k of every source, the sources in a seeded shuffled order) and
each is timed between two speed references (wagma_bench/campaign/reference.py), as tune's trials are.

    .venv/bin/python reproduce/transformer/spread.py run OUT       # runs what OUT lacks, then OUT/spread.json
    .venv/bin/python reproduce/transformer/spread.py table FILE    # the markdown table of a spread.json

Per source the table gives the coefficient of variation (standard deviation over mean) of the time to the
target, of the steps to the target (the machine's speed left out) and of the best BLEU, and how many of the
five reached the target. A source whose spread matches the tuning's trial-to-trial spread is what a 5 x 5
tuning cannot average away; docs/claims.md reads the table.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
from pathlib import Path

from wagma_bench.campaign.reference import reference_s
from wagma_bench.campaign.runs import ended, run_unless_done
from wagma_bench.campaign.tune import add_reference
from wagma_bench.record.events import SUMMARY
from wagma_bench.record.files import write_json_atomic
from wagma_bench.record.summary import RunSummary

LR, WARMUP_EPOCHS, SEED = 0.00404411, 0.686998, 4
BASE = [
    "workload=transformer",
    "optimizer=allreduce",
    f"train.warmup_epochs={WARMUP_EPOCHS}",
    "train.time_limit_s=150",
    "logger.progress=off",
]
LEVELS = {
    "repeat": [{} for _ in range(5)],
    "seed": [{"seed": s} for s in (11, 12, 13, 14, 15)],
    "order": [{"shuffle_seed": s} for s in (11, 12, 13, 14, 15)],
    "lr": [{"lr_factor": f} for f in (0.5, 0.707107, 1.0, 1.414214, 2.0)],
}
RESULT = "spread.json"


def overrides(level: dict) -> list[str]:
    lr = LR * level.get("lr_factor", 1.0)
    return [
        *BASE,
        f"seed={level.get('seed', SEED)}",
        f"workload.shuffle_seed={level.get('shuffle_seed', SEED)}",
        f"train.lr={lr:.6g}",
    ]


def plan(seed: int = 1) -> list[tuple[str, int]]:
    """(source, level index) in run order: round k holds level k of every source, in a shuffled order."""
    rng = random.Random(f"spread {seed}")
    order = []
    for k in range(5):
        sources = list(LEVELS)
        rng.shuffle(sources)
        order += [(source, k) for source in sources]
    return order


def run(out: Path) -> list[dict]:
    rows = []
    for n, (source, k) in enumerate(plan(), 1):
        run_dir = out / f"{source}{k + 1}"
        # an interrupted run is run again (it resumes) and timed again; an ended one is read
        before = None if ended(run_dir / SUMMARY) else reference_s()
        print(f"[spread {n}/{len(LEVELS) * 5}] {run_dir.name}", file=sys.stderr, flush=True)
        summary = run_unless_done(run_dir, overrides(LEVELS[source][k]))
        if before is not None and ended(run_dir / SUMMARY):
            summary = add_reference(run_dir, RunSummary.from_json(summary), before, reference_s()).to_json()
        rows.append(row(source, k, summary))
    write_json_atomic(
        out / RESULT, {"version": 1, "base": BASE, "lr": LR, "seed": SEED, "levels": LEVELS, "runs": rows}
    )
    return rows


def row(source: str, k: int, summary: dict) -> dict:
    return {
        "source": source,
        "level": LEVELS[source][k],
        "status": summary.get("status"),
        "reached": bool(summary.get("reached")),
        "time_to_target_s": summary.get("time_to_target_s"),
        "steps_to_target": summary.get("rounds_to_target"),
        "best_bleu": summary.get("best_metric"),
        "reference_before_after_s": summary.get("reference_before_after_s"),
    }


def cv(values: list[float]) -> float | None:
    return statistics.stdev(values) / statistics.mean(values) if len(values) >= 2 else None


def table(result: dict) -> str:
    lines = [
        (
            "| source varied | reached | time to target (s): median, CV | steps to target: median, CV | "
            "best BLEU: median, CV |"
        ),
        "|---|---|---|---|---|",
    ]
    for source in LEVELS:
        runs = [r for r in result["runs"] if r["source"] == source]
        hit = [r for r in runs if r["reached"]]
        cells = [f"{len(hit)}/{len(runs)}"]
        for key, fmt in (
            ("time_to_target_s", "{:.1f}"),
            ("steps_to_target", "{:.0f}"),
            ("best_bleu", "{:.1f}"),
        ):
            values = [r[key] for r in (runs if key == "best_bleu" else hit) if r[key] is not None]
            spread = cv(values)
            cells.append(
                "—"
                if not values
                else f"{fmt.format(statistics.median(values))}, {'—' if spread is None else f'{spread:.2f}'}"
            )
        lines.append(f"| {source} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("run", "table"):
        print(__doc__.split("\n\n")[3], file=sys.stderr)
        return 2
    if argv[0] == "run":
        run(Path(argv[1]))
        print(table(json.loads((Path(argv[1]) / RESULT).read_text())))
    else:
        print(table(json.loads(Path(argv[1]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
