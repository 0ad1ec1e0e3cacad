"""`make gpu-check` (reproduce/gpu/check.py) and train.precision: the GPU path's code, run on the CPU here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.cli_util import BIN
from wagma_bench.record.files import read_jsonl

# make test runs this file at idle CPU priority beside the serial tests (marker `background`): on the CPU the
# check computes its ratios but judges none, and its commands' timeouts (300 s and more) outlast any pause.
pytestmark = pytest.mark.background

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "reproduce" / "gpu" / "check.py"


def run_check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECK)],
        env={**os.environ, "GPU_CHECK_OUT": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check would run")
def test_make_gpu_check_without_cuda_names_what_it_skipped_and_writes_cpu_measured_inputs(tmp_path):
    """One line names every GPU measurement skipped; the simulator's inputs are measured on the CPU, labelled
    so, and `simulate --measured` reads the file (AD-PSGD then charged the measured exchange cost)."""
    out = subprocess.run(
        ["make", "-s", "gpu-check", f"GPU_PY={sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        # a batch of 8 images a rank, not 32, and 20 rounds a run, not 40: the same runs, pairs, files and
        # checks, an eighth of the training compute
        env={
            **os.environ,
            "GPU_CHECK_OUT": str(tmp_path),
            "GPU_CHECK_CPU_BATCH": "8",
            "GPU_CHECK_CPU_ROUNDS": "20",
        },
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (said,) = [line for line in out.stdout.splitlines() if "no CUDA GPU" in line]
    assert (
        "skipped NCCL worlds" in said
        and "AD-PSGD's exchange cost beside GPU compute" in said
        and "cpu" in said
    )
    (path,) = tmp_path.glob("measured-*-cpu.json")
    data = json.loads(path.read_text())
    assert data["measured_on"] == "cpu" and "comm-bench on CUDA tensors" in data["skipped"]
    assert len(data["pairs"]) == 2
    cost = data["gossip_cost"]
    # two pairs on a busy machine can put c outside [0, 1]: then it is said unmeasured, with the raw values,
    # never 0 with a zero-width interval; measured, it carries its bootstrap replicates
    if cost.get("unmeasured"):
        assert cost["value"] is None and cost["raw"] is not None, cost
    else:
        assert cost["replicates"] and 0 <= cost["value"] <= 1, cost
    assert data["network"]["intra"]["alpha_s"] >= 0 and data["compute"]["sigma"] > 0
    sim = subprocess.run(
        [
            str(BIN),
            "simulate",
            "gpus=8",
            "optimizer=adpsgd",
            "train.max_rounds=50",
            "--measured",
            str(path),
            "--out",
            str(tmp_path / "sim"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert sim.returncode == 0, sim.stderr
    (row,) = json.loads((tmp_path / "sim" / "predictions.json").read_text())
    assert row["gossip_cost_share"] > 0 or data["gossip_cost"]["value"] == 0


@pytest.mark.slow
def test_gpu_check_dry_mode_runs_every_part_on_cpu(tmp_path):
    out = run_check(tmp_path, GPU_CHECK_DRY="1")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (path,) = tmp_path.glob("check-*-dry.json")
    result = json.loads(path.read_text())
    assert result["ok"] and result["dry"]
    for part in ("nccl_one_rank", "gloo_shared_gpu"):
        assert [(r["status"], r["steps"]) for r in result[part]["rows"].values()] == [("completed", 2)] * 2
    for row in result["throughput"]["rows"].values():
        assert row["wagma_bench_images_per_s"] > 0 and row["plain_images_per_s"] > 0 and row["ratio"] > 0
    assert result["comm_bench"]["table"]
    goals = result["comm_bench"]["wait_avoiding_goals"]  # gloo on the CPU: computed, not judged
    assert goals and all(g["bytes"] == 2**20 and g["goal"] == 1.5 and not g["judged"] for g in goals)
    assert "throughput (ResNet-50" in out.stdout and "all ok: True" in out.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_check_on_a_gpu(tmp_path):
    out = run_check(tmp_path)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-3000:]


def test_bf16_precision_autocasts_the_training_forward(tmp_path):
    """The same seeded run in fp32 and bf16: the first step's loss differs by bfloat16's rounding."""
    out = subprocess.run(
        [
            str(BIN),
            "run",
            "-m",
            "launcher.nproc=1",
            "train.max_rounds=2",
            "eval.every_rounds=2",
            "train.precision=fp32,bf16",
            "logger.progress=off",
            f"hydra.sweep.dir={tmp_path}",
            "hydra.sweep.subdir=${train.precision}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    first_loss = {}
    for precision in ("fp32", "bf16"):
        run_dir = tmp_path / precision
        assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
        assert (
            read_jsonl(run_dir / "events.jsonl")[0]["metadata"]["config"]["train"]["precision"] == precision
        )
        first_loss[precision] = read_jsonl(run_dir / "steps" / "rank0.jsonl")[0]["loss"]
    assert first_loss["bf16"] != first_loss["fp32"]
    assert abs(first_loss["bf16"] - first_loss["fp32"]) < 0.05 * first_loss["fp32"]


def test_bf16_autocast_and_channels_last_in_the_resnet_forward():
    from omegaconf import OmegaConf

    from wagma_bench.workloads.resnet import ResNetWorkload

    cfg = OmegaConf.create(
        {
            "seed": 1,
            "train": {"batch_size": 2, "precision": "bf16"},
            "data": {"name": "synthetic", "image_size": 32, "num_samples": 8},
            "workload": {"arch": "resnet50"},
        }
    )
    workload = ResNetWorkload(cfg, 0, 1, torch.device("cpu"))
    model = workload.build_model()
    assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    seen = []
    model.fc.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, n = workload.forward(model, next(workload.batches(0)))
    assert n == 2 and seen == [torch.bfloat16] and loss.isfinite()
