"""A run's plan, fixed before its first step: its length in rounds (exactly its budget, for every optimizer:
the last round is a synchronisation point of its own), the evaluation grid, the control-exchange period and
the learning-rate schedule, all from the config; and the budget line rank 0 prints at the start. Pure
arithmetic over the settings, so tests and readers need no run."""

from __future__ import annotations

import math
from dataclasses import dataclass

from wagma_bench.config.schedules import control_period, peak_lr, round_up
from wagma_bench.config.schema import RunConfig
from wagma_bench.optim.specs import OPTIMIZER_SPECS


@dataclass
class RunPlan:
    """The run's lengths in rounds and its learning-rate schedule."""

    sync: int  # the algorithm's sync period: stops, evaluations and checkpoints only there
    steps_per_epoch: int
    total: int  # rounds to train, exactly the budget (its last round a synchronisation point too)
    eval_every: int  # the evaluation grid's spacing in rounds: every optimizer is evaluated at its
    # multiples (a grid round between sync points: from snapshots, at the next one)
    control_every: int  # rounds between exchanges of control flags
    lr_schedule: dict  # keyword arguments of schedules.lr_at besides the epoch
    ends_by: str = "epochs"  # the budget that sets `total`: max_rounds (when set, it wins) or epochs
    epoch_steps: int = 0  # the rounds train.epochs would give
    final_sync: str = ""  # what the optimizer does at a last round between its sync points (its spec's)

    @classmethod
    def of(cls, cfg: RunConfig, sync: int, steps_per_epoch: int, world: int) -> RunPlan:
        t = cfg.train
        epoch_steps = max(1, math.ceil(t.epochs * steps_per_epoch))
        # train.max_rounds, when set, is the run's length, also beyond train.epochs (which then only shapes
        # the learning-rate schedule); see TrainConfig. Not rounded to the sync period: the algorithm makes
        # the last round a synchronisation point (Algorithm.end_at), so every optimizer trains the same
        # rounds.
        ends_by = "epochs" if t.max_rounds is None else "max_rounds"
        total = epoch_steps if t.max_rounds is None else t.max_rounds
        eval_every = cfg.eval.every_rounds or max(1, round(cfg.eval.every_epochs * steps_per_epoch))
        schedule = {
            "peak": peak_lr(t.lr, t.batch_size, world, t.lr_reference_batch),
            "start": t.lr if t.warmup_start_lr is None else t.warmup_start_lr,
            "warmup_epochs": t.warmup_epochs,
            "schedule": t.schedule,
            "epochs": t.epochs,
            "milestones": t.milestones,
            "decay": t.decay,
        }
        final_sync = OPTIMIZER_SPECS[cfg.optimizer.name].final_sync
        return cls(
            sync,
            steps_per_epoch,
            total,
            eval_every,
            control_period(sync),
            schedule,
            ends_by,
            epoch_steps,
            final_sync,
        )

    def next_eval_after(self, r: int) -> int:
        """The grid round after the evaluations made at synchronisation point r. Every optimizer is evaluated
        at the multiples of ``eval_every``, exactly: a grid round between sync points is snapshotted by each
        rank there and evaluated at the next sync point, dated at the grid round
        (``Trainer.snapshot_if_due``); so optimizers of different sync periods are evaluated at the same
        rounds (samples)."""
        return (r // self.eval_every + 1) * self.eval_every

    def is_control(self, r: int, next_eval: float) -> bool:
        """Round r is a synchronisation point where the ranks exchange control flags: the run's last round
        (the algorithm made it a synchronisation point: ``Algorithm.end_at``), or a multiple of the sync
        period that is due for a control exchange or an evaluation (the first at or after ``next_eval``)."""
        if r == self.total:
            return True
        return r % self.sync == 0 and (r % self.control_every == 0 or r >= next_eval)

    def next_control_after(self, r: int, next_eval: int) -> int:
        """The first round after r at which the ranks exchange control flags: where a stop signal can end the
        run with a checkpoint (the trainer's control points: every ``control_every``, the next evaluation, the
        end)."""
        due = (round_up(r + 1, self.control_every), round_up(max(next_eval, r + 1), self.sync), self.total)
        return min((c for c in due if c > r), default=self.total)

    def budget_line(self, cfg: RunConfig) -> str:
        """Which budget ends the run, said at its start: its length, then what may end it earlier."""
        t = cfg.train
        if self.ends_by == "max_rounds":
            length = f"round {self.total} (train.max_rounds={t.max_rounds}"
            if self.total > self.epoch_steps:
                length += (
                    f", beyond train.epochs={t.epochs:g} = {self.epoch_steps} rounds: max_rounds "
                    f"wins; the learning-rate schedule still spans train.epochs"
                )
            length += ")"
        else:
            length = (
                f"round {self.total} (train.epochs={t.epochs:g} x {self.steps_per_epoch} rounds per epoch)"
            )
        if self.total % self.sync:  # never silently: the last round is not one of the optimizer's sync points
            length += (
                f", exactly, though the optimizer synchronises every {self.sync} rounds: round "
                f"{self.total} is an extra synchronisation point, "
                f"{self.final_sync or 'where every rank meets'}"
            )
        earlier = []
        if cfg.eval.target is not None and cfg.eval.stop_at_target:
            earlier.append(f"when the evaluation reaches eval.target={cfg.eval.target:g}")
        if t.time_limit_s is not None:
            earlier.append(f"at train.time_limit_s={t.time_limit_s:g} s of training time")
        return f"the run ends at {length}" + (f", or earlier {' or '.join(earlier)}" if earlier else "")
