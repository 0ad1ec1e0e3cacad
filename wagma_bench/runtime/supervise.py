"""Supervision of local ranks by their launcher: heartbeats, a failed or hung rank ends the run within
seconds, and the launcher records the failure itself when no rank could.

Each spawned rank touches its own heartbeat file (in a folder private to the launcher) from a thread every
:data:`HEARTBEAT_S`. The thread runs while the rank computes or waits in a collective (torch and gloo
release the interpreter), so a heartbeat goes stale only when the whole process stops: SIGSTOP, a debugger,
a native call stuck holding the interpreter. A rank whose heartbeat is older than ``comm.timeout_s`` is
named as hung and the run ends; the peers' own communication timeouts would otherwise end it naming
whichever waiting rank timed out first, not the one that stalled.

A rank that fails first gets :data:`GRACE_S` for the others to notice (a closed connection fails their
collectives at once, and rank 0 then records its own view), then SIGTERM, then after another
:data:`GRACE_S` SIGKILL: a rank blocked in a communication or progress thread never runs its TERM handler.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing.connection
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from multiprocessing import resource_tracker
from pathlib import Path

from wagma_bench.record.files import open_run_file, run_subdir
from wagma_bench.runtime.signals import STOP_SIGNALS

HEARTBEAT_S = 0.5  # period of a rank's heartbeat
# Ranks of an external launcher (srun, torchrun, mpiexec), possibly on several hosts, beat in the run
# directory (the shared file system), less often, and each host at most HOST_BEATS_PER_S times a second
# whatever its number of ranks (shared_period_s): 1,024 ranks on 128 hosts of 8 make 128 updates a second
# there, where one beat every 2 s per rank made 512.
SHARED_HEARTBEAT_S = 2.0  # the shortest period of a shared heartbeat
HOST_BEATS_PER_S = 1.0
HEARTBEATS = ".heartbeats"  # the folder of those heartbeats, in the run directory
LOST_AFTER_BEATS = 3  # a shared heartbeat this many of its periods older than our own: its rank is gone
STALE_S = 2.5  # a heartbeat this old, while another rank fails, marks its rank as the one that stalled
GRACE_S = 2.0  # after a rank fails: time for the others to end on their own, then between TERM and KILL


class RunFailed(RuntimeError):
    pass


class RunInterrupted(RunFailed):
    """A second Ctrl-C stopped the ranks at once (the first stops them at a
    synchronisation point, cleanly)."""


class StopOverdue(RunFailed):
    """After SIGTERM or SIGHUP the ranks reached no synchronisation point within :data:`TERM_GRACE_S` and were
    killed: the run stopped as asked (``preempted``), without a new checkpoint."""

    def __init__(self, signum: int):
        super().__init__(
            f"no synchronisation point within {TERM_GRACE_S:g} s of {signal.Signals(signum).name}: "
            "the ranks were killed before they could checkpoint"
        )
        self.signum = signum


class CtrlC:
    """The local launcher's Ctrl-C (SIGINT, from the terminal to the process group or to the launcher alone).

    The ranks ignore SIGINT (:func:`ranks_ignore_ctrl_c`); the launcher forwards each Ctrl-C to every live
    rank as :data:`~wagma_bench.runtime.slurm.FORWARDED_INTERRUPT`, so one Ctrl-C counts once however it was
    sent. The first makes every rank checkpoint at its next synchronisation point and stop (``interrupted``);
    the second stops them at once, and after :data:`GRACE_S` the launcher kills any rank still running (one
    blocked in a collective never runs its handler). The launcher itself never exits while its ranks run.

    It is installed before the ranks exist, so a Ctrl-C while they start is not lost, nor one that reaches a
    rank before its handler is in place (ranks ignore the forward until then). Before forwarding, the launcher
    writes how many Ctrl-Cs it took into :data:`INTERRUPTS_FILE` in its folder ``folder``; a rank reads it in
    its handler and once more after installing it (:func:`launcher_interrupts`), so each Ctrl-C counts once
    whether its forward arrived, arrived twice, or was ignored."""

    def __init__(self, processes: list, folder: Path | None = None):
        from wagma_bench.runtime.slurm import FORWARDED_INTERRUPT

        self.processes, self.signal, self.folder = processes, FORWARDED_INTERRUPT, folder
        self.count = 0
        self.kill_at: float | None = None  # after the second Ctrl-C: when the launcher kills what still runs
        self.terminated: int | None = (
            None  # SIGTERM or SIGHUP taken: the run stops, the launcher exits 128 + it
        )
        self.started = bool(processes)  # the ranks exist (their grace after SIGTERM counts from then)
        for sig in (signal.SIGINT, *STOP_SIGNALS):
            signal.signal(sig, self._handle if sig == signal.SIGINT else self._terminate)

    def start(self, processes: list) -> None:
        """The ranks exist now: a SIGTERM or SIGHUP taken while they were started reaches them (the file in
        :attr:`folder` tells one that was not listening yet), and their grace counts from now."""
        self.processes, self.started = processes, True
        if self.terminated is not None:
            self._kill_within(TERM_GRACE_S)
            self._send(signal.SIGTERM)

    def _kill_within(self, grace_s: float) -> None:
        self.kill_at = min(self.kill_at or math.inf, time.monotonic() + grace_s)

    def killed(self) -> RunFailed:
        """Why the launcher killed the ranks still running once :meth:`overdue`: a stop signal whose grace ran
        out before a synchronisation point (:class:`StopOverdue`), or the second Ctrl-C's wait (the caller
        says so)."""
        if self.terminated is not None and self.count < 2:
            return StopOverdue(self.terminated)
        return RunFailed("ranks still running were killed")

    def _terminate(self, signum, frame) -> None:
        """SIGTERM (``timeout``, a batch system's limit) or SIGHUP (a closed terminal) to the launcher: every
        rank gets SIGTERM, its own preemption signal (checkpoint at the next synchronisation point,
        ``run_suspend``), and the launcher waits for them, records the stop and releases the run; a rank still
        running :data:`TERM_GRACE_S` after the signal (or after the ranks started, if it came before) is
        killed. Dying at once instead would leave the ranks unsupervised and the run's lock stale. The signal
        is noted in the launcher's folder first (:func:`launcher_stop`): a rank started after it, or not yet
        listening, acts on it as it starts."""
        first = self.terminated is None
        self.terminated = self.terminated or signum
        if first:
            self._note(STOP_FILE, self.terminated)
            name = signal.Signals(signum).name
            print(
                f"wagma-bench: {name}: the run stops at its next synchronisation point, with a checkpoint, "
                f"if the ranks reach one within {TERM_GRACE_S:g} s (ranks still running then are killed)"
                if self.started
                else f"wagma-bench: {name} while the ranks start: the run stops before its first step",
                file=sys.stderr,
                flush=True,
            )
            if self.started:
                self._kill_within(TERM_GRACE_S)
        self._send(signal.SIGTERM)

    def _note(self, name: str, value: int) -> None:
        """``value`` into the launcher's file ``name`` (atomically: a rank reads it at any moment)."""
        if self.folder is None:
            return
        with contextlib.suppress(OSError):
            tmp = self.folder / f".{name}.tmp"
            tmp.write_text(str(value))
            os.replace(tmp, self.folder / name)

    def _handle(self, signum, frame) -> None:
        self.count += 1
        self._note(INTERRUPTS_FILE, self.count)
        if self.count == 1:
            print(
                "wagma-bench: Ctrl-C: every rank checkpoints at its next synchronisation point and the run "
                "stops (interrupted, resumable); Ctrl-C again stops it at once",
                file=sys.stderr,
                flush=True,
            )
        elif self.kill_at is None:
            self.kill_at = time.monotonic() + GRACE_S
        self._send(self.signal)

    def _send(self, sig: int) -> None:
        """``sig`` to every rank still running."""
        for process in self.processes:
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, sig)

    def overdue(self) -> bool:
        return self.kill_at is not None and time.monotonic() > self.kill_at

    def restore(self) -> None:
        """The ranks have ended: a signal from now on waits until the run's record is whole."""
        from wagma_bench.runtime import signals

        signals.finishing()


