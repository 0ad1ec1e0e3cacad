"""The distributed optimizers' algorithm classes, keyed by their Hydra option name (``optimizer=NAME``), read
from the one table of the optimizers, :data:`wagma_bench.optim.specs.OPTIMIZER_SPECS`: each spec's class is
the one of ``optim/<name>.py`` (one module per algorithm) that inherits the spec, found by inheritance, not by
a name."""

from __future__ import annotations

import importlib
import inspect

from wagma_bench.optim.base import Algorithm
from wagma_bench.optim.specs import OPTIMIZER_SPECS, AlgorithmSpec


def module_path(name: str) -> str:
    return f"wagma_bench/optim/{name}.py"


def algorithm_of(spec: type[AlgorithmSpec]) -> type[Algorithm]:
    """The class of ``wagma_bench/optim/<spec.name>.py`` that inherits ``spec`` and :class:`Algorithm`; an
    ImportError naming the file to add, or what the class lacks, otherwise."""
    try:
        module = importlib.import_module(f"wagma_bench.optim.{spec.name}")
    except ModuleNotFoundError as err:
        if err.name != f"wagma_bench.optim.{spec.name}":  # the module exists and imports something missing
            raise
        raise ImportError(
            f"optimizer {spec.name}: add {module_path(spec.name)}, its algorithm (a subclass of "
            f"{spec.__name__} and Algorithm)"
        ) from None
    found = [
        c
        for _, c in inspect.getmembers(module, inspect.isclass)
        if c.__module__ == module.__name__ and issubclass(c, spec) and issubclass(c, Algorithm)
    ]
    if len(found) != 1:
        raise ImportError(
            f"optimizer {spec.name}: {module_path(spec.name)} must define one class that inherits "
            f"{spec.__name__} and Algorithm; it defines {len(found)}"
        )
    return found[0]


def _found() -> tuple[dict[str, type[Algorithm]], dict[str, str]]:
    algorithms, unfound = {}, {}
    for name, spec in OPTIMIZER_SPECS.items():
        try:
            algorithms[name] = algorithm_of(spec)
        except ImportError as err:
            unfound[name] = str(err)
    return algorithms, unfound


# An optimizer whose algorithm is missing (a contributor's unfinished one) is left out of OPTIMIZERS and said
# in UNFOUND (tests/test_conformance.py reports it as the file to add); asking for it names that file.
OPTIMIZERS, UNFOUND = _found()


def get_optimizer(name: str) -> type[Algorithm]:
    if name in UNFOUND:
        raise ValueError(UNFOUND[name])
    try:
        return OPTIMIZERS[name]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; available: {', '.join(sorted(OPTIMIZERS))}") from None
