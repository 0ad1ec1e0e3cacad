"""Run events: the single source of truth for every figure.

Rank 0 appends MLPerf-style events to ``events.jsonl`` (one JSON object a line, flushed and fsynced at
each event, so a crash leaves every earlier event readable). Every rank appends its per-step timings to
``steps/rank<R>.jsonl`` (:class:`wagma_bench.record.steps.StepLog`). ``summary.json`` is derived from the
events by :func:`summarize` and written atomically (temporary file, then rename), by rank 0 at the end or by
the launcher after a failure (which also writes the ``run_stop`` rank 0 could not:
:func:`wagma_bench.record.rundir.record_failure`); so is
the MLPerf log ``mllog.txt`` (:mod:`wagma_bench.record.mlperf`).

Every reader of a run directory (report, sweep status, calibration, samples-to-target, the MLPerf log, the
W&B mirror) reads it through :class:`RunEvents`, so a rule such as "which run_start, which evaluation
reached the target, did the run end" is written once, here.

A committed result keeps its event log compacted, ``events.jsonl.xz`` (:func:`compact_events`: the live log's
bytes, xz-compressed: about a quarter of its size), as it keeps its step records as one table
(:mod:`wagma_bench.record.steps`). :func:`event_log` is the one place that decides which log a folder holds
(both: refused), :func:`is_run_dir` and :func:`find_run_dirs` what is a run directory; a compacted folder is a
read-only record that no run resumes or appends to (``checkpoint.refuse_compacted``).

An event says where in the run it happened in rounds (``metadata.round``), a summary how many rounds the run
trained (``rounds``, ``rounds_to_target``). Events and summaries written before 2026-12-06 say ``step`` and
``steps``: :class:`RunEvents` (and :func:`current_event`, :func:`current_summary`) read them under today's
names, so no reader sees the old ones.
"""

from __future__ import annotations

import io
import lzma
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wagma_bench.config.readback import RUN_SUMMARY, load
from wagma_bench.config.recorded import recorded_config, setting
from wagma_bench.config.renamed import RENAMED_METADATA, RENAMED_SUMMARY, renamed_fields
from wagma_bench.metric import Metric, metric
from wagma_bench.record.files import (
    XZ_PRESET,
    atomic_write,
    open_for_attempt,
    parse_jsonl,
    read_jsonl,
    strict_json,
)
from wagma_bench.record.summary import SUMMARY, RunSummary

EVENTS = "events.jsonl"  # a run's live event log: rank 0 appends to it, a resume cuts it back
# a committed result's event log: the live log's bytes as they were, xz-compressed (:func:`compact_events`); a
# read-only record, which no run appends to or resumes (wagma_bench.runtime.run refuses it)
EVENTS_XZ = "events.jsonl.xz"


def current_event(event: dict) -> dict:
    """An event with its metadata under today's names (:data:`RENAMED_METADATA`)."""
    meta = event.get("metadata")
    if not isinstance(meta, dict) or not any(old in meta for old in RENAMED_METADATA):
        return event
    return {**event, "metadata": renamed_fields(meta, RENAMED_METADATA)}


def current_summary(summary: dict | None) -> dict | None:
    """A summary (``summary.json``) under today's names (:data:`RENAMED_SUMMARY`); None stays None."""
    return renamed_fields(summary, RENAMED_SUMMARY) if isinstance(summary, dict) else summary


def _event_before_checkpoint(event: dict, round_: int) -> bool:
    # An earlier attempt's run_stop (failed, killed) is no end: the resumed run writes the one final stop.
    at = (current_event(event).get("metadata") or {}).get("round")
    return event.get("key") != "run_stop" and (at is None or at <= round_)


