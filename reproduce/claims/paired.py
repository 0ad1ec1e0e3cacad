"""Would a paired score decide the Transformer claims? The speed-up's 95% interval by Monte Carlo, resampling
each optimizer's studies and trials on its own (the declared two-stage bootstrap, which `wagma-bench claims`
computes exactly: the two columns agree within the Monte Carlo's error) and paired (one draw of study and
trial indices shared by every optimizer: trial k of study s has the same seed, so the same model
initialisation and batch order, and the same first quasirandom coordinate, the learning-rate multiplier, in
every optimizer's plan).

    .venv/bin/python reproduce/claims/paired.py     # the table of docs/claims.md ("paired" block)

Reads the committed sources (reproduce/claims/sources) through the suite's own trial readers; 20,000
resamples, seeded: the same table every time.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from wagma_bench.analysis.claims import find_sources, load_claims
from wagma_bench.analysis.tuning import (
    BY_METRIC,
    BY_TIME,
    LOWER_IS_BETTER,
    load_trials,
    median_score,
    trial_cost,
    trial_finished,
)

ROOT = Path(__file__).resolve().parents[2]

CLAIMS = ("transformer-time-to-solution", "transformer-sentences-time-to-solution", "transformer-final-bleu")
RESAMPLES, SEED, LEVEL = 20_000, 1, 0.95


def costs(tune_dir: Path, metric: str) -> dict[str, dict[tuple[int, int], float]]:
    """Each optimizer's cost per (study, trial) by tune's own rule (`tuning.trial_cost`, as the claims score
    it), lower is better: the time to target (inf: missed) or the negated best metric (inf: failed)."""
    plan, combos, summaries = load_trials(tune_dir)
    by = BY_TIME if metric == "time_to_target" else BY_METRIC
    out: dict[str, dict[tuple[int, int], float]] = {}
    for trials in combos.values():
        for t in trials:
            s = summaries[t.name]
            if trial_finished(s):
                out.setdefault(s.optimizer, {})[(t.study, t.trial)] = trial_cost(
                    s, plan.get("max_runtime_s"), by
                )
    return out


def score(cost: dict[tuple[int, int], float], draw: list[tuple[int, list[int]]]) -> float:
    """The tuned score of one resample: the median over the drawn studies of each one's best drawn trial."""
    return median_score([min(cost[(s, t)] for t in trials) for s, trials in draw])


def draw_indices(rng: random.Random, studies: list[int], trials: list[int]) -> list[tuple[int, list[int]]]:
    return [(rng.choice(studies), [rng.choice(trials) for _ in trials]) for _ in studies]


def speedup(subject: float, best: float, metric: str, compare: str) -> float:
    if compare == "difference":
        return -subject - (-best)  # the metric's difference, subject minus the best comparator
    if LOWER_IS_BETTER[metric]:
        return best / subject if math.isfinite(subject) else 0.0
    return subject / best  # final metric, as a ratio: both negated, so the ratio is the metric's


def interval(claim, cost: dict[str, dict], paired: bool, rng: random.Random) -> tuple[float, float]:
    names = [claim.subject] + [c for c in claim.comparators if c in cost]
    studies = sorted({s for s, _ in cost[claim.subject]})
    trials = sorted({t for _, t in cost[claim.subject]})
    values = []
    for _ in range(RESAMPLES):
        shared = draw_indices(rng, studies, trials)
        scores = {n: score(cost[n], shared if paired else draw_indices(rng, studies, trials)) for n in names}
        best = min(scores[n] for n in names[1:])
        values.append(speedup(scores[claim.subject], best, claim.metric, claim.compare))
    values.sort()
    tail = (1 - LEVEL) / 2
    return values[int(tail * RESAMPLES)], values[int((1 - tail) * RESAMPLES) - 1]


def fmt(claim, lo_hi: tuple[float, float]) -> str:
    lo, hi = lo_hi
    return f"[{lo:+.2f}, {hi:+.2f}]" if claim.compare == "difference" else f"[{lo:.2f}x, {hi:.2f}x]"


def table() -> str:
    dirs = [
        ROOT / line.strip() for line in (ROOT / "reproduce/claims/sources").read_text().splitlines() if line
    ]
    sources = find_sources(dirs)
    rows = [
        "| claim | source | independent draws (the declared bootstrap) | paired draws |",
        "|---|---|---|---|",
    ]
    for claim in (c for c in load_claims() if c.id in CLAIMS):
        tune_dir = sources.tunings[claim.measured["tuning"]]
        cost = costs(tune_dir, claim.metric)
        rng = random.Random(SEED)
        independent, paired = interval(claim, cost, False, rng), interval(claim, cost, True, rng)
        rows.append(
            f"| `{claim.id}` | `{tune_dir.relative_to(ROOT)}` | {fmt(claim, independent)} | "
            f"{fmt(claim, paired)} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
