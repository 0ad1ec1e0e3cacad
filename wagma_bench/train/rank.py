"""What every rank runs once its world is up: the trainer. The launching process (``runtime/run.py``) passes
:func:`train_rank` to its ranks by reference (this module's name and the function's), so that it need not
import the trainer, and torch with it: importing this module imports neither; the rank server has."""

from __future__ import annotations

from pathlib import Path


def train_rank(cfg, comm, run_dir: Path, local_rank: int) -> dict | None:
    """One rank's run: the trainer's ``train`` (rank 0's summary, None on the other ranks)."""
    from wagma_bench.train.trainer import train

    return train(cfg, comm, run_dir, local_rank)
