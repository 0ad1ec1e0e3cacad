"""D-PSGD: decentralized parallel SGD on a ring (Lian et al., NeurIPS 2017).

Each step every rank exchanges its model with its two ring neighbours (synchronous isend/irecv, no global
collective), replaces its model by the uniform mean of itself and the neighbours (the mixing matrix
``W`` with 1/3 on the diagonal and on both ring neighbours) and then applies its local gradient, which
backward computed on the model *before* the average:

    x_i <- (x_{i-1} + x_i + x_{i+1}) / 3 - lr * g_i(x_i)

Readings: the local update is the trainer's local optimizer (momentum SGD as in the paper's experiments,
or AdamW) fed with ``g_i``. With two ranks the two neighbours are the same rank and the weights are 1/2;
one rank keeps its model (the mean is over the distinct members of ``{i-1, i, i+1}``).

Evaluated model: the ranks' models differ (they only agree in the limit), and Lian et al.'s convergence
result is about their average, so by default the trainer evaluates the global mean (``eval.model=auto``
-> average); ``eval.model=local`` evaluates rank 0's own model instead.
"""

from __future__ import annotations

import time

import torch

from wagma_bench.comm.topology import ring_neighbours
from wagma_bench.optim.base import Algorithm, StepInfo
from wagma_bench.optim.specs import DPSGDSpec


class DPSGD(DPSGDSpec, Algorithm):
    paper = "D-PSGD, Lian et al., NeurIPS 2017"
    models_identical = False  # the ranks' models differ where evaluation happens
    default_eval_model = "average"

    def __init__(self, settings, model, local_opt_factory, comm, seed=0):
        super().__init__(settings, model, local_opt_factory, comm, seed)
        self.neighbours = ring_neighbours(comm.rank, comm.world_size)
        self._inbox = [[torch.empty_like(b.data) for _ in self.neighbours] for b in self.buckets]

    def step(self) -> StepInfo:
        t0 = time.perf_counter()
        self.mix()
        comm_s = time.perf_counter() - t0
        self.local_optimizer.step()  # the gradient was computed on the pre-average model
        self.round += 1
        self.outer_round(self.round)
        return StepInfo(round=self.round, comm_s=comm_s)

    def mix(self) -> None:
        """Replace the model by the mean of itself and its ring neighbours' models."""
        handles = []
        # untagged (NCCL has no tags): messages between two ranks match in the order they were posted
        for b, inbox in zip(self.buckets, self._inbox):
            for nb, buf in zip(self.neighbours, inbox):
                handles.append(self.comm.isend(b.data, nb))
                handles.append(self.comm.irecv(buf, nb))
        for h in handles:
            h.wait()
        for b, inbox in zip(self.buckets, self._inbox):
            for buf in inbox:
                b.data.add_(buf)
            b.data.div_(len(inbox) + 1)
