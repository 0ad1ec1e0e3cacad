"""One run launched, supervised and read back as one typed :class:`RunOutcome`.

:func:`launch` owns what a run needs between its checked command line and its exit code: the configuration
checked once for the whole run (:mod:`wagma_bench.runtime.handover`), the run directory's lock, the ranks
started here (local ranks, or the same command under mpiexec for ``comm=mpi``) or joined (a rank of
torchrun's, srun's or a user's mpiexec world), their supervision, the record of a run whose ranks failed or
were stopped, and its summary read back. It raises only for a run refused before any rank started
(:class:`~wagma_bench.errors.ConfigError`, exit 2); every other end is a :class:`RunOutcome`, which the
command (``cli/run.py``) turns into an exit code through the one table
(:func:`wagma_bench.exits.outcome_code`). Whatever the launcher, the outcome is the same kind of value, so a
multirun answers a failed job the same way under every launcher (docs/run-budget-and-exit-codes.md)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from wagma_bench import exits
from wagma_bench.errors import ConfigError
from wagma_bench.record.summary import RunSummary, run_summary

# completed: the run ended by its own rules (its budget, a time limit, a preemption it checkpointed for), or
# it had already finished (with a ``signal``: one came as its ranks ended, after they had completed it);
# failed: a rank died, raised or hung; interrupted: a Ctrl-C; stopped: SIGTERM or SIGHUP to the launcher
# (``signal``); diverged: a non-finite training loss
STATUSES = ("completed", "failed", "interrupted", "stopped", "diverged")


@dataclass(frozen=True)
class RunOutcome:
    """How one run ended: its status (:data:`STATUSES`), its run directory, its summary (None on a rank other
    than 0, or where the launcher recorded the end), the signal that stopped it or that came as its ranks
    ended (SIGINT, SIGTERM, SIGHUP; None), what to print on stdout (the summary) and the one line that says an
    end with an exit code other than 0 (:func:`wagma_bench.exits.outcome_code`)."""

    status: str
    run_dir: Path
    summary: RunSummary | None = None
    signal: int | None = None
    report: str = ""
    line: str = ""


LOCK_HELD_ENV = "WAGMA_BENCH_RUN_DIR_LOCKED"  # set for ranks re-executed under mpiexec by the lock holder

_LOCKS: dict = {}  # resolved run directory -> the RunDirLock this process holds
# Hydra writes its copy of the configuration (.hydra/) into the run directory before the job is checked. For
# each run directory this command may write: the files of its .hydra/ as they were (None: the directory did
# not exist); a refused job puts them back (:func:`restore_refused`), so a refusal never replaces the record
# of a run.
_FOUND: dict[Path, dict[str, bytes] | None] = {}
_REFUSED: list[Path] = []


def remember(run_dir: Path) -> None:
    """Note the run directory's Hydra copy as found, before Hydra writes it (see :data:`_FOUND`)."""
    key = run_dir.resolve()
    if key not in _FOUND:
        copy = key / ".hydra"
        _FOUND[key] = (
            None
            if not key.exists()
            else {f.name: f.read_bytes() for f in copy.iterdir() if f.is_file()}
            if copy.is_dir()
            else {}
        )


def release_all() -> None:
    """At the command's end: every lock this process holds released, and each refused job's run directory as
    this command found it (:func:`_as_found`)."""
    for lock in _LOCKS.values():
        lock.release()
    for run_dir in _REFUSED:
        _as_found(run_dir)


def _as_found(run_dir: Path) -> None:
    """After a refusal (its lock released): the run directory as this command found it. A directory that did
    not exist, or that the job's default name made (not remembered), loses Hydra's copy and, when nothing else
    is in it, itself; a run's earlier copy is written back."""
    from wagma_bench.record.files import atomic_write

    key = run_dir.resolve()
    found, copy = _FOUND.get(key), key / ".hydra"
    if found:
        for f in copy.iterdir() if copy.is_dir() else ():
            if f.name not in found:
                f.unlink()
        for name, data in found.items():
            atomic_write(copy / name, lambda f, data=data: f.write(data), binary=True)
        return
    shutil.rmtree(copy, ignore_errors=True)
    _close_logs_in(key)
    if found is None:  # made by this command: removed when empty (a lock of another process stays)
        with contextlib.suppress(OSError):
            key.rmdir()


