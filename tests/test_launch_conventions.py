"""Cluster launcher conventions, end to end with real ranks: preemption signals (SLURM's USR1, submitit's
USR2), the run directory that every rank of a torchrun world agrees on, restarts that find it again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_util import BIN, keys
from tests.proc_util import rank_pids
from tests.validate_count import counting_env, validated_once
from wagma_bench.record.checkpoint import latest_set
from wagma_bench.record.files import read_jsonl


def _wait_for_steps(run_dir: Path, ranks: int, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    """Until every rank has flushed its step log (first control point): the signal handlers are installed."""
    deadline = time.monotonic() + timeout_s
    logs = [run_dir / "steps" / f"rank{r}.jsonl" for r in range(ranks)]
    while not all(p.exists() and p.stat().st_size for p in logs):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.2)


def test_usr2_checkpoints_and_stops_preempted(tmp_path):
    """submitit's USR2 reaches every rank (as SLURM's USR1 does): checkpoint at the next sync point, stop.
    (Batches of 8 images a rank: the rounds until the signal's checkpoint cost a quarter.)"""
    proc = subprocess.Popen(
        [
            str(BIN),
            "run",
            "launcher.nproc=2",
            "train.batch_size=8",
            "train.max_rounds=100000",
            "eval.every_rounds=100000",
            "checkpoint.every_s=1e9",
            "logger.progress=off",
            f"hydra.run.dir={tmp_path}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for_steps(tmp_path, 2, proc)
        ranks = rank_pids(proc.pid)
        assert len(ranks) == 2, ranks
        for pid in ranks:
            os.kill(pid, signal.SIGUSR2)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "no job to requeue" in out  # outside SLURM: said, not attempted
    events = read_jsonl(tmp_path / "events.jsonl")
    ckpt = next(e for e in events if e["key"] == "checkpoint")
    stop = events[-1]  # stopped to be resumed: suspended, not the run's one run_stop
    assert stop["key"] == "run_suspend" and stop["metadata"]["status"] == "preempted", stop
    assert ckpt["metadata"]["round"] == stop["metadata"]["round"] < 100000
    assert latest_set(tmp_path) is not None


def _torchrun_with_late_rank(
    cwd: Path, rdzv_id: str | None, args: list[str], env: dict | None = None
) -> subprocess.CompletedProcess:
    """A 2-rank torchrun world (c10d rendezvous, id ``rdzv_id``; None: torchrun's default static rendezvous)
    whose local rank 1 starts 3 s late, as ranks on different nodes do; no hydra.run.dir, so the run
    directory is whatever the ranks agree on."""
    wrapper = cwd / "late_rank1.sh"
    wrapper.write_text(
        f'#!/bin/sh\n[ "$LOCAL_RANK" = 1 ] && sleep 3\nexec {sys.executable} -m wagma_bench run "$@"\n'
    )
    wrapper.chmod(0o755)
    from wagma_bench.runtime.launch import free_port

    torchrun = Path(sys.executable).parent / "torchrun"
    rdzv = (
        ["--rdzv-backend", "c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id", rdzv_id]
        if rdzv_id
        else [f"--master-port={free_port()}"]
    )
    cmd = [
        str(torchrun),
        "--nnodes",
        "1",
        "--nproc_per_node",
        "2",
        *rdzv,
        "--no-python",
        str(wrapper),
        "logger.progress=off",
        "checkpoint.every_s=0",
        *args,
    ]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_torchrun_ranks_agree_on_the_run_directory_and_a_restart_finds_it(tmp_path):
    """Also the configuration checked once in a torchrun world (tests/test_config_once.py's check on the other
    launchers; this world serves both): rank 0 checks it and hands it to the others. A resubmitted job (the
    same rendezvous id) names the same directory: asserted on the name every rank computes from the id
    (``agreed_run_dir_override``); that restarted ranks resume in an agreed directory is asserted end to end
    by torchrun's restart below (test_torchrun_restart_after_a_killed_worker_resumes), which had a second
    world of its own here."""
    from wagma_bench.runtime.launch import agreed_run_dir_override

    env, log = counting_env(tmp_path)
    first = _torchrun_with_late_rank(tmp_path, "job42", ["train.max_rounds=6", "eval.every_rounds=6"], env)
    assert first.returncode == 0, first.stderr[-3000:]
    validated_once(log, 2)
    run_dirs = {p.parent.parent for p in (tmp_path / "outputs").rglob("steps/rank*.jsonl")}
    assert len(run_dirs) == 1, run_dirs  # one directory, not one per rank's clock
    (run_dir,) = run_dirs
    assert run_dir.relative_to(tmp_path / "outputs").as_posix() == "torchrun-job42_resnet_allreduce"
    found = latest_set(run_dir)
    assert found is not None, "no complete checkpoint set"
    for rank in (0, 1):
        assert (run_dir / "steps" / f"rank{rank}.jsonl").exists() and (found[0] / f"rank{rank}.pt").exists()
    # a restart under the same rendezvous id (a resubmitted job, its ranks' clocks later) names it again
    again = agreed_run_dir_override(
        ["train.max_rounds=12"], {"TORCHELASTIC_RUN_ID": "job42", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    )
    assert again == "hydra.run.dir=outputs/torchrun-job42_${workload.name}_${optimizer.name}"


# make test: torchrun's default id in the restart test below, rank 1 3 s late in its restarted attempt
@pytest.mark.long
def test_torchrun_without_rdzv_id_ranks_share_the_first_ranks_clock(tmp_path):
    out = _torchrun_with_late_rank(tmp_path, None, ["train.max_rounds=2", "eval.every_rounds=2"])
    assert out.returncode == 0, out.stderr[-3000:]
    run_dirs = {p.parent.parent for p in (tmp_path / "outputs").rglob("steps/rank*.jsonl")}
    assert len(run_dirs) == 1, run_dirs
    assert (run_dirs.pop() / "steps" / "rank1.jsonl").exists()


def test_run_directory_from_the_launchers_stable_id():
    from wagma_bench.runtime.launch import agreed_run_dir_override, launcher_run_id

    assert launcher_run_id({"TORCHELASTIC_RUN_ID": "a b/c"}) == "torchrun-a_b_c"
    assert (
        launcher_run_id({"TORCHELASTIC_RUN_ID": "none"}) is None
    )  # torchrun's default: shared by unrelated runs
    assert launcher_run_id({"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "1"}) == "slurm-77.1"
    assert (
        launcher_run_id(
            {
                "SLURM_JOB_ID": "78",
                "SLURM_ARRAY_JOB_ID": "70",
                "SLURM_ARRAY_TASK_ID": "8",
                "SLURM_STEP_ID": "0",
            }
        )
        == "slurm-70_8.0"
    )
    assert launcher_run_id({"OMPI_COMM_WORLD_RANK": "0"}) is None
    env = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"}
    assert (
        agreed_run_dir_override(["optimizer=wagma"], env)
        == "hydra.run.dir=outputs/slurm-77.0_${workload.name}_${optimizer.name}"
    )
    assert agreed_run_dir_override(["hydra.run.dir=/x"], env) is None  # the user's choice wins
    assert agreed_run_dir_override(["-m", "seed=1,2"], env) is None  # multirun: Hydra's sweep directory
    # torchrun's default id: the clock of the first rank, shared through torchrun's store
    torchrun = {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert (
        agreed_run_dir_override([], torchrun, shared_stamp=lambda env: "2026-01-02/03-04-05")
        == "hydra.run.dir=outputs/2026-01-02/03-04-05_${workload.name}_${optimizer.name}"
    )
    assert agreed_run_dir_override([], {"OMPI_COMM_WORLD_RANK": "1"}, shared_stamp=None) is None  # mpiexec


def test_device_plan_ranks_backend_and_device():
    import pytest

    from wagma_bench.errors import ConfigError
    from wagma_bench.runtime.launch import DevicePlan, device_plan

    assert device_plan(0, None, "auto") == DevicePlan(4, "gloo", False)  # `make run` on a CPU: 4 ranks
    assert device_plan(8, None, "auto") == DevicePlan(8, "nccl", True)  # one rank per visible GPU
    assert device_plan(2, 2, "nccl") == DevicePlan(2, "nccl", True)
    one_gpu = device_plan(1, 4, "auto")  # a one-GPU workstation asked for 4 ranks
    assert (one_gpu.nproc, one_gpu.backend, one_gpu.cuda) == (4, "gloo", True)
    assert "gloo with CUDA tensors" in one_gpu.note
    with pytest.raises(ConfigError, match="4 ranks on 1 GPU.*launcher.nproc<=1"):
        device_plan(1, 4, "nccl")
    with pytest.raises(ConfigError, match="needs CUDA"):
        device_plan(0, 2, "nccl")
    assert device_plan(4, 2, "gloo") == DevicePlan(2, "gloo", False)  # gloo asked for: CPU, as before
    assert device_plan(1, 4, "mpi") == DevicePlan(4, "mpi", True)


def test_impossible_nccl_world_fails_before_spawning(tmp_path):
    import re

    import torch

    ranks = torch.cuda.device_count() + 2  # more ranks than GPUs, wherever it runs
    out = subprocess.run(
        [str(BIN), "run", "comm.backend=nccl", f"launcher.nproc={ranks}", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert re.search(r"comm.backend=nccl (needs CUDA|with \d+ ranks on \d+ GPU)", out.stderr), out.stderr[
        -3000:
    ]
    assert "local ranks" not in out.stdout
    assert not (tmp_path / "events.jsonl").exists()


def _workers_by_local_rank(agent_pid: int) -> dict[int, int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(agent_pid)], capture_output=True, text=True, check=False
    ).stdout
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


def _run_dir_under(root: Path) -> Path | None:
    """The one run directory the ranks agreed on under ``root`` (torchrun's default id: the first rank's
    clock, ``outputs/DATE/TIME_resnet_allreduce``); None before a rank has made it."""
    found = {p.parent for p in (root / "outputs").glob("*/*/events.jsonl")}
    assert len(found) <= 1, found  # one directory, not one per rank's clock
    return found.pop() if found else None


def torchrun_kill_and_restart(tmp_path: Path) -> None:
    """A 2-rank run under ``torchrun --max-restarts 1``; local rank 1 is SIGKILLed after the first checkpoint
    (round 10 of 30: the kill has 20 rounds to land before the run ends, on a busy machine too).
    In the restarted attempt rank 1 starts 3 s late, so rank 0 reads rank 1's store keys before rank 1 has
    written them: the previous attempt's keys (gloo's address of the killed worker), where the agent's store
    still serves them under the same names.
    No hydra.run.dir and torchrun's default id (``none``): every rank of both attempts names the run directory
    by the first rank's clock, shared through the agent's store, so the restarted ranks, rank 1 3 s late, find
    the first attempt's directory and resume there (before that sharing each rank took its own clock)."""
    from wagma_bench.runtime.launch import free_port

    wrapper = tmp_path / "late_rank1_on_restart.sh"
    wrapper.write_text(
        '#!/bin/sh\n[ "$LOCAL_RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 1 ] && sleep 3\n'
        f'exec {sys.executable} -m wagma_bench run "$@"\n'
    )
    wrapper.chmod(0o755)
    torchrun = Path(sys.executable).parent / "torchrun"
    agent = subprocess.Popen(
        [
            str(torchrun),
            "--nnodes",
            "1",
            "--nproc_per_node",
            "2",
            "--max-restarts",
            "1",
            f"--master-port={free_port()}",
            "--no-python",
            str(wrapper),
            "logger.progress=off",
            "checkpoint.every_s=0",
            "train.max_rounds=30",
            "eval.every_rounds=1000",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while (run_dir := _run_dir_under(tmp_path)) is None or not _checkpointed(run_dir):
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
    assert _run_dir_under(tmp_path) == run_dir and run_dir.name.endswith("_resnet_allreduce"), run_dir
    assert (run_dir / "steps" / "rank1.jsonl").exists()
    k = keys(run_dir)
    assert (k.count("run_start"), k.count("run_resume"), k.count("run_stop"), k[-1]) == (1, 1, 1, "run_stop")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["rounds"]) == ("completed", 30)
    assert not (run_dir / ".lock").exists()


def test_torchrun_restart_after_a_killed_worker_resumes(tmp_path):  # an outcome, no wait asserted: not serial
    torchrun_kill_and_restart(tmp_path)


@pytest.mark.long
def test_torchrun_restart_after_a_killed_worker_resumes_ten_times_in_a_row(tmp_path):
    for attempt in range(10):
        (tmp_path / str(attempt)).mkdir()
        torchrun_kill_and_restart(tmp_path / str(attempt))
