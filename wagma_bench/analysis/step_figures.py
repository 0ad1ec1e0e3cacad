"""What a run's per-rank step records say about how its time went (pure functions over the records, raw or
compact: :func:`wagma_bench.record.steps.read_step_records`).

- **compute imbalance**: :func:`wagma_bench.record.rundir.imbalance_of`, the figure ``summary.json`` holds,
  recomputed so that a run recorded before it was measured has it too;
- **contention**: wall-clock compute over CPU compute (:func:`wagma_bench.record.rundir.contention_of`);
- **wait**: a rank's time in the optimizer's communication step beyond the least any rank spent in that step
  (steps matched by local step). In a collective every rank waits until the last one arrives, so the rank that
  arrived last spent only the transfer itself there: the least is the transfer, the excess is waiting for
  slower ranks. An estimate (a rank that waited in every step of the least's rank too hides that part), and
  one that reads the same for every optimizer; steps not every rank logged count as transfer.
- a rank's **wait share**: its wait over its training time (its last training clock ``t``; the sum of its
  components where the records have no clock).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from wagma_bench.record.rundir import contention_of, imbalance_of
from wagma_bench.record.steps import StepRecord

COMPONENTS = ("compute", "delay", "comm", "wait")  # comm: the transfer; wait: waiting for slower ranks


@dataclass(frozen=True)
class StepFigures:
    """One run's figures from its step records (None where the records cannot say)."""

    compute_imbalance: float | None
    contention: float | None  # wall compute over CPU compute, all ranks and steps
    wait_shares: dict[int, float] = field(default_factory=dict)  # per rank
    # per rank: mean seconds per step of each of COMPONENTS, and the p10 / p90 of its step time
    components: dict[int, dict[str, float]] = field(default_factory=dict)

    @property
    def wait_share_mean(self) -> float | None:
        return statistics.fmean(self.wait_shares.values()) if self.wait_shares else None

    @property
    def wait_share_max(self) -> float | None:
        return max(self.wait_shares.values()) if self.wait_shares else None


def step_figures(records: Mapping[int, list[StepRecord]]) -> StepFigures | None:
    """The figures of one run's per-rank step records; None without records."""
    ranks = {rank: recs for rank, recs in records.items() if recs}
    if not ranks:
        return None
    waits = wait_times(ranks)
    shares, components = {}, {}
    for rank, recs in ranks.items():
        wait = waits[rank]
        comm = [float(r.comm_s or 0.0) for r in recs]
        parts = {
            "compute": [float(r.compute_s or 0.0) for r in recs],
            "delay": [float(r.delay_s or 0.0) for r in recs],
            "comm": [c - w for c, w in zip(comm, wait, strict=True)],
            "wait": wait,
        }
        totals = sorted(sum(vals) for vals in zip(*parts.values(), strict=True))
        components[rank] = {c: statistics.fmean(v) for c, v in parts.items()}
        components[rank].update(p10=_quantile(totals, 0.1), p90=_quantile(totals, 0.9))
        clock = recs[-1].t or sum(totals)
        shares[rank] = sum(wait) / clock if clock > 0 else 0.0
    return StepFigures(
        imbalance_of(list(ranks.values())), contention_of(list(ranks.values())), shares, components
    )


def wait_times(records: Mapping[int, list[StepRecord]]) -> dict[int, list[float]]:
    """Per rank, per record: its communication time beyond the least of any rank at the same local step (0
    where not every rank logged the step)."""
    least: dict[int, float] = {}
    logged: dict[int, int] = {}
    for recs in records.values():
        for r in recs:
            step, comm = r.local_step, float(r.comm_s or 0.0)
            if step is not None:
                least[step] = min(least.get(step, comm), comm)
                logged[step] = logged.get(step, 0) + 1
    everyone = {s for s, n in logged.items() if n == len(records)}
    return {
        rank: [
            float(r.comm_s or 0.0) - least[r.local_step] if r.local_step in everyone else 0.0 for r in recs
        ]
        for rank, recs in records.items()
    }


def _quantile(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted values (linear between order statistics)."""
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
