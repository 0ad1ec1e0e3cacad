"""The training loop's small state objects, apart from the loop (:mod:`wagma_bench.train.trainer`) so that it
reads in one screen: the clock that excludes evaluation and checkpoints, the counters a checkpoint carries
(:class:`TrainState`), the flags the ranks agree on at a synchronisation point (:class:`ControlFlags`), the
model that evaluation sees (:class:`EvalModel`) and the rank-local optimizer's factory."""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field

import torch

from wagma_bench.comm.base import Comm


@dataclass
class Clock:
    """Training time: wall time minus paused spans (evaluation, checkpoints)."""

    train_s: float = 0.0
    eval_s: float = 0.0
    wall_s: float = 0.0
    _mark: float = field(default_factory=time.perf_counter)
    _wall_mark: float = field(default_factory=time.perf_counter)

    def start(self) -> None:
        """(Re)start measuring from now; spans before (set-up, time in a queue) are not counted."""
        self._mark = self._wall_mark = time.perf_counter()

    def tick(self) -> None:
        now = time.perf_counter()
        self.train_s += now - self._mark
        self.wall_s += now - self._wall_mark
        self._mark = self._wall_mark = now

    def totals(self) -> dict:
        """The three clocks as the events log them."""
        return {
            "train_s": round(self.train_s, 4),
            "wall_s": round(self.wall_s, 4),
            "eval_s": round(self.eval_s, 4),
        }

    def paused(self, into: str | None = None):
        clock = self

        class _Pause:
            def __enter__(self):
                clock.tick()

            def __exit__(self, *exc):
                now = time.perf_counter()
                if into == "eval":
                    clock.eval_s += now - clock._mark
                clock.wall_s += now - clock._wall_mark
                clock._mark = clock._wall_mark = now

        return _Pause()


def make_local_optimizer(train):
    """Factory of the rank-local update rule. ``train.grad_clip`` clips the gradient norm right before
    every local step, i.e. after the algorithm combined gradients (the averaged gradient for
    Allreduce-SGD, as DD-PPO does; the local gradient for model-averaging algorithms)."""

    def build(params):
        params = list(params)
        if train.local_optimizer == "sgd":
            opt = torch.optim.SGD(
                params,
                lr=train.lr,
                momentum=train.momentum,
                nesterov=train.nesterov,
                weight_decay=train.weight_decay,
            )
        else:
            opt = torch.optim.AdamW(
                params, lr=train.lr, betas=tuple(train.adam_betas), weight_decay=train.weight_decay
            )
        if train.grad_clip:

            def clip(*_):
                torch.nn.utils.clip_grad_norm_(params, train.grad_clip)

            opt.register_step_pre_hook(clip)
        return opt

    return build


class EvalModel:
    """Builds the model that evaluation sees: rank 0's local model, or the global average; of the current
    models, or of snapshots the ranks took at an earlier round (an evaluation grid round between
    synchronisation points)."""

    def __init__(self, model, mode: str, models_identical: bool, comm: Comm):
        # Buffers (BatchNorm statistics) are each rank's own under every optimizer: a model with float
        # buffers is evaluated through rank 0's broadcast state even when the parameters are identical.
        identical = models_identical and not any(b.is_floating_point() for b in model.buffers())
        self.model, self.mode, self.identical, self.comm = model, mode, identical, comm
        self._copy = None

    def _floats(self) -> list[str]:
        return [k for k, v in self.model.state_dict().items() if v.is_floating_point()]

    def snapshot(self) -> torch.Tensor:
        """This rank's model (parameters and float buffers) as one flat copy; local, no communication."""
        state = self.model.state_dict()
        return torch.cat([state[k].reshape(-1) for k in self._floats()])

    def get(self, snapshot: torch.Tensor | None = None, mode: str | None = None):
        """The model to evaluate (a collective unless the models are identical): of the current models, or of
        each rank's ``snapshot`` (consumed), combined by ``mode`` (default: the run's; "identical": rank 0's,
        without communication, for models known to be equal)."""
        mode = mode or self.mode
        if snapshot is None:
            if (
                self.identical
            ):  # rank 0's model is every rank's, and so is their average: no copy, no collective
                return self.model
            snapshot = self.snapshot()
        if self._copy is None:
            self._copy = copy.deepcopy(self.model)
        if mode == "average":
            self.comm.allreduce(snapshot, op="mean")
        elif mode != "identical":
            self.comm.broadcast(snapshot, src=0)
        offset, target = 0, self._copy.state_dict()
        for k in self._floats():
            n = target[k].numel()
            target[k].copy_(snapshot[offset : offset + n].view_as(target[k]))
            offset += n
        return self._copy


@dataclass
class TrainState:
    """The loop's counters that a checkpoint carries besides the model and the algorithm (saved as a dict
    with these keys, so checkpoints written before this class existed still load)."""

    local_step: int = 0  # steps this rank took (its data consumption; may trail the round count)
    samples_local: int = 0  # samples this rank trained on
    next_eval: int = 0  # round of the next evaluation
    best: float | None = None  # best metric so far

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, saved: dict) -> TrainState:
        return cls(**saved)


@dataclass
class ControlFlags:
    """What every rank must agree on at a synchronisation point, exchanged in one sum-allreduce: a flag is
    set when any rank set it; ``samples`` adds up to the samples of all ranks."""

    diverged: bool = False  # a non-finite loss on some rank
    preempted: bool = False  # a preemption signal (USR1 / USR2 / TERM / Ctrl-C) reached some rank
    samples: int = 0  # samples trained on (each rank sends its own)
    checkpoint_due: bool = False  # rank 0: checkpoint.every_s of training time since the last one
    over_time: bool = False  # rank 0: train.time_limit_s reached
    requeue: bool = False  # the signal asks for a requeue (USR1 / USR2), not just an end (TERM)
    interrupted: bool = False  # the signal is a Ctrl-C (the run ends as interrupted, not preempted)

    def to_tensor(self, device) -> torch.Tensor:
        return torch.tensor([float(v) for v in dataclasses.astuple(self)], dtype=torch.float64, device=device)

    @classmethod
    def from_tensor(cls, summed: torch.Tensor) -> ControlFlags:
        values = dict(zip((f.name for f in dataclasses.fields(cls)), summed.cpu().tolist()))
        samples = int(values.pop("samples"))
        return cls(samples=samples, **{name: v > 0 for name, v in values.items()})

    def exchange(self, comm: Comm) -> ControlFlags:
        """Every rank's flags combined (collective)."""
        summed = self.to_tensor(comm.device)
        comm.allreduce(summed, op="sum")
        return ControlFlags.from_tensor(summed)