TERM_GRACE_S = (
    10.0  # after SIGTERM / SIGHUP: how long the ranks get to reach a checkpoint before they are killed
)
INTERRUPTS_FILE = "interrupts"  # in the launcher's heartbeat folder: how many Ctrl-Cs it took
STOP_FILE = "stop"  # there too: the SIGTERM or SIGHUP it took, which its ranks act on as SIGTERM
LAUNCHER_DIR_ENV = "WAGMA_BENCH_LAUNCHER_DIR"  # a local rank's copy of that folder's path


def launcher_interrupts(folder: str | Path | None) -> int:
    """How many Ctrl-Cs this rank's local launcher took (0 without a launcher of ours, see :class:`CtrlC`)."""
    return _launcher_note(folder, INTERRUPTS_FILE) or 0


def launcher_stop(folder: str | Path | None) -> int | None:
    """The SIGTERM or SIGHUP this rank's local launcher took (None: none, or no launcher of ours)."""
    return _launcher_note(folder, STOP_FILE)


def _launcher_note(folder: str | Path | None, name: str) -> int | None:
    """The number the launcher noted in its file ``name`` (:meth:`CtrlC._note`);
    None: none, or no launcher."""
    if not folder:
        return None
    try:
        return int((Path(folder) / name).read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def ranks_ignore_ctrl_c():
    """While the ranks' fork server is started: SIGINT, the forwarded interrupt, SIGTERM and SIGHUP blocked in
    this thread, a mask the server and every rank forked from it inherit (a Ctrl-C before a rank has installed
    its handlers stays pending until the rank ignores it, and is dropped then, not a traceback), and a Ctrl-C
    to the launcher itself kept, raised again once the window closes.

    Blocking in this thread alone is not enough for the launcher: a signal sent to the process goes to any
    thread that does not block it (numpy's import starts one), so the launcher's disposition here records the
    signal rather than ignoring it (an ignored one would be dropped by whichever thread took it). A recorded
    handler is reset to the default by the server's exec; the mask keeps it from acting there."""
    from wagma_bench.runtime.slurm import FORWARDED_INTERRUPT

    # SIGTERM and SIGHUP too: the server and the store process it forks keep them blocked (a signal to the
    # whole group, as `timeout` or a batch system sends, must not kill them under the run); a rank unblocks
    # them as it starts, noting any that come before its trainer listens (signals.rank_listening_later)
    sigs = (signal.SIGINT, FORWARDED_INTERRUPT, *STOP_SIGNALS)
    taken: list[int] = []
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    previous = {sig: signal.signal(sig, lambda signum, frame: taken.append(signum)) for sig in sigs}
    try:
        # multiprocessing's resource tracker, which the fork server's start would start first, unblocks SIGINT
        # and SIGTERM in this thread once it has spawned its process: started here, then blocked again
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)
        for sig in dict.fromkeys(taken):
            signal.raise_signal(sig)


