"""Whether a claim's verdict survives a second look: every single-trial and single-study removal, and the two
scorings a reviewer asks for instead of each study's best trial.

A verdict rests on few trials (3 x 3 or 5 x 5 per optimizer), so one trial can decide it. For each claim,
:func:`assess` recomputes the verdict

- **without each finished trial** in turn (of the subject or a comparator; a study left with none drops out),
- **without each study** in turn, from every optimizer at once (a study number is one quasirandom draw of the
  search space and one seed set, shared by the optimizers of a tuning),
- **scored by each trial's final evaluation** instead of its best (a final metric at a fixed budget only: a
  time to target or a throughput has no "final" reading),
- **scored by each study's median trial** instead of its best (a tuned score only: a throughput is already a
  median over every trial).

Every one of these is exact, as the claim's own interval is (:mod:`wagma_bench.analysis.intervals`): a removal
only changes the trials the two-stage bootstrap resamples, and the median per study has a closed law too (a
resampled study's median is the median of O i.i.d. draws from its O values, :func:`intervals.median_of_draws`;
the S resampled medians are i.i.d. from the mixture of those, and the score is their median). A verdict that
one removal changes is **fragile**; the alternatives are shown beside it and do not make it fragile.

What decides a verdict is not here: the caller passes ``judge`` (``claims.decide`` over ``claims.speedup``),
so that the rule is written once.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from wagma_bench.analysis import intervals
from wagma_bench.analysis.tuning import BY_METRIC, BY_TIME, load_trials, trial_cost, trial_finished
from wagma_bench.record.summary import RunSummary, run_summary

SCORINGS = ("best", "final", "median")  # per study: its best trial (the claim's own), by final eval, median


@dataclass(frozen=True)
class Law:
    """One optimizer's measured value and its bootstrap law (what ``claims.speedup`` reads of it)."""

    optimizer: str
    value: float
    dist: intervals.Dist


@dataclass(frozen=True)
class Judged:
    verdict: str
    speedup: float | None
    interval: tuple[float, float] | None


Judge = Callable[[dict[str, Law]], Judged]
# optimizer -> its studies (by study number) -> that study's finished trials as (trial name, summary)
Tuned = dict[str, dict[int, list[tuple[str, RunSummary]]]]


def tuned_trials(tune_dir: Path, loaded: tuple | None = None) -> Tuned:
    """A tuning directory's finished trials by optimizer and study (what :func:`assess` removes from)."""
    _, combos, summaries = loaded or load_trials(tune_dir)
    out: Tuned = {}
    for trials in combos.values():
        for t in trials:
            s = summaries[t.name]
            if trial_finished(s):
                out.setdefault(s.optimizer, {}).setdefault(t.study, []).append((t.name, s))
    return out


def trial_costs(
    summaries: list[RunSummary | Mapping], metric: str, scoring: str, cap: float | None
) -> list[float]:
    """Each trial's cost (lower is better) under ``scoring``: a time to target (inf: missed), a negated best
    or final metric (inf: failed), or a throughput as it is (``metric=throughput``: higher is better)."""
    summaries = [run_summary(s) for s in summaries]
    if metric == "throughput":
        return [s.throughput_samples_per_s for s in summaries if s.throughput_samples_per_s]
    if metric == "time_to_target":
        return [trial_cost(s, cap, BY_TIME) for s in summaries]
    if scoring == "final":  # the same rule as the best metric's (tuning.trial_cost), on the last evaluation
        return [trial_cost(replace(s, best_metric=s.final_metric), None, BY_METRIC) for s in summaries]
    return [trial_cost(s, None, BY_METRIC) for s in summaries]


