"""Session-wide test settings.

Every temporary file of the suite, its own and its subprocesses' (launcher heartbeat folders left by a
killed launcher, wandb's media folders, torchelastic's and the forkserver's scratch files), lands under
pytest's own temporary directory, which pytest rotates (the last three sessions are kept), not in the
machine's /tmp. Not covered: MPICH's launcher ignores TMPDIR (a ``hydra_hwloc_xmlfile_*`` in /tmp), the
local SLURM makes its directory under /tmp on purpose (``tests/slurm_cluster.py``'s ``local_cluster``), and
torch makes an empty /tmp/torchinductor_USER when a test module imported at collection, before the session
fixture below, imports torch._dynamo.
MPICH's shared-memory segments of killed or aborted jobs are removed from /dev/shm when the run ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _scratch_in_pytest_tmp(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("scratch")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(scratch))  # inherited by every subprocess
        tempfile.tempdir = None  # this process recomputes its own from TMPDIR
        yield scratch
    tempfile.tempdir = None


@pytest.fixture(scope="session")
def checkpointed(tmp_path_factory) -> Path:
    """A finished 2-rank run of the embedded default (tests.cli_util.QUICK: 12 steps, evaluations at 6 and 12)
    with checkpoints at rounds 10 and 12: one run read by every test that needs a finished one. Read it only;
    a test that changes it (a resume, a rerun, a removed file) works on a copy. The command's stdout is kept
    beside it (:func:`checkpointed_stdout`), written last: its presence says the run is complete.

    Under pytest-xdist one run serves every worker (pytest-xdist's documented pattern: the first worker to
    take the lock makes it in the folder the workers' temporary folders share, the others wait and read
    it)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return _make_checkpointed(tmp_path_factory.mktemp("checkpointed"))
    shared = tmp_path_factory.getbasetemp().parent  # this session's, above every worker's own
    with open(shared / "checkpointed.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run_dir = shared / "checkpointed"
        if not checkpointed_stdout(run_dir).exists():
            shutil.rmtree(run_dir, ignore_errors=True)  # a worker's failed attempt is not resumed
            _make_checkpointed(run_dir)
    return run_dir


def _make_checkpointed(run_dir: Path) -> Path:
    from tests.cli_util import QUICK, run

    out = run(QUICK + ["checkpoint.every_s=0", f"hydra.run.dir={run_dir}"])
    assert out.returncode == 0, out.stderr[-3000:]
    checkpointed_stdout(run_dir).write_text(out.stdout)
    return run_dir


def checkpointed_stdout(run_dir: Path) -> Path:
    return run_dir.with_name(f"{run_dir.name}.stdout")


SHM = Path("/dev/shm")
_SEGMENTS_BEFORE = pytest.StashKey[set]()


def _mpich_segments() -> set[str]:
    return {p.name for p in SHM.glob("mpich_shm_*")} if SHM.is_dir() else set()


def _mapped_anywhere(path: str) -> bool:
    """Whether a live process maps or holds open ``path`` (a segment in use is never removed)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if path in (proc / "maps").read_text():
                return True
            if any(os.readlink(fd) == path for fd in (proc / "fd").iterdir()):
                return True
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return False


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the whole run's process (xdist's controller, or pytest)
        session.config.stash[_SEGMENTS_BEFORE] = _mpich_segments()


def pytest_sessionfinish(session):
    """MPICH's shared-memory segment (``/dev/shm/mpich_shm_*``) outlives a job whose ranks were killed or
    aborted (the tests of a killed or failing MPI rank do both). Those that appeared during the run and that
    no process uses any more are removed when it ends (by then no test runs, under xdist's workers neither),
    so that the suite leaves nothing in /dev/shm."""
    before = session.config.stash.get(_SEGMENTS_BEFORE, None)
    if before is None:
        return
    for name in sorted(_mpich_segments() - before):
        path = str(SHM / name)
        deadline = time.monotonic() + 10  # an aborted job's ranks may still be exiting
        while (in_use := _mapped_anywhere(path)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not in_use:  # else a live job's, left alone
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
