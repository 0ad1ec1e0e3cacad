"""A rendered sweep on SLURM, followed and controlled: submit it (and submit again what was cancelled), each
run's state, wait for the whole sweep, cancel it.

The sweep directory's ``manifest.json`` (written by :mod:`wagma_bench.campaign.sweep`) is the record: each
job's id, and per run the id of its own later submission (``job_id``), the ids it had before
(``earlier_jobs``) and, while it stands cancelled, when and which job (``cancelled``). A cancelled run's
directory also holds ``cancelled.json`` (:data:`wagma_bench.record.rundir.CANCELLED`), which its ranks read
before any requeue and ``report`` reads to show it as cancelled.

Cancelling (:func:`cancel`): every run not yet ended is marked, then its job loses the right to be requeued
(``scontrol update JobId=... Requeue=0``), then ``scancel``. Plain scancel is what we want: SLURM sends
SIGTERM to the batch shell and to every task of the job's steps (our ranks), and SIGKILL after ``KillWait``
seconds (30 by default); the ranks take TERM as "save and stop" (:mod:`wagma_bench.runtime.preemption`), so
each run ends with a checkpoint at its next synchronisation point when that comes within KillWait, else it
keeps its last periodic one. Pending array tasks are cancelled outright. SLURM itself never requeues a
cancelled job, but ``scontrol requeue`` does bring one back (measured on the local cluster: a CANCELLED array
went back to PENDING); rank 0 runs it after a USR1 (the time-limit warning) or USR2, so a warning caught just
before the cancel would undo it. Two guards, each enough alone: the note in the run directory, written before
the scancel, which the trainer checks before it requeues (it also holds where the job is not ours, under any
script), and ``Requeue=0``, under which SLURM refuses any requeue of the job ("Requested operation is
presently disabled"), in case the note is not yet visible on the rank's node (a shared file system's attribute
cache). No hold: a held job still counts as pending, and SLURM would keep it.

Resuming (:func:`submit`): the runs that stand cancelled and did not finish by their own rules go to the queue
again, an array's as ``sbatch --array=<their indices>`` of the same script (its throttle kept), into the same
run directories, where ``wagma-bench run`` resumes each from its checkpoint.
"""

from __future__ import annotations

import datetime as _dt
import re
import subprocess
import sys
import time
from pathlib import Path

from wagma_bench.campaign.sweep import MANIFEST
from wagma_bench.config import readback
from wagma_bench.errors import ConfigError
from wagma_bench.metric import metric
from wagma_bench.record.events import RunEvents
from wagma_bench.record.files import write_json_atomic
from wagma_bench.record.rundir import CANCELLED, FINISHED, LOCK, cancel_note
from wagma_bench.runtime.slurm import TERMINAL_STATES, job_states

LIVE_STATES = ("RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING")


def load_manifest(sweep_dir: Path) -> dict:
    """The sweep's manifest, checked against its schema; every path it names inside the sweep directory, and
    the sweep where it was rendered (its scripts name that folder: a copy would write its logs and runs into
    the original's)."""
    path = Path(sweep_dir) / MANIFEST
    if not path.exists():
        raise ConfigError(f"{sweep_dir} is not a sweep directory (no {MANIFEST})")
    manifest = readback.load(path, readback.SWEEP_MANIFEST)
    for i, job in enumerate(manifest["jobs"]):
        readback.inside(sweep_dir, job["script"], str(path), f"jobs[{i}].script")
    for i, run in enumerate(manifest["runs"]):
        readback.inside(sweep_dir, run["run_dir"], str(path), f"runs[{i}].run_dir")
        if not 0 <= run["job"] < len(manifest["jobs"]):
            raise readback.ReadBackError(
                f"{path}: runs[{i}].job={run['job']} is not allowed; it must be an index into jobs "
                f"(0..{len(manifest['jobs']) - 1})"
            )
    rendered = manifest.get("dir")
    if rendered is not None and Path(rendered) != Path(sweep_dir).resolve():
        raise ConfigError(
            f"{sweep_dir} is a copy of the sweep rendered in {rendered} (its scripts write their logs and "
            f"runs there); follow that one, or render the sweep again with --out {sweep_dir}"
        )
    return manifest


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


# --- submit ---------------------------------------------------------------------------------------------


