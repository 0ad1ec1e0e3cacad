"""Schedules of a run: pure functions of training progress (the learning rate; the control exchanges).

Linear scaling rule (Goyal et al. 2017): the peak rate is ``lr * global_batch / lr_reference_batch``.
Warm-up ramps linearly from ``lr`` (the rate at the reference batch, capped at the peak) to the peak over
``warmup_epochs``; then ``step`` multiplies by ``decay`` at each milestone epoch, ``cosine`` anneals to
zero at ``epochs``, ``constant`` holds, and ``inverse_sqrt`` (Transformer, Vaswani et al.) decays as
``sqrt(warmup / epoch)``.
"""

from __future__ import annotations

import bisect
import math

# Rounds between the trainer's exchanges of control flags (stop, evaluate, checkpoint, preempt), rounded up to
# the optimizer's sync period by :func:`control_period`. The simulator models the same exchange.
CONTROL_EVERY = 10


def round_up(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple`` (at least one ``multiple``)."""
    return max(multiple, math.ceil(value / multiple) * multiple)


def control_period(sync_period: int, control_every: int = CONTROL_EVERY) -> int:
    """Rounds between two control exchanges: ``control_every`` rounded up to the sync period, because the
    flags may only change at rounds where every rank holds the same model (a stop, checkpoint or
    evaluation there is consistent)."""
    return round_up(control_every, sync_period)


def peak_lr(lr: float, batch_per_rank: int, world_size: int, reference_batch: int | None) -> float:
    if reference_batch is None:  # no scaling (DD-PPO keeps its rate at any number of workers)
        return lr
    return lr * batch_per_rank * world_size / reference_batch


def lr_at(
    epoch: float,
    *,
    peak: float,
    start: float,
    warmup_epochs: float,
    schedule: str,
    epochs: float,
    milestones=(),
    decay: float = 0.1,
) -> float:
    """Learning rate at fractional ``epoch``."""
    if warmup_epochs > 0 and epoch < warmup_epochs:
        start = min(start, peak)
        return start + (peak - start) * epoch / warmup_epochs
    if schedule == "constant":
        return peak
    if schedule == "step":
        return peak * decay ** bisect.bisect_right(sorted(milestones), epoch)
    if schedule == "cosine":
        span = max(epochs - warmup_epochs, 1e-12)
        progress = min(1.0, (epoch - warmup_epochs) / span)
        return 0.5 * peak * (1.0 + math.cos(math.pi * progress))
    if schedule == "inverse_sqrt":
        return peak * math.sqrt(max(warmup_epochs, 1e-12) / max(epoch, 1e-12)) if warmup_epochs > 0 else peak
    raise ValueError(f"unknown schedule {schedule!r}; choose step, cosine, constant or inverse_sqrt")