def _close_logs_in(folder: Path) -> None:
    """Hydra's job log handlers that would write into ``folder`` (its log file is made by its first line):
    closed and taken off, so that a later line of this process (a command run in-process) does not recreate
    the folder or fail on it once removed."""
    import logging

    for logger in (
        logging.getLogger(),
        *(lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)),
    ):
        for handler in list(logger.handlers):
            if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).is_relative_to(folder):
                logger.removeHandler(handler)
                handler.close()


def lock_run_dir(run_dir: Path) -> None:
    """Take the run directory's lock for this process (once); refused (ConfigError) naming the holder if
    another has it, or naming a file of the run that is a symbolic link."""
    from wagma_bench.record.files import SymlinkRefused
    from wagma_bench.record.rundir import RunDirLock, RunDirLocked, refuse_symlinks

    key = run_dir.resolve()
    if key in _LOCKS or os.environ.get(LOCK_HELD_ENV) == str(key):  # ours, or our launching process's
        return
    lock = RunDirLock(key)
    try:
        refuse_symlinks(key)
        lock.acquire()
    except (RunDirLocked, SymlinkRefused) as err:
        raise ConfigError(str(err)) from None
    except OSError as err:  # a read-only or full file system, no permission: before anything ran
        raise ConfigError(
            f"the run directory {run_dir} cannot be written ({err.strerror or err}); choose another "
            "hydra.run.dir"
        ) from None
    _LOCKS[key] = lock


def prepare(overrides: list[str], world) -> tuple[list[str], Path | None]:
    """A command line's overrides made ready for Hydra, before it composes them: for a rank of an external
    launcher's world, what the rank server would import (the same way), the run directory agreed by every
    rank and restart, and (not rank 0) no Hydra config copy or log file; for a launcher, its local ranks'
    fork server started now (its imports, torch's ~4 s here, overlap Hydra's work; a command refused later
    stops it as it exits). Returns them with the run directory they name (None: Hydra's default, or a rank
    handed the configuration its launching process checked), checked first (a parse error or a misspelt
    key is refused before anything is created)."""
    import importlib

    from wagma_bench.config.overrides import MULTIRUN_FLAGS, precheck
    from wagma_bench.config.paths import CONF_DIR
    from wagma_bench.runtime.handover import CHECKED_ENV
    from wagma_bench.runtime.launch import RANK_SERVER_PRELOAD, agreed_run_dir_override, start_rank_server

    if world is not None:  # a rank of torchrun's, srun's or mpiexec's world: it imports what the rank server
        importlib.import_module(RANK_SERVER_PRELOAD)  # would, the same way (the collector off, then frozen)
    if world is not None and (run_dir := agreed_run_dir_override(overrides)):
        overrides = overrides + [run_dir]  # the same on every rank and restart, not each rank's clock
    if world is not None and world.rank != 0:  # only rank 0 keeps Hydra's config copy and log file
        overrides = overrides + [
            "hydra.output_subdir=null",
            "hydra/job_logging=none",
            "hydra/hydra_logging=none",
        ]
    if world is None and not any(o.startswith("-") and o not in MULTIRUN_FLAGS for o in overrides):
        start_rank_server()  # local ranks to come (most likely)
    # a rank that its launching process handed the checked configuration composes once, in Hydra's job
    explicit = precheck(overrides, CONF_DIR) if world is None or not os.environ.get(CHECKED_ENV) else None
    chosen = any(o.startswith(("hydra.run.dir=", "hydra.sweep.dir=")) for o in overrides)
    if not chosen and not os.access(os.getcwd(), os.W_OK):  # Hydra's default directories are under it
        raise ConfigError(
            f"the current directory {os.getcwd()} cannot be written (a read-only file system, or no "
            "permission), and the run directory (outputs/..., multirun/...) is made there; run from another "
            "directory, or set hydra.run.dir"
        )
    return overrides, explicit