class RanksLost(RuntimeError):
    """Ranks of the world stopped beating (their host or process is gone); the
    message names hosts and ranks."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


def shared_period_s(local_ranks: int) -> float:
    """Period of each rank's heartbeat in the shared run directory where its host runs ``local_ranks`` ranks:
    :data:`SHARED_HEARTBEAT_S`, longer where the host's ranks would beat more than :data:`HOST_BEATS_PER_S`
    times a second together (8 ranks: 8 s). The readers (:func:`lost_ranks`) count each host's ranks in the
    heartbeat files and apply the same rule, so a rank that beats slowly is never taken for a lost one."""
    return max(SHARED_HEARTBEAT_S, local_ranks / HOST_BEATS_PER_S)


def start_heartbeat(
    folder: str | Path, rank: int, period_s: float = HEARTBEAT_S, listener: tuple[str, int] | None = None
) -> None:
    """Touch ``folder/rank<R>`` (which holds the rank's host name, and the address and port of its
    :class:`~wagma_bench.runtime.partition.ReachListener` where given) every ``period_s`` from a daemon
    thread, for the launcher, or (:func:`lost_ranks`) the other ranks, to read. The folder may be the run
    directory's ``.heartbeats``: neither it nor the file is ever followed through a symbolic link
    (:class:`~wagma_bench.record.files.SymlinkRefused`)."""
    path = run_subdir(Path(folder)) / f"rank{rank}"
    with open_run_file(path, "w") as f:
        f.write(" ".join([socket.gethostname(), *map(str, listener or ())]))

    def beat():
        while True:
            try:
                os.utime(path, follow_symlinks=False)
            except OSError:  # the launcher is gone (its folder with it): nobody is listening
                return
            time.sleep(period_s)

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()


def end_heartbeat(folder: Path, rank: int) -> None:
    """Remove this rank's heartbeat file (its thread stops at its next beat), and
    the folder with the last one."""
    with contextlib.suppress(OSError):
        (folder / f"rank{rank}").unlink()
    with contextlib.suppress(OSError):  # not empty: another rank's, still beating or left by a failed rank
        folder.rmdir()


def report_error(folder: str, rank: int, err: BaseException) -> None:
    """Leave a failing rank's error for the launcher's message and the summary (best effort: the folder is
    the launcher's, in the temp directory, so it is writable when the run directory's disk is full)."""
    try:
        with open_run_file(Path(folder) / f"rank{rank}.error", "w") as f:
            f.write(f"{type(err).__name__}: {err}"[:2000])
    except OSError:  # SymlinkRefused included: nothing is written through a link
        pass


def heartbeat_ages(folder: Path, nproc: int) -> dict[int, float]:
    """Seconds since each started rank's last heartbeat (ranks not started yet are left out)."""
    now, ages = time.time(), {}
    for rank in range(nproc):
        try:
            ages[rank] = now - (folder / f"rank{rank}").stat().st_mtime
        except FileNotFoundError:
            continue
    return ages


