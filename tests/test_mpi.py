"""The MPI backend under a real ``mpiexec`` (the mpich wheel's): exact oracles, then end-to-end runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_util import BIN, QUICK, wait_started
from tests.validate_count import counting_env, validated_once
from wagma_bench.record.files import read_jsonl

# MPICH's ranks busy-poll (they would slow a test beside them and starve make test's idle-priority tests), and
# a 0.5 s communicator must see every rank arrive in time: these run by themselves (marker alone).
pytestmark = [pytest.mark.serial, pytest.mark.alone]

MPIEXEC = str(BIN.parent / "mpiexec")
ORACLE = Path(__file__).with_name("mpi_oracle.py")


def _run(cmd: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    assert out.returncode == 0, (
        f"{' '.join(cmd)} exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )
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
    """WAGMA-SGD under a user's mpiexec: the progress and listener threads issue MPI calls beside the main
    thread's. Rank 0 checks the configuration and broadcasts it: ``schema.validate`` runs once in all the
    ranks (tests/test_config_once.py's check on the other launchers; this world serves both)."""
    env, log = counting_env(tmp_path)
    _run(
        [
            MPIEXEC,
            "-n",
            "4",
            str(BIN),
            "run",
            "comm=mpi",
            "optimizer=wagma",
            "train.max_rounds=11",
            "train.batch_size=8",  # the workload's 32 a rank is compute the MPI calls do not need
            "eval.every_rounds=11",
            "logger.progress=off",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        timeout=300,
        env=env,
    )
    validated_once(log, 4)
    summary = _summary(tmp_path / "run")
    assert summary["status"] == "completed" and summary["rounds"] == 11 and summary["optimizer"] == "wagma"
    assert summary["world_size"] == 4 and summary["versions"]["comm"] == "mpi"


@pytest.mark.slow
def test_run_reexecs_under_mpiexec(tmp_path: Path) -> None:
    """``comm=mpi`` outside any launcher: the CLI starts itself under mpiexec with launcher.nproc ranks, which
    run the checked configuration it wrote: ``schema.validate`` runs once in the command and its ranks
    (tests/test_config_once.py's check on the other launchers; this run serves both)."""
    env, log = counting_env(tmp_path)
    run_dir = tmp_path / "run"
    out = _run(
        [
            str(BIN),
            "run",
            "comm=mpi",
            "launcher.nproc=2",
            "train.max_rounds=10",
            "train.batch_size=8",
            "eval.every_rounds=5",
            "logger.progress=off",
            f"hydra.run.dir={run_dir}",
        ],
        timeout=300,
        env=env,
    )
    assert "mpiexec -n 2" in out.stdout
    validated_once(log, 3)  # the command and its two ranks at least
    summary = _summary(run_dir)
    assert summary["status"] == "completed" and summary["world_size"] == 2
    # which MPI library the ranks loaded (on a cluster: the system MPI, not the wheel), printed and recorded
    assert f"wagma-bench: MPI library: {summary['versions']['mpi']}" in out.stdout
    assert "MPICH" in summary["versions"]["mpi"]  # here: the mpich wheel of the [mpi] extra
    assert not (run_dir / ".heartbeats").exists()  # the ranks' heartbeats end with the run


@pytest.mark.slow
def test_failure_of_a_nonzero_rank_is_recorded_under_a_users_mpiexec(tmp_path: Path) -> None:
    """Rank 1 cannot open its step log (a directory is in the way): it records the failed run, naming itself,
    before MPI_Abort ends the job (rank 0, which writes summaries otherwise, is killed by the abort)."""
    (tmp_path / "steps" / "rank1.jsonl").mkdir(parents=True)
    cmd = [
        MPIEXEC,
        "-n",
        "2",
        str(BIN),
        "run",
        "comm=mpi",
        "train.max_rounds=10",
        "logger.progress=off",
        f"hydra.run.dir={tmp_path}",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode != 0
    summary = _summary(tmp_path)
    assert summary["status"] == "failed", summary
    assert summary["error"].startswith("rank 1 failed: IsADirectoryError"), summary["error"]


def _mpi_rank_pid(run_dir: Path, rank: int) -> int | None:
    """The PID of an MPI rank of this run (the mpich wheel's hydra sets PMI_RANK)."""
    for proc in Path("/proc").iterdir():
        try:
            if str(run_dir) not in proc.joinpath("cmdline").read_text() or not proc.name.isdigit():
                continue
            env = proc.joinpath("environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in env:
            return int(proc.name)
    return None


@pytest.mark.long
def test_killed_mpi_rank_is_named_and_the_run_stop_has_the_real_step_counts(tmp_path):
    launcher = subprocess.Popen(
        [
            str(BIN),
            "run",
            "comm=mpi",
            *QUICK[:1],
            "train.max_rounds=100000",
            "eval.every_rounds=100000",
            "logger.progress=off",
            f"hydra.run.dir={tmp_path}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_started(tmp_path, launcher)
        pid = _mpi_rank_pid(tmp_path, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        out, err = launcher.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
    assert launcher.returncode == 1, err[-3000:]
    assert took < 15, f"{took:.1f} s"
    assert "rank 1 was killed by signal SIGKILL" in err, (out + err)[-3000:]
    stop = read_jsonl(tmp_path / "events.jsonl")[-1]
    assert stop["key"] == "run_stop" and stop["metadata"]["status"] == "failed"
    assert "rank 1 was killed by signal SIGKILL" in stop["metadata"]["error"]
    logged = read_jsonl(tmp_path / "steps" / "rank0.jsonl")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "rank 1 was killed by signal SIGKILL" in summary["error"]
    assert summary["rounds"] == logged[-1]["round"] > 0
    assert summary["samples"] >= sum(s["samples"] for s in logged) > 0


# rank 2 (named rank 0 before) in make test; each other rank in turn in make test-long
@pytest.mark.parametrize(
    "victim",
    [
        pytest.param(0, marks=pytest.mark.long),
        pytest.param(1, marks=pytest.mark.long),
        2,
        pytest.param(3, marks=pytest.mark.long),
    ],
)
def test_killed_mpi_rank_among_four_is_named_not_the_one_mpiexecs_clean_up_killed(tmp_path, victim):
    """mpiexec (MPICH's hydra) names the PID it lists first among the ranks it killed in its clean-up (rank
    0's when rank 2 was killed); the launcher names the rank whose process ended first."""
    launcher = subprocess.Popen(
        [
            str(BIN),
            "run",
            "comm=mpi",
            "launcher.nproc=4",
            "train.max_rounds=100000",
            "eval.every_rounds=100000",
            "logger.progress=off",
            f"hydra.run.dir={tmp_path}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not (
            (tmp_path / "steps" / "rank3.jsonl").exists()
            and (tmp_path / "steps" / "rank3.jsonl").stat().st_size
        ):
            assert launcher.poll() is None and time.monotonic() < deadline, "the run did not start"
            time.sleep(0.1)
        pid = _mpi_rank_pid(tmp_path, victim)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
    assert launcher.returncode == 1, err[-3000:]
    assert f"rank {victim} was killed by signal SIGKILL" in err, err[-3000:]
    assert (
        f"rank {victim} was killed by signal SIGKILL"
        in json.loads((tmp_path / "summary.json").read_text())["error"]
    )