@contextlib.contextmanager
def run_dirs(explicit: Path | None, world):
    """The command's hold on its run directories: the one its command line names locked (by a launcher or
    rank 0) before Hydra writes its config copy and log there; on leaving, every lock released and each
    refused job's directory as it was found."""
    try:
        if explicit is not None and (world is None or world.rank == 0):
            remember(explicit)
            lock_run_dir(explicit)
        yield
    finally:
        release_all()


def launch(cfg, run_dir: Path, world, program, task_overrides: list[str] = ()) -> RunOutcome:
    """Run the composed configuration ``cfg`` in ``run_dir``: as a rank of ``world`` (an external launcher's,
    see :func:`~wagma_bench.runtime.world.detect_world`), or, with ``world`` None, on ranks started here.
    ``program`` is what each rank runs (the trainer's :func:`wagma_bench.train.rank.train_rank`: passed in, so
    that this layer does not import the one above it); ``task_overrides`` are this job's own overrides (under
    ``-m``, one point of the sweep), which mpiexec's ranks are started with."""
    from wagma_bench.runtime import startup
    from wagma_bench.runtime.launch import stop_rank_server

    startup.new_job()
    try:
        run_cfg = _checked(cfg, world, run_dir)
        if world is not None or run_cfg.comm.name == "mpi":  # no local ranks of ours: no fork server
            stop_rank_server()
        if world is None or world.rank == 0:
            lock_run_dir(run_dir)
        try:
            outcome = _launch_locked(run_cfg, run_dir, world, program, list(task_overrides))
        finally:
            lock = _LOCKS.pop(run_dir.resolve(), None)
            if lock is not None:
                lock.release()
    except ConfigError:  # refused before any rank started: Hydra's copy of what was refused goes
        if world is None or world.rank == 0:  # (rank 0 wrote it)
            _REFUSED.append(run_dir)
        raise
    return signalled_as_it_ended(outcome)


def signalled_as_it_ended(outcome: RunOutcome) -> RunOutcome:
    """``outcome``, with the stop signal (SIGTERM, SIGHUP, a Ctrl-C) that the launcher took as its ranks
    ended, while it wrote the run's record (:func:`~wagma_bench.runtime.signals.late_signal`), where the run
    completed: still ``completed`` (its record is whole), with the signal, which the exit table answers with
    128 + it, and the line that says so. A run that failed, diverged or was stopped keeps its own code. The
    signal stays noted: under ``-m`` the next job does not start
    (:func:`~wagma_bench.runtime.signals.starting` raises it), and a completed job's signal ends the sweep
    with its code. A signal after this point (while the report is printed) is noted and acts on a next job
    only: the command is ending."""
    from wagma_bench.runtime import signals

    late = signals.late_signal()
    if late is None or outcome.status != "completed" or outcome.signal is not None:
        return outcome
    ended = replace(outcome, signal=late)
    line = (
        f"wagma-bench: {signal.Signals(late).name} as the run ended: its record is whole (above); exit "
        f"{exits.outcome_code(ended)}"
    )
    return replace(ended, line=line)


