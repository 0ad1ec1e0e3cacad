"""SIGTERM at any moment, to the launcher alone or to its whole process group (what `timeout` and a batch
system's time limit send), on the local launcher and under `comm=mpi` (wagma_bench/runtime/signals.py): one
line, exit 143, no traceback, no process of the run 15 s later, no lock, the stop recorded where the run had
started, and no step trained after a signal that came before the first one. Ctrl-C's own tests:
tests/test_interrupts.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli_util import BIN, keys
from tests.proc_util import alive, descendants
from wagma_bench.record.files import read_jsonl

# "mid": once the ranks have logged steps; the others: seconds after the command started (before the launcher
# has ranks, while they start, ...: where each lands depends on the machine's load, the outcome must not)
MOMENTS = (0.3, 1.0, 2.0, "mid")
# make test runs these; make test-long the rest of the matrix
QUICK_CASES = {("local", 0.3, False), ("local", 2.0, True), ("local", "mid", True), ("mpi", 1.0, False)}


def _cases():
    for launcher in ("local", "mpi"):
        for moment in MOMENTS:
            for to_group in (False, True):
                marks = () if (launcher, moment, to_group) in QUICK_CASES else (pytest.mark.long,)
                at = f"{moment}{'s' if moment != 'mid' else ''}"
                yield pytest.param(
                    launcher,
                    moment,
                    to_group,
                    signal.SIGTERM,
                    marks=marks,
                    id=f"{launcher}-{at}-{'group' if to_group else 'launcher'}",
                )
    # Ctrl-C and SIGHUP take the same path under mpiexec (its own session: the launcher passes them on)
    yield pytest.param("mpi", "mid", True, signal.SIGINT, marks=pytest.mark.long, id="mpi-mid-group-SIGINT")
    yield pytest.param(
        "mpi", 1.0, False, signal.SIGHUP, marks=pytest.mark.long, id="mpi-1.0s-launcher-SIGHUP"
    )


def _stepped(run_dir: Path) -> bool:
    """Steps logged (flushed at a synchronisation point): the run is in training."""
    return (
        any(p.stat().st_size for p in (run_dir / "steps").glob("rank*.jsonl"))
        if (run_dir / "steps").exists()
        else False
    )


def _began(run_dir: Path) -> bool:
    """``run_start`` logged: every rank has passed the barrier before its first step (steps may not be
    flushed)."""
    return (run_dir / "events.jsonl").exists() and "run_start" in keys(run_dir)


def _signal_a_run(run_dir: Path, argv: list[str], moment, to_group: bool, sig=signal.SIGTERM):
    """Start ``wagma-bench run ARGV`` in a session of its own, send ``sig`` at ``moment``; returns (launcher,
    its stderr, whether the ranks had begun training when the signal was sent, the processes that outlived it
    by 15 s)."""
    launcher = subprocess.Popen(
        [str(BIN), "run", *argv, f"hydra.run.dir={run_dir}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    family: set[int] = set()
    try:
        t0 = time.monotonic()
        while not (_stepped(run_dir) if moment == "mid" else time.monotonic() - t0 >= moment):
            assert launcher.poll() is None, launcher.communicate()[1][-3000:]
            assert time.monotonic() - t0 < 240, "the run did not start"
            family |= set(descendants(launcher.pid))
            time.sleep(0.02)
        family |= set(descendants(launcher.pid))
        began = _began(run_dir)
        (os.killpg if to_group else os.kill)(launcher.pid, sig)
        sent = time.monotonic()
        _, err = launcher.communicate(timeout=60)
        while (left := [p for p in family if alive(p)]) and time.monotonic() - sent < 15:
            time.sleep(0.1)
        return launcher, err, began, left
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()


@pytest.mark.serial
@pytest.mark.parametrize("launcher_kind,moment,to_group,sig", list(_cases()))
def test_sigterm_at_any_moment_ends_the_run_in_one_documented_outcome(
    tmp_path, launcher_kind, moment, to_group, sig
):
    nproc = 4 if moment == "mid" else 2  # four ranks to the group mid-training: one failed with exit code 255
    argv = [
        f"launcher.nproc={nproc}",
        "train.max_rounds=100000",
        "eval.every_rounds=100000",
        "logger.progress=off",
    ]
    if launcher_kind == "mpi":
        argv.append("comm=mpi")
    launcher, err, began, left = _signal_a_run(tmp_path, argv, moment, to_group, sig)
    assert launcher.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in err and "Error" not in err, err[-3000:]
    assert not left, f"processes of the run outlive it by 15 s: {left}"
    assert not (tmp_path / ".lock").exists()
    assert not (tmp_path / ".heartbeats").exists()
    last = err.strip().splitlines()[-1]
    assert ("interrupted" if sig == signal.SIGINT else signal.Signals(sig).name) in last, err[-3000:]
    if not (tmp_path / "events.jsonl").exists():  # stopped before any rank existed: nothing ran, said so
        assert "nothing ran" in last, err[-3000:]
        return
    assert keys(tmp_path)[-1] in ("run_suspend", "run_stop"), keys(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == ("interrupted" if sig == signal.SIGINT else "preempted"), summary
    if not began:  # the signal came before the first step: none was trained after it
        assert summary["rounds"] == 0 and not _stepped(tmp_path), summary
        assert "before its first step" in last, err[-3000:]
    else:  # stopped at a synchronisation point with a checkpoint, or at the exchange before the first step
        assert "checkpoint saved" in last or (summary["rounds"] == 0 and "before its first step" in last), (
            err[-3000:]
        )


@pytest.mark.serial
def test_a_stop_that_cannot_reach_a_sync_point_within_the_grace_says_so_and_is_recorded_preempted(tmp_path):
    """Local SGD with a period beyond reach: the launcher's grace passes before any synchronisation point,
    which rank 0 says at once (no promise of a checkpoint left standing); the ranks are killed and the stop is
    recorded as a preemption (resumable from the last checkpoint), exit 143, not a failure."""
    argv = [
        "launcher.nproc=2",
        "optimizer=local_sgd",
        "optimizer.sync_period=1000000",
        "train.max_rounds=1000000",
        "logger.progress=off",
    ]
    launcher = subprocess.Popen(
        [str(BIN), "run", *argv, f"hydra.run.dir={tmp_path}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while "run_start" not in (keys(tmp_path) if (tmp_path / "events.jsonl").exists() else []):
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()[1][-3000:]
            time.sleep(0.1)
        time.sleep(1.0)  # a few steps
        os.kill(launcher.pid, signal.SIGTERM)
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
    assert launcher.returncode == 143, err[-3000:]
    assert "no synchronisation point within the grace" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    stop = read_jsonl(tmp_path / "events.jsonl")[-1]
    assert stop["key"] == "run_stop" and stop["metadata"]["status"] == "preempted", stop
    assert not (tmp_path / ".lock").exists()


def test_a_rank_without_a_report_is_not_said_to_have_left_a_traceback(tmp_path):
    """A rank that ends with a non-zero code without its own report (which prints the traceback, then leaves
    its error in the launcher's folder) is not said to have left one; a rank that reported is."""
    from wagma_bench.runtime.supervise import RankExited, _exit_message

    silent = _exit_message(RankExited(3, 255), tmp_path)
    assert silent == "rank 3 failed with exit code 255 (it left no traceback)", silent
    (tmp_path / "rank1.error").write_text("OSError: [Errno 28] No space left on device")
    reported = _exit_message(RankExited(1, 1), tmp_path)
    assert reported.endswith("No space left on device (its traceback is above)"), reported
