"""eager-SGD: gradient averaging with partial collectives (Li, Ben-Nun, Di Girolamo, Alistarh & Hoefler,
PPoPP 2020).

Gradients (not models) are averaged over all ranks every round, by a *partial* allreduce that does not
wait for every rank's computation: it is the wait-avoiding allreduce of
:mod:`wagma_bench.comm.wait_avoiding` with the whole world as the one group (``contribution="gradient"``).
A rank adds its fresh gradient to its send buffer and asks for the next round. A round reduces what is in
every rank's send buffer and empties it (the authors zero the send buffer once a round has used it), so
every gradient a rank computes is reduced in exactly one round: a rank still computing contributes
zeros, and gradients a late rank posts while its progress thread is ahead are added up and reduced
together in the next round that starts. The round's result is the sum over ranks divided by P.

- ``mode=solo``: the first rank to arrive activates the round (the fastest never waits for computation).
- ``mode=majority``: each round one initiator, drawn with a seed shared by all ranks
  (:func:`~wagma_bench.comm.topology.random_initiator`), activates it; the ranks ready before it wait
  for it, so in expectation half of the ranks contribute a fresh gradient.
- Every ``sync_period`` rounds the allreduce is synchronous (eager-SGD's "solo limiter"): every gradient
  posted before it is reduced by then, so a gradient is stale by at most ``sync_period - 1`` rounds; it is
  also where all ranks meet (``sync_period``).

Every rank applies the result of every round, in order (results of rounds it joined passively are kept
until its compute thread asks for them), with the same learning rate, so all models stay identical; only
the gradients are stale. Readings: majority mode keeps the synchronous round every ``sync_period`` rounds
too (the trainer needs common points); the local optimizer (momentum SGD) is applied to the averaged
gradient, as with Allreduce-SGD.

Default ``mode=majority``: on the embedded ResNet with 4 ranks sharing 2 CPU cores, ranks are late by
CPU scheduling alone, and solo reached 0.964 of the 0.97 target in its 10 epochs while majority reached
it (0.972 at round 240; one run each, under contention); solo is one override away.

Evaluated model: all models are identical, so the trainer evaluates rank 0's model as it is.
"""

from __future__ import annotations

from functools import partial

from wagma_bench.comm.topology import FixedSchedule, random_initiator
from wagma_bench.comm.wait_avoiding import RoundResult, WaitAvoidingAllreduce
from wagma_bench.optim.base import EngineAlgorithm
from wagma_bench.optim.specs import EagerSpec


class EagerSGD(EagerSpec, EngineAlgorithm):
    paper = "eager-SGD, Li et al., PPoPP 2020"
    default_eval_model = "local"
    models_identical = True
    models_identical_every_round = True  # every rank applies every round's result, in order

    def __init__(self, settings, model, local_opt_factory, comm, seed=0):
        super().__init__(settings, model, local_opt_factory, comm, seed)
        if len(self.buckets) != 1:
            raise ValueError("eager reduces the gradient as one flat buffer")
        self.grad = self.buckets[0].grad

    def _make_engine(self) -> WaitAvoidingAllreduce:
        activator = None
        if self.settings.mode == "majority":
            activator = partial(random_initiator, self.comm.world_size, seed=self.seed)
        # the budget's round is synchronous too: every gradient posted before it is reduced by the run's end
        schedule = FixedSchedule(
            self.comm.world_size, period=self.settings.sync_period, last=self.final_round
        )
        return WaitAvoidingAllreduce(
            self.comm,
            self.grad,
            schedule,
            contribution="gradient",
            in_order=True,
            start_round=self.round,
            timeout_s=self.comm.timeout_s,
            activator=activator,
        )

    def _exchange(self) -> RoundResult:
        self.engine.post(self.grad)  # the fresh gradient, reduced in the next round that starts
        res = self.engine.request()  # this rank's next round, in order (may have run already)
        self.grad.copy_(res.result)
        self.local_optimizer.step()
        return res
