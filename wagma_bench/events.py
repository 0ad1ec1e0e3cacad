"""Run events: the single source of truth for every figure.

Rank 0 appends MLPerf-style events to ``events.jsonl`` (one JSON object a line, flushed and fsynced at
each event, so a crash leaves every earlier event readable). Every rank appends its per-step timings to
``steps/rank<R>.jsonl``. ``summary.json`` is derived from the events by :func:`summarize` and written
atomically (temporary file, then rename), by rank 0 at the end or by the launcher after a failure (which
also writes the ``run_stop`` rank 0 could not: :func:`record_failure`); so is
the MLPerf log ``mllog.txt`` (:mod:`wagma_bench.mlperf`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

EVENTS = "events.jsonl"
SUMMARY = "summary.json"


def atomic_write(path: Path, write: Callable[[Any], Any], binary: bool = False) -> None:
    """Write ``path`` through ``write(file)`` on a temporary file beside it, then rename it into place: a
    crash leaves the old or the new file. On an error (a full disk) the temporary file is removed."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    atomic_write(path, lambda f: f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n"))


def rewrite_jsonl(path: Path, records: list[dict]) -> None:
    """Replace a JSONL file by ``records``, atomically (a crash leaves the old or the new file)."""
    atomic_write(path, lambda f: f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in records))


def _open_for_attempt(path: Path, resume_step: int | None, keep) -> Any:
    """Open a log for this attempt: empty on a fresh start (never appending to an earlier attempt's lines);
    on a resume, cut back to what the checkpoint at ``resume_step`` has seen (``keep(record, step)``)."""
    if resume_step is None:
        return open(path, "w")  # the caller closes it
    if path.exists():
        rewrite_jsonl(path, [r for r in read_jsonl(path) if keep(r, resume_step)])
    return open(path, "a")


def _event_before_checkpoint(event: dict, step: int) -> bool:
    # An earlier attempt's run_stop (failed, killed) is no end: the resumed run writes the one final stop.
    at = (event.get("metadata") or {}).get("step")
    return event.get("key") != "run_stop" and (at is None or at <= step)


def read_jsonl(path: Path) -> list[dict]:
    """Every complete line of a JSONL file; a torn last line (crash mid-write) is skipped."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return out


class EventLog:
    """Append-only event log of rank 0 (other ranks hold a disabled one).

    Each event is written to ``events.jsonl`` first, then forwarded to the ``sinks`` (W&B; see
    :mod:`wagma_bench.loggers`), which only mirror it. The MLPerf log is derived from the file at the end
    (:mod:`wagma_bench.mlperf`).
    """

    def __init__(self, run_dir: Path, enabled: bool, sinks: Iterable = (), resume_step: int | None = None):
        self.enabled = enabled
        self.path = run_dir / EVENTS
        # open for the whole run, closed by close(); resume_step None: a fresh start
        self._f = _open_for_attempt(self.path, resume_step, _event_before_checkpoint) if enabled else None
        self.sinks = list(sinks) if enabled else []

    @classmethod
    def for_run(cls, cfg, run_dir: Path, rank: int, resume_step: int | None = None) -> EventLog:
        """The event log of one rank of a run, with the sinks its ``logger`` config asks for; on a resume
        (``resume_step``: the checkpoint's round) cut back to the events up to the checkpoint."""
        from wagma_bench.loggers import make_sinks

        return cls(run_dir, enabled=rank == 0, sinks=make_sinks(cfg, run_dir, rank), resume_step=resume_step)

    def emit(self, key: str, value: Any = None, **metadata: Any) -> None:
        if not self.enabled:
            return
        event = {"key": key, "value": value, "time_ms": round(time.time() * 1000, 3), "metadata": metadata}
        line = json.dumps(event, sort_keys=True)
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


class StepLog:
    """Per-rank step timings, buffered and flushed at synchronisation points."""

    def __init__(self, run_dir: Path, rank: int, resume_step: int | None = None):
        d = run_dir / "steps"
        d.mkdir(parents=True, exist_ok=True)
        # fresh (resume_step None): empty; resumed: the steps up to the checkpoint's local step
        self._f = _open_for_attempt(d / f"rank{rank}.jsonl", resume_step, lambda r, step: r.get("step", 0) <= step)
        self._buf: list[str] = []

    def record(self, **fields: Any) -> None:
        self._buf.append(json.dumps(fields))

    def flush(self) -> None:
        if self._buf:
            self._f.write("\n".join(self._buf) + "\n")
            self._f.flush()
            self._buf.clear()

    def close(self) -> None:
        self.flush()
        self._f.close()


def _first(events: Iterable[dict], key: str) -> dict | None:
    return next((e for e in events if e["key"] == key), None)


def summarize(events: list[dict], status: str | None = None) -> dict:
    """The run summary, computed from its events only.

    Time-to-target is the training clock (``metadata.train_s``: wall time since run start minus
    evaluation, checkpoint and queue time) at the first evaluation at or above the target.
    """
    start = _first(events, "run_start") or {"value": None, "metadata": {}}
    meta = dict(start["metadata"])
    evals = [e for e in events if e["key"] == "eval_accuracy"]
    stops = [e for e in events if e["key"] == "run_stop"]
    progress = [e for e in events if e["key"] in ("eval_accuracy", "progress", "run_suspend", "run_stop")]
    # run_suspend: stopped to be resumed (preempted, requeued); run_stop: the one real end
    lifecycle = [e["key"] for e in events if e["key"] in ("run_start", "run_resume", "run_suspend", "run_stop")]
    ended = lifecycle[-1] if lifecycle else None
    last = progress[-1]["metadata"] if progress else {}
    target = meta.get("target")
    reached_at = next((e for e in evals if target is not None and e["value"] >= target), None)
    values = [e["value"] for e in evals]
    train_s = last.get("train_s", 0.0)
    samples = last.get("samples", 0)
    by_end = {"run_stop": stops[-1]["metadata"].get("status") if stops else None, "run_suspend": "preempted"}
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
        "steps_to_target": reached_at["metadata"]["step"] if reached_at else None,
        "final_metric": values[-1] if values else None,
        "best_metric": max(values) if values else None,
        "eval_model": meta.get("eval_model"),
        "steps": last.get("step", 0),
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
    }


