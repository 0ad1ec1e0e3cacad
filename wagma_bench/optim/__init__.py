"""The distributed optimizers, one module per algorithm; :data:`OPTIMIZERS` names them by their Hydra option.

Importing the package imports no algorithm: the registry (``OPTIMIZERS``, ``get_optimizer``, ``Algorithm``,
``StepInfo``) is loaded on its first use (PEP 562), so that the configuration check, which reads only
:mod:`wagma_bench.optim.specs`, runs without torch in the launching process."""

from __future__ import annotations

_REGISTRY = ("OPTIMIZERS", "Algorithm", "StepInfo", "get_optimizer")


def __getattr__(name: str):
    if name in _REGISTRY:
        from wagma_bench.optim import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_REGISTRY)
