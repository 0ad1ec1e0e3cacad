"""The MPI backend under a real ``mpiexec`` (the mpich wheel's): exact oracles, then end-to-end runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
MPIEXEC = str(BIN / "mpiexec")
ORACLE = Path(__file__).with_name("mpi_oracle.py")


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    assert out.returncode == 0, f"{' '.join(cmd)} exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.mark.parametrize("nproc", [4, 3])
def test_oracles_under_mpiexec(nproc: int) -> None:
    """Allreduce, butterfly groups (incl. singletons at P=3), broadcast, allgather, p2p, recv_any, a forked
    comm in a thread, store_add and timeouts: see tests/mpi_oracle.py."""
    out = _run([MPIEXEC, "-n", str(nproc), sys.executable, str(ORACLE)], timeout=120)
    assert f"ok {nproc} ranks" in out.stdout


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.slow
def test_run_under_mpiexec(tmp_path: Path) -> None:
    # WAGMA-SGD: the progress and listener threads issue MPI calls beside the main thread's
    _run([MPIEXEC, "-n", "4", str(BIN / "wagma-bench"), "run", "comm=mpi", "optimizer=wagma", "train.max_steps=22",
          "eval.every_steps=11", "logger.progress=off", f"hydra.run.dir={tmp_path}"], timeout=300)
    summary = _summary(tmp_path)
    assert summary["status"] == "completed" and summary["steps"] == 22 and summary["optimizer"] == "wagma"
    assert summary["world_size"] == 4 and summary["versions"]["comm"] == "mpi"


@pytest.mark.slow
def test_run_reexecs_under_mpiexec(tmp_path: Path) -> None:
    """``comm=mpi`` outside any launcher: the CLI starts itself under mpiexec with launcher.nproc ranks."""
    out = _run([str(BIN / "wagma-bench"), "run", "comm=mpi", "launcher.nproc=2", "train.max_steps=10",
                "eval.every_steps=5", "logger.progress=off", f"hydra.run.dir={tmp_path}"], timeout=300)
    assert "mpiexec -n 2" in out.stdout
    summary = _summary(tmp_path)
    assert summary["status"] == "completed" and summary["world_size"] == 2
    # which MPI library the ranks loaded (on a cluster: the system MPI, not the wheel), printed and recorded
    assert f"wagma-bench: MPI library: {summary['versions']['mpi']}" in out.stdout
    assert "MPICH" in summary["versions"]["mpi"]  # here: the mpich wheel of the [mpi] extra


@pytest.mark.slow
def test_failure_of_a_nonzero_rank_is_recorded_under_a_users_mpiexec(tmp_path: Path) -> None:
    """Rank 1 cannot open its step log (a directory is in the way): it records the failed run, naming itself,
    before MPI_Abort ends the job (rank 0, which writes summaries otherwise, is killed by the abort)."""
    (tmp_path / "steps" / "rank1.jsonl").mkdir(parents=True)
    cmd = [MPIEXEC, "-n", "2", str(BIN / "wagma-bench"), "run", "comm=mpi", "train.max_steps=10",
           "logger.progress=off", f"hydra.run.dir={tmp_path}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode != 0
    summary = _summary(tmp_path)
    assert summary["status"] == "failed", summary
    assert summary["error"].startswith("rank 1 failed: IsADirectoryError"), summary["error"]