def score_law(
    studies: list[list[RunSummary]], metric: str, cap: float | None = None, scoring: str = "best"
) -> tuple[float, intervals.Dist]:
    """One optimizer's value and its exact two-stage bootstrap law, from its studies' finished trials: a
    throughput's median over every trial, or a tuned score (the median over studies of each study's best
    trial, or with ``scoring="median"`` its median trial; ``"final"``: a final metric by its last evaluation).
    A metric is returned as itself (higher is better), a time as a time."""
    if scoring not in SCORINGS:
        raise ValueError(f"scoring={scoring!r}; one of {', '.join(SCORINGS)}")
    costs = [c for c in (trial_costs(s, metric, scoring, cap) for s in studies) if c]
    if not costs:
        return math.nan, {}
    if metric == "throughput":
        return float(statistics.median(v for c in costs for v in c)), intervals.pooled_median(costs)
    if scoring == "median":
        value = statistics.median(statistics.median(c) for c in costs)
        per_study = [intervals.median_of_draws(_empirical(c), len(c)) for c in costs]
        dist = intervals.median_of_draws(intervals.mixture(per_study), len(costs))
    else:
        value, dist = statistics.median(min(c) for c in costs), intervals.tuned_score(costs)
    value = float(value)
    if metric == "time_to_target":
        return value, dist
    return -value, {-v: p for v, p in dist.items()}


def _empirical(values: list[float]) -> intervals.Dist:
    out: intervals.Dist = {}
    for v in values:
        out[v] = out.get(v, 0.0) + 1 / len(values)
    return out


def _laws(trials: Tuned, metric: str, cap: float | None, scoring: str) -> dict[str, Law]:
    out = {}
    for opt, studies in trials.items():
        value, dist = score_law([s for _, s in _flat(studies)], metric, cap, scoring)
        if dist:
            out[opt] = Law(opt, value, dist)
    return out


def _flat(studies: dict[int, list[tuple[str, RunSummary]]]) -> list[tuple[int, list[RunSummary]]]:
    return [(n, [s for _, s in trials]) for n, trials in sorted(studies.items()) if trials]


def applies(metric: str, scoring: str) -> str | None:
    """Why ``scoring`` does not apply to ``metric`` (None: it does)."""
    if scoring == "final" and metric != "final_metric":
        return "a time to target or a throughput has no final evaluation to score by"
    if scoring == "median" and metric == "throughput":
        return "a throughput is already the median over every trial"
    return None


def assess(trials: Tuned, metric: str, judge: Judge, cap: float | None = None) -> dict:
    """The claim's verdict under every single-trial and single-study removal and under the two alternative
    scorings (this module's docstring); ``trials``: the optimizers the claim reads (:func:`tuned_trials`)."""
    base_laws = _laws(trials, metric, cap, "best")
    base = judge(base_laws)

    def removal(label: str, reduced: Tuned, only: str | None = None) -> dict:
        laws = dict(base_laws)
        for opt in [only] if only else list(reduced):
            laws.pop(opt, None)
            laws.update(_laws({opt: reduced[opt]}, metric, cap, "best"))
        return {"removed": label, **_judged(judge(laws))}

    by_trial = []
    for opt, studies in trials.items():
        for n, members in studies.items():
            for name, _ in members:
                kept = {m: [x for x in xs if m != n or x[0] != name] for m, xs in studies.items()}
                by_trial.append(removal(name, {**trials, opt: kept}, opt))
    numbers = sorted({n for studies in trials.values() for n in studies})
    by_study = [
        removal(f"study {n}", {o: {m: xs for m, xs in s.items() if m != n} for o, s in trials.items()})
        for n in numbers
    ]
    alternatives = {}
    for key, scoring in (("final_evaluation", "final"), ("median_per_study", "median")):
        why = applies(metric, scoring)
        alternatives[key] = (
            {"applies": False, "note": why}
            if why
            else {"applies": True, **_judged(judge(_laws(trials, metric, cap, scoring)))}
        )
    removals = {
        kind: {
            "kept": sum(r["verdict"] == base.verdict for r in rows),
            "of": len(rows),
            "changed": [r for r in rows if r["verdict"] != base.verdict],
        }
        for kind, rows in (("trials", by_trial), ("studies", by_study))
    }
    return {
        "fragile": any(r["changed"] for r in removals.values()),
        "verdict": base.verdict,
        "removals": removals,
        "alternatives": alternatives,
    }


def _judged(j: Judged) -> dict:
    return {
        "verdict": j.verdict,
        "speedup": j.speedup,
        "interval": list(j.interval) if j.interval else None,
    }
