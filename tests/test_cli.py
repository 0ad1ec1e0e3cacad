"""`wagma-bench run` end to end, as a user types it: real local gloo ranks, events, summary, failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_util import BIN, run
from tests.proc_util import rank_pids
from wagma_bench.record.events import RunStart
from wagma_bench.record.files import read_jsonl
from wagma_bench.simulate.calibrate import model_params_of

QUICK = ["launcher.nproc=2", "train.max_rounds=12", "eval.every_rounds=6", "logger.progress=lines"]


def test_short_run_writes_events_steps_and_summary(checkpointed):
    """The session's shared finished run (tests/conftest.py: QUICK with checkpoints)."""
    tmp_path = checkpointed
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert (summary["workload"], summary["optimizer"], summary["world_size"]) == ("resnet", "allreduce", 2)
    assert summary["rounds"] == 12 and summary["samples"] == 12 * 2 * 32
    assert summary["throughput_samples_per_s"] > 0 and summary["eval_s"] > 0
    assert summary["train_s"] < summary["wall_s"]
    keys = [e["key"] for e in read_jsonl(tmp_path / "events.jsonl")]
    assert keys[0] == "run_start" and keys[-1] == "run_stop" and keys.count("eval_accuracy") == 2
    start = read_jsonl(tmp_path / "events.jsonl")[0]["metadata"]
    assert start["world_size"] == 2 and start["seed"] == 1 and len(start["config_hash"]) == 12
    # what readers would otherwise recompute, logged once: the model size (calibration rebuilt the model
    # for it), where it ran and the scaled learning rate (the MLPerf log), the schedule
    old = RunStart({k: v for k, v in start.items() if k not in ("model_params", "base_lr", "nodes")})
    assert start["model_params"] == model_params_of(old) and start["base_lr"] == pytest.approx(old.base_lr)
    assert (start["nodes"], start["ranks_per_node"], start["group_size"], start["sync_period"]) == (
        1,
        2,
        None,
        1,
    )
    assert (start["steps_total"], start["eval_every"], start["control_every"]) == (12, 6, 10)
    for rank in (0, 1):
        steps = read_jsonl(tmp_path / "steps" / f"rank{rank}.jsonl")
        assert [s["local_step"] for s in steps] == list(range(1, 13))
    assert (tmp_path / ".hydra" / "config.yaml").exists()


@pytest.mark.long  # resumes are covered in make test by tests/test_faults.py (cut-back logs, one run_stop)
def test_resume_continues_the_same_event_log(tmp_path):
    first = run(QUICK + ["checkpoint.every_s=0", f"hydra.run.dir={tmp_path}"])
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "checkpoint" / "latest").exists()
    second = run([a.replace("max_rounds=12", "max_rounds=24") for a in QUICK] + [f"hydra.run.dir={tmp_path}"])
    assert second.returncode == 0, second.stderr[-3000:]
    events = read_jsonl(tmp_path / "events.jsonl")
    assert [e["key"] for e in events].count("run_resume") == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rounds"] == 24 and summary["restarts"] == 1
    steps = [s["local_step"] for s in read_jsonl(tmp_path / "steps" / "rank0.jsonl")]
    assert steps == list(range(1, 25))


def test_unknown_option_fails_before_any_rank_starts(tmp_path):
    out = run(["optimizer=nope", f"hydra.run.dir={tmp_path}"], timeout=120)
    assert out.returncode == 2
    assert (
        "optimizer=nope: no such option of optimizer; choose one of:" in out.stderr and "wagma" in out.stderr
    )
    assert not (tmp_path / "events.jsonl").exists()


def test_missing_imagenet_root_is_a_clear_error(tmp_path):
    """The workload's own check, which the CLI makes before any rank starts (through the CLI, with its exit 2:
    tests/test_faults.py's class folder without images)."""
    from tests.cli_util import compose
    from wagma_bench.config.schema import validate
    from wagma_bench.workloads import get_workload

    with pytest.raises(ValueError) as err:
        get_workload("resnet").check(validate(compose("data=imagenet", f"data.root={tmp_path / 'nowhere'}")))
    assert "ROOT/train/<class>" in str(err.value) and "nowhere" in str(err.value)


@pytest.mark.long  # make test: tests/test_run_outcomes.py's diverged run (exit 3, where and why, strict JSON)
def test_divergence_stops_with_status_diverged(tmp_path):
    out = run(
        QUICK + ["train.lr=1e12", "train.max_rounds=40", "train.weight_decay=0", f"hydra.run.dir={tmp_path}"]
    )
    assert out.returncode == 3, out.stderr[-3000:]  # exits.DIVERGED
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "diverged"


def test_killed_rank_ends_the_run_with_a_message_naming_it(tmp_path):
    proc = subprocess.Popen(
        [
            str(BIN),
            "run",
            "launcher.nproc=3",
            "train.max_rounds=100000",
            "logger.progress=off",
            f"hydra.run.dir={tmp_path}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 300
        while not (tmp_path / "events.jsonl").exists() and time.time() < deadline:
            time.sleep(0.5)
        time.sleep(2)
        ranks = rank_pids(proc.pid)
        assert len(ranks) == 3, ranks
        os.kill(ranks[-1], signal.SIGKILL)
        _, err = proc.communicate(timeout=200)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert "was killed by signal SIGKILL (it left no traceback)" in err and "rank" in err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "rank" in summary["error"]


# make test-long: make test's torchrun worlds (tests/test_launch_conventions.py) start `python -m wagma_bench
# run` under c10d and static rendezvous, with and without hydra.run.dir
@pytest.mark.long
def test_runs_as_one_rank_of_a_torchrun_world(tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    out = subprocess.run(
        [
            str(torchrun),
            "--nproc_per_node",
            "2",
            "--standalone",
            "-m",
            "wagma_bench",
            "run",
            "train.max_rounds=6",
            "eval.every_rounds=6",
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
    assert summary["world_size"] == 2 and summary["status"] == "completed"


@pytest.mark.parametrize(
    "argv,said",
    [
        (["run", "train.batch_size=-4", "hydra.run.dir={tmp}/run"], "train.batch_size=-4 is not allowed"),
        (["report", "{tmp}/nothing-here"], "nothing-here"),
        (["sweep", "status"], "usage: wagma-bench sweep status DIR"),
        (["tune", "tune.trials=0", "--out", "{tmp}/tune"], "tune.trials=0 is not allowed"),
        (["simulate", "gpus=0", "--out", "{tmp}/sim"], "gpus=0 is not allowed"),
        (["claims", "{tmp}/nothing-here", "--out", "{tmp}/claims"], "nothing-here"),
        (["comm-bench", "--sizes", "0", "--out", "{tmp}/cb.json"], "size '0' must be positive"),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else None,
)
def test_every_command_refuses_bad_input_with_exit_2_and_one_error_line(
    argv, said, tmp_path, capsys, monkeypatch
):
    """The one convention (docs/running.md, wagma_bench/exits.py): bad input is exit 2 and one line
    `wagma-bench COMMAND: error: ...` (argparse's own usage lines may precede it), before anything is
    written."""
    from wagma_bench import exits
    from wagma_bench.cli import main

    monkeypatch.chdir(tmp_path)
    try:
        code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    except SystemExit as stop:  # run and argparse end by sys.exit
        code = stop.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == exits.REFUSED, err
    assert err[-1].startswith(f"wagma-bench {argv[0]}: error: ") and said in err[-1], err
    assert "Traceback" not in "\n".join(err)
    assert not any(p.name in ("tune", "sim", "claims", "cb.json") for p in tmp_path.iterdir())
