"""The end of a run: every rank of a completed run ends completed, also with the cores taken by a busy loop
and over forty short runs in a row (reproduce/teardown/ stresses the same at length). That a rank which skips
the interpreter's finalization still releases what it holds: tests/test_mllog.py's Transformer run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_util import run


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
        out = run(
            [
                f"launcher.nproc={nproc}",
                f"optimizer={optimizer}",
                "train.max_rounds=2",
                "eval.every_rounds=2",
                "checkpoint.every_s=1e9",
                "logger.progress=off",
                f"hydra.run.dir={run_dir}",
            ]
        )
        assert out.returncode == 0, f"run {i}: {out.stderr[-3000:]}"
        assert "SIGABRT" not in out.stderr
        assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


def test_a_completed_run_ends_completed_under_a_busy_loop(tmp_path, busy_loop):
    short_runs_end_completed(tmp_path, 1)


@pytest.mark.long
def test_forty_short_runs_end_completed_under_a_busy_loop(tmp_path, busy_loop):
    short_runs_end_completed(tmp_path, 40)
