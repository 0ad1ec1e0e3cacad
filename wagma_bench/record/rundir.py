"""One writer per run directory, and what a rerun into an existing one means.

The launching process (rank 0 only under torchrun / srun / mpiexec) takes ``.lock`` in the run directory
before any rank starts: a JSON file with the holder's host, PID, SLURM job and start time, created
atomically (written aside, then hard-linked into place, which fails when the lock exists). A second run
into a locked directory fails at once naming the holder. A lock whose holder is gone (its PID is dead on
this host, or it is an earlier incarnation of this same SLURM job, i.e. a requeue) is taken over with a
message.

A rerun of a finished run with the same configuration and budget prints the earlier summary instead of
training again; raising the budget (``train.max_rounds``, ``train.epochs``, ``train.time_limit_s``) continues
it from its checkpoint.

After a failure the launcher writes the run's ``summary.json`` and MLPerf log from its events
(:func:`finalize`; the trainer writes them itself at a clean end).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

from wagma_bench.config import readback
from wagma_bench.config.identity import budget, resume_hash
from wagma_bench.record.events import EVENTS, SUMMARY, RunEvents, torn_last_line
from wagma_bench.record.files import open_run_file, refuse_link
from wagma_bench.record.steps import StepRecord, read_step_log
from wagma_bench.record.summary import FINISHED, RunSummary, run_summary, write_summary  # noqa: F401 (FINISHED: its old home)

LOCK = ".lock"
# Written by `wagma-bench sweep cancel` before its scancel, removed when the sweep submits the run again: the
# user ended this run, so it must not requeue itself (a USR1 caught just before the cancel would), and reports
# show it as cancelled, not as failed or preempted. (wagma_bench.campaign.sweep_jobs writes it.)
CANCELLED = "cancelled.json"
# a tuning directory (`wagma-bench tune`): its plan, written before any trial runs, and the folder of its
# trials' run directories (read by analysis/tuning.py, and by the W&B logger to group a tuning's trials)
TUNE_PLAN, TUNE_TRIALS = "tune.json", "trials"


class RunDirLocked(RuntimeError):
    """Another live run writes into this run directory."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def _describe(holder: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    job = f", SLURM job {holder['slurm_job_id']}" if holder.get("slurm_job_id") else ""
    return f"PID {holder.get('pid')} on {holder.get('host')}{job}, started {started}"


