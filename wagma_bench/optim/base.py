"""The interface every distributed optimizer (algorithm) implements, and when the trainer calls it.

An algorithm owns how models and gradients are combined across ranks; the local update rule (momentum
SGD or Adam, with the learning rate the trainer sets each step) is a plain ``torch.optim`` optimizer it
is given. The trainer calls, per step::

    algo.zero_grad(); loss.backward(); info = algo.step()

``step`` combines across ranks as the algorithm prescribes and applies the local optimizer. It returns the
round the rank has reached: synchronous algorithms advance one round per step; wait-avoiding ones may skip
rounds (a slow rank joins rounds passively through its progress thread). Every ``sync_period`` rounds all
ranks pass through the same round together; the trainer evaluates, checkpoints and stops only there.

Lifecycle (``wagma_bench/train/trainer.py``; every rank makes the same calls in the same order, so any of them
may be a collective unless said otherwise; ``tests/test_algorithm_lifecycle.py`` checks the order):

1. **Construction**, ``cls(settings, model, local_opt_factory, comm, seed=cfg.seed)``, in ``Trainer.__init__``
   once the workload has built the model on ``comm.device``. It may assume: ``settings`` is its checked
   ``Settings`` (ranges, choices, ``__post_init__`` and the rules against the world size all passed);
   ``comm`` is the run's communicator, whose world is complete (forking planes here is allowed: every rank
   forks at the same point). It may not assume the ranks' models are equal yet, nor that this is round 0:
   one of the next two calls follows. Background threads may start here, but must not exchange models
   before the first ``step`` (the engine algorithms create their engine at the first step instead).
   ``sync_period`` and ``models_identical`` are read right after, once: they must not change during a run.
   Then **``end_at(rounds)``**, on every rank, fresh or resumed: the run's last round, its budget
   (``train.max_rounds``, or the epochs' rounds), which need not be a multiple of ``sync_period``. The run
   ends exactly there: the algorithm makes that round a synchronisation point of its own (every rank completes
   it, as at a multiple of ``sync_period``), and an algorithm that averages the models globally at its
   synchronous rounds averages them there too (WAGMA-SGD's schedule makes it a synchronous round, local SGD
   averages after it, eager-SGD's allreduce is synchronous there). Not a collective; before the first step.
2. Then exactly one of:

   - **``broadcast_initial_model()``**, on a fresh start: every rank takes rank 0's weights (the default
     broadcasts each bucket). State besides the model (momentum, weights of push-sum, counters) is at its
     constructed value.
   - **``load_state_dict(state)``**, on a resume, instead (no broadcast: the ranks' models differ
     legitimately). It may assume: the model already holds this rank's own checkpointed weights
     (``model.load_state_dict`` ran first); ``state`` is what this rank's ``state_dict()`` returned at the
     checkpoint, tensors mapped to ``comm.device``, with the same settings and world size (the checkpoint
     check refuses any other). It must restore ``round`` (the base class does) and everything ``step``
     needs to continue as if never stopped: a deterministic algorithm's resumed run ends bit-identical to
     an uninterrupted one (``tests/test_faults.py``). It should not communicate.
   Then, on rank 0 only, **``largest_state_dict()``** once, before the first step (not a collective; nothing
   is in flight yet): the size of a checkpoint said at the start is counted from it.
3. **Steps**, repeated: ``set_lr(lr)``, ``zero_grad()``, the forward and backward pass (gradients land in
   the buckets' gradient storage), ``step()``. ``step`` returns a :class:`StepInfo` whose ``round`` is at
   least the previous one plus one. Between steps the model's parameters are this rank's current model,
   the one evaluation and checkpoints read. With ``computes_in_parts`` the batch is split into M parts and
   the forward and backward pass runs once per part, each asked for with ``start_micro_batch`` (a False
   ends the step's computation there) and reported with ``end_micro_batch``; each part's mean loss is
   multiplied by ``loss_weight(samples)`` before its backward (M = ``micro_batches``), so that the gradients
   add up as the algorithm normalises them. These calls are local: no communication.
4. **Synchronisation points**: after a ``step`` that returned a round ``r`` that is a multiple of
   ``sync_period`` (and is due for the control exchange, an evaluation or the end), or the last round
   (``end_at``), every rank is at round ``r``. The trainer then uses ``comm`` itself: one allreduce of control
   flags, maybe an evaluation (a broadcast or an average of the model unless ``models_identical``), maybe a
   checkpoint. So nothing of the algorithm may use ``comm`` concurrently: background threads communicate on
   forked planes only.
5. **``state_dict()``**, at a synchronisation point chosen for a checkpoint, on every rank at the same
   round (an allgather follows). It returns everything ``load_state_dict`` needs, including anything in
   flight (SGP's message with overlap); it may wait for this rank's own pending communication.
6. **``close()``**, once, at the last synchronisation point of a run that ends normally (completed, time
   limit, diverged, preempted), after its last checkpoint: stop background threads and finish what is in
   flight, so that no peer is left waiting. After it the model holds the rank's final weights. A run that
   fails does not call it (ranks may be gone); threads are daemons, and the launcher ends the processes.

``report()`` (not a collective; rank 0 only, just before ``close()``) returns what the algorithm measured
about itself for the run's last event (the wait-avoiding engine's rounds and their cost). ``average_model``
is a helper (a collective); the trainer does not call it.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from wagma_bench.comm.base import Comm
from wagma_bench.comm.buckets import Bucket, flatten_into_buckets, zero_grads
from wagma_bench.comm.wait_avoiding import RoundResult, WaitAvoidingAllreduce
from wagma_bench.optim.outer import OuterStep
from wagma_bench.optim.specs import AlgorithmSpec


@dataclass
class StepInfo:
    round: int  # the round this rank has completed (>= previous + 1)
    comm_s: float = 0.0  # time the compute thread spent waiting on communication in this step
    staleness: int = 0  # rounds this rank's model was stale in the last group average (0: fresh)
    extra: dict = field(default_factory=dict)  # more fields for this step's record (DropCompute's drops)


class Algorithm(AlgorithmSpec, abc.ABC):
    """Base class: flat parameter buckets, the local optimizer, round bookkeeping. What the configuration
    check reads (name, Settings, outer_at, outer_refusal, computes_in_parts, check_world) each algorithm
    inherits from its spec in :mod:`wagma_bench.optim.specs`, which imports no torch."""

    #: what the tables print for it: the method and its paper
    paper: ClassVar[str]
    #: which model evaluation uses when eval.model=auto: "local" (rank 0's) or "average" (global mean)
    default_eval_model: ClassVar[str] = "local"
    #: every rank holds the same parameters at every synchronisation point (evaluation then skips the copy and
    #: the broadcast of rank 0's model, unless the model has float buffers, which stay each rank's own).
    #: Every algorithm sets it.
    models_identical: ClassVar[bool]
    #: the ranks' models are identical after every round, not only at synchronisation points (eager-SGD
    #: applies every round's averaged gradient on every rank): an evaluation of snapshots taken between
    #: synchronisation points then reads rank 0's instead of averaging them (the trainer's evaluation grid)
    models_identical_every_round: ClassVar[bool] = False
    #: ranks that average together in a group round (WAGMA-SGD's effective S, set once the world is known);
    #: None for algorithms without groups. run_start logs it.
    group_size: int | None = None

    def __init__(
        self,
        settings,
        model: nn.Module,
        local_opt_factory,
        comm: Comm,
        seed: int = 0,
        bucket_mb: float = float("inf"),
    ):
        self.settings = settings
        self.model = model
        self.comm = comm
        self.seed = seed
        self.buckets: list[Bucket] = flatten_into_buckets(model, bucket_mb)
        # the rank's own torch optimizer (train.local_optimizer: SGD or AdamW), which the algorithm steps
        self.local_optimizer: torch.optim.Optimizer = local_opt_factory(model.parameters())
        self.round = 0
        self.final_round: int | None = None  # the run's budget in rounds (end_at); None: not told
        self.outer: OuterStep | None = None
        if self.outer_at is not None and settings.outer != "none":
            self.outer = OuterStep(settings, [b.data for b in self.buckets])

    # rounds between global synchronisation points (eval, checkpoint and stop happen only there)
    @property
    def sync_period(self) -> int:
        return self.sync_period_of(
            self.settings
        )  # the spec's rule (optim/specs.py), which the simulator reads too

    def end_at(self, rounds: int) -> None:
        """The run ends after round ``rounds`` (its budget): a synchronisation point whatever ``sync_period``.
        An algorithm with a periodic global average or synchronous round makes one there too (it overrides
        this or reads ``final_round``); one that meets every round needs nothing more."""
        self.final_round = rounds

    def is_final(self, round_: int) -> bool:
        """Round ``round_`` is the run's last (``end_at``)."""
        return round_ == self.final_round

    # --- micro-batches (the trainer's loop; only DropCompute splits its batch) -----------------------------
    # with ``computes_in_parts`` (the spec's) the trainer computes each batch in parts through the calls below

    @property
    def micro_batches(self) -> int:
        """Parts the trainer splits each batch into, computing them one after another."""
        return 1

    def start_micro_batch(self, elapsed_s: float) -> bool:
        """Whether to compute the next micro-batch, ``elapsed_s`` into this step's computation."""
        return True

    def end_micro_batch(self, elapsed_s: float) -> None:
        """A micro-batch's backward is done, ``elapsed_s`` into this step's computation."""

    def loss_weight(self, samples: int) -> float:
        """What a micro-batch's mean loss is multiplied by before its backward
        (with ``micro_batches`` > 1)."""
        return 1.0

    def zero_grad(self) -> None:
        zero_grads(self.buckets)

    def set_lr(self, lr: float) -> None:
        for group in self.local_optimizer.param_groups:
            group["lr"] = lr

    @abc.abstractmethod
    def step(self) -> StepInfo:
        """Combine across ranks and apply the local update; called after backward."""

    def broadcast_initial_model(self) -> None:
        """Start every rank from rank 0's weights (one broadcast per bucket)."""
        for b in self.buckets:
            self.comm.broadcast(b.data, src=0)
        if self.outer is not None:
            self.outer.restart([b.data for b in self.buckets])

    def outer_round(self, round_: int) -> None:
        """The outer optimizer's step, where one is set and due after ``round_``: bases with
        ``outer_at="average"`` call it right after their global average of the models, ``"exact"`` ones at the
        end of every round (then the global average is taken here: a collective)."""
        if self.outer is None or not self.outer.due(round_):
            return
        data = [b.data for b in self.buckets]
        if self.outer_at == "exact":
            self.average_model(out=data)
        self.outer.step(data, float(self.local_optimizer.param_groups[0]["lr"]))

    def average_model(self, out: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Global mean of the models into ``out`` (fresh tensors when None); a collective."""
        out = out or [torch.empty_like(b.data) for b in self.buckets]
        for b, o in zip(self.buckets, out):
            o.copy_(b.data)
            self.comm.allreduce(o, op="mean")
        return out

    def state_dict(self) -> dict:
        state = {"round": self.round, "local_optimizer": self.local_optimizer.state_dict()}
        if self.outer is not None:
            state["outer"] = self.outer.state_dict()
        return state

    def largest_state_dict(self) -> dict:
        """``state_dict()`` as a checkpoint's may be at its largest (a message in flight included): what the
        start of a run sizes checkpoints by, never saved. Called on rank 0 before the first step, where
        nothing is in flight: it must not communicate."""
        return self.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.round = state["round"]
        # under today's names: the checkpoint's reader translated an older one's (config/renamed.py)
        self.local_optimizer.load_state_dict(state["local_optimizer"])
        if self.outer is not None:
            self.outer.load_state_dict(state["outer"])

    def close(self) -> None:
        """Stop background threads; called on every rank at the same synchronisation point."""

    def report(self) -> dict:
        """What the algorithm measured about itself over the run, for ``run_stop`` (before :meth:`close`)."""
        return {}


class EngineAlgorithm(Algorithm):
    """An algorithm driven by the wait-avoiding engine (WAGMA-SGD, eager-SGD).

    The engine is created at the first step: the same point on every rank, fresh or resumed, so that its
    rounds continue from the restored round counter. A world of one has nobody to wait for.
    """

    engine: WaitAvoidingAllreduce | None = None

    @abc.abstractmethod
    def _make_engine(self) -> WaitAvoidingAllreduce: ...

    @abc.abstractmethod
    def _exchange(self) -> RoundResult:
        """One round through the engine plus the local update; returns the round's result."""

    def step(self) -> StepInfo:
        if (
            self.comm.world_size == 1
        ):  # every round is a synchronous one: the outer step comes before the local step
            self.outer_round(self.round + 1)
            self.local_optimizer.step()
            self.round += 1
            return StepInfo(round=self.round)
        if self.engine is None:
            self.engine = self._make_engine()
        res = self._exchange()
        self.round = res.round
        return StepInfo(round=res.round, comm_s=res.wait_s, staleness=res.staleness)

    def report(self) -> dict:
        return {"engine": self.engine.report()} if self.engine is not None else {}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
