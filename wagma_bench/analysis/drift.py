"""Figures adjusted for the machine's drift, from each trial's speed reference.

``tune`` times a fixed CPU workload before and after every trial (:mod:`wagma_bench.runtime.reference`) and
writes the mean to the trial's ``summary.json`` as ``reference_s``. A trial that ran while the machine was slow
has a larger reference; its figures are scaled to the tuning directory's median reference:

- time to target: ``time_to_target_s * median / reference_s`` (a slow machine's time scaled down);
- throughput: ``throughput * reference_s / median`` (a slow machine's samples/s scaled up);
- a final metric at a fixed step budget does not depend on the machine's speed and is left as it is.

Whether a trial reached its target within ``tune.max_runtime_s`` is decided on its raw time (the cap is what
it ran under). The adjustment assumes a trial's speed is proportional to the reference's over the trial; it is
a check on the raw verdict, which stays on the raw figures (docs/claims.md says why).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

REFERENCE = "reference_s"


def median_reference(summaries: Iterable[dict | None]) -> float | None:
    """The median reference of the trials that have one (None: none has)."""
    refs = [s[REFERENCE] for s in summaries if s and _positive(s.get(REFERENCE))]
    return float(statistics.median(refs)) if refs else None


def tuning_median(finished: list[dict]) -> float | None:
    """The median reference of a tuning's finished trials, or None unless every one of them has a reference (a
    drift adjustment of some trials only would mix two scales)."""
    return median_reference(finished) if finished and all(map(has_reference, finished)) else None


def has_reference(summary: dict | None) -> bool:
    return bool(summary) and _positive(summary.get(REFERENCE))


def adjusted(summary: dict, median: float, max_runtime_s: float | None) -> dict:
    """A copy of ``summary`` with its time to target and throughput scaled to the median reference; a trial
    past ``max_runtime_s`` (raw) stays a miss."""
    factor = summary[REFERENCE] / median
    out = dict(summary)
    if out.get("throughput_samples_per_s"):
        out["throughput_samples_per_s"] = out["throughput_samples_per_s"] * factor
    t = out.get("time_to_target_s")
    if out.get("reached") and t is not None:
        if max_runtime_s is not None and t > max_runtime_s:
            out["reached"] = False
        else:
            out["time_to_target_s"] = t / factor
    return out


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0