class RunDirLock:
    """The lock of one run directory; :meth:`acquire` raises :class:`RunDirLocked` naming a live holder."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.held = False

    def _stale(self, holder: dict) -> str | None:
        """Why the holder is gone (None: it may be alive)."""
        job = os.environ.get("SLURM_JOB_ID")
        if job and holder.get("slurm_job_id") == job and holder.get("pid") != os.getpid():
            return "an earlier incarnation of this SLURM job (requeued)"
        if holder.get("host") == socket.gethostname() and not _pid_alive(int(holder.get("pid", 0))):
            return "its process is gone"
        return None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.time(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        }
        tmp = self.path.with_name(f"{LOCK}.{me['host']}.{me['pid']}")
        tmp.unlink(missing_ok=True)  # a leftover of an earlier process with our PID, or a planted link
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(me))
        try:
            for _ in range(3):
                try:
                    self._create(tmp, me)
                    self.held = True
                    return
                except FileExistsError:
                    holder = self._holder()
                    why = self._stale(holder) if holder else None
                    if why is None:
                        raise RunDirLocked(
                            f"run directory {self.path.parent} is in use by another run "
                            f"({_describe(holder) if holder else 'holder unknown'}); "
                            f"wait for it or choose another hydra.run.dir"
                        ) from None
                    print(
                        f"wagma-bench: taking over the stale lock of {self.path.parent} "
                        f"({_describe(holder)}: {why})",
                        file=sys.stderr,
                        flush=True,
                    )
                    with contextlib.suppress(FileNotFoundError):
                        self.path.unlink()
            raise RunDirLocked(f"could not lock run directory {self.path.parent}: other runs keep taking it")
        finally:
            tmp.unlink(missing_ok=True)

    def _create(self, tmp: Path, me: dict) -> None:
        """Create the lock atomically, complete from its first instant: a hard link of the written file;
        where the file system has no hard links, an exclusive create (a reader may then briefly see it
        empty, and reports the holder as unknown). Raises FileExistsError when a lock exists."""
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            raise
        except OSError:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(me))

    def _holder(self) -> dict | None:
        try:
            return readback.load(self.path, readback.RUN_NOTE)
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        if self.held:
            holder = self._holder()
            if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
                self.path.unlink(missing_ok=True)
            self.held = False


# What a run writes in its directory (W&B's own folder, with its own links, aside): none may be a link.
# .heartbeats: the ranks of an external launcher beat there (wagma_bench.runtime.supervise.HEARTBEATS);
# refused under every launcher alike, the local one included (whose own heartbeats live elsewhere)
RUN_FILES = (
    EVENTS,
    SUMMARY,
    "mllog.txt",
    LOCK,
    CANCELLED,
    ".hydra",
    "steps",
    "checkpoint",
    "checkpoint.json",
    ".heartbeats",
)


def refuse_symlinks(run_dir: Path) -> None:
    """Raise :class:`SymlinkRefused` naming the first file or folder of the run that is a symbolic link
    (checked before any rank starts; every writer also opens without following links)."""
    run_dir = Path(run_dir)
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_symlink():
            raise refuse_link(path)
        if name in ("steps", "checkpoint", ".hydra", ".heartbeats") and path.is_dir():
            for inner in sorted(path.rglob("*")):  # rglob does not descend into linked folders
                if inner.is_symlink():
                    raise refuse_link(inner)


def finished_summary(run_dir: Path, raw: dict) -> RunSummary | None:
    """The summary of a finished run in ``run_dir`` with the same identity and
    budget as ``raw``, else None."""
    record = RunEvents.read(run_dir)
    summary = record.saved_summary
    if summary is None or not summary.finished:
        return None
    earlier = record.start.config if record.start else None
    if not earlier or resume_hash(earlier) != resume_hash(raw) or budget(earlier) != budget(raw):
        return None
    return summary


def finalize(
    run_dir: Path, status: str | None = None, error: str | None = None, echo_mllog: bool = False
) -> dict:
    """Write ``summary.json`` and the MLPerf log from the run's events: by rank 0 at the end of a run, by the
    launcher after a crash (``status``, ``error``: its view of the failure). ``echo_mllog``: also print the
    MLPerf log's lines (``logger.mllog``)."""
    from wagma_bench.record.mlperf import try_write_mllog  # imports mlperf_logging

    summary = RunEvents.read(run_dir).summary(status)
    records = step_logs(run_dir)
    summary["compute_imbalance"] = imbalance_of(records)
    summary["compute_contention"] = contention_of(records)
    summary["preempted_rollouts"] = preempted_rollouts(records)
    if error:  # the launcher's view (which rank failed) first, then what rank 0 saw
        seen = RunSummary.from_json(summary).error
        summary["error"] = error + (f" (rank 0: {seen})" if seen else "")
    write_summary(run_dir, summary)
    try_write_mllog(run_dir, echo=echo_mllog)
    return summary


def record_failure(run_dir: Path, error: str, status: str = "failed") -> dict:
    """The launcher's record of a failed run (``status``: ``failed``, or ``interrupted`` by a second Ctrl-C):
    the ``run_stop`` rank 0 could not write (it was killed, or ended before it could), then ``summary.json``.
    Where rank 0 wrote its own stop, the summary's error gives the launcher's view first, then rank 0's."""
    path = run_dir / EVENTS
    record = RunEvents.read(run_dir)
    events, lifecycle = record.events, record.lifecycle
    if not lifecycle or lifecycle[-1] not in ("run_start", "run_resume"):
        return finalize(run_dir, status=status, error=error)
    progress = [e["metadata"] for e in events if e["key"] in ("eval_accuracy", "progress", "run_resume")]
    last = {
        k: v
        for k, v in (progress[-1] if progress else {}).items()
        if k in ("round", "epoch", "samples", "train_s", "wall_s", "eval_s")
    }
    logged = _progress_in_step_logs(run_dir)
    if logged.get("round", 0) > last.get("round", 0):  # rounds since the last event, as far as flushed
        last.update(logged)
    event = {
        "key": "run_stop",
        "value": None,
        "time_ms": round(time.time() * 1000, 3),
        "metadata": {**last, "status": status, "error": error, "recorded_by": "launcher"},
    }
    with open_run_file(path, "ab") as f:
        torn = torn_last_line(path)  # rank 0 died in the middle of a line
        f.write((b"\n" if torn else b"") + json.dumps(event, sort_keys=True).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())
    return finalize(run_dir, status=status)


