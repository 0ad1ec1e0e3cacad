"""The distributed optimizers' algorithm classes, keyed by their Hydra option name (``optimizer=NAME``), read from
the one table of the optimizers, :data:`wagma_bench.optim.specs.OPTIMIZER_SPECS`: each spec names its class, which
lives in ``optim/<name>.py`` (one module per algorithm) and inherits the spec."""

from __future__ import annotations

import importlib

from wagma_bench.optim.base import Algorithm
from wagma_bench.optim.specs import OPTIMIZER_SPECS, AlgorithmSpec


def algorithm_of(spec: type[AlgorithmSpec]) -> type[Algorithm]:
    """The class ``spec.algorithm`` of ``wagma_bench/optim/<spec.name>.py``."""
    return getattr(importlib.import_module(f"wagma_bench.optim.{spec.name}"), spec.algorithm)


OPTIMIZERS: dict[str, type[Algorithm]] = {name: algorithm_of(spec) for name, spec in OPTIMIZER_SPECS.items()}


def get_optimizer(name: str) -> type[Algorithm]:
    try:
        return OPTIMIZERS[name]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; available: {', '.join(sorted(OPTIMIZERS))}") from None
