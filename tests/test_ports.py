"""A rank joins only its own run's world: two runs and one fixed port (refused before any rank starts, the
holder untouched, a race lost with exit 2), a rank that reaches another run's rendezvous store, and what a
run's identity is. Real launchers and stores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.cli_util import BIN, QUICK, keys, run


@pytest.mark.serial
def test_fixed_port_held_by_another_runs_store_is_refused_before_any_rank_starts(tmp_path):
    """The quick form of the next test: the port is held by a rendezvous store of another run (as its rank 0
    hosts it); the run is refused within seconds naming the port and that run, whose store is untouched."""
    from datetime import timedelta

    import torch.distributed as dist

    from wagma_bench.runtime.launch import free_port

    port = free_port()  # the other run's rank 0 hosts its store there and names the run in it
    holder = dist.TCPStore(
        "127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False
    )
    holder.set("wagma_bench/run", f"c0ffee {tmp_path / 'holder'}")
    t0 = time.monotonic()
    out = run(QUICK + [f"launcher.master_port={port}", f"hydra.run.dir={tmp_path / 'second'}"], timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    assert time.monotonic() - t0 < 15
    assert (
        f"launcher.master_port={port} is in use on 127.0.0.1 by the rendezvous store of run c0ffee "
        f"{tmp_path / 'holder'}" in out.stderr
    ), out.stderr[-3000:]
    assert not (tmp_path / "second" / "steps").exists()
    assert holder.num_keys() == 1


@pytest.mark.long
def test_second_run_on_a_fixed_port_in_use_fails_naming_the_port_and_the_holder_completes(tmp_path):
    from wagma_bench.runtime.launch import free_port

    port = free_port()
    holder_dir, second_dir = tmp_path / "holder", tmp_path / "second"
    holder = subprocess.Popen(
        [
            str(BIN),
            "run",
            *QUICK[:1],
            "train.max_rounds=60",
            "eval.every_rounds=1000",
            "logger.progress=off",
            f"launcher.master_port={port}",
            f"hydra.run.dir={holder_dir}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while "run_start" not in keys(holder_dir):
            assert holder.poll() is None, holder.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the holder did not start"
            time.sleep(0.1)
        t0 = time.monotonic()
        second = run(QUICK + [f"launcher.master_port={port}", f"hydra.run.dir={second_dir}"], timeout=120)
        took = time.monotonic() - t0
        _, err = holder.communicate(timeout=300)
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.communicate()
    assert holder.returncode == 0, err[-3000:]  # the innocent run is untouched
    assert json.loads((holder_dir / "summary.json").read_text())["status"] == "completed"
    assert second.returncode == 2, second.stderr[-3000:]
    assert f"launcher.master_port={port} is in use" in second.stderr
    assert str(holder_dir) in second.stderr, second.stderr[-3000:]  # names the run that holds it
    assert took < 15, f"{took:.1f} s"
    assert not (second_dir / "steps").exists()


def test_two_runs_racing_for_one_fixed_port_one_completes_the_other_exits_2_before_any_rank_starts(tmp_path):
    """Both launchers start at the same moment; each probes the port and finds it free. The launcher itself
    binds the port (it hosts the run's store) before it starts any rank, so the second to bind exits 2 naming
    the port, while the first runs to its end."""
    from wagma_bench.runtime.launch import free_port

    port = free_port()
    dirs = [tmp_path / "a", tmp_path / "b"]
    procs = [
        subprocess.Popen(
            [
                str(BIN),
                "run",
                *QUICK[:1],
                "train.max_rounds=8",
                "eval.every_rounds=1000",
                "logger.progress=off",
                f"launcher.master_port={port}",
                f"hydra.run.dir={d}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for d in dirs
    ]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], [o[1][-2000:] for o in outs]
    loser = next(i for i, p in enumerate(procs) if p.returncode == 2)
    err = outs[loser][1]
    assert f"wagma-bench run: error: launcher.master_port={port} is in use" in err, err[-3000:]
    assert "Traceback" not in err
    assert (
        not (dirs[loser] / "events.jsonl").exists() and not (dirs[loser] / "steps").exists()
    )  # no rank started
    assert json.loads((dirs[1 - loser] / "summary.json").read_text())["status"] == "completed"


def test_a_rank_that_reaches_another_runs_store_fails_at_once_naming_the_port_and_the_run(tmp_path):
    """The race the port check cannot close (the port taken between the check and rank 0's bind, or a SLURM
    port derived from the job id): a rank of run B that reaches run A's store fails before it writes a key
    there; A's store serves A on."""
    from wagma_bench.runtime.launch import ForeignStore, free_port, join_store

    port = free_port()
    theirs = join_store(("127.0.0.1", port), 0, 30, "1234 /runs/a")
    t0 = time.monotonic()
    with pytest.raises(
        ForeignStore, match=rf"store at 127.0.0.1:{port} belongs to another run \(1234 /runs/a\)"
    ):
        join_store(("127.0.0.1", port), 1, 30, "5678 /runs/b")
    assert time.monotonic() - t0 < 5
    assert theirs.num_keys() == 1  # nothing of B's in A's store
    ours = join_store(("127.0.0.1", port), 1, 30, "1234 /mnt/runs/a")  # A's own ranks join (the same id)
    assert ours.get("wagma_bench/run") == b"1234 /runs/a"


def test_run_identity_is_the_launchers_id_else_the_directory():
    from wagma_bench.runtime.launch import _same_run, run_identity

    assert run_identity("/r", {"WAGMA_BENCH_RUN_NONCE": "ab12"}) == "ab12 /r"
    assert run_identity("/r", {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1"}) == "slurm-7.1 /r"
    assert run_identity("/r", {}) == "- /r"  # mpiexec: no id
    assert _same_run("slurm-7.1 /a", "slurm-7.1 /b") and not _same_run("slurm-7.1 /a", "slurm-7.2 /a")
    assert _same_run("- /a", "- /a") and not _same_run("- /a", "- /b")
