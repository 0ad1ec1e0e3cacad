"""Allreduce-SGD: synchronous data parallelism, the baseline of both papers.

Gradients are averaged over all ranks every step, bucket by bucket, each bucket's allreduce launched
from a gradient hook as soon as backward has filled it (as DistributedDataParallel overlaps communication
with backward). Buckets are launched strictly in order so every rank issues the same sequence of
collectives. Then every rank applies the same local optimizer step, so all models stay identical.
"""

from __future__ import annotations

import time

from wagma_bench.optim.base import Algorithm, StepInfo
from wagma_bench.optim.specs import AllreduceSpec


class AllreduceSGD(AllreduceSpec, Algorithm):
    paper = "Allreduce-SGD (synchronous data parallelism)"
    # Every rank applies the same averaged gradient to the same weights. Buffers (BatchNorm statistics) are
    # each rank's own: evaluation still broadcasts rank 0's state for a model with float buffers (EvalModel).
    models_identical = True
    default_eval_model = "local"

    def __init__(self, settings, model, local_opt_factory, comm, seed=0):
        super().__init__(settings, model, local_opt_factory, comm, seed, bucket_mb=settings.bucket_mb)
        self._bucket_of = {}
        for i, b in enumerate(self.buckets):
            for p in b.params:
                self._bucket_of[p] = i
                p.register_post_accumulate_grad_hook(self._on_grad_ready)
        self._reset()

    def _reset(self) -> None:
        self._pending = [len(b.params) for b in self.buckets]
        self._handles = []

    def _on_grad_ready(self, param) -> None:
        self._pending[self._bucket_of[param]] -= 1
        self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        while len(self._handles) < len(self.buckets):
            i = len(self._handles)
            if self._pending[i] > 0 and not force:
                return
            self._handles.append(self.comm.allreduce(self.buckets[i].grad, op="mean", async_op=True))

    def step(self) -> StepInfo:
        t0 = time.perf_counter()
        # Buckets whose parameters got no gradient this step (unused branches, empty batches) still
        # take part: every rank must issue the same collectives.
        self._launch_ready(force=True)
        for h in self._handles:
            h.wait()
        comm_s = time.perf_counter() - t0
        self._reset()
        self.local_optimizer.step()
        self.round += 1
        return StepInfo(round=self.round, comm_s=comm_s)
