"""How every wagma-bench command ends: the exit codes (docs/run-budget-and-exit-codes.md) and the one function
that turns what a command's body raises into a code and one line on stderr (the error convention of every
command, docs/running.md). It imports only :mod:`wagma_bench.errors`, below it."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from wagma_bench.errors import ConfigError, Interrupted, OperationFailed, SymlinkRefused

OK = 0
FAILED = 1  # the work failed: a rank died, raised or hung; an operational error (SLURM, the disk)
REFUSED = 2  # bad input, refused before anything started (argparse's usage errors exit 2 too)
DIVERGED = 3  # a run's training loss became NaN or infinite (one line says where and why)
INTERRUPTED = 128 + signal.SIGINT  # 130: Ctrl-C, as shells report a program that SIGINT ended


def stopped_by(sig: int) -> int:
    """A run stopped by a signal to its launcher (SIGTERM: 143, SIGHUP: 129), as shells report it."""
    return 128 + int(sig)


class Stopped(BaseException):
    """SIGTERM or SIGHUP to a launcher that had no rank to stop yet (:mod:`wagma_bench.runtime.signals` raises
    it; a BaseException, as KeyboardInterrupt: no ``except Exception`` of the set-up may take it for an error
    of its own)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Stop(SystemExit):
    """The end of a command decided where a return value cannot reach :func:`run_body`: inside Hydra's task
    function, whose caller reports every ``Exception`` as a traceback and exit 1, but lets a ``SystemExit``
    through. Raised by :func:`stop` and :func:`end`; :func:`run_body` says its line and returns its code."""

    def __init__(self, code: int, text: str, error: bool):
        super().__init__(code)
        self.text, self.error = text, error


# How a run ended (``runtime/run.py``'s RunOutcome.status) -> its exit code. An outcome that carries a stop
# signal (``stopped``; ``completed`` when the signal came as its ranks ended, its record whole) exits 128 +
# the signal.
OUTCOME_CODES = {"completed": OK, "failed": FAILED, "diverged": DIVERGED, "interrupted": INTERRUPTED}


def outcome_code(outcome) -> int:
    """The exit code of a run's end, ``runtime/run.py``'s RunOutcome (its ``status`` and ``signal``): the one
    way a run's end becomes a code."""
    if outcome.status in ("stopped", "completed") and outcome.signal is not None:
        return stopped_by(outcome.signal)
    return OUTCOME_CODES[outcome.status]


def answer(outcome) -> None:
    """End the command as a run's outcome says (``runtime/run.py``'s RunOutcome): nothing for a completed
    run; else its code and line, ``error:`` for a failed or diverged run."""
    code = outcome_code(outcome)
    if code != OK:
        raise Stop(code, outcome.line, error=outcome.status in ("failed", "diverged"))


def stop_for(err: BaseException) -> Stop | None:
    """The :class:`Stop` that :func:`run_body` would answer ``err`` with, where only a SystemExit gets through
    (inside Hydra's task function): a kind of :data:`RAISED`; None for what passes Hydra anyway (Ctrl-C,
    :class:`Stopped`, a Stop) and for a defect (its traceback)."""
    code = code_of(err) if isinstance(err, Exception) else None
    return None if code is None else Stop(code, str(err), error=code != INTERRUPTED)


def stop(message: str, code: int = REFUSED) -> NoReturn:
    """End the command with ``code`` and the line ``wagma-bench COMMAND: error: MESSAGE``."""
    raise Stop(code, message, error=True)


def end(line: str, code: int) -> NoReturn:
    """End the command with ``code`` and ``line`` said as it is (a stopped run's own words, e.g.
    ``wagma-bench: interrupted at round N, checkpoint saved; ...``)."""
    raise Stop(code, line, error=False)


# What a command's body raises -> its exit code: the one table of every command (the first kind that matches).
# Commands raise these typed errors; a refusal of a value inside Hydra's task function goes through the same
# table (:func:`stop_for`).
RAISED: tuple[tuple[type[BaseException], int], ...] = (
    (ConfigError, REFUSED),  # a refused value: key, value, what is allowed
    (SymlinkRefused, REFUSED),  # a planted link (an OSError, yet a refusal)
    (OperationFailed, FAILED),  # an outside system refused the work (sbatch, scancel)
    (Interrupted, INTERRUPTED),  # a command's own interruption, its line saying where
    (OSError, FAILED),  # a full or read-only disk, no permission
)


