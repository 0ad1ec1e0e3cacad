"""Ctrl-C, whenever it comes: before the ranks start (one line), while they start (stop before the first
step), during training (checkpoint, exit 130, the rerun resumes), and a second Ctrl-C (at once, recorded). The
real CLI, signals to the launcher or to the whole process group as a terminal sends them (`tune`:
tests/test_tune.py)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_util import BIN, QUICK, keys, run, wait_started
from tests.proc_util import alive, descendants, first_fork_server, held, held_fork_server, rank_pids
from wagma_bench.record.files import read_jsonl


def _ranks_of(launcher: subprocess.Popen, nproc: int = 2) -> list[int]:
    deadline = time.monotonic() + 120
    while True:
        ranks = rank_pids(launcher.pid)
        if len(ranks) == nproc:
            return ranks
        assert time.monotonic() < deadline and launcher.poll() is None, "the ranks did not start"
        time.sleep(0.1)


def _ctrl_c(run_dir: Path, to_group: bool, extra: tuple[str, ...] = (), presses: int = 1):
    """Ctrl-C a running 2-rank run: SIGINT to the launcher alone, or to its whole process group (a terminal's
    Ctrl-C); returns (launcher, its stderr, seconds from the first press until every rank has ended)."""
    launcher = subprocess.Popen(
        [
            str(BIN),
            "run",
            *QUICK[:1],
            "train.max_rounds=100000",
            "eval.every_rounds=100000",
            "logger.progress=off",
            *extra,
            f"hydra.run.dir={run_dir}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_started(run_dir, launcher, first_step=presses == 1)
        ranks = _ranks_of(launcher)
        t0 = time.monotonic()
        for press in range(presses):
            if press:
                time.sleep(0.3)
            os.killpg(launcher.pid, signal.SIGINT) if to_group else os.kill(launcher.pid, signal.SIGINT)
        _, err = launcher.communicate(timeout=120)
        while any(alive(p) for p in ranks):
            assert time.monotonic() - t0 < 60, "ranks outlive their launcher"
            time.sleep(0.1)
        return launcher, err, time.monotonic() - t0
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()


# to the launcher in make test; to the process group (and the rerun) in make test-long
@pytest.mark.serial
@pytest.mark.parametrize(
    "to_group", [False, pytest.param(True, marks=pytest.mark.long)], ids=["launcher", "process_group"]
)
def test_ctrl_c_checkpoints_suspends_the_run_exits_130_and_the_rerun_resumes(tmp_path, to_group):
    launcher, err, took = _ctrl_c(tmp_path, to_group)
    assert launcher.returncode == 130, err[-3000:]
    assert took < 15, f"{took:.1f} s"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    events = read_jsonl(tmp_path / "events.jsonl")
    assert events[-1]["key"] == "run_suspend" and events[-1]["metadata"]["status"] == "interrupted"
    assert "run_stop" not in keys(tmp_path)
    at = events[-1]["metadata"]["round"]
    assert [e["metadata"]["round"] for e in events if e["key"] == "checkpoint"][-1] == at
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "interrupted"
    assert f"interrupted at round {at}, checkpoint saved" in err
    if not to_group:
        return  # the rerun is the same for both (the resume of a suspended run: tests/test_faults.py too)
    again = run(
        QUICK[:1]
        + [
            "eval.every_rounds=100000",
            "logger.progress=off",
            f"train.max_rounds={at + 4}",
            f"hydra.run.dir={tmp_path}",
        ]
    )
    assert again.returncode == 0, again.stderr[-3000:]
    k = keys(tmp_path)
    assert (k.count("run_suspend"), k.count("run_resume"), k.count("run_stop"), k[-1]) == (
        1,
        1,
        1,
        "run_stop",
    )
    assert json.loads((tmp_path / "summary.json").read_text())["rounds"] == at + 4


@pytest.mark.long
def test_second_ctrl_c_stops_at_once_and_the_stop_is_recorded(tmp_path):
    """Rank 0 is 50x slower than its compute (the first synchronisation point is seconds away): the second
    Ctrl-C stops the ranks there and then, and the run's end is still recorded."""
    launcher, err, took = _ctrl_c(tmp_path, True, ("imbalance=fixed", "imbalance.factor=50"), presses=2)
    assert launcher.returncode == 130, err[-3000:]
    assert took < 15, f"{took:.1f} s"
    assert "Traceback" not in err, err[-3000:]
    assert "stopped at once by a second Ctrl-C" in err
    stop = read_jsonl(tmp_path / "events.jsonl")[-1]
    assert stop["key"] == "run_stop" and stop["metadata"]["status"] == "interrupted", stop
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and "step" in stop["metadata"]


