"""Registry of workloads, keyed by their Hydra option name (``workload=NAME``); their torch-free specs are
:data:`wagma_bench.workloads.specs.WORKLOAD_SPECS`."""

from __future__ import annotations

from wagma_bench.workloads.base import Workload
from wagma_bench.workloads.ddppo.workload import DDPPOWorkload
from wagma_bench.workloads.resnet import ResNetWorkload
from wagma_bench.workloads.transformer import TransformerWorkload

WORKLOADS: dict[str, type[Workload]] = {
    ResNetWorkload.name: ResNetWorkload,
    DDPPOWorkload.name: DDPPOWorkload,
    TransformerWorkload.name: TransformerWorkload,
}


def get_workload(name: str) -> type[Workload]:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; available: {', '.join(sorted(WORKLOADS))}") from None