class RankExited(Exception):
    """A local rank ended before the others with a non-zero exit code, or by a signal (``exit_code`` < 0)."""

    def __init__(self, index: int, exit_code: int):
        super().__init__(f"rank {index} ended with exit code {exit_code}")
        self.error_index, self.exit_code = index, exit_code
        self.signal_name = _signal_name(-exit_code) if exit_code < 0 else None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class LocalRanks:
    """The local ranks' processes (``multiprocessing``, forked from the rank server), joined as
    ``torch.multiprocessing``'s ProcessContext joins its processes, without importing torch in the launcher:
    once one has failed the others get :data:`GRACE_S` to end on their own, then SIGTERM, then after
    :data:`GRACE_S` more SIGKILL."""

    def __init__(self, processes: list):
        self.processes = processes
        self._ended: set[int] = set()

    def join(self, timeout: float) -> bool:
        """Whether every rank has ended with exit code 0, after waiting up to ``timeout`` s for one to end;
        raises :class:`RankExited` for the first seen to fail, once every rank has ended."""
        pending = {p.sentinel: i for i, p in enumerate(self.processes) if i not in self._ended}
        for sentinel in multiprocessing.connection.wait(list(pending), timeout):
            index = pending[sentinel]
            self.processes[index].join()
            self._ended.add(index)
            if self.processes[index].exitcode != 0:
                self._end_the_others()
                raise RankExited(index, self.processes[index].exitcode)
        return len(self._ended) == len(self.processes)

    def _end_the_others(self) -> None:
        self._join_all(GRACE_S)  # their own end
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        self._join_all(GRACE_S)
        self.kill()

    def _join_all(self, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))

    def kill(self) -> None:
        """SIGKILL every rank still running and wait for them all. A stopped process ignores SIGTERM until
        continued; the run is lost anyway (no collective can complete)."""
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join()


