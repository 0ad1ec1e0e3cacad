"""Local SGD / Parallel Restarted SGD (Yu, Yang & Zhu, AAAI 2019), with optional post-local-SGD warm-up.

Every rank runs its local optimizer (momentum SGD or AdamW) on its own model, and every ``sync_period`` rounds
all models are replaced by their global mean, which "restarts" every rank from the same point
(PR-SGD, Algorithm 1: average when ``t mod I == 0``). The first ``warmup_rounds`` rounds are Allreduce-SGD
(gradients averaged every step, all models identical), as in post-local SGD (Lin et al., ICLR 2020) and
torch's ``PostLocalSGDOptimizer``.

Readings:

- *When averaging happens.* After rounds that are multiples of ``sync_period`` and later than the warm-up
  (the paper's ``t mod I == 0``). torch's ``PeriodicModelAverager(period, warmup_steps=W)`` averages
  after rounds ``W + 1 + k * period`` instead; the two coincide when torch's ``warmup_steps`` is the first
  multiple of ``sync_period`` above our warm-up, minus one (the agreement test builds it that way). Our choice
  puts every averaging on a synchronisation point of the trainer (its sync period is ``sync_period``), so
  what is evaluated there is the one model all ranks share. The run's last round (its budget, ``end_at``) is
  averaged too, multiple of ``sync_period`` or not (on the clock, with the momentum state under
  ``average_momentum``; an outer optimizer steps only at its own period): a run of T rounds trains T rounds
  and its final model is the global average. Streaming DiLoCo ends the same way, with the whole model.
- *Momentum buffers.* ``average_momentum: false`` (the default) keeps each rank's buffers local, as the
  paper's analysis (plain SGD restarts only the iterate) and torch's ``PostLocalSGDOptimizer`` do, and it
  costs no extra communication. ``true`` also averages the local optimizer's per-parameter state
  (``momentum_buffer``, or AdamW's ``exp_avg``/``exp_avg_sq``) at every averaging, the momentum variant of
  Yu, Jin & Yang (ICML 2019); it doubles (SGD) or triples (AdamW) the bytes of each averaging.

Streaming DiLoCo (``fragments`` > 1, or a ``fragment_delay`` or ``fragment_alpha``, with an outer optimizer):
the outer step fragment by fragment, each fragment's average overlapped with ``fragment_delay`` inner steps
(:mod:`wagma_bench.optim.streaming`, torchft's meaning). The models then differ at synchronisation points
(fragments synced at different steps, and alpha keeps local steps): the trainer evaluates their global
average.

Evaluated model: at every synchronisation point all models are identical (just averaged, or identical
throughout the warm-up), so the trainer evaluates rank 0's model as it is.
"""

from __future__ import annotations

import time

import torch

from wagma_bench.optim.base import Algorithm, StepInfo
from wagma_bench.optim.rules import local_average_at
from wagma_bench.optim.specs import LocalSGDSpec
from wagma_bench.optim.streaming import StreamingOuter

# per-parameter optimizer state that is a running average of gradients (averaged with average_momentum)
MOMENTUM_KEYS = ("momentum_buffer", "exp_avg", "exp_avg_sq")


class LocalSGD(LocalSGDSpec, Algorithm):
    paper = "PR-SGD / local SGD, Yu, Yang & Zhu, AAAI 2019"
    default_eval_model = "local"
    models_identical = True  # at every synchronisation point (the only places the trainer evaluates)

    def __init__(self, settings, model, local_opt_factory, comm, seed=0):
        super().__init__(settings, model, local_opt_factory, comm, seed)
        self.streaming: StreamingOuter | None = None
        if settings.streaming():
            self.outer = None  # the fragments' outer steps replace the whole model's
            self.streaming = StreamingOuter(settings, [p.detach() for p in model.parameters()], comm)
            self.models_identical, self.default_eval_model = False, "average"

    def broadcast_initial_model(self) -> None:
        super().broadcast_initial_model()
        if self.streaming is not None:
            self.streaming.restart()

    def averages_at(self, round_: int) -> bool:
        """Whether models are averaged after ``round_`` (1-based): PR-SGD's ``t mod I == 0``, after warm-up,
        and at the run's last round (the shared rule, :func:`~wagma_bench.optim.rules.local_average_at`)."""
        s = self.settings
        return local_average_at(round_, s.sync_period, s.warmup_rounds, self.final_round)

    def step(self) -> StepInfo:
        r = self.round + 1
        if self.streaming is not None:
            self.local_optimizer.step()
            t0 = time.perf_counter()
            self.streaming.after_step(r, float(self.local_optimizer.param_groups[0]["lr"]))
            if self.is_final(r):  # the run's model: the global average, the fragment in flight dropped
                self.streaming.finish()
                self._average_models()
            self.round = r
            return StepInfo(round=r, comm_s=time.perf_counter() - t0)
        comm_s = 0.0
        if r <= self.settings.warmup_rounds:  # post-local SGD warm-up: Allreduce-SGD
            t0 = time.perf_counter()
            for b in self.buckets:
                self.comm.allreduce(b.grad, op="mean")
            comm_s += time.perf_counter() - t0
        self.local_optimizer.step()
        if self.averages_at(r):
            t0 = time.perf_counter()
            self._average_models()
            if self.settings.average_momentum:
                self._average_optimizer_state()
            comm_s += time.perf_counter() - t0
            self.outer_round(
                r
            )  # due at multiples of the outer period only: not at a final average between them
        self.round = r
        return StepInfo(round=r, comm_s=comm_s)

    def _average_models(self) -> None:
        for b in self.buckets:
            self.comm.allreduce(b.data, op="mean")

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.streaming is not None:
            state["streaming"] = self.streaming.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.streaming is not None:
            self.streaming.load_state_dict(state["streaming"])

    def _average_optimizer_state(self) -> None:
        """Global mean of the local optimizer's gradient averages, in one allreduce."""
        buffers = [
            state[key]
            for group in self.local_optimizer.param_groups
            for p in group["params"]
            for state in [self.local_optimizer.state.get(p, {})]
            for key in MOMENTUM_KEYS
            if isinstance(state.get(key), torch.Tensor)
        ]
        if not buffers:  # plain SGD without momentum: nothing to average
            return
        flat = torch.cat([t.reshape(-1) for t in buffers])
        self.comm.allreduce(flat, op="mean")
        offset = 0
        for t in buffers:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
