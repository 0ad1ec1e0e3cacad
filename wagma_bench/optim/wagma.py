"""WAGMA-SGD: wait-avoiding group model averaging (Li et al., IEEE TPDS 2020, arXiv 2005.00124).

Each step a rank averages its model within its current butterfly group, then applies its local gradient,
computed on the weights before the average, with the local optimizer: ``W <- avg_group(W) - lr * g(W_old)``.
The group average is the wait-avoiding group allreduce (:mod:`wagma_bench.comm.wait_avoiding`): any ready rank
activates the round for the whole world, and ranks still computing take part through their progress threads
with the model they last posted. Every ``tau`` group rounds one synchronous global allreduce bounds the
staleness (``sync_period = tau + 1``). The schedule is :class:`~wagma_bench.comm.topology.WagmaSchedule`, which
the engine and the simulator share.

Readings (each set against the authors' code, with its measured effect, in docs/optimizers.md, "WAGMA-SGD:
what we implement"): a late rank's model is ``group mean + (current - contributed)``, which keeps the sum of
the models (the authors return ``(S * mean + x) / (S + 1)``, which does not); ``catch_up=replay`` (default,
round t is every rank's iteration t) or ``skip`` (a late rank skips the rounds it joined passively); momentum
stays local; evaluation uses the global average of the models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from wagma_bench.comm.topology import CATCH_UP, WagmaSchedule
from wagma_bench.comm.wait_avoiding import RoundResult, WaitAvoidingAllreduce
from wagma_bench.errors import ConfigError
from wagma_bench.optim.base import EngineAlgorithm
from wagma_bench.optim.outer import OuterSettings
from wagma_bench.ranges import AT_LEAST_ONE, setting


class WagmaSGD(EngineAlgorithm):
    name = "wagma"
    paper = "WAGMA-SGD, Li et al., TPDS 2020"
    models_identical = False  # the ranks' models differ where evaluation happens
    default_eval_model = "average"
    outer_at = "average"  # at the synchronous rounds, between the global average and the local step

    @dataclass
    class Settings(OuterSettings):
        name: str = "wagma"
        group_size: int | None = setting(None, AT_LEAST_ONE)  # power of two; None: sqrt(P) rounded to a power of two
        tau: int = setting(10, AT_LEAST_ONE)  # group rounds between synchronous global averages
        catch_up: str = "replay"            # replay | skip: how a late rank treats rounds it joined passively

        # checked with the config (wagma_bench.config.schema)
        CHOICES: ClassVar[dict[str, tuple]] = {**OuterSettings.CHOICES, "catch_up": CATCH_UP}

        def averaging_period(self) -> int:
            return self.tau + 1

        def default_outer_period(self) -> int:
            return self.tau + 1

    @classmethod
    def check_world(cls, settings, world_size: int | None) -> None:
        """Groups of a power of two that fits the world padded to the next power of two (the butterfly)."""
        size = settings.group_size
        if size is None:
            return
        if size < 1 or size & (size - 1):
            raise ConfigError(f"optimizer.group_size={size} is not allowed; it must be a power of two (1, 2, 4, ...)")
        if world_size is None:
            return
        padded = 1 << (world_size - 1).bit_length()
        if size > padded:
            raise ConfigError(f"optimizer.group_size={size} is not allowed with {world_size} ranks; it must be a "
                              f"power of two up to {padded} (the world padded to a power of two)")

    def __init__(self, settings, model, local_opt_factory, comm, seed=0):
        super().__init__(settings, model, local_opt_factory, comm, seed)  # one flat bucket
        self.schedule = WagmaSchedule(comm.world_size, settings.group_size, settings.tau)
        self.group_size = self.schedule.group_size
        self.data = self.buckets[0].data

    @property
    def sync_period(self) -> int:
        return self.schedule.period

    def _make_engine(self) -> WaitAvoidingAllreduce:
        return WaitAvoidingAllreduce(self.comm, self.data, self.schedule, contribution="model",
                                     in_order=self.settings.catch_up == "replay", start_round=self.round,
                                     timeout_s=self.comm.timeout_s, in_place=True)

    def _exchange(self) -> RoundResult:
        # self.data becomes, in place, the group average of the models plus this rank's own updates since
        # the model it contributed (none when on time); the engine holds at most one more model-sized buffer
        res = self.engine.request()
        if res.round % self.schedule.period == 0:  # a synchronous round: the model is the global average
            self.outer_round(res.round)   # the outer step's change stays in the model with the local one
        self.optimizer.step()             # apply g(W_old) to the average
        self.engine.post(self.data)       # the local update is in the model, exactly once; no copy
        return res
