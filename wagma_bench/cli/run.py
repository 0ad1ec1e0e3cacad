"""``wagma-bench run``: compose the configuration, check it, start the ranks, report the end. Every end of the
command goes through :func:`wagma_bench.exits.run_body`; inside Hydra's task function, where a raised error
would become Hydra's traceback, a refusal or a stopped run ends by :func:`wagma_bench.exits.stop` or
:func:`~wagma_bench.exits.end`."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import signal
import sys
from pathlib import Path

from wagma_bench import exits
from wagma_bench.config.paths import CONF_DIR, conf_context

# Config groups that `run` does not read: `sweep` and `simulate` take their cluster profiles from there,
# `tune` its search spaces.
NOT_RUN_GROUPS = ("cluster", "hydra", "search_space")

# what a launcher says of a Ctrl-C or a stop signal before it has ranks to stop (docs/failure-behaviour.md)
CTRL_C_AT_START = "wagma-bench: interrupted before any rank started; nothing ran"
STOPPED_AT_START = "wagma-bench: stopped by {signal} before any rank started; nothing ran"


def main(argv: list[str]) -> int:
    """``wagma-bench run``, its signals taken first (:mod:`wagma_bench.runtime.signals`): a launcher's set-up
    ends in one line on SIGINT, SIGTERM or SIGHUP; a rank of an external world notes them for its trainer (a
    Ctrl-C that reaches a rank is the second, which its trainer recorded and its launcher reports: no
    line)."""
    from wagma_bench.runtime import signals
    from wagma_bench.runtime.world import detect_world  # light: the handlers come first

    rank = detect_world() is not None
    if rank:
        signals.rank_listening_later()
    else:
        signals.starting()
    return exits.run_body(
        "run",
        lambda: _run(argv, rank),
        interrupted=None if rank else CTRL_C_AT_START,
        stopped=STOPPED_AT_START,
    )


def _run(argv: list[str], rank: bool) -> int:
    """The command, and a stop signal noted as its ranks ended: acted on once the record is whole."""
    from wagma_bench.runtime import signals

    try:
        code = run_command(argv)
    except (Exception, SystemExit) as err:  # a stop signal that a library turned into its own error
        stopped = None if rank or isinstance(err, exits.Stop) else signals.stopped_in_setup()
        if stopped is None:
            raise
        raise exits.Stopped(stopped) from None
    finally:
        if rank:
            signals.rank_done()
    late = signals.late_signal()
    if (
        late is not None and code == exits.OK
    ):  # it came as the ranks ended: the record was written whole first
        print(
            f"wagma-bench: {signal.Signals(late).name} as the run ended: its record is whole (above); exit "
            f"{exits.stopped_by(late)}",
            file=sys.stderr,
            flush=True,
        )
        return exits.stopped_by(late)
    return code


def run_command(overrides: list[str]) -> int:
    """Compose the config with Hydra (run dir, multirun, launcher plugins) and run it."""
    from wagma_bench.config.renamed import renamed_overrides
    from wagma_bench.runtime.world import detect_world

    world = detect_world()
    # an old key (train.max_steps=5) under its new name, said once: by the launching process or rank 0
    overrides = renamed_overrides(overrides, quiet=world is not None and world.rank != 0)
    if "--help" in overrides or "-h" in overrides:
        print(run_help([o for o in overrides if o not in ("--help", "-h")]))
        return 0
    import hydra

    from wagma_bench.runtime.launch import RANK_SERVER_PRELOAD, agreed_run_dir_override, start_rank_server

    if (
        world is not None
    ):  # a rank of torchrun's, srun's or mpiexec's world: it imports what the rank server would,
        importlib.import_module(RANK_SERVER_PRELOAD)  # the same way (the collector off, then frozen)
    if world is not None and (run_dir := agreed_run_dir_override(overrides)):
        overrides = overrides + [run_dir]  # the same on every rank and restart, not each rank's clock
    if world is not None and world.rank != 0:
        # Only rank 0 keeps Hydra's config copy and log file.
        overrides = overrides + [
            "hydra.output_subdir=null",
            "hydra/job_logging=none",
            "hydra/hydra_logging=none",
        ]
    from wagma_bench.config.overrides import MULTIRUN_FLAGS, precheck

    if world is None and not any(o.startswith("-") and o not in MULTIRUN_FLAGS for o in overrides):
        # local ranks to come (most likely): the server's imports (torch, ~4 s here) overlap Hydra's work and
        # the launcher's own; a command refused below stops it as it exits
        start_rank_server()
    from wagma_bench.runtime.handover import CHECKED_ENV

    # a parse error or a misspelt key: exit 2 before anything is created (a rank that its launching process
    # handed the checked configuration composes once, in Hydra's job: the launcher composed and checked it)
    explicit = precheck(overrides, CONF_DIR) if world is None or not os.environ.get(CHECKED_ENV) else None
    chosen = any(o.startswith(("hydra.run.dir=", "hydra.sweep.dir=")) for o in overrides)
    if not chosen and not os.access(os.getcwd(), os.W_OK):  # Hydra's default directories are under it
        exits.stop(
            f"the current directory {os.getcwd()} cannot be written (a read-only file system, or no "
            "permission), and the run directory (outputs/..., multirun/...) is made there; run from another "
            "directory, or set hydra.run.dir"
        )
    sys.argv = [sys.argv[0]] + overrides
    app = hydra.main(config_path=str(CONF_DIR), config_name="wagma", version_base="1.3")(_run_job)
    try:
        if explicit is not None and (world is None or world.rank == 0):
            _remember(explicit)
            _lock_run_dir(explicit)  # before Hydra writes its config copy and log there
        app()
    finally:
        for lock in _LOCKS.values():
            lock.release()
        for run_dir in _REFUSED:
            _as_found(run_dir)
    return 0


def run_help(overrides: list[str]) -> str:
    """Hydra's application help, listing only the groups `run` composes (Hydra's own would list every
    folder of conf/, `cluster` included), with the configuration the overrides compose."""
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    with conf_context():
        cfg = compose(config_name="wagma", overrides=overrides)
        loader = GlobalHydra.instance().config_loader()
        groups = [g for g in sorted(loader.list_groups("")) if g not in NOT_RUN_GROUPS]
        listing = "\n".join(f"{g}: {', '.join(loader.get_group_options(g))}" for g in groups)
    return (
        f"wagma-bench run: train one configuration (Hydra overrides; -m sweeps them locally).\n\n"
        f"== Configuration groups ==\nCompose your configuration from those groups (group=option)\n\n"
        f"{listing}\n\n== Config ==\nOverride anything in the config (foo.bar=value)\n\n"
        f"{OmegaConf.to_yaml(cfg)}\n"
        f"Use --hydra-help to view Hydra's own flags (-m, --cfg job, -cd, ...)."
    )


# Exit codes of `wagma-bench run` (wagma_bench/exits.py): 0 a run that ended by its rules (completed, time
# limit, preempted), or a rerun of a finished one; 1 a failed run (a rank died, raised or hung); 2 refused
# before any rank started (a bad value, a locked or inconsistent run directory); 3 the run diverged (a
# non-finite training loss); 130 Ctrl-C; 143 / 129 SIGTERM / SIGHUP to the launcher (the ranks checkpointed).

_LOCKS: dict = {}  # resolved run directory -> the RunDirLock this process holds
# Hydra writes its copy of the configuration (.hydra/) into the run directory before the job is checked. For
# each run directory this command may write: the files of its .hydra/ as they were (None: the directory did
# not exist); a refused job puts them back (:func:`_as_found`), so a refusal never replaces the record of a
# run.
_FOUND: dict[Path, dict[str, bytes] | None] = {}
_REFUSED: list[Path] = []


def _remember(run_dir: Path) -> None:
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


LOCK_HELD_ENV = "WAGMA_BENCH_RUN_DIR_LOCKED"  # set for ranks re-executed under mpiexec by the lock holder


def _lock_run_dir(run_dir: Path) -> None:
    """Take the run directory's lock for this process (once); exit 2 naming the holder if another has it, or
    naming a file of the run that is a symbolic link."""
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
        exits.stop(str(err))
    except OSError as err:  # a read-only or full file system, no permission: before anything ran
        exits.stop(
            f"the run directory {run_dir} cannot be written ({err.strerror or err}); choose another "
            "hydra.run.dir"
        )
    _LOCKS[key] = lock


def _run_job(cfg) -> dict | None:
    """One Hydra job: validate, then run as a rank of an existing world or spawn local ranks."""
    from hydra.core.hydra_config import HydraConfig

    from wagma_bench.runtime import startup
    from wagma_bench.runtime.launch import stop_rank_server
    from wagma_bench.runtime.world import detect_world

    startup.new_job()
    world = detect_world()
    if (
        world is None
    ):  # a launcher's set-up again (under -m: a signal while the last job ended stops the sweep)
        from wagma_bench.runtime import signals

        signals.starting()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run_cfg = _checked(cfg, world, run_dir)
        if world is not None or run_cfg.comm.name == "mpi":  # no local ranks of ours: no fork server
            stop_rank_server()
        if world is None or world.rank == 0:
            _lock_run_dir(run_dir)
        try:
            return _run_locked(run_cfg, run_dir, world)
        finally:
            lock = _LOCKS.pop(run_dir.resolve(), None)
            if lock is not None:
                lock.release()
    except exits.Stop as stop:  # refused before any rank started: Hydra's copy of what was refused goes
        if stop.code == exits.REFUSED and (world is None or world.rank == 0):  # (rank 0 wrote it)
            _REFUSED.append(run_dir)
        raise


def _checked(cfg, world, run_dir: Path):
    """The run's configuration, checked once in the whole run (:mod:`wagma_bench.runtime.handover`): as the
    launching process handed it, as rank 0 of this world checked it, or checked here (and, on rank 0 of an
    external launcher's world, handed on). Packages and data paths are checked with it, by the process that
    checks it or by a launching process that was handed it (a tune trial's run)."""
    from wagma_bench.config.schema import as_recorded, from_checked, validate
    from wagma_bench.errors import ConfigError
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
            exits.stop(message["refused"])
        return from_checked(message["config"])
    try:
        world_size = world.world_size if world else None
        run_cfg = validate(cfg, world_size) if handed is None else from_checked(handed)
        check_extras(run_cfg)
        WORKLOAD_SPECS[run_cfg.workload.name].check(run_cfg)
    except (ConfigError, ValueError) as err:
        if channel is not None:
            channel.publish({"refused": str(err)})
        exits.stop(str(err))
    if channel is not None:
        channel.publish({"config": as_recorded(run_cfg)})
    return run_cfg


def _run_locked(run_cfg, run_dir: Path, world) -> dict | None:
    """The job, with the run directory locked: a finished run is reported, else run its ranks."""
    from wagma_bench.config.schema import as_recorded, check_memory, check_world
    from wagma_bench.errors import ConfigError
    from wagma_bench.record.checkpoint import (
        CheckpointError,
        check_against_run,
        check_event_log,
        check_folder,
    )
    from wagma_bench.record.rundir import finished_summary
    from wagma_bench.runtime.launch import device_plan, external_master, run_rank, visible_cuda_devices

    raw = as_recorded(run_cfg)
    plan = None
    if world is None:  # ranks per visible GPU; more ranks than GPUs: gloo on CUDA tensors, or (nccl) an error
        try:
            plan = device_plan(visible_cuda_devices(), run_cfg.launcher.nproc, run_cfg.comm.backend)
            if plan.nproc != run_cfg.launcher.nproc:  # validate checked launcher.nproc's world, not this one
                check_world(run_cfg.optimizer, run_cfg.imbalance, plan.nproc)
            check_memory(run_cfg.workload.name, plan.nproc)  # every local rank on this machine
        except ConfigError as err:
            exits.stop(str(err))
    try:  # where the checkpoints go: writable, no link, and where a resume finds the earlier ones
        check_folder(run_dir, run_cfg.checkpoint.dir, run_cfg.checkpoint.resume)
    except (ConfigError, CheckpointError) as err:
        exits.stop(str(err))
    done = finished_summary(run_dir, raw) if run_cfg.checkpoint.resume else None
    if done is not None:  # every rank reads the same summary, so all of them stop here
        print(
            f"wagma-bench: {run_dir} already holds this run, {done['status']} (raise train.max_rounds, "
            f"train.epochs or train.time_limit_s to continue it); summary {run_dir / 'summary.json'}\n"
            f"{json.dumps(done, indent=2, sort_keys=True)}",
            flush=True,
        )
        return None
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
        except (ConfigError, CheckpointError) as err:
            exits.stop(str(err))
    if world is not None:
        torch_under_mpi = (run_cfg.launcher.master_addr, run_cfg.launcher.master_port or 29500)
        master = external_master(world, torch_under_mpi if run_cfg.comm.name == "torch" else None)
        summary = run_rank(run_cfg, str(run_dir), world, master, train_rank)
        if summary is not None and summary.get("status") == "diverged":  # rank 0; the other ranks exit 0
            exits.stop(f"{summary.get('error') or 'diverged'}. Run directory: {run_dir}", exits.DIVERGED)
        return summary
    if run_cfg.comm.name == "mpi":
        return _reexec_under_mpiexec(run_cfg, plan.nproc, run_dir)
    return _run_local(run_cfg, run_dir, plan)


def _run_local(run_cfg, run_dir: Path, plan) -> None:
    """Spawn the local ranks and report how the run ended: its summary; a failure (exit 1, recorded); a
    Ctrl-C (exit 130: the first stops the ranks at a checkpoint, the second at once, recorded)."""
    from hydra.core.hydra_config import HydraConfig

    from wagma_bench.errors import ConfigError
    from wagma_bench.runtime.launch import spawn_local
    from wagma_bench.runtime.supervise import RunFailed, RunInterrupted, StopOverdue, record_failed_run

    note = f" ({plan.note})" if plan.note else ""
    try:
        stopped_by = spawn_local(
            run_cfg,
            run_dir,
            plan.nproc,
            run_cfg.launcher.master_addr,
            run_cfg.launcher.master_port,
            train_rank,
            announce=f"wagma-bench: {plan.nproc} local ranks{note}, run directory {run_dir}",
        )
    except ConfigError as err:  # a fixed port in use: before any rank started
        exits.stop(str(err))
    except RunInterrupted as err:
        _interrupted_at_once(run_dir, err)
    except StopOverdue as err:
        _stopped_overdue(run_dir, err)
    except RunFailed as err:
        message = f"{record_failed_run(run_dir, str(err))}. Run directory: {run_dir}"
        if HydraConfig.get().mode.name == "MULTIRUN":  # record it and go on with the next job
            print(f"wagma-bench run: error: {message}", file=sys.stderr, flush=True)
            return
        exits.stop(message, exits.FAILED)
    _report_end(run_dir, stopped_by)


def _interrupted_at_once(run_dir: Path, err) -> None:
    """A second Ctrl-C stopped the ranks at once: recorded, one line, exit 130."""
    _stopped(run_dir, str(err), "interrupted", exits.INTERRUPTED)


def _stopped_overdue(run_dir: Path, err) -> None:
    """SIGTERM or SIGHUP, and no synchronisation point within the grace: stopped as asked, without a new
    checkpoint (``preempted``: the rerun resumes from the last one), one line, exit 128 + the signal."""
    _stopped(run_dir, str(err), "preempted", exits.stopped_by(err.signum))


def _stopped(run_dir: Path, error: str, status: str, code: int) -> None:
    """The launcher's record of ranks it had to kill after a stop was asked for, and the line that says it."""
    from wagma_bench.record.checkpoint import latest_set
    from wagma_bench.runtime.supervise import record_failed_run

    message = record_failed_run(run_dir, error, status)
    again = (
        f"to resume from the last checkpoint in {run_dir}"
        if latest_set(run_dir) is not None
        else f"to start it over (no checkpoint was saved in {run_dir})"
    )
    exits.end(f"wagma-bench: {message}; run the same command again {again}", code)


def train_rank(cfg, comm, run_dir: Path, local_rank: int) -> dict | None:
    """What every rank runs once its world is up: the trainer. Passed to the ranks by reference (this
    function's name), so that the launching process need not import the trainer, torch with it; the rank
    server has."""
    from wagma_bench.train.trainer import train

    return train(cfg, comm, run_dir, local_rank)


def _report_end(run_dir: Path, stopped_by: int | None = signal.SIGINT) -> None:
    """Print the summary of a run whose ranks ended; a run they stopped after a Ctrl-C: one line, exit 130;
    after SIGTERM or SIGHUP to the launcher: one line, exit 128 + the signal; a diverged run fails with
    :data:`wagma_bench.exits.DIVERGED` and one line saying where and why (under -m the line is printed and the
    sweep goes on)."""
    from hydra.core.hydra_config import HydraConfig

    summary_path = run_dir / "summary.json"
    from wagma_bench.config import readback
    from wagma_bench.record.events import current_summary

    text = summary_path.read_text()
    summary = current_summary(readback.parse(text, readback.RUN_SUMMARY, str(summary_path)))
    if stopped_by in (signal.SIGTERM, signal.SIGHUP) and summary.get("status") in (
        "preempted",
        "interrupted",
    ):
        from wagma_bench.record.checkpoint import latest_set

        at = summary.get("rounds")
        again = "run the same command again to"
        saved = (
            f"at round {at}, checkpoint saved; {again} resume from"
            if latest_set(run_dir) is not None
            else f"before its first step (nothing to checkpoint); {again} start it in"
            if not at
            else f"at round {at}, no checkpoint saved; {again} start it over in"
        )
        exits.end(
            f"wagma-bench: stopped by {signal.Signals(stopped_by).name} {saved} {run_dir}",
            exits.stopped_by(stopped_by),
        )
    if stopped_by == signal.SIGINT and summary.get("status") == "interrupted":
        from wagma_bench.record.checkpoint import latest_set

        at = summary.get("rounds")
        saved = (
            f"at round {at}, checkpoint saved; run the same command again to resume from {run_dir}"
            if latest_set(run_dir) is not None
            else f"before its first step (nothing to checkpoint); run the same command again to start it in "
            f"{run_dir}"
        )
        exits.end(f"wagma-bench: interrupted {saved}", exits.INTERRUPTED)
    print(f"wagma-bench: summary {summary_path}\n{text}", flush=True)
    if summary.get("status") != "diverged":
        return
    message = f"{summary.get('error') or 'diverged'}. Run directory: {run_dir}"
    if HydraConfig.get().mode.name == "MULTIRUN":
        print(f"wagma-bench run: error: {message}", file=sys.stderr, flush=True)
        return
    exits.stop(message, exits.DIVERGED)


def _reexec_under_mpiexec(run_cfg, nproc: int, run_dir: Path) -> None:
    """comm=mpi outside any MPI launcher: start the same command under the MPI library's mpiexec, in a session
    of its own, and stand between it and the signals: SIGINT, SIGTERM and SIGHUP, to this process or its whole
    group, reach the ranks from here, as from the local launcher
    (:class:`~wagma_bench.runtime.supervise.CtrlC`), never through mpiexec, whose own handling of them kills
    the ranks before they can checkpoint."""
    import tempfile

    from wagma_bench.config.schema import as_recorded
    from wagma_bench.errors import SymlinkRefused
    from wagma_bench.runtime.handover import CHECKED_ENV, write_checked
    from wagma_bench.runtime.launch import RANK_DIR_ENV

    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if mpiexec is None:
        exits.stop("comm=mpi needs mpiexec (pip install mpich, or your MPI module)")
    from hydra.core.hydra_config import HydraConfig

    # This job's own overrides (under -m, one point of the sweep, not the sweep's argv).
    from wagma_bench.config.overrides import quoted
    from wagma_bench.runtime.supervise import (
        HEARTBEATS,
        LAUNCHER_DIR_ENV,
        RunFailed,
        RunInterrupted,
        StopOverdue,
        mpiexec_failure,
        record_failed_run,
        supervise_mpiexec,
    )

    args = list(HydraConfig.get().overrides.task)
    cmd = [
        mpiexec,
        "-n",
        str(nproc),
        sys.executable,
        "-m",
        "wagma_bench",
        "run",
        *args,
        f"hydra.run.dir={quoted(str(run_dir))}",
    ]
    print("wagma-bench: " + " ".join(cmd), flush=True)
    with tempfile.TemporaryDirectory(prefix="wagma-bench-ranks-") as ranks:  # each rank's PID and error
        # the ranks take the configuration checked here, and check it no more
        try:  # a link planted there: one line, exit 2, as at the run's other files (Hydra's task function)
            checked = write_checked(run_dir, as_recorded(run_cfg), f"mpiexec-{os.getpid()}")
        except SymlinkRefused as err:
            exits.stop(str(err))
        env = {
            **os.environ,
            LOCK_HELD_ENV: str(run_dir.resolve()),
            RANK_DIR_ENV: ranks,
            LAUNCHER_DIR_ENV: ranks,
            CHECKED_ENV: str(checked),
        }
        try:
            rc, tail, ended_first, stopped_by = supervise_mpiexec(cmd, env, Path(ranks), nproc)
        except StopOverdue as err:
            _stopped_overdue(run_dir, err)
        except RunInterrupted as err:
            _interrupted_at_once(run_dir, err)
        except RunFailed as err:
            exits.stop(f"{record_failed_run(run_dir, str(err))}. Run directory: {run_dir}", exits.FAILED)
        finally:  # what a rank that failed left of the ranks' heartbeats (they all ran on this host)
            shutil.rmtree(run_dir / HEARTBEATS, ignore_errors=True)
        # a diverged rank 0 exits with exits.DIVERGED after writing its summary
        if rc not in (
            exits.OK,
            exits.DIVERGED,
        ):  # as the local launcher does: the rank named, run_stop with the steps the ranks logged
            error = record_failed_run(run_dir, mpiexec_failure(rc, tail, Path(ranks), ended_first))
            exits.stop(f"{error}. Run directory: {run_dir}", exits.FAILED)
    _report_end(run_dir, stopped_by)
