"""The one rule of which way a figure is better and when a run reached its target, read by the trainer, the
records (events, MLPerf logs), tuning, claims, the report and a sweep's status (AlgoPerf keeps one registry
for both). A leaf module: every layer may import it.

A :class:`Metric` is a name, a direction and, for a run, its target; :data:`METRICS` names every figure the
suite ranks: the workloads' evaluation metrics (top-1, BLEU, DD-PPO's success and SPL: higher is better) and
the figures of a comparison (time to target: lower is better; throughput and the final metric: higher)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Metric:
    """A figure and which way it is better; ``target``: the value a run must reach (None: no target)."""

    name: str
    lower_is_better: bool
    target: float | None = None

    def with_target(self, target: float | None) -> Metric:
        return replace(self, target=target)

    def key(self, value: float) -> float:
        """A sort key, the better value first: the value, or its negation where higher is better (a tuning
        study's trial cost: the cheapest is the best)."""
        return value if self.lower_is_better else -value

    def better(self, value: float, than: float | None) -> bool:
        """``value`` is strictly better than ``than`` (anything is better than None)."""
        return than is None or self.key(value) < self.key(than)

    def best(self, values: Iterable[float | None]) -> float | None:
        """The best of ``values`` (None ignored); None when there is none."""
        have = [v for v in values if v is not None]
        return min(have, key=self.key) if have else None

    def reached(self, value: float | None, elapsed_s: float | None = None, time_limit_s: float | None = None):
        """An evaluation of ``value`` at ``elapsed_s`` of training reached the target: at it or past it in the
        metric's direction, within ``time_limit_s`` (``train.time_limit_s``: the trainer stops a run at its
        first synchronisation point past the limit, and an evaluation there comes too late to count)."""
        if (
            self.target is None
            or value is None
            or not math.isfinite(value)
            or self.key(value) > self.key(self.target)
        ):
            return False
        return time_limit_s is None or elapsed_s is None or elapsed_s <= time_limit_s

    def ratio(self, value: float | None, reference: float | None) -> float | None:
        """``value`` against ``reference`` as a plain ratio, above 1 when ``value`` is the better (the
        reference over the value where lower is better); None where either is None or the divisor 0."""
        if value is None or reference is None:
            return None
        num, den = (reference, value) if self.lower_is_better else (value, reference)
        return num / den if den else None

    def cost(self, value: float | None) -> float:
        """The figure as a cost, lower being better: a lower-is-better figure as it is, another as its
        reciprocal (so that a ratio of costs is the figure's ratio upside down); inf for a missing, infinite
        or non-positive figure."""
        if value is None or not 0 < value < math.inf:
            return math.inf
        return value if self.lower_is_better else 1.0 / value

    def factor(self, value: float | None, reference: float | None) -> float | None:
        """How many times better ``value`` is than ``reference`` (above 1: better); None where either has no
        finite cost."""
        cost, ref = self.cost(value), self.cost(reference)
        return ref / cost if math.isfinite(cost) and math.isfinite(ref) else None


METRICS = {
    m.name: m
    for m in (
        Metric("top1", lower_is_better=False),
        Metric("bleu", lower_is_better=False),
        Metric("success", lower_is_better=False),
        Metric("spl", lower_is_better=False),
        Metric("time_to_target", lower_is_better=True),
        Metric("throughput", lower_is_better=False),
        Metric("final_metric", lower_is_better=False),
    )
}


def metric(name: str | None, target: float | None = None) -> Metric:
    """The metric named ``name`` with ``target``; a name not in :data:`METRICS` (a run recorded before its
    name was: None) is an evaluation metric, higher being better, as every workload's is."""
    return METRICS.get(name or "", Metric(name or "metric", lower_is_better=False)).with_target(target)
