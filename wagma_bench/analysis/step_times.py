"""A run's per-rank step-time components (compute, injected delay, communication), read from its step records
(:mod:`wagma_bench.record.steps`, raw or compact) as tidy rows and summarised: what the report's step-time
figure and table show, where a straggler appears as its own delay or compute and as its peers'
communication."""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from wagma_bench.analysis.run_records import RunRecord
from wagma_bench.record.steps import StepRecord, read_step_records

MAX_STEPS_PER_RANK = 5000  # step records read per rank file (evenly thinned beyond)


def load_step_records(run_dir: Path, limit: int = MAX_STEPS_PER_RANK) -> dict[int, list[StepRecord]]:
    """Per-rank step records of a run, raw or compact (:mod:`~wagma_bench.record.steps`), evenly thinned to
    ``limit`` per rank."""
    out = {}
    for rank, recs in read_step_records(run_dir).items():
        out[rank] = recs[:: math.ceil(len(recs) / limit)] if len(recs) > limit else recs
    return out


def step_time_rows(runs: Sequence[RunRecord]) -> list[dict]:
    """Tidy per-rank step-time components of one series (seeds pooled): rank, component, seconds.

    Components: ``compute`` (forward + backward), ``delay`` (injected straggler sleep), ``comm`` (time in
    the optimizer's communication step, i.e. waiting for the others included)."""
    rows = []
    for run in runs:
        try:
            records = load_step_records(run.path)
        except ValueError as err:  # a damaged compact table: the report goes on without this run's step times
            print(
                f"wagma-bench report: warning: {err}; its step times are left out",
                file=sys.stderr,
                flush=True,
            )
            continue
        for rank, recs in records.items():
            for rec in recs:
                for comp, seconds in (
                    ("compute", rec.compute_s),
                    ("delay", rec.delay_s),
                    ("comm", rec.comm_s),
                ):
                    if seconds is not None:
                        rows.append({"rank": rank, "component": comp, "seconds": float(seconds)})
    return rows


def step_time_summary(rows: Sequence[dict]) -> dict:
    """Median of each component over all ranks and steps, and the rank with the largest mean step time."""
    by_comp: dict[str, list[float]] = {}
    per_rank: dict[int, float] = {}
    for r in rows:
        by_comp.setdefault(r["component"], []).append(r["seconds"])
        per_rank[r["rank"]] = per_rank.get(r["rank"], 0.0) + r["seconds"]
    out = {f"{c}_median_s": statistics.median(v) for c, v in by_comp.items()}
    out["slowest_rank"] = max(per_rank, key=per_rank.get) if per_rank else None
    return out
