"""Figures adjusted for the machine's drift, from each trial's speed reference,
by the drift's measured effect.

``tune`` times a fixed CPU workload before and after every trial (:mod:`wagma_bench.campaign.reference`) and
writes the mean to the trial's ``summary.json`` as ``reference_s``. A trial that ran while the machine was
slow has a larger reference. How much slower the trial itself ran is measured, not assumed: within each
optimizer (each combination) of a tuning, a trial's seconds per round on the training clock
(``train_s / steps``) rises with its reference with an elasticity e, fitted once per tuning by a pooled
regression on logs (:func:`fit_elasticity`: log(seconds per round) = a_combination + e * log(reference_s)).
Its figures are then scaled to the tuning's median reference by (reference_s / median)^e:

- time to target: ``time_to_target_s * (median / reference_s)^e`` (a slow machine's time scaled down);
- throughput: ``throughput * (reference_s / median)^e`` (a slow machine's samples/s scaled up);
- a final metric at a fixed step budget does not depend on the machine's speed and is left as it is.

e = 1 is the proportional model (a trial slows exactly as its reference does), the one used before 2026-12-06.
The fitted e has a sampling error; :func:`elasticity_draws` gives equally likely values of it that the claims'
intervals mix over (docs/claims.md says why). Whether a trial reached its target within ``tune.max_runtime_s``
is decided on its raw time (the cap is what it ran under). The adjustment is a check on the raw verdict, which
stays on the raw figures.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from wagma_bench.record.summary import RunSummary, run_summary

REFERENCE = "reference_s"
DRAWS = 9  # equally likely values of the elasticity mixed into a drift-adjusted interval


@dataclass(frozen=True)
class Elasticity:
    """The fitted elasticity of seconds per round to the speed reference, within combinations."""

    value: float
    se: float  # its ordinary least-squares standard error
    trials: int  # the trials the fit read
    groups: int  # the combinations (one intercept each)


def median_reference(summaries: Iterable[RunSummary | Mapping | None]) -> float | None:
    """The median reference of the trials that have one (None: none has)."""
    refs = [s.reference_s for s in map(run_summary, summaries) if s and _positive(s.reference_s)]
    return float(statistics.median(refs)) if refs else None


def tuning_median(finished: list[RunSummary | Mapping]) -> float | None:
    """The median reference of a tuning's finished trials, or None unless every one of them has a reference (a
    drift adjustment of some trials only would mix two scales)."""
    return median_reference(finished) if finished and all(map(has_reference, finished)) else None


def has_reference(summary: RunSummary | Mapping | None) -> bool:
    s = run_summary(summary or None)
    return s is not None and _positive(s.reference_s)


def seconds_per_round(summary: RunSummary | Mapping | None) -> float | None:
    """A trial's training clock over its rounds: what both its throughput and
    its time to target scale with."""
    s = run_summary(summary or None)
    if s is None or not _positive(s.train_s) or not _positive(s.rounds):
        return None
    return s.train_s / s.rounds


def fit_elasticity(groups: Iterable[Iterable[RunSummary | Mapping | None]]) -> Elasticity | None:
    """The pooled within-group regression log(seconds per round) = a_group + e * log(reference_s) over the
    trials that have both, one intercept per group (combination) and one slope, with its OLS standard error.
    By Frisch-Waugh-Lovell the slope is that of the deviations from each group's means. None when it cannot be
    fitted: fewer than groups + 2 trials, or no reference varying within a group."""
    points = []  # per group: (log reference, log seconds per round)
    for group in groups:
        mine = [
            (math.log(s.reference_s), math.log(seconds_per_round(s)))
            for s in map(run_summary, group)
            if has_reference(s) and seconds_per_round(s) is not None
        ]
        if mine:
            points.append(mine)
    n, g = sum(map(len, points)), len(points)
    dev = []  # (x - group mean x, y - group mean y)
    for mine in points:
        mx, my = statistics.fmean(x for x, _ in mine), statistics.fmean(y for _, y in mine)
        dev += [(x - mx, y - my) for x, y in mine]
    sxx = sum(x * x for x, _ in dev)
    if n < g + 2 or sxx <= 0:
        return None
    e = sum(x * y for x, y in dev) / sxx
    residual = sum((y - e * x) ** 2 for x, y in dev) / (n - g - 1)
    return Elasticity(e, math.sqrt(residual / sxx), n, g)


def elasticity_draws(fit: Elasticity, k: int = DRAWS) -> list[float]:
    """k equally likely values of the elasticity under its normal sampling law N(e, se^2): the medians of k
    slices of equal probability (deterministic, so the claims' tables are the same at every run)."""
    normal = statistics.NormalDist(fit.value, fit.se) if fit.se > 0 else None
    return [normal.inv_cdf((i + 0.5) / k) if normal else fit.value for i in range(k)]


def adjusted(
    summary: RunSummary | Mapping, median: float, max_runtime_s: float | None, elasticity: float = 1.0
) -> RunSummary:
    """A copy of ``summary`` with its time to target and throughput scaled to the median reference by
    (reference_s / median)^elasticity; a trial past ``max_runtime_s`` (raw) stays a miss."""
    out = run_summary(summary)
    factor = (out.reference_s / median) ** elasticity
    if out.throughput_samples_per_s:
        out = dataclasses.replace(out, throughput_samples_per_s=out.throughput_samples_per_s * factor)
    t = out.time_to_target_s
    if out.reached and t is not None:
        if max_runtime_s is not None and t > max_runtime_s:
            out = dataclasses.replace(out, reached=False)
        else:
            out = dataclasses.replace(out, time_to_target_s=t / factor)
    return out


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0
