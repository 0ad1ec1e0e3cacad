"""Cluster launcher conventions, end to end with real ranks: preemption signals (SLURM's USR1, submitit's
USR2), the run directory that every rank of a torchrun world agrees on, restarts that find it again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from wagma_bench.events import read_jsonl

BIN = Path(sys.executable).parent / "wagma-bench"


def _rank_pids(pid: int) -> list[int]:
    """The spawned rank processes of a local `wagma-bench run` (not its resource tracker)."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True,
                         check=False).stdout
    return [int(p) for p in out.split() if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text()]


def _wait_for_steps(run_dir: Path, ranks: int, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    """Until every rank has flushed its step log (first control point): the signal handlers are installed."""
    deadline = time.monotonic() + timeout_s
    logs = [run_dir / "steps" / f"rank{r}.jsonl" for r in range(ranks)]
    while not all(p.exists() and p.stat().st_size for p in logs):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.2)


def test_usr2_checkpoints_and_stops_preempted(tmp_path):
    """submitit's USR2 reaches every rank (as SLURM's USR1 does): checkpoint at the next sync point, stop."""
    proc = subprocess.Popen([str(BIN), "run", "launcher.nproc=2", "train.max_steps=100000", "eval.every_steps=100000",
                             "checkpoint.every_s=1e9", "logger.progress=off", f"hydra.run.dir={tmp_path}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_steps(tmp_path, 2, proc)
        ranks = _rank_pids(proc.pid)
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
    stop = events[-1]
    assert stop["key"] == "run_stop" and stop["metadata"]["status"] == "preempted", stop
    assert ckpt["metadata"]["step"] == stop["metadata"]["step"] < 100000
    assert (tmp_path / "checkpoint" / "meta.json").exists()