def supervise(ranks: LocalRanks, folder: Path, hung_after_s: float, ctrl_c: CtrlC | None = None) -> None:
    """Wait for the local ranks; raise :class:`RunFailed` naming the rank that failed or hung, after every
    rank has ended (:class:`RunInterrupted` after a second Ctrl-C)."""
    try:
        _supervise(ranks, folder, hung_after_s, ctrl_c)
    except RunFailed as err:
        if ctrl_c is not None and ctrl_c.count > 1:
            raise RunInterrupted(f"stopped at once by a second Ctrl-C ({err})") from None
        raise


def _supervise(ranks: LocalRanks, folder: Path, hung_after_s: float, ctrl_c: CtrlC | None) -> None:
    hung_after_s = max(hung_after_s, STALE_S)
    while True:
        if ctrl_c is not None and ctrl_c.overdue():
            ranks.kill()
            raise ctrl_c.killed()  # after a second Ctrl-C, supervise() says so (RunInterrupted)
        # before join(), which ends the survivors; only live ranks (one that ended has no heartbeat)
        ages = {
            r: age
            for r, age in heartbeat_ages(folder, len(ranks.processes)).items()
            if ranks.processes[r].is_alive()
        }
        hung = {r: age for r, age in ages.items() if age > hung_after_s}
        if hung:
            ranks.kill()
            raise RunFailed(_hung_message(hung, hung_after_s))
        try:
            if ranks.join(HEARTBEAT_S):
                return
        except RankExited as err:
            stalled = {r: age for r, age in ages.items() if r != err.error_index and age > STALE_S}
            if stalled:  # the failure is a peer's timeout: the cause is the rank that stopped first
                raise RunFailed(
                    _hung_message(stalled, STALE_S) + f"; then {_exit_message(err, folder)}"
                ) from None
            raise RunFailed(_exit_message(err, folder)) from None


def lost_ranks(run_dir: Path, rank: int, world_size: int, err: BaseException) -> RanksLost | None:
    """After a communication failure of a rank of an external launcher: the ranks whose shared heartbeat
    stopped, as an error naming their hosts (all of a host's ranks: the host is lost); None where every
    rank still beats, or no heartbeats were kept. Waits up to :data:`LOST_AFTER_BEATS` + 1 heartbeat periods
    (:func:`shared_period_s`; 8 s at 2 ranks a host) for a fresh loss to show.

    Ages are taken against this rank's own heartbeat, not the clock: on a shared file system the times are
    the file server's."""
    folder = Path(run_dir) / HEARTBEATS
    if not isinstance(err, RuntimeError) or not (folder / f"rank{rank}").exists():
        return None
    hosts = _hosts_of(folder, world_size)
    periods = _shared_periods(hosts)
    stale = _stale_shared(folder, rank, world_size, periods)
    if not stale:
        time.sleep((LOST_AFTER_BEATS + 1) * max(periods.values(), default=SHARED_HEARTBEAT_S))
        stale = _stale_shared(folder, rank, world_size, periods)
    if not stale:
        return None
    parts = []
    for host in sorted({hosts.get(r, "?") for r in stale}):
        mine = sorted(r for r in stale if hosts.get(r, "?") == host)
        whole = mine == sorted(r for r, h in hosts.items() if h == host)
        what = f"host {host} lost" if whole else f"rank(s) on host {host} lost"
        parts.append(f"{what}: {ranks_named(mine)} (no heartbeat for {max(stale[r] for r in mine):.0f} s)")
    return RanksLost(
        f"{'; '.join(parts)}; rank {rank} on {socket.gethostname()} saw: {type(err).__name__}: {err}",
        sorted(stale),
    )


def ranks_named(ranks: list[int]) -> str:
    """``rank 2`` or ``ranks 2, 3``: how a lost host's ranks are named (here and by the partition watch)."""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _shared_periods(hosts: dict[int, str]) -> dict[int, float]:
    """Each rank's heartbeat period (:func:`shared_period_s`), from the number of
    ranks its host's files name."""
    per_host = {h: sum(1 for other in hosts.values() if other == h) for h in set(hosts.values())}
    return {r: shared_period_s(per_host[h]) for r, h in hosts.items()}