def _progress_in_step_logs(run_dir: Path) -> dict:
    """Rank 0's last logged round and training time, and the samples of every rank's logged steps."""
    records = {p: read_step_log(p) for p in sorted((run_dir / "steps").glob("rank*.jsonl"))}
    mine = records.get(run_dir / "steps" / "rank0.jsonl")
    if not mine:
        return {}
    last = mine[-1]
    return {
        "round": 0 if last.round is None else last.round,
        "train_s": 0.0 if last.t is None else last.t,
        "samples": sum(r.samples for recs in records.values() for r in recs if r.samples is not None),
    }


def compute_imbalance(run_dir: Path) -> float | None:
    """How uneven the ranks' compute was: the mean over steps of slowest / mean rank compute time, from the
    step logs (1.0: perfectly even; 2.0: the slowest rank took twice the mean). A rank's compute is its
    forward + backward (``compute_s``, batch loading included) plus its injected straggler delay
    (``delay_s``: the imbalance models stand for slower compute). Steps are matched by each rank's local step
    index, over the steps every rank logged; None without step logs."""
    return imbalance_of(step_logs(run_dir))


def step_logs(run_dir: Path) -> list[list[StepRecord]]:
    """Every rank's step log, as written (``steps/rank<R>.jsonl``)."""
    # regular files only: the summary of a failed run is written whatever stands in the way of a step log
    return [read_step_log(p) for p in sorted((Path(run_dir) / "steps").glob("rank*.jsonl")) if p.is_file()]


def contention_of(records: list[list[StepRecord]]) -> float | None:
    """How long the ranks' compute waited for a core: their wall-clock compute over their CPU compute (the
    thread's own CPU time, ``compute_cpu_s``), summed over every rank and step. About 1 on a machine whose
    cores the ranks had to themselves; 2 when each rank got half a core (another process, too many ranks for
    the cores). None where the records have no CPU time (logged before 2026-12-02, or a compact table without
    it)."""
    wall = cpu = 0.0
    for recs in records:
        for r in recs:
            if r.compute_cpu_s is not None and r.compute_s is not None:
                wall, cpu = wall + r.compute_s, cpu + r.compute_cpu_s
    return round(wall / cpu, 4) if cpu > 0 else None


def imbalance_of(records: list[list[StepRecord]]) -> float | None:
    """:func:`compute_imbalance` of per-rank step records, however they were read (raw logs, a compact table):
    the report recomputes it so for a run whose summary was written before it was measured."""
    per_rank = [
        {r.local_step: _or_0(r.compute_s) + _or_0(r.delay_s) for r in recs if r.local_step is not None}
        for recs in records
    ]
    per_rank = [times for times in per_rank if times]
    if not per_rank:
        return None
    common = set.intersection(*(set(times) for times in per_rank))
    ratios = []
    for step in common:
        values = [times[step] for times in per_rank]
        mean = sum(values) / len(values)
        if mean > 0:
            ratios.append(max(values) / mean)
    return round(sum(ratios) / len(ratios), 4) if ratios else None


def _or_0(seconds: float | None) -> float:
    return 0.0 if seconds is None else seconds


def preempted_rollouts(records: list[list[StepRecord]]) -> dict | None:
    """DD-PPO's straggler preemption (``workload.preemption``): the rollouts it cut short, summed over the
    ranks, of the rollouts the ranks collected, from their step records (:func:`step_logs`: the ``preempted``
    flag each rank logs on a rollout's first step). Preemption acts on timing (a rank stops when enough others
    have finished), so this count is why two DD-PPO runs with one seed differ; None for a run that logs no
    rollouts."""
    flags = [r.preempted for recs in records for r in recs if r.preempted is not None]
    return {"cut": sum(map(bool, flags)), "rollouts": len(flags)} if flags else None


def live_holder(run_dir: Path) -> dict | None:
    """The lock holder of a run still in progress: its lock names a process alive on this host (None: no
    lock, a stale one, or one of another host, which cannot be checked from here)."""
    try:
        holder = readback.load(Path(run_dir) / LOCK, readback.RUN_NOTE)
    except (OSError, ValueError):
        return None
    if holder.get("host") != socket.gethostname():
        return None
    pid = holder.get("pid")
    return holder if isinstance(pid, int) and pid > 0 and _pid_alive(pid) else None


def cancel_note(run_dir: Path) -> dict | None:
    """What ``wagma-bench sweep cancel`` noted in the run directory (when, which
    job), or None: not cancelled."""
    try:
        note = readback.load(Path(run_dir) / CANCELLED, readback.RUN_NOTE)
    except (OSError, ValueError):
        return None
    return note
