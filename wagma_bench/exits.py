"""How every wagma-bench command ends: the exit codes (docs/run-budget-and-exit-codes.md) and the one function
that turns what a command's body raises into a code and one line on stderr (the error convention of every
command, docs/running.md). It imports only :mod:`wagma_bench.errors`, below it."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from wagma_bench.errors import ConfigError, SymlinkRefused

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


# How a run ended (``runtime/run.py``'s RunOutcome.status) -> its exit code; ``stopped``: 128 + its signal
OUTCOME_CODES = {"completed": OK, "failed": FAILED, "diverged": DIVERGED, "interrupted": INTERRUPTED}


def outcome_code(status: str, signum: int | None = None) -> int:
    """The exit code of a run that ended with ``status`` (``stopped``: by ``signum``)."""
    return stopped_by(signum) if status == "stopped" else OUTCOME_CODES[status]


def answer(outcome) -> None:
    """End the command as a run's outcome says (``runtime/run.py``'s RunOutcome): nothing for a completed
    run; else its code and line, ``error:`` for a failed or diverged run."""
    code = outcome_code(outcome.status, outcome.signal)
    if code != OK:
        raise Stop(code, outcome.line, error=outcome.status in ("failed", "diverged"))


def stop_for(err: BaseException) -> Stop | None:
    """The :class:`Stop` that :func:`run_body` would answer ``err`` with, where only a SystemExit gets through
    (inside Hydra's task function): a refused value or a planted link (2), another ``OSError`` (1); None for
    what passes Hydra anyway (Ctrl-C, :class:`Stopped`, a Stop) and for a defect (its traceback)."""
    if isinstance(err, (ConfigError, SymlinkRefused)):
        return Stop(REFUSED, str(err), error=True)
    if isinstance(err, OSError):
        return Stop(FAILED, str(err), error=True)
    return None


def stop(message: str, code: int = REFUSED) -> NoReturn:
    """End the command with ``code`` and the line ``wagma-bench COMMAND: error: MESSAGE``."""
    raise Stop(code, message, error=True)


def end(line: str, code: int) -> NoReturn:
    """End the command with ``code`` and ``line`` said as it is (a stopped run's own words, e.g.
    ``wagma-bench: interrupted at round N, checkpoint saved; ...``)."""
    raise Stop(code, line, error=False)


def run_body(
    command: str,
    body: Callable[[], int],
    *,
    also: tuple[tuple[type[BaseException], int], ...] = (),
    interrupted: str | None = "",
    stopped: str = "",
) -> int:
    """Run a command's ``body`` and answer what it raises with the documented code and one line on stderr,
    the one mapper of every command:

    - :class:`Stop` (:func:`stop`, :func:`end`): its own code and line;
    - a refused value (:class:`~wagma_bench.errors.ConfigError`) or a planted link (``SymlinkRefused``):
      exit 2, ``wagma-bench COMMAND: error: ...``;
    - a command's own kinds, ``also`` (kind, code): that code, the same line (an interruption's without
      ``error:``);
    - any other ``OSError`` (a full or read-only disk, no permission): exit 1, the same line;
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
    except (ConfigError, SymlinkRefused) as err:
        _say(command, str(err))
        return REFUSED
    except tuple(kind for kind, _ in also) as err:
        code = next(code for kind, code in also if isinstance(err, kind))
        _say(command, str(err), error=code in (REFUSED, FAILED))
        return code
    except OSError as err:
        _say(command, str(err))
        return FAILED
    except KeyboardInterrupt:
        if interrupted is not None:
            _say(command, interrupted or f"wagma-bench {command}: interrupted", error=False)
        return INTERRUPTED
    except Stopped as err:
        line = stopped or f"wagma-bench {command}: stopped by {{signal}}"
        _say(command, line.format(signal=err), error=False)
        return stopped_by(err.signum)
    except Exception as err:  # noqa: BLE001 - a defect: its traceback says where
        import traceback

        traceback.print_exc()
        _say(command, f"unexpected {type(err).__name__}: {err}")
        return FAILED


def _say(command: str, text: str, error: bool = True) -> None:
    """One line on stderr: ``wagma-bench COMMAND: error: TEXT`` for an error, else ``TEXT`` as it is; a text
    that already starts with ``wagma-bench`` (a line of an interruption) is said as it is."""
    line = f"wagma-bench {command}: error: {text}" if error else text
    if not error and not text.startswith("wagma-bench"):
        line = f"wagma-bench {command}: {text}"
    print(line, file=sys.stderr, flush=True)