def _checked(cfg, world, run_dir: Path):
    """The run's configuration, checked once in the whole run (:mod:`wagma_bench.runtime.handover`): as the
    launching process handed it, as rank 0 of this world checked it, or checked here (and, on rank 0 of an
    external launcher's world, handed on). Packages and data paths are checked with it, by the process that
    checks it or by a launching process that was handed it (a tune trial's run)."""
    from wagma_bench.config.schema import as_recorded, from_checked, validate
    from wagma_bench.runtime import handover
    from wagma_bench.runtime.extras import check_extras
    from wagma_bench.workloads.specs import WORKLOAD_SPECS

    handed = handover.handed(run_dir)
    if handed is not None and world is not None:  # a rank our launching process started: checked there
        return from_checked(handed)
    external = world is not None and handed is None  # a world started by torchrun, srun or a user's mpiexec
    channel = handover.world_channel(world, run_dir, cfg.comm.name) if external else None
    if channel is not None and world.rank != 0:
        message = channel.receive()
        if "refused" in message:
            raise ConfigError(message["refused"])
        return from_checked(message["config"])
    try:
        world_size = world.world_size if world else None
        run_cfg = validate(cfg, world_size) if handed is None else from_checked(handed)
        check_extras(run_cfg)
        WORKLOAD_SPECS[run_cfg.workload.name].check(run_cfg)
    except (ConfigError, ValueError) as err:
        if channel is not None:
            channel.publish({"refused": str(err)})
        raise ConfigError(str(err)) from None
    if channel is not None:
        channel.publish({"config": as_recorded(run_cfg)})
    return run_cfg


def _launch_locked(run_cfg, run_dir: Path, world, program, task_overrides: list[str]) -> RunOutcome:
    """The run, with its directory locked: a finished run is reported, else its ranks run."""
    from wagma_bench.config.schema import as_recorded, check_memory, check_world
    from wagma_bench.record.checkpoint import (
        CheckpointError,
        check_against_run,
        check_event_log,
        check_folder,
        refuse_compacted,
    )
    from wagma_bench.record.rundir import finished_summary
    from wagma_bench.runtime.launch import device_plan, visible_cuda_devices

    raw = as_recorded(run_cfg)
    plan = None
    if world is None:  # ranks per visible GPU; more ranks than GPUs: gloo on CUDA tensors, or (nccl) an error
        plan = device_plan(visible_cuda_devices(), run_cfg.launcher.nproc, run_cfg.comm.backend)
        if plan.nproc != run_cfg.launcher.nproc:  # validate checked launcher.nproc's world, not this one
            check_world(run_cfg.optimizer, run_cfg.imbalance, plan.nproc)
        check_memory(run_cfg.workload.name, plan.nproc)  # every local rank on this machine
    try:  # where the checkpoints go: writable, no link, and where a resume finds the earlier ones
        check_folder(run_dir, run_cfg.checkpoint.dir, run_cfg.checkpoint.resume)
    except CheckpointError as err:
        raise ConfigError(str(err)) from None
    done = finished_summary(run_dir, raw) if run_cfg.checkpoint.resume else None
    if done is not None:  # every rank reads the same summary, so all of them stop here
        report = (
            f"wagma-bench: {run_dir} already holds this run, {done.status} (raise train.max_rounds, "
            f"train.epochs or train.time_limit_s to continue it); summary {run_dir / 'summary.json'}\n"
            f"{json.dumps(done.to_json(), indent=2, sort_keys=True)}"
        )
        return RunOutcome("completed", run_dir, done, report=report)
    refuse_compacted(run_dir)
    if run_cfg.checkpoint.resume:  # a checkpoint of another world or config: refused before any rank starts
        world_size, world_from = (
            (world.world_size, f"the {world.source} world")
            if world
            else (plan.nproc, f"launcher.nproc={plan.nproc}")
        )
        try:
            if world is None or world.rank == 0:  # rank 0's node holds the event log
                check_event_log(run_dir)
            check_against_run(run_dir, raw, world_size, world_from)
        except CheckpointError as err:
            raise ConfigError(str(err)) from None
    if world is not None:
        return _as_rank(run_cfg, run_dir, world, program)
    if run_cfg.comm.name == "mpi":
        return _under_mpiexec(run_cfg, plan.nproc, run_dir, task_overrides)
    return _local(run_cfg, run_dir, plan, program)


