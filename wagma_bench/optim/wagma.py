"""WAGMA-SGD: wait-avoiding group model averaging (Li et al., IEEE TPDS 2020, arXiv 2005.00124).

Each step, a rank averages its model within its current butterfly group and then applies its local
gradient, computed on the weights before the average, with the local optimizer (momentum SGD in the
paper)::

    W <- avg_group(W) - lr * g(W_old)

The group average is the wait-avoiding group allreduce (:mod:`wagma_bench.comm.wait_avoiding`): the first
ready member activates it and members still computing contribute the model they posted at the end of
their previous step. Every ``tau`` group rounds one synchronous global allreduce bounds the staleness,
so rounds ``tau+1, 2(tau+1), ...`` are where all ranks meet (``sync_period``).

Readings we chose (the paper leaves them open):
- Weight decay is applied by the local optimizer to the averaged weights (PyTorch's SGD adds
  ``wd * W`` at the time of the update).
- Momentum buffers stay local; only weights are averaged (as in the authors' TensorFlow code).
- A rank that joined rounds passively while computing takes the result of the next round it activates,
  so its gradient may be applied to a model up to ``tau - 1`` rounds newer than the one it was computed on.
- Evaluation uses the global average of the models (``default_eval_model = "average"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Optional

from wagma_bench.comm.topology import butterfly_stage, default_group_size, num_stages
from wagma_bench.comm.wait_avoiding import WaitAvoidingAllreduce
from wagma_bench.optim.base import Algorithm, StepInfo


class WagmaSGD(Algorithm):
    name = "wagma"
    default_eval_model = "average"

    @dataclass
    class Settings:
        name: str = "wagma"
        group_size: Optional[int] = None   # power of two; None: sqrt(P) rounded to a power of two
        tau: int = 10                       # group rounds between synchronous global averages

    def __init__(self, settings, model, local_opt_factory, comm, seed=0):
        super().__init__(settings, model, local_opt_factory, comm, seed)  # one flat bucket
        if settings.tau < 1:
            raise ValueError(f"optimizer.tau must be >= 1, got {settings.tau}")
        p = comm.world_size
        self.group_size = settings.group_size or default_group_size(p)
        stages = num_stages(p, self.group_size)  # validates the power of two
        self.data = self.buckets[0].data
        self._schedule = partial(self._stage, p, self.group_size)
        self._all_groups = [g for k in range(stages) for g in butterfly_stage(p, self.group_size, k)]
        self.engine: WaitAvoidingAllreduce | None = None

    @staticmethod
    def _stage(p: int, s: int, r: int):
        # Round r (1-based) uses butterfly stage r - 1, so stages alternate round-robin.
        return butterfly_stage(p, s, r - 1)

    @property
    def sync_period(self) -> int:
        return self.settings.tau + 1

    def _start_engine(self) -> None:
        # Created at the first step (the same point on every rank, fresh or resumed), so the rounds
        # continue from the restored round counter.
        self.engine = WaitAvoidingAllreduce(self.comm, self.data, self._schedule, self._all_groups,
                                            sync_every=self.sync_period, start_round=self.round,
                                            timeout_s=getattr(self.comm, "timeout_s", 300.0))
        self.engine.post(self.data)

    def step(self) -> StepInfo:
        if self.comm.world_size == 1:
            self.optimizer.step()
            self.round += 1
            return StepInfo(round=self.round)
        if self.engine is None:
            self._start_engine()
        res = self.engine.request()       # average of the posted (pre-gradient) models
        self.data.copy_(res.result)
        self.optimizer.step()             # apply g(W_old) to the average
        self.engine.post(self.data)
        self.round = res.round
        return StepInfo(round=res.round, comm_s=res.wait_s, staleness=res.staleness)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
