"""Copy a tuning directory's compact record into the repository: what `claims`, `report`'s tuned tables and a
resumed `tune` read, without the raw per-rank step logs and checkpoints.

    .venv/bin/python reproduce/tuning/compact.py TUNE_DIR DEST
    .venv/bin/python reproduce/tuning/compact.py --events-only FOLDER...

Kept: `tune.json` (the plan and its command), `tuning.json` (the scores), and per trial `summary.json` (with
its speed reference and compute imbalance), `events.jsonl.xz` (the event log `events.jsonl` as it was,
run_start's configuration and clock, every evaluation, xz-compressed: wagma_bench/record/events.py) and
`steps.json.xz`, the per-rank step records as one compressed columnar table with the fields that report and
`simulate --compute-from` / `--calibrate` read (wagma_bench/record/steps.py; a thirtieth of the raw
`steps/rank*.jsonl`). Left out: the raw step logs, `checkpoint/`, `logs/`, `.hydra/`, `mllog.txt` (rewritten
from the events by `report --mllog`). A finished trial copied so is skipped when the same `tune` command runs
into DEST again (its summary and run_start identify it), so a campaign goes on across sessions from what was
committed; an unfinished trial is not copied and runs again from its start.

`--events-only` compacts in place the event log of every run directory below each FOLDER (a committed
result written before 2026-12-07 kept `events.jsonl` plain): `events.jsonl.xz` is written, and each run read
back the same (events, summary, torn and skipped lines) before its `events.jsonl` is removed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from wagma_bench.analysis.tuning import PLAN, TRIALS, TUNING, load_trials, trial_finished
from wagma_bench.record.events import EVENTS, EVENTS_XZ, SUMMARY, RunEvents, compact_events, find_run_dirs
from wagma_bench.record.files import OUTPUT_HINT, atomic_write, run_subdir
from wagma_bench.record.steps import STEP_TABLE, read_step_records, write_step_table


def compact(src: Path, dest: Path) -> tuple[int, int]:
    """(trials copied, trials planned)."""
    _, combos, summaries = load_trials(src)
    run_subdir(dest, OUTPUT_HINT)
    for name in (PLAN, TUNING):
        if (src / name).is_file():
            _copy(src / name, dest / name)
    copied = 0
    for name, summary in summaries.items():
        if not trial_finished(summary):
            continue
        run_subdir(dest / TRIALS / name, OUTPUT_HINT)
        _copy(src / TRIALS / name / SUMMARY, dest / TRIALS / name / SUMMARY)
        compact_events(src / TRIALS / name, dest / TRIALS / name / EVENTS_XZ)
        if read_step_records(src / TRIALS / name):
            write_step_table(src / TRIALS / name, dest / TRIALS / name / STEP_TABLE)
        copied += 1
    return copied, sum(len(t) for t in combos.values())


def compact_events_in_place(folder: Path) -> int:
    """Every run directory below ``folder`` with a plain event log: its ``events.jsonl.xz`` written, the run
    read back as before, then its ``events.jsonl`` removed; the number of runs compacted. Refused (ValueError,
    the run named) where a run reads otherwise, its plain log then left as it was."""
    done = 0
    for run in sorted(find_run_dirs(folder)):
        if not (run / EVENTS).is_file():
            continue
        before = _as_read(run)
        compact_events(run, run / EVENTS_XZ)
        (run / EVENTS).rename(run / (EVENTS + ".old"))  # kept until the compacted log reads the same
        if _as_read(run) != before:
            (run / EVENTS_XZ).unlink()
            (run / (EVENTS + ".old")).rename(run / EVENTS)
            raise ValueError(f"{run}: reads otherwise from {EVENTS_XZ}; left as it was")
        (run / (EVENTS + ".old")).unlink()
        done += 1
    return done


def _as_read(run: Path) -> tuple:
    record = RunEvents.read(run)
    return record.events, record.torn, record.skipped, record.saved_summary


def _copy(src: Path, dest: Path) -> None:
    """Atomically, and never through a link planted at ``dest`` (the project's writer)."""
    data = src.read_bytes()
    atomic_write(dest, lambda f: f.write(data), binary=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--events-only"] and len(sys.argv) > 2:
        for folder in sys.argv[2:]:
            n = compact_events_in_place(Path(folder))
            print(f"{folder}: {n} event logs compacted, each read back the same")
        sys.exit(0)
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    done, planned = compact(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"copied {done} finished trials of {planned} planned into {sys.argv[2]}")