def _as_rank(run_cfg, run_dir: Path, world, program) -> RunOutcome:
    """This process is one rank of an external launcher's world: its run; rank 0 reads the summary (a diverged
    run: rank 0's outcome; the other ranks complete)."""
    from wagma_bench.runtime.launch import external_master, run_rank

    torch_under_mpi = (run_cfg.launcher.master_addr, run_cfg.launcher.master_port or 29500)
    master = external_master(world, torch_under_mpi if run_cfg.comm.name == "torch" else None)
    summary = run_summary(run_rank(run_cfg, str(run_dir), world, master, program))
    if summary is not None and summary.status == "diverged":
        line = f"{summary.error or 'diverged'}. Run directory: {run_dir}"
        return RunOutcome("diverged", run_dir, summary, line=line)
    return RunOutcome("completed", run_dir, summary)


def _local(run_cfg, run_dir: Path, plan, program) -> RunOutcome:
    """Spawn the local ranks and read how the run ended: its summary; a failure (recorded); a Ctrl-C (the
    first stops the ranks at a checkpoint, the second at once, recorded)."""
    from wagma_bench.runtime.launch import spawn_local
    from wagma_bench.runtime.supervise import RunFailed, RunInterrupted, StopOverdue

    note = f" ({plan.note})" if plan.note else ""
    try:
        stopped_by = spawn_local(
            run_cfg,
            run_dir,
            plan.nproc,
            run_cfg.launcher.master_addr,
            run_cfg.launcher.master_port,
            program,
            announce=f"wagma-bench: {plan.nproc} local ranks{note}, run directory {run_dir}",
        )
    except (RunInterrupted, StopOverdue, RunFailed) as err:
        return _killed(run_dir, err)
    return _read_end(run_dir, stopped_by)


def _killed(run_dir: Path, err) -> RunOutcome:
    """The launcher's record of a run whose ranks it had to end: a rank failed or hung (failed); a second
    Ctrl-C (interrupted); SIGTERM or SIGHUP and no synchronisation point within the grace (stopped, recorded
    ``preempted``: the rerun resumes from the last checkpoint)."""
    from wagma_bench.record.checkpoint import latest_set
    from wagma_bench.runtime.supervise import RunInterrupted, StopOverdue, record_failed_run

    if not isinstance(err, (RunInterrupted, StopOverdue)):
        return RunOutcome(
            "failed", run_dir, line=f"{record_failed_run(run_dir, str(err))}. Run directory: {run_dir}"
        )
    overdue = isinstance(err, StopOverdue)
    message = record_failed_run(run_dir, str(err), "preempted" if overdue else "interrupted")
    again = (
        f"to resume from the last checkpoint in {run_dir}"
        if latest_set(run_dir) is not None
        else f"to start it over (no checkpoint was saved in {run_dir})"
    )
    line = f"wagma-bench: {message}; run the same command again {again}"
    if overdue:
        return RunOutcome("stopped", run_dir, signal=err.signum, line=line)
    return RunOutcome("interrupted", run_dir, signal=signal.SIGINT, line=line)


def _read_end(run_dir: Path, stopped_by: int | None = signal.SIGINT) -> RunOutcome:
    """The summary of a run whose ranks ended, read back: a run they stopped after a Ctrl-C (interrupted) or
    after SIGTERM or SIGHUP to the launcher (stopped), with the line that says where it stopped and how to go
    on; a diverged run, with the line that says where and why; else completed. Its text is the report."""
    from wagma_bench.config import readback
    from wagma_bench.record.checkpoint import latest_set

    summary_path = run_dir / "summary.json"
    text = summary_path.read_text()
    summary = RunSummary.from_json(readback.parse(text, readback.RUN_SUMMARY, str(summary_path)))
    status, at = summary.status, summary.rounds
    again = "run the same command again to"
    if stopped_by in (signal.SIGTERM, signal.SIGHUP) and status in ("preempted", "interrupted"):
        saved = (
            f"at round {at}, checkpoint saved; {again} resume from"
            if latest_set(run_dir) is not None
            else f"before its first step (nothing to checkpoint); {again} start it in"
            if not at
            else f"at round {at}, no checkpoint saved; {again} start it over in"
        )
        line = f"wagma-bench: stopped by {signal.Signals(stopped_by).name} {saved} {run_dir}"
        return RunOutcome("stopped", run_dir, summary, stopped_by, line=line)
    if stopped_by == signal.SIGINT and status == "interrupted":
        saved = (
            f"at round {at}, checkpoint saved; {again} resume from {run_dir}"
            if latest_set(run_dir) is not None
            else f"before its first step (nothing to checkpoint); {again} start it in {run_dir}"
        )
        return RunOutcome(
            "interrupted", run_dir, summary, stopped_by, line=f"wagma-bench: interrupted {saved}"
        )
    report = f"wagma-bench: summary {summary_path}\n{text}"
    if status == "diverged":
        line = f"{summary.error or 'diverged'}. Run directory: {run_dir}"
        return RunOutcome("diverged", run_dir, summary, report=report, line=line)
    return RunOutcome("completed", run_dir, summary, report=report)


