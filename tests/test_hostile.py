"""Hostile and careless input, round two: links planted in a run directory,
two runs on one port, Ctrl-C, torchrun restarts, a killed MPI rank, the teardown after the last collective.
Each through the real CLI with real ranks where a process is involved."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.proc_util import fork_servers, rank_pids
from wagma_bench.record.events import read_jsonl

BIN = Path(sys.executable).parent / "wagma-bench"
QUICK = ["launcher.nproc=2", "train.max_steps=12", "eval.every_steps=6", "logger.progress=off"]


def run(args, timeout=300, **kw):
    return subprocess.run([str(BIN), "run", *args], capture_output=True, text=True, timeout=timeout,
                          check=False, **kw)


def keys(run_dir: Path) -> list[str]:
    return [e["key"] for e in read_jsonl(run_dir / "events.jsonl")]


# --- a run never writes through a symbolic link --------------------------------------------------

# the user's own file; it reads as a started run, so that the launcher's record of a failure appends to it
VICTIM = json.dumps({"key": "run_start", "value": None, "time_ms": 0, "metadata": {}}) + "\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM)
    return victim


# .heartbeats: a local run keeps its heartbeats elsewhere, and ignored the link (the docs said refused)
@pytest.mark.parametrize("name", ["events.jsonl", ".heartbeats"])
def test_planted_run_file_symlink_is_refused_naming_it_and_its_target_is_unchanged(tmp_path, name):
    victim = _victim(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / name).symlink_to(victim)
    out = run(QUICK + [f"hydra.run.dir={run_dir}"], timeout=120)
    assert victim.read_text() == VICTIM
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"{run_dir.resolve() / name} is a symbolic link (to {victim})" in out.stderr, out.stderr[-2000:]
    assert not (run_dir / "steps").exists()  # refused before any rank started


def test_planted_temp_file_symlink_does_not_redirect_the_summary(tmp_path):
    """The temporary name of an atomic write was guessable (``.summary.json.tmp<PID>``): a link planted there
    received the summary, and the rename made ``summary.json`` itself that link."""
    from wagma_bench.record.events import write_json_atomic

    victim = _victim(tmp_path)
    (tmp_path / f".summary.json.tmp{os.getpid()}").symlink_to(victim)
    write_json_atomic(tmp_path / "summary.json", {"status": "completed"})
    assert victim.read_text() == VICTIM
    assert not (tmp_path / "summary.json").is_symlink()
    assert json.loads((tmp_path / "summary.json").read_text()) == {"status": "completed"}


def _event_log(run_dir: Path):
    from wagma_bench.record.events import EventLog

    EventLog(run_dir, enabled=True).close()


def _event_log_resumed(run_dir: Path):
    from wagma_bench.record.events import EventLog

    EventLog(run_dir, enabled=True, resume_step=4).close()


def _step_log(run_dir: Path):
    from wagma_bench.record.events import StepLog

    StepLog(run_dir, rank=0).close()


def _launcher_record(run_dir: Path):
    from wagma_bench.record.rundir import record_failure

    record_failure(run_dir, "rank 1 was killed")


def _mllog(run_dir: Path):
    from wagma_bench.record.mlperf import write_mllog

    write_mllog(run_dir)


def _lock(run_dir: Path):
    from wagma_bench.record.rundir import RunDirLock

    RunDirLock(run_dir).acquire()


def _shared_heartbeat(run_dir: Path):
    from wagma_bench.runtime.supervise import HEARTBEATS, start_heartbeat

    start_heartbeat(run_dir / HEARTBEATS, 0, period_s=60)


def _rank_error(run_dir: Path):
    from wagma_bench.runtime.supervise import HEARTBEATS, report_error

    report_error(str(run_dir / HEARTBEATS), 0, RuntimeError("boom"))


# (what writes, the name in the run directory planted as a link)
WRITERS = [
    (_shared_heartbeat, ".heartbeats"),
    (_shared_heartbeat, ".heartbeats/rank0"),
    (_event_log, "events.jsonl"),
    (_event_log_resumed, "events.jsonl"),
    (_step_log, "steps/rank0.jsonl"),
    (_step_log, "steps"),
    (_launcher_record, "events.jsonl"),
]


@pytest.mark.parametrize("write,name", WRITERS, ids=[f"{w.__name__}-{n}" for w, n in WRITERS])
def test_every_writer_of_a_run_refuses_a_planted_link_naming_it(tmp_path, write, name):
    from wagma_bench.record.events import SymlinkRefused

    run_dir = tmp_path / "run"
    (run_dir / "steps").mkdir(parents=True)
    (run_dir / ".heartbeats").mkdir()
    victim = _victim(tmp_path)
    link = run_dir / name
    if link.is_dir():
        link.rmdir()
        victim = tmp_path / "victim_dir"
        victim.mkdir()
    link.symlink_to(victim)
    with pytest.raises(SymlinkRefused, match=f"{link} is a symbolic link"):
        write(run_dir)
    if victim.is_dir():
        assert not any(victim.iterdir())
    else:
        assert victim.read_text() == VICTIM


@pytest.mark.parametrize("write,name", [(_mllog, f".mllog.txt.tmp{os.getpid()}"),
                                        (_lock, f".lock.{os.uname().nodename}.{os.getpid()}")])
def test_planted_link_at_a_temporary_name_is_not_written_through(tmp_path, write, name):
    from tests.test_mllog import evaluation, event, start_event, write_events

    victim = _victim(tmp_path)
    run_dir = write_events(tmp_path / "run", [start_event(), evaluation(2000, 10, 0.95),
                                              event("run_stop", 2100, step=10, status="completed")])
    (run_dir / name).symlink_to(victim)
    write(run_dir)
    assert victim.read_text() == VICTIM
    assert not (run_dir / "mllog.txt").is_symlink()


# --- a torchrun restart resumes, every time ------------------------------------------------------

def _workers_by_local_rank(agent_pid: int) -> dict[int, int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(agent_pid)], capture_output=True, text=True,
                         check=False).stdout
    found = {}
    for pid in out.split():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        found.update({int(e.split(b"=")[1]): int(pid) for e in env if e.startswith(b"LOCAL_RANK=")})
    return found


def _checkpointed(run_dir: Path) -> bool:
    return "checkpoint" in keys(run_dir)


def torchrun_kill_and_restart(tmp_path: Path) -> None:
    """A 2-rank run under ``torchrun --max-restarts 1``; local rank 1 is SIGKILLed after the first checkpoint.
    In the restarted attempt rank 1 starts 3 s late, so rank 0 reads rank 1's store keys before rank 1 has
    written them: the previous attempt's keys (gloo's address of the killed worker), where the agent's store
    still serves them under the same names."""
    from wagma_bench.runtime.launch import free_port

    wrapper = tmp_path / "late_rank1_on_restart.sh"
    wrapper.write_text('#!/bin/sh\n[ "$LOCAL_RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 1 ] && sleep 3\n'
                       f'exec {sys.executable} -m wagma_bench run "$@"\n')
    wrapper.chmod(0o755)
    run_dir = tmp_path / "run"
    torchrun = Path(sys.executable).parent / "torchrun"
    agent = subprocess.Popen([str(torchrun), "--nnodes", "1", "--nproc_per_node", "2", "--max-restarts", "1",
                              f"--master-port={free_port()}", "--no-python", str(wrapper), "logger.progress=off",
                              "checkpoint.every_s=0", "train.max_steps=16", "eval.every_steps=1000",
                              f"hydra.run.dir={run_dir}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not _checkpointed(run_dir):
            assert agent.poll() is None, agent.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.1)
        os.kill(_workers_by_local_rank(agent.pid)[1], signal.SIGKILL)
        _, err = agent.communicate(timeout=300)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.communicate()
    assert agent.returncode == 0, err[-3000:]
    assert "connectFullMesh" not in err
    k = keys(run_dir)
    assert (k.count("run_start"), k.count("run_resume"), k.count("run_stop"), k[-1]) == (1, 1, 1, "run_stop")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["steps"]) == ("completed", 16)
    assert not (run_dir / ".lock").exists()


def test_torchrun_restart_after_a_killed_worker_resumes(tmp_path):
    torchrun_kill_and_restart(tmp_path)


@pytest.mark.long
def test_torchrun_restart_after_a_killed_worker_resumes_ten_times_in_a_row(tmp_path):
    for attempt in range(10):
        (tmp_path / str(attempt)).mkdir()
        torchrun_kill_and_restart(tmp_path / str(attempt))


# --- every world a rank joins is its own run's ---------------------------------------------------

def test_fixed_port_held_by_another_runs_store_is_refused_before_any_rank_starts(tmp_path):
    """The quick form of the next test: the port is held by a rendezvous store of another run (as its rank 0
    hosts it); the run is refused within seconds naming the port and that run, whose store is untouched."""
    from datetime import timedelta

    import torch.distributed as dist

    from wagma_bench.runtime.launch import free_port

    port = free_port()  # the other run's rank 0 hosts its store there and names the run in it
    holder = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
    holder.set("wagma_bench/run", f"c0ffee {tmp_path / 'holder'}")
    t0 = time.monotonic()
    out = run(QUICK + [f"launcher.master_port={port}", f"hydra.run.dir={tmp_path / 'second'}"], timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    assert time.monotonic() - t0 < 15
    assert f"launcher.master_port={port} is in use on 127.0.0.1 by the rendezvous store of run c0ffee " \
           f"{tmp_path / 'holder'}" in out.stderr, out.stderr[-3000:]
    assert not (tmp_path / "second" / "steps").exists()
    assert holder.num_keys() == 1


@pytest.mark.long
def test_second_run_on_a_fixed_port_in_use_fails_naming_the_port_and_the_holder_completes(tmp_path):
    from wagma_bench.runtime.launch import free_port

    port = free_port()
    holder_dir, second_dir = tmp_path / "holder", tmp_path / "second"
    holder = subprocess.Popen([str(BIN), "run", *QUICK[:1], "train.max_steps=60", "eval.every_steps=1000",
                               "logger.progress=off", f"launcher.master_port={port}", f"hydra.run.dir={holder_dir}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "run_start" not in keys(holder_dir):
            assert holder.poll() is None, holder.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the holder did not start"
            time.sleep(0.1)
        t0 = time.monotonic()
        second = run(QUICK + [f"launcher.master_port={port}", f"hydra.run.dir={second_dir}"], timeout=120)
        took = time.monotonic() - t0
        _, err = holder.communicate(timeout=300)
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.communicate()
    assert holder.returncode == 0, err[-3000:]  # the innocent run is untouched
    assert json.loads((holder_dir / "summary.json").read_text())["status"] == "completed"
    assert second.returncode == 2, second.stderr[-3000:]
    assert f"launcher.master_port={port} is in use" in second.stderr
    assert str(holder_dir) in second.stderr, second.stderr[-3000:]  # names the run that holds it
    assert took < 15, f"{took:.1f} s"
    assert not (second_dir / "steps").exists()


def test_two_runs_racing_for_one_fixed_port_one_completes_the_other_exits_2_before_any_rank_starts(tmp_path):
    """Both launchers start at the same moment; each probes the port and finds it free. The launcher itself
    binds the port (it hosts the run's store) before it starts any rank, so the second to bind exits 2 naming
    the port, while the first runs to its end."""
    from wagma_bench.runtime.launch import free_port

    port = free_port()
    dirs = [tmp_path / "a", tmp_path / "b"]
    procs = [subprocess.Popen([str(BIN), "run", *QUICK[:1], "train.max_steps=8", "eval.every_steps=1000",
                               "logger.progress=off", f"launcher.master_port={port}", f"hydra.run.dir={d}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
             for d in dirs]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], [o[1][-2000:] for o in outs]
    loser = next(i for i, p in enumerate(procs) if p.returncode == 2)
    err = outs[loser][1]
    assert f"wagma-bench run: error: launcher.master_port={port} is in use" in err, err[-3000:]
    assert "Traceback" not in err
    assert not (dirs[loser] / "events.jsonl").exists() and not (dirs[loser] / "steps").exists()  # no rank started
    assert json.loads((dirs[1 - loser] / "summary.json").read_text())["status"] == "completed"


def test_a_rank_that_reaches_another_runs_store_fails_at_once_naming_the_port_and_the_run(tmp_path):
    """The race the port check cannot close (the port taken between the check and rank 0's bind, or a SLURM
    port derived from the job id): a rank of run B that reaches run A's store fails before it writes a key
    there; A's store serves A on."""
    from wagma_bench.runtime.launch import ForeignStore, free_port, join_store

    port = free_port()
    theirs = join_store(("127.0.0.1", port), 0, 30, "1234 /runs/a")
    t0 = time.monotonic()
    with pytest.raises(ForeignStore, match=rf"store at 127.0.0.1:{port} belongs to another run \(1234 /runs/a\)"):
        join_store(("127.0.0.1", port), 1, 30, "5678 /runs/b")
    assert time.monotonic() - t0 < 5
    assert theirs.num_keys() == 1  # nothing of B's in A's store
    ours = join_store(("127.0.0.1", port), 1, 30, "1234 /mnt/runs/a")  # A's own ranks join (the same id)
    assert ours.get("wagma_bench/run") == b"1234 /runs/a"


def test_run_identity_is_the_launchers_id_else_the_directory():
    from wagma_bench.runtime.launch import _same_run, run_identity

    assert run_identity("/r", {"WAGMA_BENCH_RUN_NONCE": "ab12"}) == "ab12 /r"
    assert run_identity("/r", {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1"}) == "slurm-7.1 /r"
    assert run_identity("/r", {}) == "- /r"  # mpiexec: no id
    assert _same_run("slurm-7.1 /a", "slurm-7.1 /b") and not _same_run("slurm-7.1 /a", "slurm-7.2 /a")
    assert _same_run("- /a", "- /a") and not _same_run("- /a", "- /b")


# --- Ctrl-C is a preemption ------------------------------------------------------------------------

def _ranks_of(launcher: subprocess.Popen, nproc: int = 2) -> list[int]:
    deadline = time.monotonic() + 120
    while True:
        ranks = rank_pids(launcher.pid)
        if len(ranks) == nproc:
            return ranks
        assert time.monotonic() < deadline and launcher.poll() is None, "the ranks did not start"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _started(run_dir: Path, launcher: subprocess.Popen, first_step: bool = True) -> None:
    """Until both ranks have logged steps, or (``first_step`` false) until the run has started: run_start is
    logged after a barrier that every rank reaches with its signal handlers installed."""
    deadline = time.monotonic() + 240
    logs = [run_dir / "steps" / f"rank{r}.jsonl" for r in (0, 1)]
    while not (all(p.exists() and p.stat().st_size for p in logs) if first_step else "run_start" in keys(run_dir)):
        assert launcher.poll() is None, launcher.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.1)


def _ctrl_c(run_dir: Path, to_group: bool, extra: tuple[str, ...] = (), presses: int = 1):
    """Ctrl-C a running 2-rank run: SIGINT to the launcher alone, or to its whole process group (a terminal's
    Ctrl-C); returns (launcher, its stderr, seconds from the first press until every rank has ended)."""
    launcher = subprocess.Popen([str(BIN), "run", *QUICK[:1], "train.max_steps=100000", "eval.every_steps=100000",
                                 "logger.progress=off", *extra, f"hydra.run.dir={run_dir}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _started(run_dir, launcher, first_step=presses == 1)
        ranks = _ranks_of(launcher)
        t0 = time.monotonic()
        for press in range(presses):
            if press:
                time.sleep(0.3)
            os.killpg(launcher.pid, signal.SIGINT) if to_group else os.kill(launcher.pid, signal.SIGINT)
        _, err = launcher.communicate(timeout=120)
        while any(_alive(p) for p in ranks):
            assert time.monotonic() - t0 < 60, "ranks outlive their launcher"
            time.sleep(0.1)
        return launcher, err, time.monotonic() - t0
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()


# to the launcher in make test; to the process group (and the rerun) in make test-long
@pytest.mark.parametrize("to_group", [False, pytest.param(True, marks=pytest.mark.long)],
                         ids=["launcher", "process_group"])
def test_ctrl_c_checkpoints_suspends_the_run_exits_130_and_the_rerun_resumes(tmp_path, to_group):
    launcher, err, took = _ctrl_c(tmp_path, to_group)
    assert launcher.returncode == 130, err[-3000:]
    assert took < 15, f"{took:.1f} s"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    events = read_jsonl(tmp_path / "events.jsonl")
    assert events[-1]["key"] == "run_suspend" and events[-1]["metadata"]["status"] == "interrupted"
    assert "run_stop" not in keys(tmp_path)
    at = events[-1]["metadata"]["step"]
    assert [e["metadata"]["step"] for e in events if e["key"] == "checkpoint"][-1] == at
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "interrupted"
    assert f"interrupted at step {at}, checkpoint saved" in err
    if not to_group:
        return  # the rerun is the same for both (the resume of a suspended run: tests/test_faults.py too)
    again = run(QUICK[:1] + ["eval.every_steps=100000", "logger.progress=off", f"train.max_steps={at + 4}",
                             f"hydra.run.dir={tmp_path}"])
    assert again.returncode == 0, again.stderr[-3000:]
    k = keys(tmp_path)
    assert (k.count("run_suspend"), k.count("run_resume"), k.count("run_stop"), k[-1]) == (1, 1, 1, "run_stop")
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == at + 4


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


# --- comm=mpi, a killed rank is named and recorded as comm=torch records it ---------------------

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
    launcher = subprocess.Popen([str(BIN), "run", "comm=mpi", *QUICK[:1], "train.max_steps=100000",
                                 "eval.every_steps=100000", "logger.progress=off", f"hydra.run.dir={tmp_path}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _started(tmp_path, launcher)
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
    assert summary["steps"] == logged[-1]["round"] > 0
    assert summary["samples"] >= sum(s["samples"] for s in logged) > 0


# rank 2 (named rank 0 before) in make test; each other rank in turn in make test-long
@pytest.mark.parametrize("victim", [pytest.param(0, marks=pytest.mark.long), pytest.param(1, marks=pytest.mark.long),
                                    2, pytest.param(3, marks=pytest.mark.long)])
def test_killed_mpi_rank_among_four_is_named_not_the_one_mpiexecs_clean_up_killed(tmp_path, victim):
    """mpiexec (MPICH's hydra) names the PID it lists first among the ranks it killed in its clean-up (rank 0's
    when rank 2 was killed); the launcher names the rank whose process ended first."""
    launcher = subprocess.Popen([str(BIN), "run", "comm=mpi", "launcher.nproc=4", "train.max_steps=100000",
                                 "eval.every_steps=100000", "logger.progress=off", f"hydra.run.dir={tmp_path}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not ((tmp_path / "steps" / "rank3.jsonl").exists() and (tmp_path / "steps" / "rank3.jsonl").stat().st_size):
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
    assert f"rank {victim} was killed by signal SIGKILL" in json.loads((tmp_path / "summary.json").read_text())["error"]


# --- a completed run ends completed (the teardown after the last collective) -------------------

@pytest.fixture
def busy_loop():
    """One niced busy process beside the run, as another job on the node: the ranks' teardowns interleave."""
    proc = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"])
    yield
    proc.kill()
    proc.wait()


def short_runs_end_completed(tmp_path: Path, runs: int) -> None:
    """``runs`` short runs, alternating 2 ranks of WAGMA-SGD (progress threads, forked planes) and 4 of
    eager-SGD, each until its last collective and teardown: every one must end completed, exit 0."""
    for i in range(runs):
        nproc, optimizer = ((2, "wagma"), (4, "eager"))[i % 2]
        run_dir = tmp_path / str(i)
        out = run([f"launcher.nproc={nproc}", f"optimizer={optimizer}", "train.max_steps=2", "eval.every_steps=2",
                   "checkpoint.every_s=1e9", "logger.progress=off", f"hydra.run.dir={run_dir}"])
        assert out.returncode == 0, f"run {i}: {out.stderr[-3000:]}"
        assert "SIGABRT" not in out.stderr
        assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


def test_a_completed_run_ends_completed_under_a_busy_loop(tmp_path, busy_loop):
    short_runs_end_completed(tmp_path, 1)


@pytest.mark.long
def test_forty_short_runs_end_completed_under_a_busy_loop(tmp_path, busy_loop):
    short_runs_end_completed(tmp_path, 40)


def test_a_rank_that_skips_finalization_still_releases_its_semaphores(tmp_path):
    """A local rank ends with os._exit (the ordered shutdown), which skips multiprocessing's finalizers too: the
    named semaphore that fairseq makes at import (fairseq.pdb's stdin lock) was left to the launcher's resource
    tracker, which warned at the end of every Transformer run ("4 leaked semaphore objects")."""
    out = run(["workload=transformer", "launcher.nproc=2", "train.max_steps=2", "eval.target=null",
               "checkpoint.every_s=1e9", "logger.progress=off", f"hydra.run.dir={tmp_path}"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "leaked semaphore" not in out.stderr, out.stderr[-2000:]


def test_a_rank_error_is_not_written_through_a_planted_link(tmp_path):
    """report_error is best effort (the launcher may be gone): through a link it writes nothing, silently."""
    victim = _victim(tmp_path)
    run_dir = tmp_path / "run"
    (run_dir / ".heartbeats").mkdir(parents=True)
    (run_dir / ".heartbeats" / "rank0.error").symlink_to(victim)
    _rank_error(run_dir)
    assert victim.read_text() == VICTIM


def _ctrl_c_while_starting(run_dir: Path, presses: int):
    """Ctrl-C the launcher as it starts its ranks (its fork server still importing torch): no rank exists yet
    to take the forward, nor, a moment later, has one installed its handler."""
    launcher = subprocess.Popen([str(BIN), "run", *QUICK[:1], "train.max_steps=100000", "eval.every_steps=100000",
                                 "logger.progress=off", f"hydra.run.dir={run_dir}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert "local ranks" in launcher.stdout.readline()  # printed as the launcher takes Ctrl-C over
        time.sleep(0.1)
        assert fork_servers(launcher.pid)
        assert not rank_pids(launcher.pid), "the ranks had started: too late to test their start"
        for press in range(presses):
            os.kill(launcher.pid, signal.SIGINT)
            time.sleep(0.3)
        _, err = launcher.communicate(timeout=180)
        return launcher, err
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()


def test_ctrl_c_while_the_ranks_start_stops_the_run_before_its_first_step(tmp_path):
    launcher, err = _ctrl_c_while_starting(tmp_path, presses=1)
    assert launcher.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == 0, summary  # no step after the Ctrl-C
    assert not list((tmp_path / "steps").glob("*.jsonl")) or not any(
        p.read_text().strip() for p in (tmp_path / "steps").glob("*.jsonl"))
    assert "interrupted before its first step (nothing to checkpoint)" in err, err[-3000:]
    assert keys(tmp_path)[-1] == "run_suspend"  # resumable: the rerun starts it
    again = run(QUICK[:1] + ["train.max_steps=4", "eval.every_steps=4", f"hydra.run.dir={tmp_path}"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"


def test_a_second_ctrl_c_while_the_ranks_start_stops_at_once_and_claims_no_checkpoint(tmp_path):
    launcher, err = _ctrl_c_while_starting(tmp_path, presses=2)
    assert launcher.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "stopped at once by a second Ctrl-C" in err and "no checkpoint was saved" in err, err[-3000:]
    assert "resume from the last checkpoint" not in err
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "interrupted"


def test_ctrl_c_before_the_ranks_start_ends_in_one_line(tmp_path):
    """Ctrl-C as the launcher composes its configuration (its fork server just started), before it has taken
    Ctrl-C over: one line, exit 130. SIGINT's default disposition is restored for the launcher, as a terminal
    gives it (a test run in a background job would pass it on ignored)."""
    argv = [str(BIN), "run", *QUICK[:1], f"hydra.run.dir={tmp_path}"]
    default_sigint = f"import os, signal; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv({argv[0]!r}, {argv!r})"
    launcher = subprocess.Popen([sys.executable, "-c", default_sigint], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (servers := fork_servers(launcher.pid)):
            assert time.monotonic() < deadline and launcher.poll() is None, "no fork server started"
            time.sleep(0.01)
        os.kill(launcher.pid, signal.SIGINT)
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "interrupted before any rank started" in err, err[-3000:]
    time.sleep(0.5)
    assert not _alive(servers[0])  # the fork server went with its launcher, not on importing