class EventLog:
    """Append-only event log of rank 0 (other ranks hold a disabled one).

    Each event is written to ``events.jsonl`` first, then forwarded to the ``sinks`` (W&B; see
    :mod:`wagma_bench.record.loggers`, whose :func:`~wagma_bench.record.loggers.event_log_for_run` builds the
    log of a run with them), which only mirror it. The MLPerf log is derived from the file at the end
    (:mod:`wagma_bench.record.mlperf`).
    """

    def __init__(self, run_dir: Path, enabled: bool, sinks: Iterable = (), resume_step: int | None = None):
        self.enabled = enabled
        self.path = run_dir / EVENTS
        # open for the whole run, closed by close(); resume_step None: a fresh start
        self._f = open_for_attempt(self.path, resume_step, _event_before_checkpoint) if enabled else None
        self.sinks = list(sinks) if enabled else []

    def emit(self, key: str, value: Any = None, **metadata: Any) -> None:
        if not self.enabled:
            return
        event = {"key": key, "value": value, "time_ms": round(time.time() * 1000, 3), "metadata": metadata}
        line = strict_json(event, sort_keys=True)
        self._f.write(line + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())
        for sink in self.sinks:
            sink.emit(event)

    def close(self) -> None:
        if self._f:
            self._f.close()
            self._f = None
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def _first(events: Iterable[dict], key: str) -> dict | None:
    return next((e for e in events if e["key"] == key), None)


def run_metric(meta: dict) -> Metric:
    """The run's metric and its target, as ``run_start`` recorded them (the one rule of "reached":
    :meth:`wagma_bench.metric.Metric.reached`, the time limit honoured)."""
    return metric(meta.get("metric"), meta.get("target"))


def _time_limit(config: dict | None) -> float | None:
    return setting(config, "train.time_limit_s")


def summarize(events: list[dict], status: str | None = None) -> dict:
    """The run summary, computed from its events only.

    Time-to-target is the training clock (``metadata.train_s``: wall time since run start minus
    evaluation, checkpoint and queue time) at the first evaluation at or above the target.
    """
    events = [current_event(e) for e in events]
    start = _first(events, "run_start") or {"value": None, "metadata": {}}
    meta = dict(start["metadata"])
    evals = [e for e in events if e["key"] == "eval_accuracy"]
    stops = [e for e in events if e["key"] == "run_stop"]
    progress = [e for e in events if e["key"] in ("eval_accuracy", "progress", "run_suspend", "run_stop")]
    # run_suspend: stopped to be resumed (preempted, requeued); run_stop: the one real end
    lifecycle = [
        e["key"] for e in events if e["key"] in ("run_start", "run_resume", "run_suspend", "run_stop")
    ]
    ended = lifecycle[-1] if lifecycle else None
    last = progress[-1]["metadata"] if progress else {}
    target, goal = meta.get("target"), run_metric(meta)
    limit = _time_limit(meta.get("config"))
    reached_at = next(
        (e for e in evals if goal.reached(e["value"], e["metadata"].get("train_s"), limit)), None
    )
    values = [e["value"] for e in evals]
    train_s = last.get("train_s", 0.0)
    samples = last.get("samples", 0)
    suspends = [e for e in events if e["key"] == "run_suspend"]  # preempted, or interrupted (Ctrl-C)
    by_end = {
        "run_stop": stops[-1]["metadata"].get("status") if stops else None,
        "run_suspend": suspends[-1]["metadata"].get("status", "preempted") if suspends else None,
    }
    final_status = status or by_end.get(ended) or "incomplete"
    return {
        "workload": meta.get("workload"),
        "data": meta.get("data"),
        "optimizer": meta.get("optimizer"),
        "imbalance": meta.get("imbalance"),
        "world_size": meta.get("world_size"),
        "seed": meta.get("seed"),
        "target_metric": meta.get("metric"),
        "target": target,
        "reached": reached_at is not None,
        "time_to_target_s": reached_at["metadata"]["train_s"] if reached_at else None,
        "rounds_to_target": reached_at["metadata"]["round"] if reached_at else None,
        "final_metric": values[-1] if values else None,
        "best_metric": goal.best(values),
        "eval_model": meta.get("eval_model"),
        "rounds": last.get("round", 0),
        "samples": samples,
        "throughput_samples_per_s": samples / train_s if train_s > 0 else None,
        "wall_s": last.get("wall_s", 0.0),
        "train_s": train_s,
        "eval_s": last.get("eval_s", 0.0),
        "restarts": sum(1 for e in events if e["key"] == "run_resume"),
        "status": final_status,
        "error": stops[-1]["metadata"].get("error") if stops and ended == "run_stop" else None,
        "config_hash": meta.get("config_hash"),
        "git_sha": meta.get("git_sha"),
        "versions": meta.get("versions"),
        "hosts": meta.get("hosts"),
        "cpu": meta.get("cpu"),  # rank 0's CPU model and torch's instruction set (record.provenance)
        "ranks_per_cpu": ranks_per_cpu(meta),
        # rank 0's CPU seconds by thread over the last attempt (wagma_bench.record.cpu), at the run's end
        "threads_cpu_s": stops[-1]["metadata"].get("threads_cpu_s")
        if stops and ended == "run_stop"
        else None,
        # rank 0's wait-avoiding engine (WAGMA-SGD, eager-SGD): rounds, ms per
        # round by phase, progress-thread CPU
        "engine": stops[-1]["metadata"].get("engine") if stops and ended == "run_stop" else None,
        # DropCompute's threshold and what it dropped over the world (micro-batches)
        "dropcompute": stops[-1]["metadata"].get("dropcompute") if stops and ended == "run_stop" else None,
        # where the last attempt's start went (wagma_bench.runtime.startup), seconds per phase
        "startup": next((e["metadata"] for e in reversed(events) if e["key"] == "startup"), None),
    }


