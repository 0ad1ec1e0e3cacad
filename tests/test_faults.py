"""Faults a demanding user or a hostile tester provokes (docs/failure-behaviour.md), each through the real CLI
and real local gloo ranks: bad values refused up front, one writer per run directory, consistent event logs
across restarts, checkpoints verified as sets."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import typing
from pathlib import Path

import pytest
import torch

from tests.cli_util import BIN, compose, run
from tests.proc_util import alive, rank_pids
from wagma_bench.config.schema import FIXED_SECTIONS, missing_range_hint, option_schemas
from wagma_bench.ranges import range_of
from wagma_bench.record.files import read_jsonl
from wagma_bench.workloads import WORKLOADS

QUICK = ["launcher.nproc=2", "train.max_rounds=12", "eval.every_rounds=6", "logger.progress=off"]


def no_rank_started(run_dir: Path) -> bool:
    return not (run_dir / "events.jsonl").exists() and not (run_dir / "steps").exists()


# --- rows 6, 7, 8: every bad value refused before any rank starts ------------------------------------

BAD_VALUES = [
    ("train.batch_size", "-4", []),
    ("train.batch_size", "0", []),
    ("launcher.nproc", "0", []),
    ("launcher.nproc", "-1", []),
    ("optimizer.group_size", "3", ["optimizer=wagma"]),
    ("optimizer.group_size", "8", ["optimizer=wagma"]),  # larger than 2 ranks padded to a power of two
    ("train.max_rounds", "0", []),
    ("eval.every_rounds", "0", []),
    ("imbalance.delay_s", "-1", ["imbalance=shared_draw"]),
    ("imbalance.probability", "1.5", ["imbalance=independent"]),  # a probability
    ("train.momentum", "1.5", []),  # a fraction
    ("workload.sync_frac", "-0.1", ["workload=ddppo"]),  # a probability
    ("workload.gamma", "1.01", ["workload=ddppo"]),
    ("optimizer.sync_period", "0", ["optimizer=local_sgd"]),  # a schema's own __post_init__ check
    ("optimizer.outer_momentum", "1", ["optimizer=local_sgd", "optimizer.outer=slowmo"]),
    ("optimizer.outer_period", "6", ["optimizer=local_sgd", "optimizer.outer=slowmo"]),  # not a multiple of 4
]


# Through the real CLI (3-5 s each): a range check and a schema's own __post_init__ check, the two ways
# validate() refuses (cli/run.py's _run_job turns either into exit 2 before any rank starts); every value of
# BAD_VALUES in the launching process's own check, below (the same validate() the CLI calls).
THROUGH_THE_CLI = {"train.batch_size=-4", "optimizer.sync_period=0"}


@pytest.mark.parametrize("key,value,extra", BAD_VALUES, ids=[f"{k}={v}" for k, v, _ in BAD_VALUES])
def test_bad_value_fails_the_config_check_naming_key_value_and_what_is_allowed(key, value, extra):
    from wagma_bench.config.schema import validate
    from wagma_bench.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        validate(compose(*extra, "launcher.nproc=2", f"{key}={value}"))
    assert f"{key}={value}" in str(err.value) and "must be" in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "extra,reason",
    [
        (
            ["optimizer=allreduce"],
            (
                "it averages gradients, not models: every rank holds the same model after every "
                "step; an outer optimizer applies to: wagma, local_sgd, dpsgd, sgp"
            ),
        ),
        (["optimizer=eager"], "it averages gradients, not models"),
        (["optimizer=adpsgd"], "corrections in flight"),
        (["optimizer=sgp", "optimizer.overlap=true"], "push-sum mass is in flight"),
    ],
)
def test_an_outer_optimizer_where_it_does_not_apply_is_refused_with_the_reason(extra, reason):
    from wagma_bench.config.schema import validate
    from wagma_bench.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        validate(compose(*extra, "launcher.nproc=2", "optimizer.outer=slowmo"))
    assert "optimizer.outer=slowmo is not allowed with optimizer=" in str(err.value), str(err.value)
    assert reason in str(err.value), str(err.value)


CLI_CASES = [case for case in BAD_VALUES if f"{case[0]}={case[1]}" in THROUGH_THE_CLI]


@pytest.mark.parametrize("key,value,extra", CLI_CASES, ids=[f"{k}={v}" for k, v, _ in CLI_CASES])
def test_bad_value_is_refused_before_any_rank_starts(tmp_path, key, value, extra):
    out = run(extra + ["launcher.nproc=2", f"{key}={value}", f"hydra.run.dir={tmp_path}"], timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "wagma-bench run: error:" in out.stderr
    assert f"{key}={value}" in out.stderr, out.stderr[-2000:]
    assert "must be" in out.stderr  # ... and what is allowed
    assert no_rank_started(tmp_path)
    assert list(tmp_path.iterdir()) == []  # the directory as it was (docs/failure-behaviour.md)


def test_imagenet_class_folder_without_images_is_refused(tmp_path):
    root = tmp_path / "imagenet"
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (root / split / cls).mkdir(parents=True)
            (root / split / cls / "a.JPEG").write_bytes(b"")  # never opened: the layout check runs first
    for f in (root / "train" / "dog").iterdir():
        f.unlink()
    run_dir = tmp_path / "run"
    out = run(["data=imagenet", f"data.root={root}", f"hydra.run.dir={run_dir}"], timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"class folder {root / 'train' / 'dog'} holds no images" in out.stderr
    assert no_rank_started(run_dir)


def _schemas() -> list[type]:
    """Every configuration schema: the fixed sections (and the sections nested in them), every option's."""
    schemas = list(FIXED_SECTIONS.values())
    schemas += [cls for options in option_schemas().values() for cls in options.values()]
    schemas += [cls for w in WORKLOADS.values() for cls in w.DATA.values()]
    nested = [
        t
        for cls in schemas
        for hint in typing.get_type_hints(cls).values()
        for t in typing.get_args(hint) or [hint]
        if dataclasses.is_dataclass(t)
    ]  # WandbConfig | None
    return list(dict.fromkeys(schemas + nested))