def _stale_shared(folder: Path, rank: int, world_size: int, periods: dict[int, float]) -> dict[int, float]:
    """The ranks whose heartbeat is :data:`LOST_AFTER_BEATS` of its periods older than ours, with its age."""
    mine = (folder / f"rank{rank}").stat().st_mtime
    ages = {}
    for r in range(world_size):
        try:
            ages[r] = mine - (folder / f"rank{r}").stat().st_mtime
        except FileNotFoundError:
            continue
    return {r: age for r, age in ages.items() if age > LOST_AFTER_BEATS * periods.get(r, SHARED_HEARTBEAT_S)}


def _hosts_of(folder: Path, world_size: int) -> dict[int, str]:
    hosts = {}
    for r in range(world_size):
        try:
            hosts[r] = ((folder / f"rank{r}").read_text().split() or ["?"])[0]
        except OSError:
            continue
    return hosts


FULL_BELOW_BYTES = 1 << 20  # a run directory's file system with less free space is reported as full


def record_failed_run(run_dir: Path, error: str, status: str = "failed") -> str:
    """The launcher's record of a failed run (``run_stop`` if rank 0 wrote none, ``summary.json``), after
    removing the checkpoint set the failure left incomplete (on a full disk: the room the record needs).
    Returns the message for the user: the error, and what could not be recorded. A run stopped on purpose (a
    second Ctrl-C, a stop out of the grace's reach) before any rank began its event log gets no record:
    nothing ran, and a summary without its events would stand for a run that never started."""
    from wagma_bench.record.checkpoint import discard_incomplete_sets
    from wagma_bench.record.events import EVENTS
    from wagma_bench.record.rundir import record_failure

    if status != "failed" and not (run_dir / EVENTS).exists():
        return f"{error}; nothing was recorded: no rank had begun the run"

    try:
        free = shutil.disk_usage(run_dir).free
    except OSError:
        free = None
    if free is not None and free < FULL_BELOW_BYTES:
        error += f"; the run directory's file system is full ({free // 1024} KiB free)"
    discard_incomplete_sets(run_dir)
    try:
        record_failure(run_dir, error, status)
    except OSError as err:
        return f"{error}; the failure could not be recorded in {run_dir / 'summary.json'}: {err}"
    return error


class FirstToEnd:
    """Which ranks of an mpiexec job ended first, watched from outside (a thread
    of the re-executing launcher).

    mpiexec's own report cannot tell: once a rank dies, MPICH's hydra kills the others and names whichever
    process it lists first (SIGKILL of the rank with PMI_RANK=2 was reported at rank 0's PID). Each rank
    writes its PID into ``folder`` (``rank<R>.pid``) as it starts; this thread opens a pidfd for each (Linux
    5.3+; it polls every 50 ms elsewhere) and records the ranks whose processes had ended at its first
    wake-up, within microseconds of the first end, well before hydra's clean-up (a round trip through its
    proxies) ends the rest."""

    def __init__(self, folder: Path, nproc: int):
        self.folder, self.nproc = Path(folder), nproc
        self.ranks: list[int] | None = None  # the ranks seen ended at the first wake-up; None: none yet
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="first-to-end", daemon=True)
        self._thread.start()

    def stop(self) -> list[int] | None:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.ranks

    def _pids(self) -> dict[int, int] | None:
        pids = {}
        for rank in range(self.nproc):
            try:
                pids[rank] = int((self.folder / f"rank{rank}.pid").read_text())
            except (OSError, ValueError):
                return None
        return pids

    def _watch(self) -> None:
        import select

        while (pids := self._pids()) is None:  # every rank has started
            if self._stop.wait(0.05):
                return
        fds: dict[int, int] = {}
        try:
            for rank, pid in pids.items():
                try:
                    fds[os.pidfd_open(pid)] = rank
                except ProcessLookupError:  # ended already
                    self.ranks = sorted({*(self.ranks or []), rank})
                except (AttributeError, OSError):
                    break
            while self.ranks is None and not self._stop.is_set():
                if len(fds) == self.nproc:
                    ready, _, _ = select.select(list(fds), [], [], 0.2)
                    ended = sorted(fds[fd] for fd in ready)
                else:  # no pidfd here
                    time.sleep(0.05)
                    ended = [r for r, pid in pids.items() if not process_alive(pid)]
                self.ranks = ended or None
        finally:
            for fd in fds:
                os.close(fd)


