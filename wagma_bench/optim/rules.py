"""The optimizers' rules that are plain arithmetic, written once without torch: the algorithms
(``optim/<name>.py``) run them on their ranks and the simulator (:mod:`wagma_bench.simulate.des`) runs them in
its models, so that a prediction follows the same rule as a run and ``wagma-bench simulate`` starts without
importing torch.

Not in :mod:`wagma_bench.optim.specs`: the configuration check imports that one and must start without NumPy
too (``tests/test_config.py``).
"""

from __future__ import annotations

import math

import numpy as np

CANDIDATES = 200  # thresholds DropCompute's automatic rule tries (the authors' linspace)


def best_threshold(ends, step_s: float) -> tuple[float, float]:
    """DropCompute's automatic threshold, the authors' rule (:mod:`wagma_bench.optim.dropcompute`):
    ``ends[n, s, m]``, when rank n's micro-batch m of step s ended (seconds into the step; an array or a CPU
    tensor); ``step_s`` the steps' mean duration, communication and update included. Returns (threshold, its
    predicted effective speed-up); (inf, 0.0) when no candidate beats not dropping."""
    ends = np.asarray(ends, dtype=np.float64)
    compute = ends[:, :, -1].max(axis=0)  # C_s: the slowest rank's compute
    overhead = max(step_s - float(compute.mean()), 0.0)  # O
    half = ends.shape[2] // 2
    low, high = float(ends[:, :, half:].min()), float(ends.max())
    # Each step's end times sorted once: the ends kept by a candidate (< tau) are a prefix, found by
    # bisection. The same numbers as masking the whole array per candidate, which took 14 s at the simulator's
    # 65,536 ranks.
    steps, size = ends.shape[1], ends.shape[0] * ends.shape[2]
    per_step = np.sort(ends.transpose(1, 0, 2).reshape(steps, size), axis=1)
    taus = np.linspace(low, high, CANDIDATES)
    kept = np.stack(
        [np.searchsorted(row, taus, side="left") for row in per_step]
    )  # [step, candidate]: ends < tau
    largest_kept = np.where(kept > 0, per_step[np.arange(steps)[:, None], np.maximum(kept - 1, 0)], -np.inf)
    # C_s(tau): the latest kept end, or 0.0 (a dropped micro-batch's) where any is dropped
    cut_all = np.where(kept < size, np.maximum(largest_kept, 0.0), largest_kept)
    best, best_gain = math.inf, 0.0
    for j, tau in enumerate(taus.tolist()):
        cut = cut_all[:, j]
        dropped = 1.0 - kept[:, j] / size  # d_s
        gain = (
            float(((1.0 - dropped) * (compute + overhead) / np.maximum(cut + overhead, 1e-12)).mean()) - 1.0
        )
        if gain > best_gain:
            best, best_gain = tau, gain
    return best, best_gain


def local_average_at(round_: int, period: int, warmup: int, last: int | None) -> bool:
    """Whether local SGD averages the models globally after ``round_`` (1-based): PR-SGD's ``t mod I == 0``
    after the warm-up, and at the run's last round ``last`` (its budget, None: not known), so that the run's
    final model is the global average whatever the budget (in the warm-up the models are identical
    already)."""
    return round_ > warmup and (round_ % period == 0 or round_ == last)


def sync_at(step: int, period: int, fragments: int, delay: int) -> tuple[str, int] | None:
    """Streaming DiLoCo's schedule (:mod:`wagma_bench.optim.streaming`): what happens after inner step
    ``step`` (1-based): ("prepare" | "perform", fragment), or None."""
    every = period // fragments
    if step % every == 0:
        return "perform", (step // every - 1) % fragments
    if (step + delay) % every == 0:
        return "prepare", ((step + delay) // every - 1) % fragments
    return None
