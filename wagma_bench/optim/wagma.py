"""WAGMA-SGD: wait-avoiding group model averaging (Li et al., IEEE TPDS 2020, arXiv 2005.00124).

Each step a rank averages its model within its current butterfly group, then applies its local gradient,
computed on the weights before the average, with the local optimizer: ``W <- avg_group(W) - lr * g(W_old)``.
The group average is the wait-avoiding group allreduce (:mod:`wagma_bench.comm.wait_avoiding`): any ready rank
activates the round for the whole world, and ranks still computing take part through their progress threads
with the model they last posted. Every ``tau`` group rounds one synchronous global allreduce bounds the
staleness (``sync_period = tau + 1``). The schedule is :class:`~wagma_bench.comm.topology.WagmaSchedule`,
which the engine and the simulator share.

Readings (each set against the authors' code, with its measured effect, in docs/optimizers.md, "WAGMA-SGD:
what we implement"): a late rank's model is ``group mean + (current - contributed)``, which keeps the sum of
the models (the authors return ``(S * mean + x) / (S + 1)``, which does not); ``catch_up=replay`` (default,
round t is every rank's iteration t) or ``skip`` (a late rank skips the rounds it joined passively); momentum
stays local; evaluation uses the global average of the models.
"""

from __future__ import annotations

from wagma_bench.comm.topology import WagmaSchedule
from wagma_bench.comm.wait_avoiding import RoundResult, WaitAvoidingAllreduce
from wagma_bench.optim.base import EngineAlgorithm
from wagma_bench.optim.specs import WagmaSpec


class WagmaSGD(WagmaSpec, EngineAlgorithm):
    paper = "WAGMA-SGD, Li et al., TPDS 2020"
    models_identical = False  # the ranks' models differ where evaluation happens
    default_eval_model = "average"

    def __init__(self, settings, model, local_opt_factory, comm, seed=0):
        super().__init__(settings, model, local_opt_factory, comm, seed)  # one flat bucket
        self.schedule = WagmaSchedule(comm.world_size, settings.group_size, settings.tau)
        self.group_size = self.schedule.group_size
        self.data = self.buckets[0].data

    def end_at(self, rounds: int) -> None:
        super().end_at(rounds)
        self.schedule.last = rounds  # the budget is a synchronous round: the global average, every rank at it

    def _make_engine(self) -> WaitAvoidingAllreduce:
        return WaitAvoidingAllreduce(
            self.comm,
            self.data,
            self.schedule,
            contribution="model",
            in_order=self.settings.catch_up == "replay",
            start_round=self.round,
            timeout_s=self.comm.timeout_s,
            in_place=True,
        )

    def _exchange(self) -> RoundResult:
        # self.data becomes, in place, the group average of the models plus this rank's own updates since
        # the model it contributed (none when on time); the engine holds at most one more model-sized buffer
        res = self.engine.request()
        if self.schedule.is_sync(res.round):  # a synchronous round: the model is the global average
            self.outer_round(res.round)  # the outer step's change stays in the model with the local one
        self.local_optimizer.step()  # apply g(W_old) to the average
        self.engine.post(self.data)  # the local update is in the model, exactly once; no copy
        return res
