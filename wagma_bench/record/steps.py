"""A run's per-rank step records, written and read in this one module, read as one type
(:class:`StepRecord`) from either of their two forms.

A run writes ``steps/rank<R>.jsonl`` (:class:`StepLog`: every field a workload logs, about 100-170 bytes a
step and rank). A committed result keeps instead one compressed, columnar table, ``steps.json.xz``
(:func:`write_step_table`): per rank, one list per field of :data:`STEP_FIELDS`, the fields that the analyses
read (report's step-time components, the simulator's calibration): about a thirtieth of the raw logs (4.9 MB
for the 150.9 MB of the 432 trials committed before 2026-12-05). :func:`read_step_records` gives the same
records from either form, so every analysis reads a compact result as it reads the raw one
(tests/test_steps.py checks report's and calibration's numbers are identical). No module reads a step record
by key outside this one (tests/test_step_record_type.py).

A record counts the rank's own steps as ``local_step`` and the algorithm's rounds as ``round`` (an
asynchronous optimizer's rank may take several local steps in a round). Logs and tables written before
2026-12-06 name the local step ``step``; :meth:`StepRecord.from_json` reads them under today's name (the one
rename table, config/renamed.py), in both forms, so a reader never sees the old one.
"""

from __future__ import annotations

import lzma
import re
from pathlib import Path
from typing import Any, NamedTuple

from wagma_bench.config import readback
from wagma_bench.config.renamed import RENAMED_STEP_FIELDS, renamed_fields
from wagma_bench.record.files import (
    XZ_PRESET,
    atomic_write,
    open_for_attempt,
    read_jsonl,
    run_subdir,
    strict_json,
)

STEPS = "steps"
STEP_TABLE = "steps.json.xz"


class StepRecord(NamedTuple):
    """One step of one rank, as the analyses read it; a field the rank did not log is None. A NamedTuple:
    typed, immutable and as cheap as a tuple (a committed study reads millions), and not readable by key."""

    local_step: int | None = None  # the rank's own steps so far
    round: int | None = None  # the algorithm's round the step belongs to
    t: float | None = None  # the rank's training clock after the step (s)
    compute_s: float | None = None  # forward + backward, batch loading included (wall s)
    compute_cpu_s: float | None = None  # the same, the thread's CPU time (s)
    delay_s: float | None = None  # injected straggler sleep (s)
    comm_s: float | None = None  # in the optimizer's step: communication, waiting for others included (s)
    samples: int | None = None  # samples the step took
    # raw logs only (the compact table does not keep them): DD-PPO, on a rollout's first step, whether
    # straggler preemption cut it short (the run's summary counts them); the Transformer, the target tokens
    preempted: bool | None = None
    tokens: int | None = None

    @classmethod
    def from_json(cls, record: dict) -> StepRecord:
        """A record as logged or as a row of the table, its old field names read as today's
        (:data:`RENAMED_FIELDS`); the fields the type does not name (the loss, a workload's statistics) are
        left out."""
        return cls._make(map(renamed_fields(record, RENAMED_FIELDS).get, cls._fields))


# What report (compute/delay/comm per rank, wall against CPU compute) and simulate's calibration (the clock,
# compute, samples, the round a step belongs to) read: the compact table's columns. A field a rank did not log
# is stored as null and read back as None.
STEP_FIELDS = StepRecord._fields[: StepRecord._fields.index("preempted")]
# fields of a step record renamed since runs were recorded (config/renamed.py)
RENAMED_FIELDS = RENAMED_STEP_FIELDS
_RANK_LOG = re.compile(r"rank(\d+)\.jsonl")


def read_step_records(run_dir: Path) -> dict[int, list[StepRecord]]:
    """Per rank, its step records in the order written: from ``steps/rank<R>.jsonl`` where the run has them
    (torn lines skipped; they win over a table beside them), else from the compact table, else none. A damaged
    table raises :class:`ValueError` naming it."""
    run_dir = Path(run_dir)
    logs = {
        int(m.group(1)): p
        for p in sorted((run_dir / STEPS).glob("rank*.jsonl"))
        if (m := _RANK_LOG.fullmatch(p.name))
    }
    if logs:
        return {rank: read_step_log(path) for rank, path in sorted(logs.items())}
    table = run_dir / STEP_TABLE
    if not table.is_file():
        return {}
    try:
        ranks = readback.parse(lzma.decompress(table.read_bytes()).decode(), readback.STEP_TABLE, str(table))
        return {int(rank): _rows(columns) for rank, columns in ranks.items()}
    except readback.ReadBackError:
        raise
    except (lzma.LZMAError, ValueError, AttributeError, TypeError) as err:  # cut short, or not what we write
        raise ValueError(
            f"{table}: damaged step table ({type(err).__name__}: {err}); "
            f"{Path(__file__).name} writes it from the run's steps/rank*.jsonl"
        ) from None


def read_step_log(path: Path) -> list[StepRecord]:
    """One rank's raw step log (``steps/rank<R>.jsonl``), its torn lines skipped."""
    return [StepRecord.from_json(r) for r in read_jsonl(path)]


def write_step_table(run_dir: Path, dest: Path) -> int:
    """Write ``run_dir``'s step records as ``dest`` (a ``steps.json.xz``), atomically; the number of records.
    xz rather than gzip: a third smaller on these tables, and its header has no time stamp, so the same
    records give the same bytes."""
    records = read_step_records(run_dir)
    table = {
        str(rank): {f: [getattr(r, f) for r in recs] for f in STEP_FIELDS} for rank, recs in records.items()
    }
    data = lzma.compress(strict_json(table, separators=(",", ":")).encode(), preset=XZ_PRESET)
    atomic_write(Path(dest), lambda f: f.write(data), binary=True)
    return sum(map(len, records.values()))


def _rows(columns: dict[str, list]) -> list[StepRecord]:
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"columns of unequal lengths {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    fields = [f for f in (*STEP_FIELDS, *RENAMED_FIELDS) if f in columns]
    return [
        StepRecord.from_json({f: columns[f][i] for f in fields if columns[f][i] is not None})
        for i in range(n)
    ]


class StepLog:
    """Per-rank step timings, buffered and flushed at synchronisation points."""

    def __init__(self, run_dir: Path, rank: int, resume_step: int | None = None):
        d = run_subdir(Path(run_dir) / STEPS)
        # fresh (resume_step None): empty; resumed: the steps up to the checkpoint's local step
        self._f = open_for_attempt(
            d / f"rank{rank}.jsonl",
            resume_step,
            lambda r, step: (StepRecord.from_json(r).local_step or 0) <= step,
        )
        self._buf: list[str] = []

    def record(self, **fields: Any) -> None:
        self._buf.append(strict_json(fields))

    def flush(self) -> None:
        if self._buf:
            self._f.write("\n".join(self._buf) + "\n")
            self._f.flush()
            self._buf.clear()

    def close(self) -> None:
        self.flush()
        self._f.close()
