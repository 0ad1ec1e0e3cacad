"""Whether a comparison gave its series the same chance: the flags ``report``, ``claims`` and ``tune``
print beside a figure and in one line at the top, as pyperf and hyperfine warn of an unstable measurement
rather than print it silently.

- **contended**: a run whose ranks' wall-clock compute exceeds their CPU compute by more than
  :data:`CONTENDED_FACTOR` (:func:`wagma_bench.record.rundir.contention_of`) waited for a core: another
  process ran beside it, or more ranks than cores. Its throughput and times measure the machine as much as the
  optimizer.
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


def contended(factors: Iterable[float | None], factor: float = CONTENDED_FACTOR) -> str | None:
    """The flag of a series whose runs have these wall / CPU compute factors: None when none is above
    ``factor``."""
    values = [f for f in factors if f is not None]
    over = [f for f in values if f > factor]
    if not over:
        return None
    return f"contended: wall/CPU compute {max(over):.2f}x > {factor:g}x ({len(over)} of {len(values)} run(s))"


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
