"""Copy a validation campaign's compact record into the repository: what `validation_table.py` and
`measure_inputs.py` read, without the raw per-rank step logs.

    .venv/bin/python reproduce/scaling/compact.py OUT DEST

OUT is `validate.sh`'s output folder. Kept: `comm_bench.json`, and per run directory under `runs/` and
`gossip/` that completed, its `summary.json`, `events.jsonl.xz` (its event log, xz-compressed:
wagma_bench/record/events.py) and `steps.json.xz` (the per-rank step records as one compressed columnar table:
wagma_bench/record/steps.py). Left out: the raw step logs, checkpoints, logs,
`.hydra/`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from wagma_bench.record.events import EVENTS_XZ, SUMMARY, compact_events
from wagma_bench.record.files import OUTPUT_HINT, atomic_write, run_subdir
from wagma_bench.record.steps import STEP_TABLE, write_step_table


def copy(src: Path, dest: Path) -> None:
    """Atomically, and never through a link planted at ``dest`` (the project's writer)."""
    data = src.read_bytes()
    atomic_write(dest, lambda f: f.write(data), binary=True)


def compact(out: Path, dest: Path) -> int:
    run_subdir(dest, OUTPUT_HINT)
    copy(out / "comm_bench.json", dest / "comm_bench.json")
    copied = 0
    for group in ("runs", "gossip"):
        for run in sorted(p for p in (out / group).glob("*") if p.is_dir()):
            if json.loads((run / SUMMARY).read_text()).get("status") != "completed":
                print(f"left out (not completed): {run}", file=sys.stderr)
                continue
            target = dest / group / run.name
            run_subdir(target, OUTPUT_HINT)
            copy(run / SUMMARY, target / SUMMARY)
            compact_events(run, target / EVENTS_XZ)
            write_step_table(run, target / STEP_TABLE)
            copied += 1
    return copied


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    print(f"copied {compact(Path(sys.argv[1]), Path(sys.argv[2]))} completed runs into {sys.argv[2]}")
