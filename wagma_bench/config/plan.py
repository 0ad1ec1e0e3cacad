"""A run's plan, fixed before its first step: its length in rounds (rounded up to the optimizer's sync period),
the evaluation grid, the control-exchange period and the learning-rate schedule, all from the config; and the
budget line rank 0 prints at the start. Pure arithmetic over the settings, so tests and readers need no run."""

from __future__ import annotations

import math
from dataclasses import dataclass

from wagma_bench.config.schedules import control_period, peak_lr, round_up
from wagma_bench.config.schema import RunConfig


@dataclass
class RunPlan:
    """The run's lengths in rounds, each a multiple of the sync period, and its learning-rate schedule."""

    sync: int                   # the algorithm's sync period: stops, evaluations and checkpoints only there
    steps_per_epoch: int
    total: int                  # rounds to train
    eval_every: int             # the evaluation grid's spacing in rounds (each evaluation at the first sync point
                                # at or after a grid point: the same grid for every optimizer)
    control_every: int          # rounds between exchanges of control flags
    lr_schedule: dict           # keyword arguments of schedules.lr_at besides the epoch
    ends_by: str = "epochs"     # the budget that sets `total`: max_steps (when set, it wins) or epochs
    epoch_steps: int = 0        # the rounds train.epochs would give

    @classmethod
    def of(cls, cfg: RunConfig, sync: int, steps_per_epoch: int, world: int) -> RunPlan:
        t = cfg.train
        epoch_steps = round_up(math.ceil(t.epochs * steps_per_epoch), sync)
        # train.max_steps, when set, is the run's length, also beyond train.epochs (which then only shapes the
        # learning-rate schedule); see TrainConfig
        ends_by = "epochs" if t.max_steps is None else "max_steps"
        total = epoch_steps if t.max_steps is None else round_up(t.max_steps, sync)
        eval_every = cfg.eval.every_steps or max(1, round(cfg.eval.every_epochs * steps_per_epoch))
        schedule = {"peak": peak_lr(t.lr, t.batch_size, world, t.lr_reference_batch),
                    "start": t.lr if t.warmup_start_lr is None else t.warmup_start_lr,
                    "warmup_epochs": t.warmup_epochs, "schedule": t.schedule, "epochs": t.epochs,
                    "milestones": t.milestones, "decay": t.decay}
        return cls(sync, steps_per_epoch, total, eval_every, control_period(sync), schedule, ends_by, epoch_steps)

    def next_eval_after(self, r: int) -> int:
        """The grid point after an evaluation at round r. Evaluations happen only at sync points, at the first at or
        after each multiple of ``eval_every``: so optimizers of different sync periods are evaluated within one
        period of the same rounds (samples), rather than every ``eval_every`` rounded up to each one's period,
        which drifts apart over a run (every 24 rounds against every 21)."""
        return (r // self.eval_every + 1) * self.eval_every

    def next_control_after(self, r: int, next_eval: int) -> int:
        """The first round after r at which the ranks exchange control flags: where a stop signal can end the run
        with a checkpoint (the trainer's control points: every ``control_every``, the next evaluation, the end)."""
        due = (round_up(r + 1, self.control_every), round_up(max(next_eval, r + 1), self.sync), self.total)
        return min((c for c in due if c > r), default=self.total)

    def budget_line(self, cfg: RunConfig) -> str:
        """Which budget ends the run, said at its start: its length, then what may end it earlier."""
        t = cfg.train
        if self.ends_by == "max_steps":
            length = f"step {self.total} (train.max_steps={t.max_steps}"
            if self.total != t.max_steps:  # never silently: the budget moved to the next synchronisation point
                length += (f" rounded up to a multiple of the optimizer's sync period, {self.sync}: a run stops only "
                           "where the ranks synchronise")
            if self.total > self.epoch_steps:
                length += (f", beyond train.epochs={t.epochs:g} = {self.epoch_steps} steps: max_steps wins; the "
                           f"learning-rate schedule still spans train.epochs")
            length += ")"
        else:
            length = f"step {self.total} (train.epochs={t.epochs:g} x {self.steps_per_epoch} steps per epoch)"
        earlier = []
        if cfg.eval.target is not None and cfg.eval.stop_at_target:
            earlier.append(f"when the evaluation reaches eval.target={cfg.eval.target:g}")
        if t.time_limit_s is not None:
            earlier.append(f"at train.time_limit_s={t.time_limit_s:g} s of training time")
        return f"the run ends at {length}" + (f", or earlier {' or '.join(earlier)}" if earlier else "")
