"""The error types every layer raises; a leaf module (imports nothing of wagma_bench), so that the
configuration check, the workloads and the launcher can all raise the same error without importing one
another."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot run: the message names the key, the bad value and what is allowed.

    Raised in the launching process, before any rank starts (``wagma_bench.config.schema.validate``, a
    workload's ``check``, the launcher's device plan); the CLI reports it and exits with code 2."""


class SymlinkRefused(OSError):
    """A file or folder of a run that is a symbolic link. A run never writes through one: on a shared file
    system anyone who can write the run directory could otherwise make the run overwrite their choice of the
    user's files (``events.jsonl`` -> ``~/.bashrc``). Raised by :mod:`wagma_bench.record.files`; every command
    answers it as a refusal (exit 2), not as the operational failure another ``OSError`` is."""

    def __str__(self) -> str:  # a refusal in words, as every other one: no "[Errno 40]" before it
        return str(self.strerror) if self.strerror else super().__str__()


class OperationFailed(RuntimeError):
    """An outside system refused the work (SLURM's ``sbatch`` or ``scancel``): an operational failure (exit
    1)."""


class Interrupted(Exception):
    """A command's own interruption, its line saying where (a tuning trial stopped at a checkpoint): exit 130,
    the line said without ``error:``."""
