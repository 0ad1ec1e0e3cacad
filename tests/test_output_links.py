"""Every command's output refuses a symbolic link planted where it writes, naming it, and leaves the link's
target as it was: `report --out`, `tune --out` (its logs), `sweep --out`, `simulate --out`, `comm-bench --out`
(`claims --out`: tests/test_claims.py; the run directory: tests/test_hostile.py). Before the shared writer, the
report and tune cases overwrote or appended to the target."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.test_report import write_run

BIN = Path(sys.executable).parent / "wagma-bench"
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
    from wagma_bench.analysis.report import main

    runs = tmp_path / "runs"
    write_run(runs / "a", "allreduce", 1, [(10, 5.0, 0.5), (20, 10.0, 0.95)])
    out = tmp_path / "report"
    victims = [_plant(out / name, tmp_path) for name in ("runs.csv", "report.md")]
    assert main([str(runs), "--out", str(out)]) == 2
    _one_line_naming(capsys.readouterr().err, out / "runs.csv")
    assert all(v.read_text() == KEEP for v in victims)
    (out / "runs.csv").unlink()
    assert main([str(runs), "--out", str(out)]) == 2
    _one_line_naming(capsys.readouterr().err, out / "report.md")
    assert all(v.read_text() == KEEP for v in victims)


def test_tune_refuses_a_planted_log_before_its_trial_runs(tmp_path):
    out = tmp_path / "tuned"
    victim = _plant(out / "logs" / "allreduce_study1_trial1.log", tmp_path)
    proc = subprocess.run([str(BIN), "tune", "workload=resnet", "optimizer=allreduce", "tune.trials=1",
                           "tune.studies=1", "train.max_steps=2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr
    _one_line_naming(proc.stderr, out / "logs" / "allreduce_study1_trial1.log")
    assert victim.read_text() == KEEP
    assert not (out / "trials" / "allreduce_study1_trial1" / "events.jsonl").exists()  # the trial never started


def test_sweep_refuses_a_planted_job_script(tmp_path):
    out = tmp_path / "sweep"
    script = out / "jobs" / "000_0004gpu.sbatch"
    victim = _plant(script, tmp_path)
    proc = subprocess.run([str(BIN), "sweep", "cluster=local", "gpus=4", "optimizer=allreduce", "--dry-run",
                           "--out", str(out)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr
    _one_line_naming(proc.stderr, script)
    assert victim.read_text() == KEEP


def test_simulate_refuses_a_planted_prediction_file(tmp_path, capsys):
    from wagma_bench.cli.simulate import main

    out = tmp_path / "sim"
    victim = _plant(out / "predictions.json", tmp_path)
    assert main(["cluster=generic8", "gpus=2", "optimizer=allreduce", "train.max_steps=22", "--out", str(out)]) == 2
    _one_line_naming(capsys.readouterr().err, out / "predictions.json")
    assert victim.read_text() == KEEP


def test_comm_bench_refuses_a_planted_output_before_any_rank_starts(tmp_path):
    out = tmp_path / "comm-bench.json"
    victim = _plant(out, tmp_path)
    proc = subprocess.run([str(BIN), "comm-bench", "--nproc", "2", "--sizes", "4K", "--repeats", "1", "--out",
                           str(out)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    _one_line_naming(proc.stderr, out)
    assert victim.read_text() == KEEP
    assert "comm-bench: backend" not in proc.stdout
