"""Counting ``schema.validate`` calls in every Python process of a run (the command, its rank server and
store, each rank, whoever started them): a test-only helper of tests/test_config_once.py,
tests/test_mpi.py, tests/test_launch_conventions.py and tests/test_slurm.py."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Installed in every Python process of the run (the command, the rank server, the store, each rank) through
# sitecustomize: each call of schema.validate appends its process id to a file.
COUNTING_HOOK = """
import functools, os
import wagma_bench.config.schema as schema

with open(os.environ["WAGMA_TEST_VALIDATE_LOG"] + ".loaded", "a") as f:  # the hook is in this process
    f.write(f"{os.getpid()}\\n")

_validate = schema.validate

@functools.wraps(_validate)
def counting_validate(*args, **kwargs):
    with open(os.environ["WAGMA_TEST_VALIDATE_LOG"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    return _validate(*args, **kwargs)

schema.validate = counting_validate
"""


def counting_env(tmp_path: Path) -> tuple[dict, Path]:
    """The environment that installs :data:`COUNTING_HOOK` in every Python process started with it, and the
    log its calls of ``schema.validate`` go to."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(COUNTING_HOOK)
    log = tmp_path / "validate.log"
    env = {
        **os.environ,
        "WAGMA_TEST_VALIDATE_LOG": str(log),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return env, log


def validated_once(log: Path, processes: int) -> None:
    """The hook ran in ``processes`` processes at least, and ``schema.validate`` was called once in all."""
    loaded = set(log.with_name(log.name + ".loaded").read_text().split())
    assert len(loaded) >= processes, loaded  # a hook that failed to load would count no call
    calls = log.read_text().split() if log.exists() else []
    assert len(calls) == 1, f"schema.validate called {len(calls)} times, in processes {calls}"


# two rounds and one evaluation: every process that could validate still starts and runs its part
TINY = ["train.max_rounds=2", "eval.every_rounds=2", "logger.progress=off", "checkpoint.every_s=0"]
