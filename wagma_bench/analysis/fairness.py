"""Whether a comparison gave its series the same chance: the flags ``report``, ``claims`` and ``tune``
print beside a figure and in one line at the top, as pyperf and hyperfine warn of an unstable measurement
rather than print it silently.

- **contended**: a run whose ranks' wall-clock compute exceeds their CPU compute
  (:func:`wagma_bench.record.rundir.contention_of`) by more than :data:`CONTENDED_FACTOR` times what its own
  placement explains (its ranks per usable CPU, :func:`wagma_bench.record.events.ranks_per_cpu`: four ranks
  on two cores wait about 2x by design) waited for a core because of another process beside it. Its
  throughput and times measure the machine as much as the optimizer. Runs that did not record their CPUs
  (before 2026-12-07) are judged as if each rank had a core: more ranks than cores flags them too.
- **different conditions**: two series whose speed references (``reference_s``, the fixed CPU workload timed
  at each trial's start and end, :mod:`wagma_bench.campaign.reference`) differ by more than their noise ran on
  a machine of different speed. The noise is the larger relative spread (max / min - 1) of either series' own
  readings, at least :data:`REFERENCE_NOISE_FLOOR`.

Pure functions over figures: the callers read them from their records
(:mod:`~wagma_bench.analysis.run_records`) and say which of their ratios a flag touches.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

# Wall over CPU compute above which a run is contended. A rank with a core of its own reads a little over 1
# (batch loading and page faults run on the wall clock too); a rank that gets half a core reads about 2 (a
# 2-rank run on 2 cores beside two CPU-bound processes). 1.5 lies between, with room on either side.
CONTENDED_FACTOR = 1.5
REFERENCE_NOISE_FLOOR = 0.05  # speed references closer than this (relative) never count as different


def contended(
    runs: Iterable[tuple[float | None, float | None]], factor: float = CONTENDED_FACTOR
) -> str | None:
    """The flag of a series whose runs have these (wall / CPU compute factor, ranks per CPU) pairs: None when
    no run waited for a core more than ``factor`` times what its own placement makes it wait. Four ranks on
    two cores wait about 2x by design (``ranks_per_cpu`` 2): that alone is not flagged, 2x more beside other
    work is. A run that did not record its CPUs (``ranks_per_cpu`` None, before 2026-12-07) is judged by its
    raw factor, as if each rank had a core."""
    judged = [(c / max(1.0, r or 1.0), c, r) for c, r in runs if c is not None]
    over = [j for j in judged if j[0] > factor]
    if not over:
        return None
    excess, raw, per_cpu = max(over)
    tail = f"({len(over)} of {len(judged)} run(s))"
    if per_cpu is None or per_cpu <= 1:
        return f"contended: wall/CPU compute {raw:.2f}x > {factor:g}x {tail}"
    return (
        f"contended: wall/CPU compute {raw:.2f}x at {per_cpu:g} ranks per CPU, {excess:.2f}x what that "
        f"placement explains > {factor:g}x {tail}"
    )


def reference_noise(*series: Sequence[float]) -> float:
    """The relative spread of the noisiest series' speed readings, at least :data:`REFERENCE_NOISE_FLOOR`."""
    spreads = [max(s) / min(s) - 1 for s in series if s and min(s) > 0]
    return max([REFERENCE_NOISE_FLOOR, *spreads])


def different_conditions(readings: Sequence[float], reference: Sequence[float], name: str) -> str | None:
    """The flag of a series whose speed readings differ from the reference series' (``name``) by more than
    their noise; None when they agree or either has none."""
    if not readings or not reference:
        return None
    mine, theirs = statistics.median(readings), statistics.median(reference)
    if min(mine, theirs) <= 0:
        return None
    noise = reference_noise(readings, reference)
    if max(mine, theirs) / min(mine, theirs) - 1 <= noise:
        return None
    return (
        f"different conditions: speed reference {mine:.4g} s against {name}'s {theirs:.4g} s "
        f"({mine / theirs:.2f}x, noise {noise:.0%})"
    )


def summary_line(
    flagged: dict[str, list[str]],
    total: int,
    touched: Sequence[str],
    noun: str = "series",
    unmeasured: int = 0,
) -> str:
    """The one line at the top: how many of ``total`` series (claims, combinations: ``noun``) are flagged,
    which, and the ratios they touch; ``unmeasured``: how many had no CPU time recorded (runs made before
    2026-12-02, compact results without it), which no flag can clear."""
    unknown = f"; {unmeasured} without a CPU-time record, so not checked for contention" if unmeasured else ""
    if not flagged:
        return (
            f"Fairness: no {noun} flagged ({total} checked: none contended above {CONTENDED_FACTOR:g}x "
            f"wall/CPU compute, speed references within their noise where recorded{unknown})."
        )
    listed = "; ".join(f"{name}: {', '.join(flags)}" for name, flags in flagged.items())
    line = f"Fairness: **{len(flagged)} of {total} {noun} flagged**: {listed}{unknown}."
    if touched:
        line += f" The ratios they touch: {', '.join(touched)}."
    return line