def _ctrl_c_while_starting(run_dir: Path, presses: int):
    """Ctrl-C the launcher as it starts its ranks (its fork server still importing torch): no rank exists yet
    to take the forward, nor, a moment later, has one installed its handler.

    The fork server is held (SIGSTOP) from the moment it appears until the presses have landed: a slow server,
    as on a loaded node, which cannot fork a rank before it continues. Without the hold, the window (the
    server's ~2 CPU-s of imports against the launcher's ~0.4 to announce itself) was a race, which CI lost
    once (the ranks had started)."""
    launcher = subprocess.Popen(
        [
            str(BIN),
            "run",
            *QUICK[:1],
            "train.max_rounds=100000",
            "eval.every_rounds=100000",
            "logger.progress=off",
            f"hydra.run.dir={run_dir}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        with held_fork_server(launcher):
            assert not rank_pids(launcher.pid), "the ranks had started before the fork server was held"
            assert "local ranks" in launcher.stdout.readline()  # printed as the launcher takes Ctrl-C over
            for _ in range(presses):
                os.kill(launcher.pid, signal.SIGINT)
                time.sleep(0.3)
            assert not rank_pids(launcher.pid)
        _, err = launcher.communicate(timeout=180)
        return launcher, err
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()


# serial: the test must see the fork server before it ends its imports (about 2 CPU-seconds), to hold it; with
# the cores to itself it polls every 5 ms
@pytest.mark.serial
def test_ctrl_c_while_the_ranks_start_stops_the_run_before_its_first_step(tmp_path):
    launcher, err = _ctrl_c_while_starting(tmp_path, presses=1)
    assert launcher.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds"] == 0, summary  # no step after the Ctrl-C
    assert not list((tmp_path / "steps").glob("*.jsonl")) or not any(
        p.read_text().strip() for p in (tmp_path / "steps").glob("*.jsonl")
    )
    assert "interrupted before its first step (nothing to checkpoint)" in err, err[-3000:]
    assert keys(tmp_path)[-1] == "run_suspend"  # resumable: the rerun starts it
    again = run(QUICK[:1] + ["train.max_rounds=4", "eval.every_rounds=4", f"hydra.run.dir={tmp_path}"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"


@pytest.mark.serial  # as the test above
def test_a_second_ctrl_c_while_the_ranks_start_stops_at_once_and_claims_no_checkpoint(tmp_path):
    launcher, err = _ctrl_c_while_starting(tmp_path, presses=2)
    assert launcher.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "stopped at once by a second Ctrl-C" in err and "no checkpoint was saved" in err, err[-3000:]
    assert "resume from the last checkpoint" not in err
    # no rank had begun its event log (both Ctrl-Cs came before the ranks listened): no record at all, rather
    # than a summary without the events it summarises
    assert not (tmp_path / "events.jsonl").exists(), keys(tmp_path)
    assert not (tmp_path / "summary.json").exists()
    assert "nothing was recorded" in err, err[-3000:]


@pytest.mark.serial
def test_ctrl_c_before_the_ranks_start_ends_in_one_line(tmp_path):
    """Ctrl-C as the launcher composes its configuration (its fork server just started), before it has taken
    Ctrl-C over: one line, exit 130. The launcher announces taking it over on its stdout, about 0.25 s after
    the fork server appears here; the test holds the launcher (SIGSTOP) from when it sees the server until the
    Ctrl-C is sent, so that the Ctrl-C lands there whatever the cores' load. SIGINT's default disposition is
    restored for the launcher, as a terminal gives it (a test run in a background job would pass it on
    ignored)."""
    argv = [str(BIN), "run", *QUICK[:1], f"hydra.run.dir={tmp_path}"]
    default_sigint = (
        f"import os, signal; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv({argv[0]!r}, {argv!r})"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", default_sigint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        server = first_fork_server(launcher)
        with held(
            launcher.pid
        ):  # while the Ctrl-C is sent: it lands where the launcher was, whatever the load
            assert not select.select([launcher.stdout], [], [], 0)[0], (
                "the launcher had taken Ctrl-C over: too late"
            )
            os.kill(launcher.pid, signal.SIGINT)
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "interrupted before any rank started" in err, err[-3000:]
    time.sleep(0.5)
    assert not alive(server)  # the fork server went with its launcher, not on importing


def test_a_ctrl_c_while_the_fork_server_starts_is_kept_with_another_thread_running():
    """The window in which the fork server starts, in a process with a second thread that does not block
    SIGINT (the launcher has one: numpy's import starts it). The kernel hands a signal sent to the process to
    that thread; it must still reach the launcher's handler once the window closes, not be dropped there.
    Ctrl-C's handler is Python's own, as a terminal gives it (a test run in a background job would pass SIGINT
    on ignored, and an ignored Ctrl-C rightly stays ignored)."""
    program = """
import os, signal, threading, time
from wagma_bench.runtime.supervise import ranks_ignore_ctrl_c
signal.signal(signal.SIGINT, signal.default_int_handler)
# started before the window: SIGINT unblocked
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
try:
    with ranks_ignore_ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the other thread takes it meanwhile
    print("lost")
except KeyboardInterrupt:
    print("kept")
"""
    out = subprocess.run(
        [sys.executable, "-c", program], check=False, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "kept", out.stdout + out.stderr[-2000:]


@pytest.mark.serial
@pytest.mark.parametrize(
    "sig,nproc", [(signal.SIGTERM, 4), (signal.SIGHUP, 2)], ids=["SIGTERM-4-ranks", "SIGHUP"]
)
def test_a_terminating_signal_to_the_launcher_ends_every_process_of_the_run(tmp_path, sig, nproc):
    """SIGTERM (`timeout`, a batch system's time limit) or SIGHUP (a closed terminal) to the launcher alone:
    it passes the stop to every rank, which checkpoints at its next synchronisation point; the run records its
    stop, releases its lock and the launcher exits 128 + the signal. No process of the run is left 15 s later
    (before this, SIGTERM ended the launcher alone and left its ranks running, a stale lock and no recorded
    stop)."""
    launcher = subprocess.Popen(
        [
            str(BIN),
            "run",
            f"launcher.nproc={nproc}",
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
        _ranks_of(launcher, nproc)
        family = descendants(launcher.pid)
        t0 = time.monotonic()
        os.kill(launcher.pid, sig)
        _, err = launcher.communicate(timeout=60)
        while any(alive(p) for p in family):
            assert time.monotonic() - t0 < 15, (
                f"processes of the run outlive it: {[p for p in family if alive(p)]}"
            )
            time.sleep(0.1)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
    assert launcher.returncode == 128 + sig, err[-3000:]
    assert keys(tmp_path)[-1] in ("run_suspend", "run_stop")
    assert not (tmp_path / ".lock").exists()
    assert signal.Signals(sig).name in err.strip().splitlines()[-1], err[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["status"] in ("preempted", "interrupted")
