"""NCCL-clean communication, checked on CPU: ``comm.emulate=nccl`` makes a gloo world's data plane refuse
what NCCL refuses (any-source receives, tags), so an optimizer that sends control traffic on the data
plane fails here as it would on a GPU cluster. The exactness of every optimizer under emulation is in
tests/test_invariants.py (the ``-nccl`` world); here: the refusals themselves, and every optimizer run to its
step budget through the command line."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from tests.cli_util import BIN
from tests.dist_util import PAUSABLE, run_world
from wagma_bench.comm.base import CommError
from wagma_bench.comm.topology import default_group_size
from wagma_bench.optim import OPTIMIZERS

# make test runs this file at idle CPU priority beside the serial tests (marker `background`): it times
# nothing, and its runs' timeouts (300 s a collective, 600 s a command; its world's: dist_util.PAUSABLE)
# outlast any pause they get there.
pytestmark = pytest.mark.background


def _refusals(comm):
    out = {"data": comm.capabilities, "control": None}
    buf = torch.zeros(1)
    for what, call in (
        ("any-source", lambda: comm.recv_any(buf, 5)),
        ("tag", lambda: comm.isend(buf, 1 - comm.rank, 7)),
    ):
        try:
            call()
            out[what] = "allowed"
        except CommError as err:
            out[what] = str(err)
    control = comm.fork_control()
    out["control"] = control.capabilities
    if comm.rank == 0:  # the control plane keeps both: a tagged message, received from any rank
        control.send(torch.tensor([3.0]), 1, tag=9)
    else:
        out["sender"] = control.recv_any(buf, 9)
    comm.barrier()
    return out


def test_the_emulated_data_plane_refuses_what_nccl_refuses_and_the_control_plane_does_not():
    results = run_world(_refusals, 2, emulate="nccl", **PAUSABLE)
    for res in results:
        assert not res["data"].any_source and not res["data"].tags
        assert res["control"].any_source and res["control"].tags
        assert (
            "cannot receive from any rank" in res["any-source"] and "comm.emulate=nccl" in res["any-source"]
        )
        assert "cannot match messages by tag" in res["tag"]
    assert results[1]["sender"] == 0


def test_every_optimizer_runs_to_its_budget_under_emulated_nccl_from_the_command_line(tmp_path):
    optimizers = ",".join(OPTIMIZERS)
    cmd = [
        str(BIN),
        "run",
        "-m",
        f"optimizer={optimizers}",
        "comm.emulate=nccl",
        "launcher.nproc=2",
        "train.max_rounds=10",
        "train.batch_size=8",  # a quarter of the workload's compute a round: the same collectives
        "eval.every_rounds=1000",
        "logger.progress=off",
        f"hydra.sweep.dir={tmp_path}",
        "hydra.sweep.subdir=${optimizer.name}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in OPTIMIZERS:
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["status"] == "completed", (name, summary)
        assert summary["rounds"] >= 10, (name, summary["rounds"])
        start = json.loads((tmp_path / name / "events.jsonl").read_text().splitlines()[0])
        assert start["metadata"]["config"]["comm"]["emulate"] == "nccl"
        # the effective group size, after WAGMA's default rule; optimizers without groups log none
        assert start["metadata"]["group_size"] == (default_group_size(2) if name == "wagma" else None), name


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["comm=mpi", "comm.emulate=nccl"],
            (
                "comm.emulate=nccl is not allowed with comm=mpi comm.backend=mpi: it "
                "emulates NCCL on a gloo world, so it needs comm=torch"
            ),
        ),
        (["comm.emulate=mpi"], "comm.emulate='mpi' is not allowed; choose one of: null, nccl"),
        (
            ["comm.backend=mpi"],
            "comm.backend='mpi' is not allowed with comm=torch; choose one of: auto, gloo, nccl",
        ),
    ],
)
def test_an_impossible_emulation_or_backend_fails_the_config_check(overrides, message):
    """The check `wagma-bench run` makes before any rank starts (the CLI's exit 2 on such a ConfigError:
    tests/test_faults.py); NCCL without CUDA, which the launcher's device plan refuses:
    tests/test_launch_conventions.py's test_impossible_nccl_world_fails_before_spawning."""
    from tests.cli_util import compose
    from wagma_bench.config.schema import validate
    from wagma_bench.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        validate(compose(*overrides))
    assert message in str(err.value), str(err.value)


@pytest.mark.long
def test_every_outer_optimizer_base_runs_to_its_budget_under_emulated_nccl_from_the_command_line(tmp_path):
    """The outer layer's global average (D-PSGD, SGP) and its step inside WAGMA-SGD's synchronous round on a
    data plane that refuses what NCCL refuses (their exactness under emulation: the -nccl world of
    test_invariants)."""
    bases = [name for name, cls in OPTIMIZERS.items() if cls.outer_at is not None]
    cmd = [
        str(BIN),
        "run",
        "-m",
        f"optimizer={','.join(bases)}",
        "optimizer.outer=slowmo",
        "comm.emulate=nccl",
        "launcher.nproc=2",
        "train.max_rounds=24",
        "eval.every_rounds=1000",
        "logger.progress=off",
        f"hydra.sweep.dir={tmp_path}",
        "hydra.sweep.subdir=${optimizer.name}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in bases:
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["rounds"] >= 24, (name, summary)


# make test-long; make test checks the fragment average's collective in test_streaming.py's world
@pytest.mark.long
def test_streaming_diloco_runs_to_its_budget_under_emulated_nccl(tmp_path):
    """Each fragment's average in flight across inner steps is an asynchronous allreduce on the data plane:
    what NCCL does (no tags, no any-source)."""
    out = subprocess.run(
        [
            str(BIN),
            "run",
            "optimizer=local_sgd",
            "optimizer.outer=nesterov",
            "optimizer.fragments=2",
            "optimizer.fragment_delay=1",
            "comm.emulate=nccl",
            "launcher.nproc=2",
            "train.max_rounds=24",
            "eval.every_rounds=1000",
            "logger.progress=off",
            f"hydra.run.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds"] >= 24, summary
