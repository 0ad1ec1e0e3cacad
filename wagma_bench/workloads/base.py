"""The interface of a workload: model, loss, this rank's share of the data, evaluation.

Workloads do not know which distributed optimizer runs; the trainer drives them.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from wagma_bench.comm.base import Comm


def default_cache_root() -> Path:
    """Where workloads keep data they derive once (the synthetic corpus, parsed MNIST): ``$WAGMA_BENCH_CACHE``,
    else ``$XDG_CACHE_HOME/wagma-bench``, else ``~/.cache/wagma-bench``."""
    if os.environ.get("WAGMA_BENCH_CACHE"):
        return Path(os.environ["WAGMA_BENCH_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "wagma-bench"


class Workload(abc.ABC):
    name: ClassVar[str]
    Settings: ClassVar[type]             # schema of the `workload:` section
    DATA: ClassVar[dict[str, type]]      # data option name -> schema of the `data:` section
    DATA_SECTION: ClassVar[str] = "data"  # the config section holding the data options (ddppo: `env`)
    metric_name: ClassVar[str] = "top1"   # evaluation metric; higher is better
    # Peak resident memory of one rank on the workload's embedded default data, in MiB, measured by
    # reproduce/memory/footprint.py (peak VmRSS of a rank of a 2-rank CPU run; docs/run-budget-and-exit-codes.md):
    # ranks x this must fit in the machine's memory (config.check_memory, before any rank starts). A lower
    # bound for larger data (ImageNet, WMT), so it refuses only worlds that cannot fit.
    RANK_MEMORY_MB: ClassVar[float]
    # every metric's range (eval.target is checked against it before any rank starts)
    METRIC_RANGES: ClassVar[dict[str, tuple[float, float]]] = {"top1": (0.0, 1.0)}  # a fraction
    sample_unit: ClassVar[str] = "samples"
    #: its batches split into micro-batches (:meth:`split`), as DropCompute needs
    splittable: ClassVar[bool] = True

    @classmethod
    def metric_of(cls, cfg) -> str:
        """The name of the evaluation metric a configuration uses, known before the workload is built."""
        return cls.metric_name

    def __init__(self, cfg, rank: int, world_size: int, device: torch.device):
        self.cfg, self.rank, self.world_size, self.device = cfg, rank, world_size, device

    @classmethod
    def check(cls, cfg) -> None:
        """Validate data paths and options in the launching process (raise ConfigError)."""

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
        raise TypeError(f"workload {self.name}: a batch of type {type(batch).__name__} has no split into parts")

    @abc.abstractmethod
    def forward(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
        """Training loss of ``batch`` (to backpropagate) and the number of samples it holds."""

    def steps_per_epoch(self) -> int:
        """Steps (rounds) of one epoch; the unit of eval.every_epochs, train.epochs and the LR schedule."""
        return max(1, -(-self.train_size // (self.cfg.train.batch_size * self.world_size)))

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