class _RankProcess:
    """A rank of an mpiexec job by its PID, as CtrlC and FirstToEnd see a process."""

    def __init__(self, pid: int):
        self.pid = pid

    def is_alive(self) -> bool:
        return process_alive(self.pid)


class MpiRanks:
    """The ranks of an mpiexec job that have started, by the PIDs they write into ``folder`` as they start
    (``rank<R>.pid``, see :class:`FirstToEnd`); read again each time, since they start one by one."""

    def __init__(self, folder: Path, nproc: int):
        self.folder, self.nproc = folder, nproc

    def __iter__(self):
        for rank in range(self.nproc):
            with contextlib.suppress(OSError, ValueError):
                yield _RankProcess(int((self.folder / f"rank{rank}.pid").read_text()))

    def all_started(self) -> bool:
        return len(list(self)) == self.nproc

    def kill(self) -> None:
        for process in self:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)


def supervise_mpiexec(cmd: list[str], env: dict, folder: Path, nproc: int):
    """Run ``cmd`` (mpiexec) in a session of its own, its output passed through, and wait for it, the signals
    to this process passed to the ranks as the local launcher passes them (:class:`CtrlC`: mpiexec's own
    handling of SIGINT and SIGTERM kills the ranks before they can checkpoint, and a signal to our process
    group would reach mpiexec too). Returns mpiexec's exit code, its last lines, the ranks seen to end first
    (:class:`FirstToEnd`) and the signal that stopped the run (None: none); raises :class:`StopOverdue` or
    :class:`RunInterrupted` when the ranks had to be killed after one, as :func:`supervise` does."""
    import subprocess

    ranks = MpiRanks(folder, nproc)
    ctrl_c = CtrlC([], folder)  # from here on a signal reaches the ranks, started or not
    tail: list[str] = []
    killed = False
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, text=True, errors="replace", env=env, start_new_session=True
        )
        first = FirstToEnd(folder, nproc)  # mpiexec's own report may name a rank its clean-up killed
        reader = threading.Thread(
            target=_pass_through, args=(proc.stdout, tail), name="mpiexec-output", daemon=True
        )
        reader.start()
        while proc.poll() is None:
            if not ctrl_c.started and ranks.all_started():  # their grace counts from now
                ctrl_c.start(ranks)
            if ctrl_c.overdue():
                killed = True
                ranks.kill()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(
                        proc.pid, signal.SIGKILL
                    )  # mpiexec and its proxy: their session is theirs alone
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(HEARTBEAT_S)
        reader.join(timeout=5)
        ended_first = first.stop()
    finally:
        ctrl_c.restore()
    if ctrl_c.count > 1:
        raise RunInterrupted("stopped at once by a second Ctrl-C")
    if killed:
        raise ctrl_c.killed()
    return (
        proc.returncode,
        tail[-40:],
        ended_first,
        ctrl_c.terminated or (signal.SIGINT if ctrl_c.count else None),
    )


def _pass_through(stream, tail: list[str]) -> None:
    """A child's output line by line to ours, its last lines kept in ``tail``."""
    for line in stream:
        sys.stdout.write(line)
        sys.stdout.flush()
        tail.append(line)
        del tail[:-40]


