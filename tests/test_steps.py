"""The compact step table (wagma_bench/record/steps.py, what committed results keep instead of the raw
per-rank step logs): every analysis that reads step records gets the same numbers from either form, and the
committed tuning folders are compact (the repository's size)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

from wagma_bench.analysis.step_times import load_step_records, step_time_rows, step_time_summary
from wagma_bench.record.events import EVENTS, SUMMARY
from wagma_bench.record.files import read_jsonl
from wagma_bench.record.steps import STEP_FIELDS, STEP_TABLE, StepRecord, read_step_records, write_step_table
from wagma_bench.simulate.calibrate import cycle_compute, fit_run

ROOT = Path(__file__).resolve().parents[1]


def _compact_copy(run_dir: Path, dest: Path) -> Path:
    dest.mkdir()
    for name in (EVENTS, SUMMARY):
        shutil.copy(run_dir / name, dest / name)
    write_step_table(run_dir, dest / STEP_TABLE)
    return dest


def test_the_compact_table_gives_every_analysis_the_raw_logs_numbers(checkpointed, tmp_path):
    compact = _compact_copy(checkpointed, tmp_path / "compact")
    raw = {int(p.stem[4:]): read_jsonl(p) for p in sorted((checkpointed / "steps").glob("rank*.jsonl"))}
    assert sorted(raw) == [0, 1] and all(len(r) >= 12 for r in raw.values())
    kept = {
        rank: [StepRecord(**{f: r[f] for f in STEP_FIELDS if f in r}) for r in recs]
        for rank, recs in raw.items()
    }
    assert read_step_records(compact) == kept  # the independent reading: the raw lines
    assert load_step_records(compact) == kept
    rows = [type("Run", (), {"path": d})() for d in (checkpointed, compact)]
    assert step_time_rows(rows[:1]) == step_time_rows(rows[1:]) != []
    assert step_time_summary(step_time_rows(rows[1:])) == step_time_summary(step_time_rows(rows[:1]))
    fits = [dataclasses.replace(fit_run(d, params=1000), path="") for d in (checkpointed, compact)]
    assert fits[0] == fits[1]
    assert cycle_compute(checkpointed) == cycle_compute(compact)


def test_the_same_records_give_the_same_bytes(checkpointed, tmp_path):
    """No time stamp in the xz header: recompacting a committed result leaves git nothing to commit."""
    write_step_table(checkpointed, tmp_path / "a.json.xz")
    write_step_table(checkpointed, tmp_path / "b.json.xz")
    assert (tmp_path / "a.json.xz").read_bytes() == (tmp_path / "b.json.xz").read_bytes()


def test_a_run_without_step_records_reads_as_none(tmp_path):
    assert read_step_records(tmp_path) == {}


def test_committed_results_are_compact():
    """Tuning folders keep summary.json, events.jsonl.xz and steps.json.xz per trial, no raw step logs and no
    plain event logs, and the tracked files stay under 20 MB (a clone that carries no raw logs)."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    paths = [p for p in tracked.decode().split("\0") if p]
    raw = [
        p for p in paths if p.startswith("reproduce/") and ("/steps/rank" in p or p.endswith(f"/{EVENTS}"))
    ]
    assert raw == [], raw[:5]
    total = sum((ROOT / p).stat().st_size for p in paths if (ROOT / p).is_file())
    assert total < 20 * 2**20, f"{total / 2**20:.1f} MB tracked"


def test_a_damaged_table_is_named(checkpointed, tmp_path):
    """Cut short, or columns of unequal lengths: one error naming the file, not a bare decoder error."""
    import json
    import lzma

    import pytest

    write_step_table(checkpointed, tmp_path / STEP_TABLE)
    data = (tmp_path / STEP_TABLE).read_bytes()
    (tmp_path / STEP_TABLE).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{STEP_TABLE}: damaged step table"):
        read_step_records(tmp_path)
    table = json.loads(lzma.decompress(data))
    table["0"]["t"] = table["0"]["t"][:-1]
    (tmp_path / STEP_TABLE).write_bytes(lzma.compress(json.dumps(table).encode()))
    with pytest.raises(ValueError, match="unequal lengths"):
        read_step_records(tmp_path)


def test_report_goes_on_past_a_damaged_table_and_warns(checkpointed, tmp_path, capsys):
    compact = _compact_copy(checkpointed, tmp_path / "compact")
    (compact / STEP_TABLE).write_bytes(b"not xz")
    rows = [type("Run", (), {"path": d})() for d in (checkpointed, compact)]
    assert step_time_rows(rows) == step_time_rows(rows[:1])
    assert f"{STEP_TABLE}: damaged step table" in capsys.readouterr().err