def ranks_per_cpu(meta: dict) -> float | None:
    """The most ranks a usable CPU was given on any of the run's hosts (``run_start``'s ``rank_hosts`` and
    ``host_cpus``): 2 for four ranks on two cores. What the ranks' compute is expected to wait by design
    (:mod:`wagma_bench.analysis.fairness`); None for runs logged before 2026-12-07, which did not record
    their CPUs."""
    cpus, hosts = meta.get("host_cpus"), meta.get("rank_hosts")
    if not isinstance(cpus, dict) or not isinstance(hosts, list):
        return None
    shares = [hosts.count(h) / n for h, n in cpus.items() if isinstance(n, int) and n > 0]
    return round(max(shares), 4) if shares else None


# --- reading a run directory ------------------------------------------------------------------------

LIFECYCLE = ("run_start", "run_resume", "run_suspend", "run_stop")


@dataclass(frozen=True)
class Evaluation:
    """One ``eval_accuracy`` event: the metric and where in the run it was measured."""

    value: float
    round: int | None
    epoch: float | None
    samples: int | None
    train_s: float | None  # the training clock (time-to-target is read from it)
    wall_s: float | None
    took_s: float  # how long the evaluation itself took
    signature: str | None  # how the metric was computed (sacrebleu's signature for BLEU)
    time_ms: float | None

    @classmethod
    def of(cls, event: dict) -> Evaluation:
        meta = event.get("metadata") or {}
        return cls(
            value=event["value"],
            round=meta.get("round"),
            epoch=meta.get("epoch"),
            samples=meta.get("samples"),
            train_s=meta.get("train_s"),
            wall_s=meta.get("wall_s"),
            took_s=meta.get("eval_took_s") or 0.0,
            signature=meta.get("sacrebleu_signature"),
            time_ms=event.get("time_ms"),
        )


