"""Session-wide test settings.

Every temporary file of the suite, its own and its subprocesses' (launcher heartbeat folders left by a
killed launcher, wandb's media folders, torchelastic's and MPICH's scratch files), lands under pytest's
own temporary directory, which pytest rotates (the last three sessions are kept), not in the machine's
/tmp.
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
