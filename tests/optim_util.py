"""Helpers of the optimizer tests: tiny models and algorithm construction (worlds: tests/dist_util.py)."""

from __future__ import annotations

import torch
from torch import nn

from tests.dist_util import RankFailed, run_world  # noqa: F401 - re-exported for the optimizer tests


class Vector(nn.Module):
    """A model that is one trainable vector (plus a small matrix, so there are two parameter tensors)."""

    def __init__(self, dim: int, value: float = 0.0):
        super().__init__()
        self.x = nn.Parameter(torch.full((dim,), float(value)))
        self.m = nn.Parameter(torch.full((2, 2), float(value)))


def sgd(lr: float = 0.5, momentum: float = 0.0, weight_decay: float = 0.0):
    """Local optimizer factory, as the trainer builds it."""
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def make_algorithm(name: str, comm, model: nn.Module, opt_factory, seed: int = 0, **settings):
    from wagma_bench.optim import get_optimizer

    cls = get_optimizer(name)
    return cls(cls.Settings(**settings), model, opt_factory, comm, seed=seed)


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
