"""How a run ends and what it says: a diverged run (exit 3, where and why, strict JSON), which budget ends a
run, operational errors (a read-only or full disk, a missing directory) in one line with the documented exit
code, checkpoints without their event log, an MLLOG of an earlier end, and what report makes of a damaged
event log or a run still in progress."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli_util import QUICK, run


def _strict(path: Path) -> list[dict]:
    """Every line of a JSONL file read by a strict reader (no NaN / Infinity tokens)."""

    def refuse(token):
        raise ValueError(f"{path}: bare {token} is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def test_diverged_run_exits_3_naming_step_and_rank_with_strict_json_logs(tmp_path, capsys):
    run_dir = tmp_path / "run"
    out = run(
        [
            "launcher.nproc=2",
            "train.max_rounds=40",
            "eval.every_rounds=20",
            "logger.progress=off",
            "train.lr=1e6",
            "train.weight_decay=0",
            f"hydra.run.dir={run_dir}",
        ]
    )
    assert out.returncode == 3, out.stderr[-3000:]
    errors = [x for x in out.stderr.splitlines() if x.startswith("wagma-bench run: error:")]
    assert len(errors) == 1 and "diverged: the training loss became" in errors[0], out.stderr[-3000:]
    assert " on rank " in errors[0] and " at step " in errors[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["error"] in errors[0]
    for rank in (0, 1):
        steps = _strict(run_dir / "steps" / f"rank{rank}.jsonl")
        assert any(s["loss"] is None for s in steps)  # the non-finite loss, as null
    _strict(run_dir / "events.jsonl")
    code, err = report([str(run_dir), "--out", str(tmp_path / "report")], capsys)
    assert code == 0, err
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| diverged |" in text  # the comparison's column header
    comparison = next(line for line in text.splitlines() if line.startswith("| allreduce |"))
    assert comparison.rstrip().endswith("| 1 |"), comparison  # one diverged run, its throughput not counted


def test_checkpoints_without_an_event_log_are_refused_naming_what_is_missing(checkpointed, tmp_path):
    """A copy of the session's shared finished run (tests/conftest.py: QUICK, checkpoints every round) without
    its event log, resumed with a larger budget."""
    run_dir = tmp_path / "run"
    shutil.copytree(checkpointed, run_dir)
    assert (run_dir / "checkpoint" / "latest").exists() and (run_dir / "mllog.txt").exists()
    (run_dir / "events.jsonl").unlink()
    again = run(
        [a.replace("max_rounds=12", "max_rounds=24") for a in QUICK]
        + ["checkpoint.every_s=0", f"hydra.run.dir={run_dir}"],
        timeout=120,
    )
    assert again.returncode == 2, again.stderr[-3000:]
    line = next(x for x in again.stderr.splitlines() if x.startswith("wagma-bench run: error:"))
    assert (
        f"its event log {run_dir / 'events.jsonl'} is missing" in line and "checkpoint.resume=false" in line
    )
    assert not (run_dir / "steps" / "rank0.jsonl").read_text().count('"local_step": 13')  # nothing trained


def test_mllog_of_an_earlier_end_never_stands_for_a_later_one(tmp_path):
    """An end whose events cannot give an MLPerf log (no run_start) removes the earlier log."""
    from wagma_bench.record.mlperf import write_mllog

    (tmp_path / "mllog.txt").write_text(':::MLLOG {"key": "run_stop", "metadata": {"epoch_num": 3}}\n')
    (tmp_path / "events.jsonl").write_text(
        json.dumps({"key": "run_resume", "value": None, "time_ms": 1, "metadata": {"step": 4}}) + "\n"
    )
    assert write_mllog(tmp_path) is None
    assert not (tmp_path / "mllog.txt").exists()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A short finished run (also the run budget's: 4,500 samples / (2 ranks x 64) = 36 steps per epoch, so
    train.epochs=0.1 gives 4 steps and train.max_rounds=6 goes beyond them)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    out = run(
        [
            "launcher.nproc=2",
            "train.batch_size=64",
            "train.epochs=0.1",
            "train.max_rounds=6",
            "eval.every_rounds=3",
            "logger.progress=off",
            f"hydra.run.dir={run_dir}",
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir, out


@pytest.fixture
def finished(finished_run) -> Path:
    return finished_run[0]


def report(args: list[str], capsys) -> tuple[int, str]:
    """``wagma-bench report ARGS`` in this process (its stderr)."""
    from wagma_bench.cli.report import main

    code = main(args)
    return code, capsys.readouterr().err


def test_report_warns_about_each_unreadable_line_naming_file_and_line(finished, tmp_path, capsys):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    lines = (run_dir / "events.jsonl").read_text().splitlines(keepends=True)
    evals = [i for i, line in enumerate(lines) if '"eval_accuracy"' in line]
    lines[evals[0]] = lines[evals[0]][:25] + "\n"  # a damaged line in the middle
    (run_dir / "events.jsonl").write_text("".join(lines))
    code, err = report([str(run_dir), "--out", str(tmp_path / "report")], capsys)
    assert code == 0, err
    assert f"warning: {run_dir / 'events.jsonl'} line {evals[0] + 1}: not JSON, skipped" in err
    assert (
        f"unreadable line(s) {evals[0] + 1} of events.jsonl skipped"
        in (tmp_path / "report" / "report.md").read_text()
    )


def test_report_shows_a_run_with_a_live_lock_as_running_and_does_not_compare_it(finished, tmp_path, capsys):
    import os
    import shutil
    import socket

    done, live = tmp_path / "runs" / "done", tmp_path / "runs" / "live"
    shutil.copytree(finished, done)
    shutil.copytree(finished, live)
    events = (live / "events.jsonl").read_text().splitlines(keepends=True)
    (live / "events.jsonl").write_text("".join(e for e in events if '"run_stop"' not in e))
    (live / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": 0}))
    code, err = report([str(tmp_path / "runs"), "--out", str(tmp_path / "report")], capsys)
    assert code == 0, err
    text = (tmp_path / "report" / "report.md").read_text()
    live_row = next(line for line in text.splitlines() if line.startswith("| live |"))
    assert "| running |" in live_row and "not compared" in live_row, live_row
    comparison = next(line for line in text.splitlines() if line.startswith("| allreduce | 2 |"))
    assert comparison.startswith("| allreduce | 2 | none | 1 |"), comparison  # one seed: the finished run


def test_run_says_which_budget_ends_it_and_max_rounds_beyond_the_epochs_wins(finished_run):
    run_dir, out = finished_run
    assert "budget: 6 rounds (train.max_rounds=6, beyond train.epochs=0.1)" in out.stdout, out.stdout[-2000:]
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 6


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a small tmpfs at a fresh folder (root only; skipped where mounting is not allowed); yields a
    function that remounts it read-only or fills it."""
    where = tmp_path / "fs"
    where.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)], capture_output=True, check=False
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here (needs root)")

    def make(state: str) -> Path:
        if state == "read-only":
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        elif state == "full":
            try:
                with open(where / "filler", "wb") as f:
                    while True:
                        f.write(b"\0" * 4096)
                        f.flush()
            except OSError:  # ENOSPC: full
                pass
        return where

    yield make
    subprocess.run(["umount", str(where)], check=False)


