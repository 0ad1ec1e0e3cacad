"""A run's plan, fixed before its first step: its length in rounds (exactly its budget, for every optimizer:
the last round is a synchronisation point of its own), the evaluation grid, the control-exchange period and
the learning-rate schedule, all from the config; and the budget line rank 0 prints at the start (one short
sentence; what it means is in docs/run-budget-and-exit-codes.md). Pure arithmetic over the settings, so tests
and readers need no run."""

from __future__ import annotations

import math
from dataclasses import dataclass

from wagma_bench.config.schedules import control_period, peak_lr, round_up
from wagma_bench.config.schema import RunConfig

BUDGET_DOC = (
    "docs/run-budget-and-exit-codes.md"  # the rules the budget line names, and what each optimizer does
)
# at an extra last synchronisation point (its spec's ``final_sync``, kept in step by a test)


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
        return cls(
            sync, steps_per_epoch, total, eval_every, control_period(sync), schedule, ends_by, epoch_steps
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
        """Which budget ends the run, in one short sentence at its start: its rounds and the key that set
        them, an extra synchronisation point where the last round is not one of the optimizer's (never
        silently), and what may end it sooner; the rules and each optimizer's extra point: ``BUDGET_DOC``."""
        t = cfg.train
        if self.ends_by == "max_rounds":
            why = f"train.max_rounds={t.max_rounds}"
            if self.total > self.epoch_steps:  # max_rounds wins; the learning-rate schedule spans the epochs
                why += f", beyond train.epochs={t.epochs:g}"
        else:
            why = f"train.epochs={t.epochs:g}"
        if self.total % self.sync:
            why += f"; the last an extra sync point, {cfg.optimizer.name} syncing every {self.sync}"
        sooner = []
        if cfg.eval.target is not None and cfg.eval.stop_at_target:
            sooner.append(f"eval.target={cfg.eval.target:g}")
        if t.time_limit_s is not None:
            sooner.append(f"train.time_limit_s={t.time_limit_s:g}")
        until = f", or until {' or '.join(sooner)}" if sooner else ""
        return f"budget: {self.total} rounds ({why}){until} ({BUDGET_DOC})"