def _is_numeric(hint) -> bool:
    return hint is not bool and any(t in str(hint) for t in ("int", "float"))


def test_every_numeric_setting_has_an_allowed_range():
    missing = [
        f"{cls.__qualname__}.{f.name}: {missing_range_hint(cls, f.name)}"
        for cls in _schemas()
        for f in dataclasses.fields(cls)
        if _is_numeric(typing.get_type_hints(cls)[f.name]) and range_of(f) is None
    ]
    assert not missing, "\n".join(missing)


def test_only_numeric_settings_declare_a_range():
    """A range on a string or a flag would never be checked (check_ranges skips them): a mistake."""
    stray = [
        f"{cls.__qualname__}.{f.name}"
        for cls in _schemas()
        for f in dataclasses.fields(cls)
        if range_of(f) is not None and not _is_numeric(typing.get_type_hints(cls)[f.name])
    ]
    assert not stray, f"a range on a setting that is not a number: {', '.join(stray)}"


# --- rows 1, 12, 13: one writer per run directory; no step or event twice ---------------------------


def start(args) -> subprocess.Popen:
    """A run in the background, in its own process group (to kill the launcher and its ranks at once)."""
    return subprocess.Popen(
        [str(BIN), "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for(condition, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def kill_run(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and its ranks, as a crash or an OOM killer would."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate(timeout=60)


def keys(run_dir: Path) -> list[str]:
    return [e["key"] for e in read_jsonl(run_dir / "events.jsonl")]


def logged_steps(run_dir: Path, rank: int) -> list[int]:
    return [s["local_step"] for s in read_jsonl(run_dir / "steps" / f"rank{rank}.jsonl")]


def latest_manifest(run_dir: Path) -> dict:
    name = (run_dir / "checkpoint" / "latest").read_text().strip()
    return json.loads((run_dir / "checkpoint" / name / "manifest.json").read_text())


def kill_when_held(proc: subprocess.Popen, condition, what: str) -> None:
    """SIGKILL the run once ``condition`` holds with its ranks held (SIGSTOP): read while they run, it may be
    stale by the time the kill lands (a checkpoint written meanwhile, on a busy machine). Held and false, they
    go on."""
    while True:
        wait_for(condition, what)
        ranks = rank_pids(proc.pid)
        for pid in ranks:
            os.kill(pid, signal.SIGSTOP)
        if condition():
            kill_run(proc)
            return
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)


def _steps_logged_past_the_checkpoint(run_dir: Path) -> bool:
    try:
        at = latest_manifest(run_dir)["round"]
    except FileNotFoundError:  # none yet
        return False
    return max(logged_steps(run_dir, 0), default=0) > at


def checkpoints(run_dir: Path) -> list[int]:
    return [e["metadata"]["round"] for e in read_jsonl(run_dir / "events.jsonl") if e["key"] == "checkpoint"]


@pytest.mark.serial
def test_second_run_into_a_locked_directory_fails_naming_the_holder(tmp_path):
    """Row 1, and row 13's first half: the killed first run leaves a stale lock and no checkpoint; the
    rerun takes the lock over and starts afresh, appending nothing to the killed attempt's logs."""
    first = start(QUICK[:1] + ["train.max_rounds=100000", "logger.progress=off", f"hydra.run.dir={tmp_path}"])
    try:
        wait_for(lambda: logged_steps(tmp_path, 0) or (tmp_path / "steps" / "rank0.jsonl").exists(), "rank 0")
        t0 = time.monotonic()
        second = run(["optimizer=wagma"] + QUICK + [f"hydra.run.dir={tmp_path}"], timeout=120)
        refused_s = time.monotonic() - t0
        assert second.returncode == 2, second.stderr[-2000:]
        assert "in use by another run" in second.stderr and f"PID {first.pid}" in second.stderr
        assert refused_s < 15
        assert first.poll() is None  # the holder runs on, undisturbed
    finally:
        kill_run(first)
    assert keys(tmp_path).count("run_start") == 1
    third = run(QUICK + [f"hydra.run.dir={tmp_path}"])
    assert third.returncode == 0, third.stderr[-3000:]
    assert "taking over the stale lock" in third.stderr and f"PID {first.pid}" in third.stderr
    assert keys(tmp_path).count("run_start") == 1 and keys(tmp_path).count("run_stop") == 1
    assert logged_steps(tmp_path, 0) == logged_steps(tmp_path, 1) == list(range(1, 13))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["optimizer"], summary["rounds"], summary["status"]) == ("allreduce", 12, "completed")
    assert not (tmp_path / ".lock").exists()


