"""Copy a tuning directory's compact record into the repository: what `claims`, `report`'s tuned tables and a
resumed `tune` read, without the raw per-rank step logs and checkpoints.

    .venv/bin/python reproduce/tuning/compact.py TUNE_DIR DEST

Kept: `tune.json` (the plan and its command), `tuning.json` (the scores), and per trial `summary.json` (with
its speed reference and compute imbalance), `events.jsonl` (run_start's configuration and clock, every
evaluation) and `steps.json.xz`, the per-rank step records as one compressed columnar table with the fields
that report and `simulate --compute-from` / `--calibrate` read (wagma_bench/record/steps.py; a thirtieth of
the raw `steps/rank*.jsonl`). Left out: the raw step logs, `checkpoint/`, `logs/`, `.hydra/`, `mllog.txt`
(rewritten from the events by `report --mllog`). A finished trial copied so is skipped when the same `tune`
command runs into DEST again (its summary and run_start identify it), so a campaign goes on across sessions
from what was committed; an unfinished trial is not copied and runs again from its start.
"""

from __future__ import annotations

import sys
from pathlib import Path

from wagma_bench.analysis.tuning import PLAN, TRIALS, TUNING, load_trials, trial_finished
from wagma_bench.record.events import EVENTS, SUMMARY
from wagma_bench.record.files import OUTPUT_HINT, atomic_write, run_subdir
from wagma_bench.record.steps import STEP_TABLE, read_step_records, write_step_table

KEPT = (SUMMARY, EVENTS)


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
        for f in KEPT:
            _copy(src / TRIALS / name / f, dest / TRIALS / name / f)
        if read_step_records(src / TRIALS / name):
            write_step_table(src / TRIALS / name, dest / TRIALS / name / STEP_TABLE)
        copied += 1
    return copied, sum(len(t) for t in combos.values())


def _copy(src: Path, dest: Path) -> None:
    """Atomically, and never through a link planted at ``dest`` (the project's writer)."""
    data = src.read_bytes()
    atomic_write(dest, lambda f: f.write(data), binary=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    done, planned = compact(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"copied {done} finished trials of {planned} planned into {sys.argv[2]}")