def _one_line(out: subprocess.CompletedProcess, code: int, *words: str) -> None:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == code and len(lines) == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and all(w in lines[0] for w in words), lines


def test_operational_errors_end_in_one_line_with_the_documented_exit_code(tmpfs, finished, tmp_path):
    fs = tmpfs("read-only")
    _one_line(
        run(["launcher.nproc=2", f"hydra.run.dir={fs / 'run'}"], timeout=120),
        2,
        f"the run directory {fs / 'run'} cannot be written",
        "Read-only file system",
    )
    _one_line(
        run(["launcher.nproc=2"], timeout=120, cwd=fs), 2, f"the current directory {fs} cannot be written"
    )
    _one_line(
        run(["workload=transformer", "workload.max_sentences=1.5"], timeout=120),
        2,
        "workload.max_sentences=1.5 is not allowed; it must be an integer",
    )
    _one_line(
        run(["tune.max_runtime_s=nan", "--out", str(tmp_path / "t")], timeout=120, command="tune"),
        2,
        "tune.max_runtime_s=nan is not allowed",
    )
    subprocess.run(["mount", "-o", "remount,rw", str(fs)], check=True)
    full = tmpfs("full")
    _one_line(
        run([str(finished), "--out", str(full / "report")], timeout=120, command="report"),
        1,
        "No space left on device",
    )
    assert sorted(p.name for p in full.iterdir()) == ["filler"]  # no --out made, no temporary folder left


PAGE = 4096  # tmpfs counts its room in pages


def test_report_that_runs_out_of_room_partway_leaves_the_previous_outputs(tmpfs, finished, tmp_path):
    """`report --out` wrote its files into --out one by one: on a full disk it left the new figures beside the
    previous report.md, a mix of two reports. Here the disk has room for the first figure but not for all."""
    reference = tmp_path / "reference"  # what the report writes, and in which order
    assert run([str(finished), "--out", str(reference)], timeout=120, command="report").returncode == 0
    written = sorted(reference.iterdir(), key=lambda p: p.stat().st_mtime_ns)
    pages = [-(-p.stat().st_size // PAGE) for p in written]
    room = (pages[0] + 1) * PAGE  # the first file fits, the whole report does not
    assert sum(pages) * PAGE > room
    fs = tmpfs("none")
    out = fs / "report"
    out.mkdir()
    before = {
        "report.md": b"# the previous report\n",
        "runs.csv": b"group,run\nold,1\n",
        "comparison.csv": b"x\n",
    }
    for name, data in before.items():
        (out / name).write_bytes(data)
    tmpfs("full")
    os.truncate(fs / "filler", (fs / "filler").stat().st_size - room)
    _one_line(
        run([str(finished), "--out", str(out)], timeout=120, command="report"), 1, "No space left on device"
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in fs.iterdir()) == ["filler", "report"]  # no temporary folder left beside it


@pytest.mark.parametrize(
    "status,ended",
    [
        ("completed", True),
        ("time_limit", True),
        ("diverged", True),
        ("failed", True),
        ("interrupted", False),
        ("preempted", False),
        (None, False),
    ],
)
def test_reproduce_scripts_read_an_ended_run_and_run_an_interrupted_one_again(tmp_path, status, ended):
    """campaign.runs.run_unless_done, what the scripts under reproduce/ build their campaigns from: a summary
    left by a Ctrl-C or a preemption is not a result (the rerun resumes the run); a missing or torn summary
    neither."""
    from wagma_bench.campaign.runs import ended as run_ended

    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"status": status}) if status else '{"status": "comp')
    assert run_ended(summary) is ended
