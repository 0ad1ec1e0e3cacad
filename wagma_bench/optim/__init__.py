"""Registry of the distributed optimizers, keyed by their Hydra option name (``optimizer=NAME``)."""

from __future__ import annotations

from wagma_bench.optim.allreduce import AllreduceSGD
from wagma_bench.optim.base import Algorithm, StepInfo

OPTIMIZERS: dict[str, type[Algorithm]] = {
    AllreduceSGD.name: AllreduceSGD,
}


def get_optimizer(name: str) -> type[Algorithm]:
    try:
        return OPTIMIZERS[name]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; available: {', '.join(sorted(OPTIMIZERS))}") from None


__all__ = ["OPTIMIZERS", "Algorithm", "StepInfo", "get_optimizer"]
