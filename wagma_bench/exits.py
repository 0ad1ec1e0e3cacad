"""The exit codes of every wagma-bench command, in one place (docs/run-budget-and-exit-codes.md, and the one error
convention of every command in docs/running.md). A leaf: it imports nothing of the package."""

import signal

OK = 0
FAILED = 1       # the work failed: a rank died, raised or hung; an operational error (SLURM, the disk)
REFUSED = 2      # bad input, refused before anything started (argparse's usage errors exit 2 too)
DIVERGED = 3     # a run's training loss became NaN or infinite (one line says where and why)
INTERRUPTED = 128 + signal.SIGINT  # 130: Ctrl-C, as shells report a program that SIGINT ended


def stopped_by(sig: int) -> int:
    """A run stopped by a signal to its launcher (SIGTERM: 143, SIGHUP: 129), as shells report it."""
    return 128 + int(sig)