@dataclass(frozen=True)
class RunStart:
    """What ``run_start`` says about a run: its identity, and every value derived from its config that a
    reader would otherwise recompute (the trainer computes each once, see ``provenance.run_start_fields``).

    A field a run logged before it existed reads as None; the derived values that can be recomputed from
    the logged config fall back to that (``base_lr``, ``nodes``, ``ranks_per_node``), the model size does
    not (it takes the model: see ``simulate.calibrate``)."""

    metadata: dict  # as logged, the resolved config (``config``) included

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def settings(self) -> dict:
        """The logged fields without the resolved config (the report's view of a run)."""
        return {k: v for k, v in self.metadata.items() if k != "config"}

    @property
    def config(self) -> dict:
        """The configuration the run recorded, under today's keys (one written before a key was renamed reads
        as one written after)."""
        return recorded_config(self.metadata.get("config"))

    @property
    def workload(self) -> str | None:
        return self.metadata.get("workload")

    @property
    def optimizer(self) -> str | None:
        return self.metadata.get("optimizer")

    @property
    def world_size(self) -> int | None:
        return self.metadata.get("world_size")

    @property
    def metric(self) -> str | None:
        return self.metadata.get("metric")

    @property
    def target(self) -> float | None:
        return self.metadata.get("target")

    @property
    def model_params(self) -> int | None:
        """Parameters of the model (None: logged before run_start said)."""
        return self.metadata.get("model_params") or None

    @property
    def group_size(self) -> int | None:
        """Ranks that average together in a round (WAGMA's S); None for optimizers without groups."""
        return self.metadata.get("group_size")

    @property
    def sync_period(self) -> int | None:
        return self.metadata.get("sync_period")

    @property
    def base_lr(self) -> float | None:
        """The peak learning rate after batch scaling (MLPerf's ``opt_base_learning_rate``)."""
        if "base_lr" in self.metadata:
            return self.metadata["base_lr"]
        train = self.config.get("train") or {}
        if "lr" not in train:
            return None
        from wagma_bench.config.schedules import peak_lr

        return peak_lr(
            train["lr"], train["batch_size"], self.world_size or 1, train.get("lr_reference_batch")
        )

    @property
    def nodes(self) -> int:
        """Hosts the ranks ran on (at least 1)."""
        return self.metadata.get("nodes") or max(1, len(self.metadata.get("hosts") or []))

    @property
    def ranks_per_node(self) -> int:
        return self.metadata.get("ranks_per_node") or math.ceil((self.world_size or 1) / self.nodes)


@dataclass
class RunEvents:
    """One run directory read once: its events (``events.jsonl``, or a committed result's ``events.jsonl.xz``:
    :func:`event_log`; a torn last line skipped) and the ``summary.json`` written from them. A half-written
    run (crashed, killed, still running) reads too; its properties say what is missing rather than failing."""

    path: Path
    events: list[dict]
    torn: bool  # the last line of events.jsonl was cut mid-write (and is skipped)
    saved_summary: RunSummary | None  # summary.json as written, under today's names; None: absent, unreadable
    summary_after_events: bool  # summary.json is no older than events.jsonl
    skipped: tuple[int, ...] = ()  # numbers of the lines of events.jsonl that are not JSON (and were skipped)
    log: Path | None = None  # the event log read: events.jsonl, or events.jsonl.xz (event_log); None: neither

    @classmethod
    def read(cls, run_dir: Path) -> RunEvents:
        run_dir = Path(run_dir)
        skipped: list[int] = []
        log = event_log(run_dir)
        rows, torn = _read_log(log, skipped) if log is not None else ([], False)
        events = [current_event(e) for e in rows if isinstance(e, dict) and "key" in e]
        saved = _read_json(run_dir / SUMMARY)
        summary = None if saved is None else RunSummary.from_json(saved)
        # a compacted log was written after the run ended, its summary beside it: that summary is the run's
        compacted = log is not None and log.name == EVENTS_XZ
        after = summary is not None and (compacted or _no_older(run_dir / SUMMARY, run_dir / EVENTS))
        return cls(run_dir, events, torn, summary, after, tuple(skipped), log)

    @property
    def start(self) -> RunStart | None:
        """The run's run_start (a resumed run has one, from its first process); None: never started."""
        event = _first(self.events, "run_start")
        return RunStart(event.get("metadata") or {}) if event else None

    @property
    def evaluations(self) -> list[Evaluation]:
        """Every evaluation with a value, in order (a resume's repeated ones included, as logged)."""
        return [
            Evaluation.of(e)
            for e in self.events
            if e["key"] == "eval_accuracy" and e.get("value") is not None
        ]

    @property
    def lifecycle(self) -> list[str]:
        """run_start / run_resume / run_suspend / run_stop, in order."""
        return [e["key"] for e in self.events if e["key"] in LIFECYCLE]

    @property
    def resumes(self) -> int:
        return sum(e["key"] == "run_resume" for e in self.events)

    @property
    def stopped(self) -> bool:
        """The last process ended cleanly: its last lifecycle event is run_stop or run_suspend (preempted,
        to be resumed); False for a run that crashed, was killed or still runs."""
        lifecycle = self.lifecycle
        return bool(lifecycle) and lifecycle[-1] in ("run_stop", "run_suspend")

    @property
    def last_round(self) -> int | None:
        """The round of the last event (where a running or crashed run got to)."""
        return (self.events[-1].get("metadata") or {}).get("round") if self.events else None

    @property
    def first_at_target(self) -> Evaluation | None:
        """The first evaluation at or above the target (None: no target, or not reached)."""
        if self.start is None or self.start.target is None:
            return None
        goal, limit = run_metric(self.start.metadata), _time_limit(self.start.config)
        return next((e for e in self.evaluations if goal.reached(e.value, e.train_s, limit)), None)

    @property
    def signature(self) -> str | None:
        """The last evaluation's metric signature (sacrebleu's, for BLEU)."""
        return next((e.signature for e in reversed(self.evaluations) if e.signature), None)

    def summary(self, status: str | None = None) -> dict:
        """The summary computed from the events (:func:`summarize`; ``status`` overrides theirs), never
        summary.json."""
        return summarize(self.events, status)

    def summary_or_saved(self) -> RunSummary:
        """summary.json when it was written and is readable, else the summary computed from the events."""
        return self.saved_summary if self.saved_summary is not None else RunSummary.from_json(self.summary())


