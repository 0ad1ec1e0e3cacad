"""The one signal state machine of ``wagma-bench run``, for the launching process and its ranks alike.

SIGINT (Ctrl-C), SIGTERM (``timeout``, a batch system's limit) and SIGHUP (a closed terminal) may come at any
moment, to the launcher alone or to the whole process group. Each process of a run is in one phase at a time:

- ``starting`` (a launcher from the command's first line until it has ranks to stop): SIGINT raises
  KeyboardInterrupt (Python's own), SIGTERM and SIGHUP raise :class:`Stopped`; the command ends in one line,
  ``nothing ran``, with 128 + the signal. No rank exists to stop and nothing of the run was recorded.
- ``ranks`` (the launcher once it starts its ranks, locally or under mpiexec):
  :class:`~wagma_bench.runtime.supervise.CtrlC` takes the signals over and passes them to the ranks, and notes
  each in its folder so that a rank that did not exist yet, or did not listen yet, acts on it as it starts
  (:func:`~wagma_bench.runtime.supervise.launcher_stop`).
- ``finishing`` (the launcher after its ranks have ended, writing the run's record and report): a signal is
  noted and acted on once the record is whole (:func:`late_signal`); it never cuts a record in two. The
  launch folds it into the run's outcome (:func:`wagma_bench.runtime.run.signalled_as_it_ended`), and under
  ``-m`` the next job's ``starting`` ends the sweep on it.
- a rank, before the trainer's :class:`~wagma_bench.runtime.preemption.Preemption` listens: every stop signal
  is noted (:func:`take_early`) and handed to the trainer's handler as it is installed, so a signal that came
  while the rank started is acted on, not lost and not fatal.

The fork server and the store process are started with these signals blocked, so that a signal to the whole
group kills neither them nor a rank before it listens
(:func:`~wagma_bench.runtime.supervise.ranks_ignore_ctrl_c`).
"""

from __future__ import annotations

import signal

# raised here, answered by the one exit mapper (exits.run_body): 128 + the signal, one line
from wagma_bench.exits import Stopped

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # the launcher stops the run on these, as on a Ctrl-C
# what a rank notes before the trainer listens (its local launcher's Ctrl-C forward is ignored until then: the
# launcher's count covers it, see supervise.CtrlC)
RANK_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


_early: list[int] = []  # a rank's signals before the trainer listened; the launcher's after its ranks ended
_phase = "none"
# the launcher's own Ctrl-C disposition, as its parent gave it (an ignored Ctrl-C stays ignored)
_ctrl_c = None


_stopped: list[int] = []  # the stop signals raised into the launcher's set-up (stopped_in_setup)


def _raise_stopped(signum, frame) -> None:
    _stopped.append(signum)
    raise Stopped(signum)


def stopped_in_setup() -> int | None:
    """The stop signal raised into a launcher's set-up, if one was (None: none). An exception raised into
    library code at an arbitrary line can be turned into another one as the library unwinds (OmegaConf, inside
    Hydra's composition, raised an AttributeError from a half-built node; Hydra then exits 1 with its own
    message): the command's outcome is still the signal's, and `run` answers it as such."""
    return _stopped[0] if _phase == "starting" and _stopped else None


def _note(signum, frame) -> None:
    _early.append(signum)


def starting() -> None:
    """A launcher's set-up (from the command's first line, and again before each job of a Hydra multirun): a
    stop signal ends the command there; one noted while a previous job finished ends it now."""
    global _phase, _ctrl_c
    if _ctrl_c is None:
        _ctrl_c = signal.getsignal(signal.SIGINT)
    _phase = "starting"
    signal.signal(signal.SIGINT, _ctrl_c)
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_stopped)
    if _early:
        noted = _early.pop(0)
        _early.clear()
        if noted == signal.SIGINT:
            raise KeyboardInterrupt
        raise Stopped(noted)


def finishing() -> None:
    """A launcher whose ranks have ended: stop signals and Ctrl-C are noted until the run's record and report
    are whole."""
    global _phase
    _phase = "finishing"
    for sig in (*STOP_SIGNALS, *([signal.SIGINT] if _ctrl_c != signal.SIG_IGN else [])):
        signal.signal(sig, _note)


def late_signal() -> int | None:
    """The first stop signal a launcher noted while finishing (None: none), for the run's outcome; it stays
    noted (a next job of ``-m`` does not start)."""
    return _early[0] if _phase == "finishing" and _early else None


def rank_listening_later() -> None:
    """A rank from its first line: every stop signal is noted until the trainer's handler takes it
    (:func:`take_early`). The signals are unblocked here: a rank forked from the fork server inherits them
    blocked (:func:`~wagma_bench.runtime.supervise.ranks_ignore_ctrl_c`)."""
    global _phase
    _phase = "rank"
    from wagma_bench.runtime.slurm import FORWARDED_INTERRUPT

    for sig in RANK_SIGNALS:
        signal.signal(sig, _note)
    # a local launcher's Ctrl-C forward, by default fatal: its count in the launcher's folder stands for it
    signal.signal(FORWARDED_INTERRUPT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RANK_SIGNALS)


def rank_done() -> None:
    """A rank whose run has ended (however): a stop signal has nothing left to stop, and the interpreter's
    finalization would reset our handlers to the default, fatal one, which would make a clean end a death by
    SIGTERM in the launcher's report (mpiexec's ranks finalize; the local ones skip it)."""
    for sig in RANK_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def take_early() -> list[int]:
    """The signals a rank noted before its trainer listened, once (the trainer acts on each)."""
    taken = list(dict.fromkeys(_early)) if _phase == "rank" else []
    _early.clear()
    return taken
