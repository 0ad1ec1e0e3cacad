"""Optional dependencies: which pip extra installs what a configuration needs.

A plain ``pip install wagma-bench`` runs the embedded ResNet default over torch.distributed. Everything
else is an extra (``pyproject.toml``); a run that needs a missing one fails in the launching process,
before any rank starts, with the ``pip install`` command that fixes it.
"""

from __future__ import annotations

import importlib.util

from wagma_bench.config.schema import RunConfig
from wagma_bench.errors import ConfigError
from wagma_bench.record.loggers import resolve_mode

FAIRSEQ_HINT = (
    "pip install --no-build-isolation fairseq-fixed==0.12.3.1 (after cython, setuptools, wheel "
    "and numpy; `make setup` does it)"
)


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (a module set to None in sys.modules counts as missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, extra: str, needed_by: str) -> None:
    """Raise a :class:`ConfigError` naming the extra that installs ``module`` when it is missing."""
    if not installed(module):
        raise ConfigError(
            f"{needed_by} needs the Python package {module!r}, which is not installed: "
            f"pip install 'wagma-bench[{extra}]'"
        )


def check_extras(cfg: RunConfig) -> None:
    """Every optional package the configuration uses is installed (else a ConfigError naming its extra), and
    W&B's mode can be met (``online`` needs an API key)."""
    if cfg.comm.name == "mpi":
        require("mpi4py", "mpi", "comm=mpi")
    if cfg.logger.wandb is not None:
        require("wandb", "wandb", "logger=wandb")
        resolve_mode(cfg.logger.wandb.mode)  # online needs an API key: refused here, not on rank 0 later
    if cfg.workload.name == "transformer":
        require("sacrebleu", "transformer", "workload=transformer")
        require("sacremoses", "transformer", "workload=transformer")
        if not installed("fairseq"):
            raise ConfigError(f"workload=transformer needs fairseq, which is not installed: {FAIRSEQ_HINT}")
    if cfg.workload.name == "ddppo" and cfg.data.name == "miniworld_pointnav":
        require("miniworld", "ddppo", "env=miniworld_pointnav")
