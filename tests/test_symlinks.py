"""No command writes through a symbolic link someone planted: a run's own files (refused before any rank
starts, naming the link), an atomic write's temporary name, a rank's error record, and the outputs of report,
tune, sweep, simulate and comm-bench (`claims --out`: tests/test_claims.py). Each through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli_util import BIN, QUICK, run
from tests.test_report import write_run

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
    from wagma_bench.record.files import write_json_atomic

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
    from wagma_bench.record.steps import StepLog

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
    from wagma_bench.record.files import SymlinkRefused

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


# the temporary names of this process (computed when the test runs: an id with a pid differs per xdist worker)
@pytest.mark.parametrize(
    "write,temporary",
    [
        (_mllog, lambda: f".mllog.txt.tmp{os.getpid()}"),
        (_lock, lambda: f".lock.{os.uname().nodename}.{os.getpid()}"),
    ],
    ids=["mllog", "lock"],
)
def test_planted_link_at_a_temporary_name_is_not_written_through(tmp_path, write, temporary):
    from tests.test_mllog import evaluation, event, start_event, write_events

    victim = _victim(tmp_path)
    run_dir = write_events(
        tmp_path / "run",
        [start_event(), evaluation(2000, 10, 0.95), event("run_stop", 2100, step=10, status="completed")],
    )
    (run_dir / temporary()).symlink_to(victim)
    write(run_dir)
    assert victim.read_text() == VICTIM
    assert not (run_dir / "mllog.txt").is_symlink()


def test_a_rank_error_is_not_written_through_a_planted_link(tmp_path):
    """report_error is best effort (the launcher may be gone): through a link it writes nothing, silently."""
    victim = _victim(tmp_path)
    run_dir = tmp_path / "run"
    (run_dir / ".heartbeats").mkdir(parents=True)
    (run_dir / ".heartbeats" / "rank0.error").symlink_to(victim)
    _rank_error(run_dir)
    assert victim.read_text() == VICTIM


KEEP = "someone else's file\n"


def _plant(link: Path, tmp_path: Path) -> Path:
    victim = tmp_path / f"victim-{link.name}"
    victim.write_text(KEEP)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)
    return victim


def _one_line_naming(stderr: str, link: Path) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert f"{link} is a symbolic link" in lines[0] and "never writes through a link" in lines[0], lines[0]


def test_report_refuses_planted_links(tmp_path, capsys):
    from wagma_bench.cli.report import main

    runs = tmp_path / "runs"
    write_run(runs / "a", "allreduce", 1, [(10, 5.0, 0.5), (20, 10.0, 0.95)])
    out = tmp_path / "report"
    victims = [_plant(out / name, tmp_path) for name in ("runs.csv", "report.md")]
    assert main([str(runs), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    _one_line_naming(err, out / "runs.csv")
    assert (
        f"{out / 'report.md'} is a symbolic link" in err
    )  # every link named at once, before any file moves in
    assert all(v.read_text() == KEEP for v in victims)
    (out / "runs.csv").unlink()
    assert main([str(runs), "--out", str(out)]) == 2
    _one_line_naming(capsys.readouterr().err, out / "report.md")
    assert all(v.read_text() == KEEP for v in victims)


def test_tune_refuses_a_planted_log_before_its_trial_runs(tmp_path):
    out = tmp_path / "tuned"
    victim = _plant(out / "logs" / "allreduce_study1_trial1.log", tmp_path)
    proc = subprocess.run(
        [
            str(BIN),
            "tune",
            "workload=resnet",
            "optimizer=allreduce",
            "tune.trials=1",
            "tune.studies=1",
            "train.max_rounds=2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    _one_line_naming(proc.stderr, out / "logs" / "allreduce_study1_trial1.log")
    assert victim.read_text() == KEEP
    assert not (
        out / "trials" / "allreduce_study1_trial1" / "events.jsonl"
    ).exists()  # the trial never started


def test_sweep_refuses_a_planted_job_script(tmp_path):
    out = tmp_path / "sweep"
    script = out / "jobs" / "000_0004gpu.sbatch"
    victim = _plant(script, tmp_path)
    proc = subprocess.run(
        [str(BIN), "sweep", "cluster=local", "gpus=4", "optimizer=allreduce", "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    _one_line_naming(proc.stderr, script)
    assert victim.read_text() == KEEP


@pytest.mark.parametrize("folder", ["jobs", "logs", "runs"])
def test_sweep_refuses_a_planted_link_at_a_folder_it_creates(tmp_path, folder):
    """A link at jobs/ used to take the job scripts into its target (exit 0); one at logs/ or runs/ was
    accepted, and SLURM would later have written the job logs and the runs through it."""
    out = tmp_path / "sweep"
    out.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "kept.txt").write_text(KEEP)
    (out / folder).symlink_to(target)
    proc = subprocess.run(
        [str(BIN), "sweep", "cluster=local", "gpus=4", "optimizer=allreduce", "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    _one_line_naming(proc.stderr, out / folder)
    assert [p.name for p in target.iterdir()] == ["kept.txt"] and (target / "kept.txt").read_text() == KEEP
    assert not (out / "manifest.json").exists()  # refused before anything was rendered
    assert not list((out / "jobs").glob("*.sbatch"))  # no job script beside the refused link either


def test_simulate_refuses_a_planted_prediction_file(tmp_path, capsys):
    from wagma_bench.cli.simulate import main

    out = tmp_path / "sim"
    victim = _plant(out / "predictions.json", tmp_path)
    assert (
        main(["cluster=generic8", "gpus=2", "optimizer=allreduce", "train.max_rounds=22", "--out", str(out)])
        == 2
    )
    _one_line_naming(capsys.readouterr().err, out / "predictions.json")
    assert victim.read_text() == KEEP


def test_comm_bench_refuses_a_planted_output_before_any_rank_starts(tmp_path):
    out = tmp_path / "comm-bench.json"
    victim = _plant(out, tmp_path)
    proc = subprocess.run(
        [str(BIN), "comm-bench", "--nproc", "2", "--sizes", "4K", "--repeats", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    _one_line_naming(proc.stderr, out)
    assert victim.read_text() == KEEP
    assert "comm-bench: backend" not in proc.stdout


def test_a_link_at_the_checked_configuration_under_mpi_is_one_line(tmp_path):
    """comm=mpi: the launching process writes the checked configuration for the ranks mpiexec starts; a link
    there was Hydra's "Error executing job" and a traceback ending in SymlinkRefused, exit 1."""
    victim = _victim(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checked_config.json").symlink_to(victim)
    out = run([*QUICK, "comm=mpi", f"hydra.run.dir={run_dir}"], timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"{run_dir / 'checked_config.json'} is a symbolic link (to {victim})" in lines[-1], lines
    assert victim.read_text() == VICTIM
