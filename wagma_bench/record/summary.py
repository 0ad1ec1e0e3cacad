"""A run's summary (``summary.json``) as a type: :class:`RunSummary`, the one place its fields are read by
name.

Rank 0 writes the summary at its end (or the launcher after a failure:
:func:`wagma_bench.record.rundir.finalize`) from :func:`wagma_bench.record.events.summarize`; every reader
takes it through :meth:`RunSummary.from_json` (a mapping already read: a computed summary, or one read back
through :data:`wagma_bench.config.readback.RUN_SUMMARY`) or :meth:`RunSummary.load` (a file), so the names
renamed since runs were recorded (``steps`` -> ``rounds``: :data:`wagma_bench.config.renamed.RENAMED_SUMMARY`)
are translated in one place, and a reader names a field as an attribute a type checker follows. Older and
newer summaries carry different fields: the ones the type does not name stay in :attr:`RunSummary.extra`, so
reading a summary loses nothing, and what is written stays the mapping :func:`summarize` made (the committed
summaries under reproduce/ are read byte for byte; :meth:`RunSummary.to_json` gives back the fields read, in
their order).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wagma_bench.config import readback
from wagma_bench.config.renamed import RENAMED_SUMMARY, renamed_fields
from wagma_bench.record.files import write_json_atomic

SUMMARY = "summary.json"  # written by write_summary, read through RunSummary (also named by record.events)


@dataclass(frozen=True)
class RunSummary:
    """One run's summary under today's names; every field None (or its default) where the summary lacks it."""

    status: str | None = None  # completed, diverged, failed, interrupted, preempted, incomplete, ...
    error: str | None = None  # why it failed (the launcher's view first, then rank 0's)
    workload: str | None = None
    data: str | None = None
    optimizer: str | None = None
    imbalance: str | None = None  # the imbalance model's name, as the run started
    world_size: int | None = None
    seed: int | None = None
    target_metric: str | None = None  # the metric's name
    target: float | None = None
    reached: bool | None = None
    time_to_target_s: float | None = None
    rounds_to_target: int | None = None
    final_metric: float | None = None
    best_metric: float | None = None
    rounds: int | None = None
    samples: int | None = None
    throughput_samples_per_s: float | None = None
    wall_s: float | None = None
    train_s: float | None = None
    eval_s: float | None = None
    restarts: int = 0
    compute_imbalance: float | None = None  # record.rundir.finalize, from the step records
    compute_contention: float | None = None
    ranks_per_cpu: float | None = None  # record.events.ranks_per_cpu: the ranks each core was given by design
    dropcompute: dict | None = None  # DropCompute's threshold and drops, where it ran
    reference_s: float | None = None  # the speed reference's reading (campaign.reference)
    reference_before_after_s: list | None = None  # its readings at the run's start and end
    wandb: dict | None = None  # logger=wandb: the mode W&B ran in, why, and the W&B run's id
    extra: Mapping[str, Any] = field(default_factory=dict)  # every field the type does not name
    keys: tuple[str, ...] = field(default=(), repr=False)  # the fields read, in their order (to_json)

    @classmethod
    def from_json(cls, mapping: Mapping[str, Any]) -> RunSummary:
        """The summary of a mapping (as written, or as computed), its old field names read as today's."""
        current = renamed_fields(dict(mapping), RENAMED_SUMMARY)
        named = {k: v for k, v in current.items() if k in _NAMED}
        if named.get("restarts") is None:
            named.pop("restarts", None)
        extra = {k: v for k, v in current.items() if k not in _NAMED}
        return cls(**named, extra=extra, keys=tuple(current))

    @classmethod
    def load(cls, path: Path | str) -> RunSummary:
        """``summary.json`` at ``path``, checked against its schema (a ValueError naming the file where it is
        not one; OSError where it cannot be read)."""
        return cls.from_json(readback.load(path, readback.RUN_SUMMARY))

    @property
    def finished(self) -> bool:
        """The run ended by its own stop rules (:data:`FINISHED`), not cut short."""
        return self.status in FINISHED

    @property
    def round_s(self) -> float | None:
        """Training seconds a round (None where the summary has no positive rounds and training time)."""
        ok = all(isinstance(v, (int, float)) and v > 0 for v in (self.train_s, self.rounds))
        return self.train_s / self.rounds if ok else None

    def given(self, name: str) -> bool:
        """Whether the summary holds ``name`` (today's name), at None or not: ``target: null`` is a run with
        no target, its absence a summary written before targets were recorded."""
        return name in (self.keys or self.to_json())

    def to_json(self) -> dict[str, Any]:
        """The summary as a mapping under today's names: the fields it was read from, in their order (one
        built here: every named field, then the others)."""
        keys = self.keys or (*(f.name for f in dataclasses.fields(self) if f.name in _NAMED), *self.extra)
        return {k: getattr(self, k) if k in _NAMED else self.extra[k] for k in keys}


FINISHED = ("completed", "time_limit", "diverged")  # ended by the run's own stop rules
_NAMED = frozenset(f.name for f in dataclasses.fields(RunSummary)) - {"extra", "keys"}


def write_summary(run_dir: Path | str, fields: Mapping[str, Any]) -> None:
    """Write ``run_dir``'s ``summary.json`` (atomically, never through a link): the one writer. ``fields`` are
    written as given, so what a run records is :func:`summarize`'s mapping and its order."""
    write_json_atomic(Path(run_dir) / SUMMARY, dict(fields))


def add_to_summary(run_dir: Path | str, added: Mapping[str, Any]) -> dict[str, Any]:
    """``run_dir``'s ``summary.json`` as written (read back against its schema), with ``added`` set, written
    again; what was written. A ValueError or OSError where the summary cannot be read back."""
    fields = {**readback.load(Path(run_dir) / SUMMARY, readback.RUN_SUMMARY), **added}
    write_summary(run_dir, fields)
    return fields


def run_summary(mapping: Mapping[str, Any] | RunSummary | None) -> RunSummary | None:
    """:class:`RunSummary` of a mapping, or the summary itself; None stays None."""
    if mapping is None or isinstance(mapping, RunSummary):
        return mapping
    return RunSummary.from_json(mapping)
