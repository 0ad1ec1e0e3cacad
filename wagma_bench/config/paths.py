"""Where the configuration (``conf/``) and the SLURM files (``slurm/``) are: inside the package of an
installed wheel, which carries them as ``wagma_bench/conf`` and ``wagma_bench/slurm`` (pyproject.toml), else
at the top of the clone the package runs from (an editable install, or the checkout on ``PYTHONPATH``)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # wagma_bench/


def _shipped_or_checkout(name: str) -> Path:
    shipped = PACKAGE / name
    return shipped if shipped.is_dir() else PACKAGE.parent / name


CONF_DIR = _shipped_or_checkout("conf")
#: the top of the clone (reproduce/ lives there; an installed wheel has none)
CHECKOUT = PACKAGE.parent
SLURM_DIR = _shipped_or_checkout("slurm")


def conf_context(job_name: str = "wagma-bench", conf_dir: Path | None = None):
    """Hydra initialised on the configuration folder (``with conf_context(): compose(...)``), as every command
    composes ``conf/`` outside a ``@hydra.main`` job."""
    from hydra import initialize_config_dir

    return initialize_config_dir(config_dir=str(conf_dir or CONF_DIR), version_base="1.3", job_name=job_name)