def submit(sweep_dir: Path, sbatch: str = "sbatch") -> list[str]:
    """sbatch every job not yet submitted, and again the runs that were cancelled before they finished
    (:func:`resubmit_cancelled`); records the job ids in the manifest and returns those submitted now."""
    sweep_dir = Path(sweep_dir).resolve()
    manifest = load_manifest(sweep_dir)
    ids = []
    try:
        for job in manifest["jobs"]:
            if job["job_id"] is None:
                job["job_id"] = _sbatch(sbatch, sweep_dir / job["script"])
                job["submitted"] = _now()
                ids.append(job["job_id"])
        ids += resubmit_cancelled(sweep_dir, manifest, sbatch)
    finally:  # what was submitted stays recorded, also when a later sbatch failed
        write_json_atomic(sweep_dir / MANIFEST, manifest)
    return ids


def _sbatch(sbatch: str, script: Path, options: tuple[str, ...] = ()) -> str:
    out = subprocess.run(
        [sbatch, "--parsable", *options, str(script)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0:
        raise RuntimeError(f"sbatch {script.name} failed: {out.stderr.strip()}")
    return out.stdout.strip().split(";")[0]


def resubmit_cancelled(sweep_dir: Path, manifest: dict, sbatch: str = "sbatch") -> list[str]:
    """Submit again the runs that stand cancelled and did not finish by their own rules: one sbatch per job of
    the manifest, an array's with ``--array`` of just those runs' indices (the script maps each index to its
    run). Refused while one of their old jobs still ends (two jobs would write one run directory)."""
    cancelled = [r for r in manifest["runs"] if r.get("cancelled")]
    rows = {row["run"]: row for row in status(sweep_dir, manifest)} if cancelled else {}
    again = []
    for run in cancelled:
        row = rows[run["name"]]
        if row["slurm"] in LIVE_STATES or row["slurm"] == "PENDING":
            raise ConfigError(
                f"run {run['name']} (job {row['job']}) is still {row['slurm']} after its cancel; "
                f"submit it again once it has ended: wagma-bench sweep wait {sweep_dir}"
            )
        if (
            row["own"] in FINISHED
        ):  # it ended by its own rules before the cancel reached it: nothing to resume
            _uncancel(sweep_dir, run)
        else:
            again.append(run)
    ids = []
    for j, job in enumerate(manifest["jobs"]):
        runs = [r for r in again if r["job"] == j]
        if not runs:
            continue
        script = sweep_dir / job["script"]
        options = (
            (f"--array={','.join(str(r['array_index']) for r in runs)}{_throttle(script)}",)
            if job["array"]
            else ()
        )
        for run in runs:
            _release_ended_lock(sweep_dir / run["run_dir"])
        new_id = _sbatch(sbatch, script, options)
        ids.append(new_id)
        for run in runs:
            run.setdefault("earlier_jobs", []).append(run_slurm_id(manifest, run))
            run["job_id"], run["submitted"] = new_id, _now()
            _uncancel(sweep_dir, run)
    return ids


def _throttle(script: Path) -> str:
    """The ``%N`` of the script's own ``#SBATCH --array`` (at most N tasks at once): the command line's
    ``--array`` replaces the script's whole option."""
    found = re.search(r"^#SBATCH --array=\S*?(%\d+)\s*$", script.read_text(), re.MULTILINE)
    return found.group(1) if found else ""


def _uncancel(sweep_dir: Path, run: dict) -> None:
    run.pop("cancelled", None)
    (sweep_dir / run["run_dir"] / CANCELLED).unlink(missing_ok=True)


def _release_ended_lock(run_dir: Path) -> None:
    """Remove a run directory's lock left by a SLURM job that has ended (ranks killed after KillWait on
    another node leave theirs, which the run's own check cannot judge from a new node: another host's PID)."""
    try:
        holder = readback.load(run_dir / LOCK, readback.RUN_NOTE)
    except (OSError, ValueError):
        return
    job = holder.get("slurm_job_id")
    if not job:
        return
    # only when SLURM says it ended (no answer: it may be unreachable, and the run's own check will name the
    # holder); an array task's own id is answered under its array's name (ARRAY_TASK)
    states = job_states([str(job)]).values()
    if states and all(state in TERMINAL_STATES for state in states):
        print(
            f"wagma-bench: removing the lock of {run_dir} left by SLURM job {job}, which has ended",
            file=sys.stderr,
            flush=True,
        )
        (run_dir / LOCK).unlink(missing_ok=True)


# --- state ----------------------------------------------------------------------------------------------


def run_job_id(manifest: dict, run: dict) -> str | None:
    """The SLURM job (an array's id) that runs ``run`` now: its own later submission's, else its job's."""
    return run.get("job_id") or manifest["jobs"][run["job"]]["job_id"]


def run_slurm_id(manifest: dict, run: dict) -> str | None:
    job_id = run_job_id(manifest, run)
    if job_id is None:
        return None
    return f"{job_id}_{run['array_index']}" if run["array_index"] is not None else job_id


def run_progress(run_dir: Path) -> dict:
    """A run's own view: its status (from its summary when written after its last event, else its events), the
    last round logged, and its last evaluation (value and round)."""
    record = RunEvents.read(run_dir)
    evals = record.evaluations
    last = {"metric": evals[-1].value if evals else None, "eval_step": evals[-1].round if evals else None}
    last["metric_name"] = record.start.metric if record.start else None  # which way it is better
    s = record.saved_summary
    if s is not None and record.summary_after_events:  # else an earlier attempt's, before this one's events
        if last["metric"] is None:
            last["metric"] = s.final_metric
        return {"status": s.status, "step": s.rounds, **last, "restarts": s.restarts, "reached": s.reached}
    if not record.events:
        return {"status": "not started", "step": None, **last, "restarts": 0, "reached": None}
    return {
        "status": "running",
        "step": record.last_round,
        **last,
        "restarts": record.resumes,
        "reached": None,
    }


def status(sweep_dir: Path, manifest: dict | None = None) -> list[dict]:
    """One row per run: SLURM's state of its job (array task) and the run's own progress. A run that stands
    cancelled and did not finish by its own rules has status ``cancelled`` (``own``: what its record says)."""
    sweep_dir = Path(sweep_dir).resolve()
    manifest = load_manifest(sweep_dir) if manifest is None else manifest
    ids = sorted({j for j in (run_job_id(manifest, r) for r in manifest["runs"]) if j})
    try:
        states = job_states(ids) if ids else {}
    except (OSError, subprocess.SubprocessError):
        states = {}
    rows = []
    for run in manifest["runs"]:
        sid = run_slurm_id(manifest, run)
        slurm = "unsubmitted" if sid is None else states.get(sid, "unknown")
        if sid is not None and slurm == "unknown" and run["array_index"] is not None:
            # a pending array's tasks are one record until they start
            slurm = states.get(run_job_id(manifest, run), "unknown")
        progress = run_progress(sweep_dir / run["run_dir"])
        own = progress["status"]
        if own not in FINISHED and (
            run.get("cancelled") or cancel_note(sweep_dir / run["run_dir"]) is not None
        ):
            progress["status"] = "cancelled"
        rows.append({"run": run["name"], "job": sid, "slurm": slurm, **progress, "own": own})
    return rows


def format_rows(rows: list[dict]) -> str:
    """The status table; ``last eval`` is the last evaluation's value at the step it was taken."""
    cols = ["run", "job", "slurm", "status", "step", "last eval", "restarts"]

    def cell(row: dict, col: str) -> str:
        if col == "last eval":
            return "-" if row["metric"] is None else f"{row['metric']:.4f} @ {row.get('eval_step', '?')}"
        value = row[col]
        return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)

    cells = [[cell(r, c) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def finished(row: dict) -> bool:
    return row["slurm"] in TERMINAL_STATES or (
        row["slurm"] == "unknown" and row["status"] not in ("running", "not started", "preempted")
    )


ENDED_WELL = ("completed", "time_limit")  # a run's own statuses that count as done (else failed)


def phase(row: dict) -> str:
    """pending | running | done | failed | cancelled: where one submitted run
    stands, for the progress line."""
    if finished(row):
        return (
            row["status"]
            if row["status"] == "cancelled"
            else "done"
            if row["status"] in ENDED_WELL
            else "failed"
        )
    if row["slurm"] in LIVE_STATES or row["status"] == "running":
        return "running"
    return "pending"


def progress_line(rows: list[dict], elapsed_s: float) -> str:
    """One line for the whole sweep: counts by phase (cancelled only when some are) and the best metric so
    far (in its Metric's direction)."""
    submitted = [r for r in rows if r["job"] is not None]
    counts = {p: 0 for p in ("pending", "running", "done", "failed", "cancelled")}
    for row in submitted:
        counts[phase(row)] += 1
    line = ", ".join(f"{n} {p}" for p, n in counts.items() if p != "cancelled" or n)
    if len(submitted) < len(rows):
        line += f" ({len(rows) - len(submitted)} unsubmitted)"
    scored = [r for r in rows if r["metric"] is not None]
    if scored:
        key = metric(scored[0].get("metric_name")).key
        best = min(scored, key=lambda r: key(r["metric"]))
        line += f"; best metric {best['metric']:.4f} ({best['run']})"
    return f"[{_dt.timedelta(seconds=round(elapsed_s))}] {line}"


def refuse_unsubmitted(sweep_dir: Path, rows: list[dict], what: str) -> None:
    """A sweep with no submitted job has nothing to wait for or cancel: an exit 0
    at once would read as done."""
    if all(r["job"] is None for r in rows):
        raise ConfigError(
            f"sweep {sweep_dir} has no submitted job, so there is nothing to {what}; submit it "
            f"first: wagma-bench sweep submit {sweep_dir}"
        )


# --- wait -----------------------------------------------------------------------------------------------


def wait(sweep_dir: Path, timeout_s: float | None = None, interval_s: float = 30.0, out=None) -> list[dict]:
    """Poll SLURM once per ``interval_s`` for the whole sweep (one squeue call) until every submitted job
    has ended, writing a progress line to ``out`` (overwritten in place on a terminal, else one line per
    change). ``timeout_s`` None waits as long as it takes. (Not sbatch --wait: it polls lazily, an 11 s job
    returned after 42 s.) A sweep with no submitted job is refused (:func:`refuse_unsubmitted`)."""
    t0 = time.monotonic()
    tty = out is not None and out.isatty()
    last = None
    rows = status(sweep_dir)
    refuse_unsubmitted(sweep_dir, rows, "wait for")
    while True:
        line = progress_line(rows, time.monotonic() - t0)
        counts = line.partition("] ")[2]
        if out is not None and (tty or counts != last):
            out.write(f"\r{line}\033[K" if tty else f"{line}\n")
            out.flush()
        last = counts
        if all(finished(r) for r in rows if r["job"] is not None):
            if tty:
                out.write("\n")
            return rows
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            raise TimeoutError(
                f"sweep {sweep_dir} not finished after {timeout_s:.0f} s:\n{format_rows(rows)}"
            )
        time.sleep(interval_s)
        rows = status(sweep_dir)


# --- cancel ---------------------------------------------------------------------------------------------


def cancel(sweep_dir: Path, scancel: str = "scancel") -> list[dict]:
    """Cancel every run of the sweep that has not ended (see the module docstring for the order and why);
    returns their rows. The runs resume with :func:`submit`."""
    sweep_dir = Path(sweep_dir).resolve()
    manifest = load_manifest(sweep_dir)
    rows = status(sweep_dir, manifest)
    refuse_unsubmitted(sweep_dir, rows, "cancel")
    live = [
        (run, row)
        for run, row in zip(manifest["runs"], rows, strict=True)
        if row["job"] is not None and not finished(row)
    ]
    when = _now()
    for run, row in live:  # first the marks: a rank that requeues itself from now on finds its run cancelled
        note = {"cancelled": when, "job": row["job"], "by": "wagma-bench sweep cancel"}
        run["cancelled"] = note
        run_dir = sweep_dir / run["run_dir"]
        if run_dir.is_dir():  # a run not yet started has no directory: the manifest alone marks it
            write_json_atomic(run_dir / CANCELLED, note)
    write_json_atomic(sweep_dir / MANIFEST, manifest)
    jobs = sorted({run_job_id(manifest, run) for run, _ in live})
    for (
        job
    ) in jobs:  # fails for a job that ended meanwhile ("already finished"): nothing left to requeue then
        subprocess.run(
            ["scontrol", "update", f"JobId={job}", "Requeue=0"], check=False, capture_output=True, timeout=60
        )
    if jobs:
        out = subprocess.run([scancel, *jobs], check=False, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"scancel {' '.join(jobs)} failed: {out.stderr.strip() or out.stdout.strip()}")
    return [{**row, "status": "cancelled"} for _, row in live]