def process_alive(pid: int) -> bool:
    """Whether a process of this user with that PID exists (another user's process that took the number is
    not ours)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# How mpiexec names the process whose end ended the job: MPICH's hydra by PID (its exit code a signal number
# when one killed it; the PID is not reliable, see FirstToEnd), Open MPI by rank and signal.
_MPICH_BAD = re.compile(r"PID (\d+) RUNNING AT (\S+)")
_MPICH_CODE = re.compile(r"EXIT CODE: (\d+)")
_OPENMPI_BAD = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")


def mpiexec_failure(rc: int, output_tail: list[str], folder: Path, first: list[int] | None = None) -> str:
    """Which rank ended an mpiexec job, and how, from the ranks seen to end first (:class:`FirstToEnd`),
    mpiexec's last lines and the ranks' PID and error files in ``folder`` (written by the ranks under the
    re-executing launcher, ``RANK_DIR_ENV``)."""
    text = "".join(output_tail)
    rank = signum = None
    if match := _OPENMPI_BAD.search(text):
        rank, signum = int(match.group(1)), int(match.group(2))
    elif (
        first and len(first) == 1 and (match := _MPICH_BAD.search(text))
    ):  # hydra's PID may be another rank's
        rank = first[0]
        code = _MPICH_CODE.search(text)
        signum = int(code.group(1)) if code and _is_signal(int(code.group(1))) else None
    elif first and len(first) > 1 and _MPICH_BAD.search(text):
        return f"ranks {', '.join(map(str, first))} ended at once (mpiexec exited with code {rc})"
    elif match := _MPICH_BAD.search(text):
        pids = {}
        for path in folder.glob("rank*.pid"):
            with contextlib.suppress(OSError, ValueError):
                pids[int(path.read_text())] = int(path.stem.removeprefix("rank"))
        rank = pids.get(int(match.group(1)))
        code = _MPICH_CODE.search(text)
        signum = int(code.group(1)) if code and rank is not None and _is_signal(int(code.group(1))) else None
    if rank is None:  # an MPI_Abort names nobody: the rank that reported an error, if one did
        reported = sorted(
            (p for p in folder.glob("rank*.error") if p.stem.removeprefix("rank").isdigit()),
            key=lambda p: int(p.stem.removeprefix("rank")),
        )
        if not reported:
            return f"mpiexec exited with code {rc}"
        rank = int(reported[0].stem.removeprefix("rank"))
    try:
        return f"rank {rank} failed: " + (folder / f"rank{rank}.error").read_text().removeprefix(
            "SymlinkRefused: "
        )
    except OSError:
        pass
    if signum is not None:
        return f"rank {rank} was killed by signal {signal.Signals(signum).name} (it left no traceback)"
    return f"rank {rank} ended the job (mpiexec exited with code {rc})"


def _is_signal(number: int) -> bool:
    return number in {s.value for s in signal.Signals}


def _exit_message(err, folder: Path) -> str:
    if err.signal_name:
        return f"rank {err.error_index} was killed by signal {err.signal_name} (it left no traceback)"
    try:
        error = (folder / f"rank{err.error_index}.error").read_text()
    except OSError:
        error = ""
    if error.startswith("ConfigError: "):  # a setting only a rank could check: refused, not a crash
        return f"rank {err.error_index} refused the run: {error.removeprefix('ConfigError: ')}"
    if error.startswith("SymlinkRefused: "):  # a link planted while the run ran: named, no traceback printed
        return f"rank {err.error_index} failed: {error.removeprefix('SymlinkRefused: ')}"
    if (
        not error
    ):  # it ended without going through its own report (which prints the traceback, then this file)
        return f"rank {err.error_index} failed with exit code {err.exit_code} (it left no traceback)"
    return f"rank {err.error_index} failed with exit code {err.exit_code}: {error} (its traceback is above)"


def _hung_message(stalled: dict[int, float], after_s: float) -> str:
    ranks = ", ".join(f"rank {r} (no heartbeat for {age:.0f} s)" for r, age in sorted(stalled.items()))
    return (
        f"{ranks} hung: its process stopped (SIGSTOP, a debugger, or a native call holding the "
        f"interpreter) for more than {after_s:g} s"
    )