def _under_mpiexec(run_cfg, nproc: int, run_dir: Path, task_overrides: list[str]) -> RunOutcome:
    """comm=mpi outside any MPI launcher: start the same command under the MPI library's mpiexec, in a session
    of its own, and stand between it and the signals: SIGINT, SIGTERM and SIGHUP, to this process or its whole
    group, reach the ranks from here, as from the local launcher
    (:class:`~wagma_bench.runtime.supervise.CtrlC`), never through mpiexec, whose own handling of them kills
    the ranks before they can checkpoint."""
    import tempfile

    from wagma_bench.config.overrides import quoted
    from wagma_bench.config.schema import as_recorded
    from wagma_bench.errors import SymlinkRefused
    from wagma_bench.runtime.handover import CHECKED_ENV, write_checked
    from wagma_bench.runtime.launch import RANK_DIR_ENV
    from wagma_bench.runtime.supervise import (
        HEARTBEATS,
        LAUNCHER_DIR_ENV,
        RunFailed,
        mpiexec_failure,
        supervise_mpiexec,
    )

    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if mpiexec is None:
        raise ConfigError("comm=mpi needs mpiexec (pip install mpich, or your MPI module)")
    cmd = [mpiexec, "-n", str(nproc), sys.executable, "-m", "wagma_bench", "run", *task_overrides]
    cmd.append(f"hydra.run.dir={quoted(str(run_dir))}")
    print("wagma-bench: " + " ".join(cmd), flush=True)
    with tempfile.TemporaryDirectory(prefix="wagma-bench-ranks-") as ranks:  # each rank's PID and error
        # the ranks take the configuration checked here, and check it no more
        try:  # a link planted there: refused in one line, as at the run's other files
            checked = write_checked(run_dir, as_recorded(run_cfg), f"mpiexec-{os.getpid()}")
        except SymlinkRefused as err:
            raise ConfigError(str(err)) from err
        env = {
            **os.environ,
            LOCK_HELD_ENV: str(run_dir.resolve()),
            RANK_DIR_ENV: ranks,
            LAUNCHER_DIR_ENV: ranks,
            CHECKED_ENV: str(checked),
        }
        try:
            rc, tail, ended_first, stopped_by = supervise_mpiexec(cmd, env, Path(ranks), nproc)
        except RunFailed as err:  # its kinds RunInterrupted and StopOverdue too, as the local launcher's
            return _killed(run_dir, err)
        finally:  # what a rank that failed left of the ranks' heartbeats (they all ran on this host)
            shutil.rmtree(run_dir / HEARTBEATS, ignore_errors=True)
        # a diverged rank 0 exits with exits.DIVERGED after writing its summary
        if rc not in (
            exits.OK,
            exits.DIVERGED,
        ):  # as the local launcher does: the rank named, run_stop with the steps logged
            return _killed(run_dir, RunFailed(mpiexec_failure(rc, tail, Path(ranks), ended_first)))
    return _read_end(run_dir, stopped_by)
