"""Session-wide test settings.

Every temporary file of the suite, its own and its subprocesses' (launcher heartbeat folders left by a
killed launcher, wandb's media folders, torchelastic's and the forkserver's scratch files), lands under
pytest's own temporary directory, which pytest rotates (the last three sessions are kept), not in the
machine's /tmp. Not covered: MPICH's launcher ignores TMPDIR (a ``hydra_hwloc_xmlfile_*`` in /tmp), and the
local SLURM makes its directory under /tmp on purpose (``tests/slurm_cluster.py``'s ``local_cluster``).
"""

from __future__ import annotations

import tempfile

import pytest


@pytest.fixture(scope="session", autouse=True)
def _scratch_in_pytest_tmp(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("scratch")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(scratch))  # inherited by every subprocess
        tempfile.tempdir = None  # this process recomputes its own from TMPDIR
        yield scratch
    tempfile.tempdir = None