def code_of(err: BaseException) -> int | None:
    """``err``'s exit code by :data:`RAISED` (None: not a kind of the table)."""
    return next((code for kind, code in RAISED if isinstance(err, kind)), None)


def run_body(
    command: str,
    body: Callable[[], int],
    *,
    interrupted: str | None = "",
    stopped: str = "",
) -> int:
    """Run a command's ``body`` and answer what it raises with the documented code and one line on stderr,
    the one mapper of every command:

    - :class:`Stop` (:func:`stop`, :func:`end`, :func:`answer`): its own code and line;
    - a kind of :data:`RAISED` (a refused value, a planted link: 2; an outside system's
      refusal, another ``OSError``: 1; a command's own interruption: 130): its code, ``wagma-bench COMMAND:
      error: ...`` (an interruption's line without ``error:``);
    - Ctrl-C (``KeyboardInterrupt``): exit 130 and ``interrupted`` (default ``wagma-bench COMMAND:
      interrupted``; None: no line, someone else says it);
    - SIGTERM or SIGHUP before the command handed them on (:class:`Stopped`): 128 + the signal and
      ``stopped``, where ``{signal}`` is the signal's name (default ``wagma-bench COMMAND: stopped by
      {signal}``);
    - anything else is a defect: its traceback, then ``wagma-bench COMMAND: error: unexpected TYPE: ...``,
      exit 1.

    A plain ``SystemExit`` (argparse's usage errors and ``--help``, Hydra's own) goes through unchanged."""
    try:
        return body()
    except Stop as done:
        _say(command, done.text, done.error)
        return int(done.code)
    except KeyboardInterrupt:
        if interrupted is not None:
            _say(command, interrupted or f"wagma-bench {command}: interrupted", error=False)
        return INTERRUPTED
    except Stopped as err:
        line = stopped or f"wagma-bench {command}: stopped by {{signal}}"
        _say(command, line.format(signal=err), error=False)
        return stopped_by(err.signum)
    except Exception as err:  # noqa: BLE001 - a kind of the table, or a defect: its traceback says where
        code = code_of(err)
        if code is not None:
            _say(command, str(err), error=code != INTERRUPTED)
            return code
        import traceback

        traceback.print_exc()
        _say(command, f"unexpected {type(err).__name__}: {err}")
        return FAILED


# the table's own kinds, raised as they are
TYPED = (ConfigError, SymlinkRefused, OperationFailed, Interrupted)


def typed(kinds: dict[type[Exception], type[Exception]], body: Callable[[], int]) -> int:
    """Run ``body``, whose libraries' errors of ``kinds`` are, for this command, the typed errors they map to
    (the simulator's ``ValueError``, a value its model cannot take read from the command's input: a
    ConfigError; SLURM's ``RuntimeError``: an OperationFailed). The table (:data:`RAISED`) gives the code."""
    try:
        return body()
    except TYPED:
        raise
    except tuple(kinds) as err:
        kind = next(to for of, to in kinds.items() if isinstance(err, of))
        raise kind(str(err)) from err


def die_now(code: int) -> NoReturn:
    """End this process at once with ``code``, unwinding nothing: a rank whose main thread is blocked in a
    collective that will never return (:class:`~wagma_bench.runtime.partition.PartitionWatch`)."""
    os._exit(code)


def _say(command: str, text: str, error: bool = True) -> None:
    """One line on stderr: ``wagma-bench COMMAND: error: TEXT`` for an error, else ``TEXT`` as it is; a text
    that already starts with ``wagma-bench`` (a line of an interruption) is said as it is."""
    line = f"wagma-bench {command}: error: {text}" if error else text
    if not error and not text.startswith("wagma-bench"):
        line = f"wagma-bench {command}: {text}"
    print(line, file=sys.stderr, flush=True)
