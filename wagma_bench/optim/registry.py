"""Registry of the distributed optimizers, keyed by their Hydra option name (``optimizer=NAME``); their torch-free
specs are :data:`wagma_bench.optim.specs.OPTIMIZER_SPECS`."""

from __future__ import annotations

from wagma_bench.optim.adpsgd import ADPSGD
from wagma_bench.optim.allreduce import AllreduceSGD
from wagma_bench.optim.base import Algorithm
from wagma_bench.optim.dpsgd import DPSGD
from wagma_bench.optim.dropcompute import DropCompute
from wagma_bench.optim.eager import EagerSGD
from wagma_bench.optim.local_sgd import LocalSGD
from wagma_bench.optim.sgp import SGP
from wagma_bench.optim.wagma import WagmaSGD

OPTIMIZERS: dict[str, type[Algorithm]] = {
    AllreduceSGD.name: AllreduceSGD,
    WagmaSGD.name: WagmaSGD,
    LocalSGD.name: LocalSGD,
    DPSGD.name: DPSGD,
    ADPSGD.name: ADPSGD,
    SGP.name: SGP,
    EagerSGD.name: EagerSGD,
    DropCompute.name: DropCompute,
}


def get_optimizer(name: str) -> type[Algorithm]:
    try:
        return OPTIMIZERS[name]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; available: {', '.join(sorted(OPTIMIZERS))}") from None

