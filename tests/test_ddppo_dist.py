"""DD-PPO on real gloo worlds: the store counter, deterministic straggler preemption, and training steps
through the real trainer with several optimizers (2 and 3 ranks); an end-to-end run to a target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.dist_util import run_world

CONF = Path(__file__).resolve().parent.parent / "conf"
TINY = [
    "env=gridnav",
    "env.num_envs=2",
    "env.max_episode_steps=20",
    "workload.num_steps=8",
    "workload.hidden_size=16",
    "workload.ppo_epoch=1",
    "workload.num_mini_batch=2",
    "workload.num_eval_episodes=4",
    "train.max_rounds=10",
    "eval.every_rounds=10",
    "eval.target=null",
    "logger.progress=off",
    "checkpoint.every_s=0",
    "checkpoint.resume=false",
]


def _cfg(overrides):
    from hydra import compose, initialize_config_dir

    from wagma_bench.config.schema import validate

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return validate(compose("wagma", overrides=["workload=ddppo", *overrides]))


def _preempt_and_count(comm) -> dict:
    """Rank 2 is held at its 20th step until two ranks finished: it must stop right there (20 >= 64/4).

    The first rollout is choreographed through the store, so that it does not depend on how fast each rank
    starts: ranks 0 and 1 begin stepping only once rank 2 has reached its 20th step (else a rank 2 that
    starts late is preempted at step 16, before it is ever held, and its hold then fell into the second
    rollout, where nobody releases it: a 60 s stall and a barrier timeout)."""
    from wagma_bench.workloads.ddppo.workload import DDPPOWorkload

    total = comm.store_add("test/sum", comm.rank + 1)
    comm.barrier()
    final = comm.store_add("test/sum", 0)
    cfg = _cfg([*TINY, "workload.num_steps=64"])
    w = DDPPOWorkload(cfg, comm.rank, comm.world_size, torch.device("cpu"))
    w.attach(comm)
    w.build_model()
    w._start()
    env, calls, inner, first_rollout = w.envs[0], [0], w.envs[0].step, [True]

    def wait_until(ready) -> None:
        deadline = time.monotonic() + 60
        while not ready():
            assert time.monotonic() < deadline, f"rank {comm.rank}: the choreography stalled"
            time.sleep(0.01)

    def choreographed_step(action):
        calls[0] += 1
        if first_rollout[0] and comm.rank == 2 and calls[0] == 20:
            comm.store_add("test/held", 1)
            wait_until(lambda: w.counter.done(0) >= 2)
        elif first_rollout[0] and comm.rank != 2 and calls[0] == 1:
            wait_until(lambda: comm.store_add("test/held", 0) >= 1)
        return inner(action)

    env.step = choreographed_step
    first = w.collect(0)
    first_rollout[0] = False
    comm.barrier()
    second = w.collect(1)  # a new rollout: a new count
    comm.barrier()  # the parent hosts the store; nobody leaves while another may still read it
    return {"first_add": total, "sum": final, "frames": [first, second], "stats": w._stats}


def _train(comm, run_root: str, optimizers: list[str], preemption: bool = False) -> dict:
    from wagma_bench.train.trainer import train

    out = {"preemption": _preempt_and_count(comm) if preemption else None}
    for name in optimizers:
        run_dir = Path(run_root) / name
        run_dir.mkdir(parents=True, exist_ok=True)
        comm.barrier()
        summary = train(_cfg([*TINY, f"optimizer={name}"]), comm, run_dir)
        latest = run_dir / "checkpoint" / (run_dir / "checkpoint" / "latest").read_text().strip()
        state = torch.load(latest / f"rank{comm.rank}.pt", weights_only=False)["model"]
        flat = torch.cat([v.flatten().float() for v in state.values()])
        out[name] = {"summary": summary, "fingerprint": flat}
    return out


def _assert_runs(results, run_root: Path, world: int, optimizers: list[str]):
    for name in optimizers:
        summary = results[0][name]["summary"]
        assert summary["status"] == "completed" and summary["rounds"] >= 10, (name, summary)
        assert 0.0 <= summary["final_metric"] <= 1.0
        rows = [
            json.loads(line)
            for r in range(world)
            for line in (run_root / name / "steps" / f"rank{r}.jsonl").read_text().splitlines()
        ]
        assert sum(row["samples"] for row in rows) == summary["samples"] > 0  # frames
        for r in range(world):  # every rank logs its own rollout times (wait-avoiding ranks may skip rounds)
            lines = (run_root / name / "steps" / f"rank{r}.jsonl").read_text().splitlines()
            rollouts = [json.loads(line) for line in lines]
            rollouts = [row for row in rollouts if "rollout_s" in row]
            assert len(rollouts) >= 2 and all(row["rollout_s"] > 0 and row["frames"] > 0 for row in rollouts)
        for r in range(world):
            assert torch.isfinite(results[r][name]["fingerprint"]).all()
    from wagma_bench.optim import OPTIMIZERS

    for name in optimizers:  # every rank holds the same model where the optimizer says so
        if OPTIMIZERS[name].models_identical:
            for r in range(1, world):
                assert torch.equal(results[0][name]["fingerprint"], results[r][name]["fingerprint"]), name


def test_ddppo_three_ranks_preemption_and_training(tmp_path):
    """On an odd world: preemption, and every optimizer whose ranks hold one model ends with it on all
    three."""
    from wagma_bench.optim import OPTIMIZERS

    # DD-PPO's batches do not split: an optimizer that computes in micro-batches is refused
    # (test_dropcompute.py)
    optimizers = [
        name for name, cls in OPTIMIZERS.items() if cls.models_identical and not cls.computes_in_parts
    ]
    assert optimizers
    res = run_world(_train, 3, str(tmp_path), optimizers, True, timeout_s=120)
    pre = [r["preemption"] for r in res]
    assert max(p["first_add"] for p in pre) == 6 and all(p["sum"] == 6 for p in pre)  # 1 + 2 + 3
    assert [p["frames"][0] for p in pre] == [64 * 2, 64 * 2, 20 * 2]  # 2 envs per rank; rank 2 preempted
    assert all(p["frames"][1] >= 16 * 2 for p in pre) and max(p["frames"][1] for p in pre) == 64 * 2
    _assert_runs(res, tmp_path, 3, optimizers)


def test_ddppo_trains_two_ranks(tmp_path):
    """Every registered optimizer that applies to DD-PPO (all but those computing in micro-batches) trains it
    through the real trainer."""
    from wagma_bench.optim import OPTIMIZERS

    optimizers = [name for name, cls in OPTIMIZERS.items() if not cls.computes_in_parts]
    res = run_world(_train, 2, str(tmp_path), optimizers, timeout_s=180)
    _assert_runs(res, tmp_path, 2, optimizers)


@pytest.mark.slow
def test_gridnav_end_to_end_reaches_target(tmp_path):
    """`wagma-bench run` with 2 ranks learns a one-room gridnav task to a held-out success rate of 0.6."""
    cmd = [
        sys.executable,
        "-m",
        "wagma_bench",
        "run",
        "workload=ddppo",
        "env=gridnav",
        "env.layout=one_room",
        "env.max_episode_steps=30",
        "workload.hidden_size=64",
        "workload.num_steps=32",
        "train.lr=1e-3",
        "train.epochs=400",
        "eval.every_epochs=10",
        "eval.target=0.6",
        "workload.num_eval_episodes=32",
        "launcher.nproc=2",
        "logger.progress=off",
        f"hydra.run.dir={tmp_path}",
    ]
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["reached"] and summary["status"] == "completed", summary
    assert summary["best_metric"] >= 0.6
