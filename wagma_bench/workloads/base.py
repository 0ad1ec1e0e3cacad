"""The interface of a workload: model, loss, this rank's share of the data, evaluation.

Workloads do not know which distributed optimizer runs; the trainer drives them.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from wagma_bench.comm.base import Comm
from wagma_bench.workloads.specs import WorkloadSpec, rounds_per_epoch


def default_cache_root() -> Path:
    """Where workloads keep data they derive once (the synthetic corpus, parsed MNIST):
    ``$WAGMA_BENCH_CACHE``, else ``$XDG_CACHE_HOME/wagma-bench``, else ``~/.cache/wagma-bench``."""
    if os.environ.get("WAGMA_BENCH_CACHE"):
        return Path(os.environ["WAGMA_BENCH_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "wagma-bench"


class Workload(WorkloadSpec, abc.ABC):
    """A workload as its ranks run it. What the configuration check reads (name, Settings, DATA, DATA_SECTION,
    metrics and their ranges, RANK_MEMORY_MB, splittable, check) each workload inherits from its spec in
    :mod:`wagma_bench.workloads.specs`, which imports no torch."""

    def __init__(self, cfg, rank: int, world_size: int, device: torch.device):
        self.cfg, self.rank, self.world_size, self.device = cfg, rank, world_size, device

    def attach(self, comm: Comm) -> None:
        """Called by the trainer right after construction with the run's communicator (for workloads
        that coordinate outside the optimizer, e.g. DD-PPO's shared count of finished rollouts)."""

    @abc.abstractmethod
    def build_model(self) -> nn.Module: ...

    @property
    @abc.abstractmethod
    def train_size(self) -> int:
        """Number of training samples in one epoch (all ranks together)."""

    @property
    def eval_size(self) -> int | None:
        """Number of samples one evaluation scores (all ranks together); None when there is no fixed set."""
        return None

    @abc.abstractmethod
    def batches(self, start_step: int) -> Iterator[Any]:
        """This rank's training batches, forever, starting at its local step ``start_step``."""

    def split(self, batch: Any, parts: int) -> list[Any]:
        """``batch`` as ``parts`` micro-batches in order (some may be empty), for an algorithm that computes a
        batch in parts (DropCompute). This default splits a tuple of tensors along their first dimension;
        a workload whose batches cannot be split sets ``splittable = False``, and the configuration check
        refuses such an algorithm for it before any rank starts."""
        if isinstance(batch, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in batch):
            return [type(batch)(pieces) for pieces in zip(*(torch.tensor_split(t, parts) for t in batch))]
        raise TypeError(
            f"workload {self.name}: a batch of type {type(batch).__name__} has no split into parts"
        )

    @abc.abstractmethod
    def forward(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
        """Training loss of ``batch`` (to backpropagate) and the number of samples it holds."""

    def steps_per_epoch(self) -> int:
        """Steps (rounds) of one epoch; the unit of eval.every_epochs, train.epochs and the LR schedule."""
        return rounds_per_epoch(self.train_size, self.cfg.train.batch_size, self.world_size)

    def step_stats(self) -> dict:
        """Extra per-step fields for this rank's step log (e.g. tokens in the batch); empty by default."""
        return {}

    def eval_metadata(self) -> dict:
        """Fields every ``eval_accuracy`` event carries besides the value (e.g. how BLEU was computed)."""
        return {}

    @abc.abstractmethod
    def evaluate(self, model: nn.Module, comm: Comm) -> float:
        """The validation metric of ``model`` over the whole validation set (collective: every rank
        evaluates its shard and the counts are summed)."""
