"""The workloads, one module (or package) each; :data:`WORKLOADS` names them by their Hydra option.

Importing the package imports no workload: the registry (``WORKLOADS``, ``get_workload``, ``Workload``) is
loaded on its first use (PEP 562), so that the configuration check, which reads only
:mod:`wagma_bench.workloads.specs`, runs without torch in the launching process."""

from __future__ import annotations

_REGISTRY = ("WORKLOADS", "Workload", "get_workload")


def __getattr__(name: str):
    if name in _REGISTRY:
        from wagma_bench.workloads import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_REGISTRY)