def event_log(run_dir: Path) -> Path | None:
    """Where a run directory's events are: the live ``events.jsonl``, or a committed result's
    ``events.jsonl.xz``; None: neither (not a run directory). The one place that decides; both present is
    refused (:class:`ValueError` naming the folder): which of them is the run's record cannot be told."""
    live, compacted = Path(run_dir) / EVENTS, Path(run_dir) / EVENTS_XZ
    if live.exists() and compacted.exists():
        raise ValueError(
            f"{run_dir} holds both {EVENTS} (a run's live log) and {EVENTS_XZ} (a committed result's): "
            f"remove the one that is not this run's record"
        )
    return live if live.exists() else compacted if compacted.exists() else None


def is_run_dir(path: Path) -> bool:
    """The folder holds a run's event log, live or compacted."""
    return (Path(path) / EVENTS).exists() or (Path(path) / EVENTS_XZ).exists()


def find_run_dirs(root: Path) -> set[Path]:
    """Every run directory at or below ``root``, live or compacted, W&B's own folders aside."""
    return {
        e.parent for name in (EVENTS, EVENTS_XZ) for e in Path(root).rglob(name) if "wandb" not in e.parts
    }


def compact_events(run_dir: Path, dest: Path) -> None:
    """Write ``run_dir``'s event log as ``dest`` (an ``events.jsonl.xz``), atomically: the live log's bytes,
    xz-compressed with the step table's settings (no time stamp: the same log gives the same bytes; a log
    compacted already is copied as it is)."""
    log = event_log(run_dir)
    if log is None:
        raise FileNotFoundError(f"{run_dir}: no {EVENTS} to compact")
    data = log.read_bytes()
    data = data if log.name == EVENTS_XZ else lzma.compress(data, preset=XZ_PRESET)
    atomic_write(Path(dest), lambda f: f.write(data), binary=True)


def _read_log(path: Path, skipped: list[int]) -> tuple[list, bool]:
    """A log's lines read as JSON (those that are not, skipped and numbered) and whether its last is torn."""
    if path.name == EVENTS:
        return read_jsonl(path, skipped), torn_last_line(path)
    try:
        text = lzma.decompress(path.read_bytes()).decode()
    except (lzma.LZMAError, UnicodeDecodeError) as err:  # cut short, or not what compact_events writes
        raise ValueError(
            f"{path}: damaged event log ({type(err).__name__}: {err}); "
            f"{Path(__file__).name} compact_events writes it from the run's {EVENTS}"
        ) from None
    return parse_jsonl(io.StringIO(text, newline=None), skipped), bool(text) and not text.endswith("\n")


def torn_last_line(path: Path) -> bool:
    """True when the file's last line was cut mid-write (no final newline)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            if f.tell() == 0:
                return False
            f.seek(-1, 2)
            return f.read(1) != b"\n"
    except OSError:
        return False


def _no_older(a: Path, b: Path) -> bool:
    try:
        return a.stat().st_mtime >= b.stat().st_mtime
    except OSError:
        return False


def _read_json(path: Path) -> dict | None:
    try:
        return load(path, RUN_SUMMARY)
    except (OSError, ValueError):  # absent, not JSON (a torn write, another file's bytes), not a summary
        return None