def finalize(run_dir: Path, status: str | None = None, error: str | None = None) -> dict:
    """Write ``summary.json`` from the run's events (used after a crash by the launcher)."""
    events = read_jsonl(run_dir / EVENTS)
    summary = summarize(events, status)
    if error:  # the launcher's view (which rank failed) first, then what rank 0 saw
        summary["error"] = error + (f" (rank 0: {summary['error']})" if summary.get("error") else "")
    write_json_atomic(run_dir / SUMMARY, summary)
    from wagma_bench.mlperf import try_write_mllog  # derived from the events too; imports mlperf_logging

    try_write_mllog(run_dir)
    return summary


def record_failure(run_dir: Path, error: str) -> dict:
    """The launcher's record of a failed run: the ``run_stop`` rank 0 could not write (it was killed, or
    ended before it could), then ``summary.json``. Where rank 0 wrote its own stop, the summary's error
    gives the launcher's view first, then rank 0's."""
    path = run_dir / EVENTS
    events = read_jsonl(path)
    lifecycle = [e["key"] for e in events if e["key"] in ("run_start", "run_resume", "run_suspend", "run_stop")]
    if not lifecycle or lifecycle[-1] not in ("run_start", "run_resume"):
        return finalize(run_dir, status="failed", error=error)
    progress = [e["metadata"] for e in events if e["key"] in ("eval_accuracy", "progress", "run_resume")]
    last = {k: v for k, v in (progress[-1] if progress else {}).items()
            if k in ("step", "epoch", "samples", "train_s", "wall_s", "eval_s")}
    logged = _progress_in_step_logs(run_dir)
    if logged.get("step", 0) > last.get("step", 0):  # steps since the last event, as far as flushed
        last.update(logged)
    event = {"key": "run_stop", "value": None, "time_ms": round(time.time() * 1000, 3),
             "metadata": {**last, "status": "failed", "error": error, "recorded_by": "launcher"}}
    with open(path, "ab") as f:
        torn = f.tell() > 0 and not _ends_with_newline(path)  # rank 0 died in the middle of a line
        f.write((b"\n" if torn else b"") + json.dumps(event, sort_keys=True).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())
    return finalize(run_dir, status="failed")


def _progress_in_step_logs(run_dir: Path) -> dict:
    """Rank 0's last logged round and training time, and the samples of every rank's logged steps."""
    records = {p: read_jsonl(p) for p in sorted((run_dir / "steps").glob("rank*.jsonl"))}
    mine = records.get(run_dir / "steps" / "rank0.jsonl")
    if not mine:
        return {}
    return {"step": mine[-1].get("round", 0), "train_s": mine[-1].get("t", 0.0),
            "samples": sum(r.get("samples", 0) for recs in records.values() for r in recs)}


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"
