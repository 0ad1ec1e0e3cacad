"""The committed paper-scale predictions are what the current code computes from their committed inputs
(reproduce/claims/paper-scale/README.md gives each folder's command): one prediction recomputed here, with the
folder's command narrowed to one world size and two optimizers, no interval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wagma_bench.cli.simulate import main as simulate_main

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "reproduce" / "claims" / "paper-scale" / "resnet50"
TUNED = "reproduce/tuning/results-2core-20261205/resnet_independent"


def test_a_committed_resnet50_prediction_is_what_the_code_computes_now(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = [
        "cluster=daint", "workload=resnet", "data=imagenet", "gpus=16", "optimizer=allreduce,wagma",
        "imbalance=independent", "train.max_rounds=500", "control_every=0",
        "--convergence", TUNED, "--compute-from", TUNED, "--out", str(tmp_path),
    ]  # fmt: skip
    assert simulate_main(args) == 0
    now = {r["optimizer"]: r for r in json.loads((tmp_path / "predictions.json").read_text())}
    committed = {
        r["optimizer"]: r
        for r in json.loads((FOLDER / "predictions.json").read_text())
        if r["world_size"] == 16
    }
    for name in ("allreduce", "wagma"):
        for key in ("throughput", "time_to_target_s"):
            assert now[name][key] == pytest.approx(committed[name][key], rel=1e-9), (
                f"paper-scale/resnet50 {name} {key} is stale: regenerate it with the command "
                "in reproduce/claims/paper-scale/README.md"
            )
