"""Where the configuration (``conf/``) and the SLURM files (``slurm/``) are: inside the package of an installed
wheel, which carries them as ``wagma_bench/conf`` and ``wagma_bench/slurm`` (pyproject.toml), else at the top
of the clone the package runs from (an editable install, or the checkout on ``PYTHONPATH``)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def _shipped_or_checkout(name: str) -> Path:
    shipped = PACKAGE / name
    return shipped if shipped.is_dir() else PACKAGE.parent / name


CONF_DIR = _shipped_or_checkout("conf")
SLURM_DIR = _shipped_or_checkout("slurm")