def test_rerun_of_a_completed_run_prints_its_summary_and_trains_nothing(checkpointed, tmp_path):
    """Row 12: the same command again (on a copy of the shared finished run, made by that command)."""
    run_dir = tmp_path / "run"
    shutil.copytree(checkpointed, run_dir)
    events, summary = (run_dir / "events.jsonl").read_bytes(), (run_dir / "summary.json").read_bytes()
    t0 = time.monotonic()
    again = run(QUICK + ["checkpoint.every_s=0", f"hydra.run.dir={run_dir}"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert time.monotonic() - t0 < 20
    assert "already holds this run, completed" in again.stdout and '"rounds": 12' in again.stdout
    assert (run_dir / "events.jsonl").read_bytes() == events
    assert (run_dir / "summary.json").read_bytes() == summary


def test_resume_cuts_step_logs_and_events_back_to_the_checkpoint(tmp_path):
    """Row 13's second half: killed after a checkpoint with later steps already logged; the resume
    logs every step once and the events hold one run_start, one run_resume and one run_stop."""
    # checkpoints 3 s apart, so that steps are logged past one before the next is written
    args = QUICK[:1] + [
        "eval.every_rounds=1000",
        "checkpoint.every_s=3",
        "logger.progress=off",
        f"hydra.run.dir={tmp_path}",
    ]
    first = start(args + ["train.max_rounds=400"])
    try:
        kill_when_held(
            first, lambda: _steps_logged_past_the_checkpoint(tmp_path), "steps logged after a checkpoint"
        )
    finally:
        kill_run(first)
    at = latest_manifest(tmp_path)["round"]
    assert max(logged_steps(tmp_path, 0)) > at
    total = at + 1  # the killed process logged past the checkpoint: the resume must cut those steps back
    second = run(args + [f"train.max_rounds={total}"])
    assert second.returncode == 0, second.stderr[-3000:]
    for rank in (0, 1):
        assert logged_steps(tmp_path, rank) == list(range(1, total + 1))
    k = keys(tmp_path)
    assert (k.count("run_start"), k.count("run_resume"), k.count("run_stop")) == (1, 1, 1) and k[
        -1
    ] == "run_stop"
    resume = next(e for e in read_jsonl(tmp_path / "events.jsonl") if e["key"] == "run_resume")
    before = read_jsonl(tmp_path / "events.jsonl")[: k.index("run_resume")]
    assert all(e["metadata"].get("round", 0) <= resume["metadata"]["round"] for e in before)


def test_preempted_run_is_suspended_and_its_resume_ends_with_one_run_stop(tmp_path):
    """A run stopped to be resumed (SIGTERM / SLURM's USR1) writes run_suspend, not a second run_stop.
    (Batches of 8 images a rank: the rounds before the signal's checkpoint cost a quarter.)"""
    args = QUICK[:1] + [
        "train.batch_size=8",
        "eval.every_rounds=1000",
        "logger.progress=off",
        f"hydra.run.dir={tmp_path}",
    ]
    first = start(args + ["train.max_rounds=400"])
    try:
        wait_for(lambda: (tmp_path / "steps" / "rank0.jsonl").exists() and logged_steps(tmp_path, 0), "steps")
        for pid in rank_pids(first.pid):
            os.kill(pid, signal.SIGTERM)
        first.communicate(timeout=120)
    finally:
        kill_run(first)
    assert first.returncode == 0
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "preempted"
    assert keys(tmp_path)[-1] == "run_suspend" and "run_stop" not in keys(tmp_path)
    at = checkpoints(tmp_path)[-1]
    second = run(args + [f"train.max_rounds={at + 1}"])
    assert second.returncode == 0, second.stderr[-3000:]
    k = keys(tmp_path)
    assert (k.count("run_start"), k.count("run_suspend"), k.count("run_resume"), k.count("run_stop")) == (
        1,
        1,
        1,
        1,
    )
    assert k[-1] == "run_stop"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["restarts"], summary["rounds"]) == ("completed", 1, at + 1)
    # the MLPerf log of the same run passes the official checker, with our run_suspend / run_resume in order
    # (the ResNet-20 run in tests/test_mllog.py, stopped after an evaluation, is in make test-long)
    from tests.test_mllog import assert_compliant, keys_of
    from wagma_bench.record.mlperf import MLLOG

    assert_compliant(tmp_path / MLLOG, "4.0.0")
    mllog = keys_of(tmp_path / MLLOG)
    assert [mllog.count(k) for k in ("run_start", "run_suspend", "run_resume", "run_stop")] == [1, 1, 1, 1]
    assert mllog.index("run_suspend") < mllog.index("run_resume") < mllog.index("run_stop")


# --- rows 2, 3, 4: checkpoints as verified sets --------------------------------------------------------


def resume_copy(checkpointed: Path, tmp_path: Path, *args: str, timeout: float = 120):
    """Resume a copy of the checkpointed run with a larger budget (a plain rerun would only report it)."""
    run_dir = tmp_path / "run"
    shutil.copytree(checkpointed, run_dir)
    events = (run_dir / "events.jsonl").read_bytes()
    t0 = time.monotonic()
    out = run(
        [a.replace("max_rounds=12", "max_rounds=24") for a in QUICK] + [*args, f"hydra.run.dir={run_dir}"],
        timeout=timeout,
    )
    return out, time.monotonic() - t0, run_dir, events


def test_checkpoint_sets_are_kept_two_deep_with_a_manifest(checkpointed):
    sets = sorted(p.name for p in (checkpointed / "checkpoint").glob("round-*"))
    assert sets == ["round-10", "round-12"]
    manifest = latest_manifest(checkpointed)
    assert (manifest["round"], manifest["world_size"]) == (12, 2) and sorted(manifest["files"]) == [
        "rank0.pt",
        "rank1.pt",
    ]


@pytest.mark.parametrize("nproc", [1])
def test_resume_with_another_world_size_is_refused_before_any_rank_starts(checkpointed, tmp_path, nproc):
    """Row 2 (a 2-rank checkpoint; a 4-rank one behaves alike). One rank, the world of its own
    launcher path; more ranks than the checkpoint's meet the same comparison of counts."""
    out, took, run_dir, events = resume_copy(checkpointed, tmp_path, f"launcher.nproc={nproc}")
    assert out.returncode == 2, out.stderr[-3000:]
    assert (
        f"checkpoint round-12 in {run_dir / 'checkpoint'} was written by 2 ranks, this run has {nproc} "
        f"(launcher.nproc={nproc})" in out.stderr
    )
    assert took < 20 and (run_dir / "events.jsonl").read_bytes() == events


def test_damaged_rank_file_is_named_and_nothing_is_loaded(checkpointed, tmp_path):
    """Row 3: 4 KB overwritten inside rank 1's file; every rank checks its own file before loading."""
    run_dir = tmp_path / "run"
    shutil.copytree(checkpointed, run_dir)
    path = run_dir / "checkpoint" / "round-12" / "rank1.pt"
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(os.urandom(4096))
    t0 = time.monotonic()
    out = run([a.replace("max_rounds=12", "max_rounds=24") for a in QUICK] + [f"hydra.run.dir={run_dir}"])
    assert out.returncode == 1, out.stderr[-3000:]
    assert f"rank 1: {path} is damaged" in out.stderr
    assert "previous complete set is round-10" in out.stderr
    assert time.monotonic() - t0 < 90
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    assert "run_resume" not in keys(run_dir)


def test_missing_rank_file_is_refused_before_any_rank_starts(checkpointed, tmp_path):
    """Row 4."""
    run_dir = tmp_path / "run"
    shutil.copytree(checkpointed, run_dir)
    (run_dir / "checkpoint" / "round-12" / "rank1.pt").unlink()
    t0 = time.monotonic()
    out = run(
        [a.replace("max_rounds=12", "max_rounds=24") for a in QUICK] + [f"hydra.run.dir={run_dir}"],
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert f"{run_dir / 'checkpoint' / 'round-12' / 'rank1.pt'} is missing" in out.stderr
    assert time.monotonic() - t0 < 20


def test_changed_configuration_is_refused_naming_the_key(checkpointed, tmp_path):
    out, _, run_dir, events = resume_copy(checkpointed, tmp_path, "train.lr=0.05")
    assert out.returncode == 2, out.stderr[-3000:]
    assert "written with another configuration (train.lr: " in out.stderr and " -> 0.05)" in out.stderr
    assert (run_dir / "events.jsonl").read_bytes() == events


def test_sgp_overlap_checkpoint_keeps_the_message_in_flight(tmp_path):
    """Push-sum conserves mass: the weights of all ranks plus the messages in flight sum to the world
    size. A checkpoint without the in-flight message loses that mass on resume. (Batches of 8 images a rank:
    the message in flight is the model's, whatever the batch.)"""
    out = run(
        QUICK[:1]
        + [
            "optimizer=sgp",
            "optimizer.overlap=true",
            "train.batch_size=8",
            "train.max_rounds=10",
            "eval.every_rounds=10",
            "logger.progress=off",
            "checkpoint.every_s=0",
            f"hydra.run.dir={tmp_path}",
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    folder = tmp_path / "checkpoint" / "round-10"
    algos = [torch.load(folder / f"rank{r}.pt", weights_only=False)["algo"] for r in (0, 1)]
    held = sum(a["weight"] for a in algos)
    in_flight = sum(float(a["in_flight"][-1]) for a in algos if a.get("in_flight") is not None)
    assert held < 2 - 1e-6  # some mass is on its way at a checkpoint ...
    assert held + in_flight == pytest.approx(2.0, abs=1e-5)  # ... and the checkpoint holds it


# --- row 9: ranks die with their launcher --------------------------------------------------------------


@pytest.mark.serial
def test_ranks_end_with_their_killed_launcher_and_record_it(tmp_path):
    """Row 9: SIGKILL the launcher only; its ranks get SIGTERM (parent-death signal), checkpoint at the
    next synchronisation point and end the run as preempted, resumable; none trains on unsupervised."""
    launcher = start(
        QUICK[:1]
        + [
            "train.max_rounds=100000",
            "eval.every_rounds=1000",
            "logger.progress=off",
            f"hydra.run.dir={tmp_path}",
        ]
    )
    try:
        wait_for(lambda: (tmp_path / "steps" / "rank0.jsonl").exists() and logged_steps(tmp_path, 0), "steps")
        ranks = rank_pids(launcher.pid)
        assert len(ranks) == 2, ranks
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.communicate(timeout=60)
        t0 = time.monotonic()
        wait_for(lambda: not any(alive(p) for p in ranks), "the ranks to end", timeout=60)
        took = time.monotonic() - t0
    finally:
        kill_run(launcher)
    assert took < 30
    assert keys(tmp_path)[-1] == "run_suspend"
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "preempted"
    assert (tmp_path / "checkpoint" / "latest").exists()


# --- row 15: a corrupt sample names its file -----------------------------------------------------------


def test_corrupt_jpeg_is_named(tmp_path):
    from PIL import Image

    root = tmp_path / "imagenet"
    for split in ("train", "val"):
        for c, cls in enumerate(("cat", "dog")):
            (root / split / cls).mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (32, 32), (60 * c + 10 * i, 0, 0)).save(root / split / cls / f"{i}.JPEG")
    bad = root / "train" / "dog" / "2.JPEG"
    bad.write_bytes(bad.read_bytes()[:200])  # truncated, as a broken copy leaves it
    out = run(
        [
            "data=imagenet",
            f"data.root={root}",
            "workload.arch=resnet20",
            "workload.num_workers=0",
            "launcher.nproc=1",
            "train.batch_size=8",
            "train.max_rounds=2",
            "eval.every_rounds=2",
            "logger.progress=off",
            f"hydra.run.dir={tmp_path / 'run'}",
        ]
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert f"cannot read image {bad}" in out.stderr
    assert f"cannot read image {bad}" in json.loads((tmp_path / "run" / "summary.json").read_text())["error"]


# --- the lock's rules, without processes -------------------------------------------------------------


def _write_lock(run_dir: Path, **holder) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    base = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "slurm_job_id": None}
    (run_dir / ".lock").write_text(json.dumps({**base, **holder}))


def test_lock_rules_live_dead_other_host_and_requeued_job(tmp_path, monkeypatch, capsys):
    from wagma_bench.record.rundir import RunDirLock, RunDirLocked

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    dead = subprocess.Popen(["true"])
    dead.wait()
    cases = {"live": {"pid": os.getppid()}, "other_host": {"host": "elsewhere", "pid": dead.pid}}
    for name, holder in cases.items():
        _write_lock(tmp_path / name, **holder)
        with pytest.raises(
            RunDirLocked, match=f"PID {holder['pid']} on {holder.get('host', socket.gethostname())}"
        ):
            RunDirLock(tmp_path / name).acquire()
    _write_lock(tmp_path / "dead", pid=dead.pid)
    lock = RunDirLock(tmp_path / "dead")
    lock.acquire()
    assert "its process is gone" in capsys.readouterr().err
    assert json.loads((tmp_path / "dead" / ".lock").read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / "dead" / ".lock").exists()
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # a requeued job on another node finds its own old lock
    _write_lock(tmp_path / "requeued", host="node17", pid=1, slurm_job_id="4242")
    RunDirLock(tmp_path / "requeued").acquire()
    assert "earlier incarnation of this SLURM job" in capsys.readouterr().err


# --- row 11: a SIGKILLed rank ends the run within seconds, always recorded --------------------------------


def _rank_pids(launcher: subprocess.Popen, nproc: int) -> list[int]:
    """The ranks' PIDs by rank (spawned in rank order, so in increasing PID order)."""
    wait_for(lambda: len(rank_pids(launcher.pid)) == nproc, "the ranks to start", timeout=60)
    return sorted(rank_pids(launcher.pid))


@pytest.mark.serial
def test_sigkilled_rank_ends_an_eager_run_within_seconds_and_is_recorded(tmp_path):
    """Row 11: rank 0 (the one that writes the events) is SIGKILLed mid-run; the survivor may be blocked in
    eager-SGD's progress thread, deaf to SIGTERM. The launcher ends it within seconds and records the
    failure itself: a run_stop naming the rank and the signal, and summary.json."""
    launcher = start(
        QUICK[:1]
        + [
            "optimizer=eager",
            "train.max_rounds=100000",
            "eval.every_rounds=1000",
            f"hydra.run.dir={tmp_path}",
        ]
    )
    try:
        wait_for(
            lambda: (
                (tmp_path / "steps" / "rank1.jsonl").exists()
                and logged_steps(tmp_path, 0)
                and keys(tmp_path) == ["run_start", "startup"]
            ),
            "steps",
        )
        os.kill(_rank_pids(launcher, 2)[0], signal.SIGKILL)
        t0 = time.monotonic()
        _, err = launcher.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        kill_run(launcher)
    assert launcher.returncode == 1, err[-3000:]
    assert took < 12, f"{took:.1f} s"
    assert "rank 0 was killed by signal SIGKILL" in err, err[-3000:]
    stops = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["key"] == "run_stop"]
    assert len(stops) == 1 and keys(tmp_path)[-1] == "run_stop"
    assert stops[0]["metadata"]["status"] == "failed"
    assert "rank 0 was killed by signal SIGKILL" in stops[0]["metadata"]["error"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "rank 0 was killed by signal SIGKILL" in summary["error"]
    assert "see its traceback" not in summary["error"]
    assert summary["rounds"] > 0


# --- row 10: a hung rank is named, within comm.timeout_s plus seconds -------------------------------------

HUNG_TIMEOUT_S = 5  # comm.timeout_s: short, yet long enough for the set-up's collectives on a busy machine


# the wait-avoiding engine (its own threads and control plane) in make test; allreduce in make test-long
@pytest.mark.serial
@pytest.mark.parametrize("optimizer", ["wagma", pytest.param("allreduce", marks=pytest.mark.long)])
def test_stopped_rank_is_named_as_hung_within_the_comm_timeout(tmp_path, optimizer):
    """Row 10: rank 1 is SIGSTOPped mid-run. Its peers' collectives time out and fail, naming themselves;
    the launcher names rank 1, the one whose heartbeat stopped, and ends the run (the stopped process
    included) within comm.timeout_s plus a few seconds."""
    launcher = start(
        QUICK[:1]
        + [
            f"optimizer={optimizer}",
            "train.max_rounds=100000",
            "eval.every_rounds=1000",
            f"comm.timeout_s={HUNG_TIMEOUT_S}",
            f"hydra.run.dir={tmp_path}",
        ]
    )
    try:
        wait_for(lambda: (tmp_path / "steps" / "rank1.jsonl").exists() and logged_steps(tmp_path, 1), "steps")
        stopped = _rank_pids(launcher, 2)[1]
        os.kill(stopped, signal.SIGSTOP)
        t0 = time.monotonic()
        _, err = launcher.communicate(timeout=120)
        took = time.monotonic() - t0
        assert not alive(stopped)
    finally:
        kill_run(launcher)
    assert launcher.returncode == 1, err[-3000:]
    assert "rank 1 (no heartbeat for" in err and "hung" in err, err[-3000:]
    assert "rank 0 (no heartbeat" not in err
    assert took < HUNG_TIMEOUT_S + 8, f"{took:.1f} s"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("rank 1 (no heartbeat for")
    assert keys(tmp_path)[-1] == "run_stop"


# --- row 14: a full file system ---------------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path):
    """A 256 KiB tmpfs: room for the configuration copy and the logs, not for a checkpoint (about 380 KB
    per rank on the embedded ResNet)."""
    mount = tmp_path / "fs"
    mount.mkdir()
    out = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {out.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_disk_ends_the_run_with_a_clear_message_and_leaves_no_temp_files(small_fs):
    """Row 14: the first checkpoint fills the disk. The run fails naming the cause; the launcher removes the
    incomplete set and records run_stop and summary.json (status failed, the reason); no temporary file
    is left; every complete line of the logs reads back."""
    run_dir = small_fs / "run"
    out = run(QUICK + ["checkpoint.every_s=0", f"hydra.run.dir={run_dir}"])
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr.split("wagma-bench run: error:")[-1]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("wagma-bench run: error: rank ") and "No space left on device" in last, last
    assert not [p for p in run_dir.rglob("*") if ".tmp" in p.name]
    assert not [p for p in (run_dir / "checkpoint").glob("round-*") if not (p / "manifest.json").exists()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "No space left on device" in summary["error"]
    assert keys(run_dir)[0] == "run_start" and keys(run_dir)[-1] == "run_stop"
    assert logged_steps(run_dir, 0)


# --- row 5: W&B without network never runs on the training clock ------------------------------------------


@pytest.mark.serial
def test_unreachable_wandb_falls_back_to_offline_off_the_training_clock(tmp_path):
    """Row 5: an API key, but W&B's server does not answer (every connection is closed at once). W&B's
    online start runs in the sink's own thread and gives up after logger.wandb.timeout_s; the run logs
    offline instead, says so, and its training clock holds none of the wait."""
    from tests.test_report import Listener, offline_env

    timeout_s = 4  # the first step must come well before it: a step holding the wait would be at 4 s or later
    listener = Listener()
    env = {**offline_env(tmp_path, listener), "WANDB_API_KEY": "k" * 40}
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [
            str(BIN),
            "run",
            *QUICK,
            "logger=wandb",
            f"logger.wandb.timeout_s={timeout_s}",
            f"hydra.run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    listener.close()
    assert out.returncode == 0, out.stderr[-3000:]
    assert listener.connections > 0  # it did try to go online
    assert f"W&B online start failed within logger.wandb.timeout_s={timeout_s}" in out.stderr
    assert "logging offline instead" in out.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["wandb"]["mode"] == "offline" and summary["wandb"]["reason"].startswith(
        "fallback: online start"
    )
    # the first step's training time: before, it held W&B's whole wait (logger.wandb.timeout_s at least)
    first = read_jsonl(run_dir / "steps" / "rank0.jsonl")[0]
    assert first["t"] < timeout_s, first
    assert list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))


# --- identical continuation ---------------------------------------------------------------------------------


def _continued(tmp_path: Path, optimizer: str, *extra: str) -> tuple[Path, list[str]]:
    """A run of 10 rounds continued to 20 from its last checkpoint (a resume loads the same state whether
    the first process completed or was killed after that checkpoint), and its arguments. Each run ends at
    exactly its budget (its last round a synchronisation point). Batches of 8 images a rank, not 32: what a
    resume must restore is the same at any batch size, and the rounds cost a quarter."""
    args = QUICK[:1] + [
        f"optimizer={optimizer}",
        "train.batch_size=8",
        "eval.every_rounds=10",
        "checkpoint.every_s=0",
        "logger.progress=off",
        *extra,
    ]
    # one multirun (one launcher, one fork server): its second job reruns the first's directory with the
    # larger budget, so it resumes there from the checkpoint at 10, in rank processes of its own
    out = run(
        ["-m", *args, "train.max_rounds=10,20", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=cut"]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp_path / "cut", args


def _cut_and_whole(tmp_path: Path, optimizer: str, *extra: str, cut_at: int = 10) -> tuple[Path, Path]:
    """A run of ``cut_at`` rounds continued to 20 from its last checkpoint, and the same 20 rounds at once.
    The first run and the whole 20 are one multirun (one launcher, one fork server); then the continuation.
    The cut is a multiple of the sync period: a budget between sync points ends with a synchronisation of its
    own (local SGD's global average), which a continuation keeps and a run of 20 at once does not make.
    Batches of 8 images a rank, as in :func:`_continued`."""
    args = QUICK[:1] + [
        f"optimizer={optimizer}",
        "train.batch_size=8",
        "eval.every_rounds=10",
        "checkpoint.every_s=0",
        "logger.progress=off",
        *extra,
    ]
    out = run(
        [
            "-m",
            *args,
            f"train.max_rounds={cut_at},20",
            f"hydra.sweep.dir={tmp_path}",
            "hydra.sweep.subdir=steps${train.max_rounds}",
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    cut, whole = tmp_path / f"steps{cut_at}", tmp_path / "steps20"
    out = run(args + ["train.max_rounds=20", f"hydra.run.dir={cut}"])
    assert out.returncode == 0, out.stderr[-3000:]
    return cut, whole


def _final_state(run_dir: Path, rank: int, part: str = "model") -> dict:
    newest = (run_dir / "checkpoint" / "latest").read_text().strip()
    return torch.load(run_dir / "checkpoint" / newest / f"rank{rank}.pt", weights_only=False)[part]


# make test resumes local SGD bit-identically with its outer optimizer (below: the model, the local
# optimizer's and the outer state, through the same checkpoint path); every deterministic optimizer here in
# make test-long
DETERMINISTIC = [
    pytest.param(o, marks=pytest.mark.long) for o in ("allreduce", "local_sgd", "dpsgd", "sgp", "dropcompute")
]


@pytest.mark.parametrize("optimizer", DETERMINISTIC)
def test_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path, optimizer):
    """Deterministic optimizers: 10 rounds (local SGD: 12, a multiple of its period), then resumed to 20, end
    bit-identical to 20 rounds at once (the final checkpoint set of each; every rank's model, buffers
    included)."""
    cut, whole = _cut_and_whole(tmp_path, optimizer, cut_at=12 if optimizer == "local_sgd" else 10)
    for rank in (0, 1):
        a, b = _final_state(whole, rank), _final_state(cut, rank)
        assert a.keys() == b.keys()
        different = [k for k in a if not torch.equal(a[k], b[k])]
        assert not different, f"rank {rank}: {different[:5]}"


OUTER_RESUMES = [
    pytest.param("local_sgd", "nesterov"),
    *(pytest.param(o, "slowmo", marks=pytest.mark.long) for o in ("dpsgd", "sgp")),
]


@pytest.mark.parametrize("optimizer,outer", OUTER_RESUMES)
def test_resumed_run_with_an_outer_optimizer_continues_bit_identically(tmp_path, optimizer, outer):
    """The outer state (the previous outer model, the momentum) is checkpointed: 10 rounds (local SGD: 12, a
    multiple of its period 4) resumed to 20 end with the model and outer state of 20 rounds at once (outer
    period 4, local SGD's 8: the cut falls between outer steps)."""
    local = optimizer == "local_sgd"
    extra = [f"optimizer.outer={outer}", f"optimizer.outer_period={8 if local else 4}"]
    cut, whole = _cut_and_whole(tmp_path, optimizer, *extra, cut_at=12 if local else 10)
    for rank in (0, 1):
        a, b = _final_state(whole, rank), _final_state(cut, rank)
        assert all(torch.equal(a[k], b[k]) for k in a), f"rank {rank}: the models differ"
        a, b = _final_state(whole, rank, "algo")["outer"], _final_state(cut, rank, "algo")["outer"]
        assert all(torch.equal(x, y) for key in ("prev", "u") for x, y in zip(a[key], b[key])), f"rank {rank}"
        assert any(u.abs().sum() > 0 for u in a["u"])  # the momentum was in use when the run was cut


@pytest.mark.long  # 35 s: make test-long (make test resumes local SGD with the outer step of the whole model)
def test_resumed_streaming_diloco_continues_bit_identically(tmp_path):
    """Streaming DiLoCo (two fragments, one step of delay): each fragment's global parameters and momentum are
    checkpointed at the synchronisation point, where no fragment's average is in flight; a run of 20 rounds
    stopped at 12 (its time limit, then lifted) and resumed ends with the models and fragment states of 20
    rounds at once. (Not a run of 12 extended to 20: streaming DiLoCo's budget ends with the whole model's
    average, which a run of 20 at once does not make at 12.)"""
    args = QUICK[:1] + [
        "optimizer=local_sgd",
        "optimizer.outer=nesterov",
        "optimizer.fragments=2",
        "optimizer.fragment_delay=1",
        "optimizer.fragment_alpha=0.5",
        "eval.every_rounds=10",
        "checkpoint.every_s=0",
        "logger.progress=off",
        "train.max_rounds=20",
    ]
    cut, whole = tmp_path / "cut", tmp_path / "whole"
    for extra in (
        ["train.time_limit_s=0.001", f"hydra.run.dir={cut}"],
        [f"hydra.run.dir={whole}"],
        [f"hydra.run.dir={cut}"],
    ):
        out = run(args + extra)
        assert out.returncode == 0, out.stderr[-3000:]
    resumed = [e for e in read_jsonl(cut / "events.jsonl") if e["key"] == "run_resume"]
    assert [e["metadata"]["round"] for e in resumed] == [12]
    for rank in (0, 1):
        a, b = _final_state(whole, rank), _final_state(cut, rank)
        assert all(torch.equal(a[k], b[k]) for k in a), f"rank {rank}: the models differ"
        a, b = (_final_state(d, rank, "algo")["streaming"]["outer"] for d in (whole, cut))
        assert all(
            torch.equal(x, y)
            for fa, fb in zip(a, b)
            for key in ("prev", "u")
            for x, y in zip(fa[key], fb[key])
        ), f"rank {rank}: the fragments' states differ"


ASYNCHRONOUS = [pytest.param("wagma")] + [
    pytest.param(o, marks=pytest.mark.long) for o in ("eager", "adpsgd")
]


def test_every_registered_optimizer_has_a_resume_test():
    """Bit-identical continuation (deterministic ones) or every step and round logged once (asynchronous)."""
    from tests.test_conformance import missing, resume_entry
    from wagma_bench.optim import OPTIMIZERS

    problems = missing(resume_entry)
    problems += [
        f"tests/test_faults.py: remove {p.values[0]!r} from DETERMINISTIC/ASYNCHRONOUS (not a registered "
        f"optimizer)"
        for p in DETERMINISTIC + ASYNCHRONOUS
        if p.values[0] not in OPTIMIZERS
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("optimizer", ASYNCHRONOUS)
def test_resumed_asynchronous_run_logs_every_step_and_round_once(tmp_path, optimizer):
    """Asynchronous optimizers (no bit-identical oracle): the resumed run's step logs hold every local step
    once, rounds strictly increasing and meeting the checkpoint's round exactly once; one run_start, one
    run_resume at the checkpoint's round, one run_stop at round 20."""
    cut, _ = _continued(tmp_path, optimizer)
    k = keys(cut)
    assert (k.count("run_start"), k.count("run_resume"), k.count("run_stop")) == (1, 1, 1) and k[
        -1
    ] == "run_stop"
    events = read_jsonl(cut / "events.jsonl")
    resume = next(e for e in events if e["key"] == "run_resume")["metadata"]["round"]
    end = events[-1]["metadata"]["round"]  # the budgets 10 and 20, exactly
    before = [e["metadata"]["round"] for e in events[: k.index("run_resume")] if e["key"] == "checkpoint"]
    assert resume == 10 and end == 20 and resume == before[-1]
    for rank in (0, 1):
        records = read_jsonl(cut / "steps" / f"rank{rank}.jsonl")
        steps, rounds = [r["local_step"] for r in records], [r["round"] for r in records]
        assert steps == list(range(1, len(steps) + 1)), steps
        assert all(a < b for a, b in itertools.pairwise(rounds)), rounds
        assert rounds.count(resume) == 1 and rounds[-1] == end, rounds
