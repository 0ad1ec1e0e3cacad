"""DropCompute on real gloo worlds, against independent oracles, and through the real CLI.

- With one micro-batch and nothing dropped it is Allreduce-SGD bit for bit (same buckets, same reductions).
- With drops, the update is the oracle's, computed here in one process from the samples each rank computed:
  ``nominal`` (the authors') sums the computed micro-batches' mean-loss gradients over world x micro-batches;
  ``computed`` weighs every computed sample the same. Every rank stops after a different number of
  micro-batches and every sample has its own value, so a part lost or counted twice changes the result.
- The automatic threshold is the authors' rule: a straggler's late micro-batches are cut, a balanced world's
  are not; `run optimizer=dropcompute imbalance=shared_draw` drops, logs its threshold and records the drop
  rate.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from tests.cli_util import run
from tests.optim_util import flat_params, make_algorithm, run_world, sgd
from wagma_bench.optim.dropcompute import best_threshold

WORLD, PARTS, SAMPLES, LR = 3, 4, 8, 0.1
THRESHOLD = 2.5  # with the clock below: rank 0 computes 3 parts, rank 1 two, rank 2 one


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sample distinct: rank r's sample j has inputs and target from (r, j)."""
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(SAMPLES, 4, generator=g), torch.randn(SAMPLES, 1, generator=g)


def _model() -> nn.Module:
    torch.manual_seed(7)
    return nn.Linear(4, 1)


def _clock(rank: int, part: int) -> float:
    """The elapsed time a rank reports before part ``part``: rank r is r + 1 times slower."""
    return float(part * (rank + 1))


def _compute(algo, model, batch, rank: int) -> int:
    """The trainer's micro-batch loop (Trainer.compute) with a synthetic clock; returns the parts computed."""
    done = 0
    for i, (x, y) in enumerate(zip(*(torch.tensor_split(t, algo.micro_batches) for t in batch))):
        if i and not algo.start_micro_batch(_clock(rank, i)):
            break
        loss = nn.functional.mse_loss(model(x), y)
        (loss * algo.loss_weight(len(y))).backward()
        algo.end_micro_batch(_clock(rank, i + 1))
        done += 1
    return done


def _world(comm):
    rank, out = comm.rank, {}
    # with one part and no threshold: the same weights as Allreduce-SGD after 3 steps with momentum
    for name, settings in (("allreduce", {}), ("dropcompute", {"micro_batches": 1, "threshold_s": "inf"})):
        model = _model()
        algo = make_algorithm(name, comm, model, sgd(lr=LR, momentum=0.9), **settings)
        for step in range(3):
            algo.zero_grad()
            x, y = _batch(rank + 10 * step)
            if name == "allreduce":
                nn.functional.mse_loss(model(x), y).backward()
            else:
                _compute(algo, model, (x, y), rank)
            algo.step()
        out[name] = flat_params(model)
    # with drops: one step of plain SGD, each normalisation
    for normalize in ("nominal", "computed"):
        model = _model()
        algo = make_algorithm(
            "dropcompute",
            comm,
            model,
            sgd(lr=LR),
            micro_batches=PARTS,
            threshold_s=str(THRESHOLD),
            normalize=normalize,
        )
        algo.zero_grad()
        parts = _compute(algo, model, _batch(rank), rank)
        info = algo.step()
        out[normalize] = (flat_params(model), parts, info.extra, algo.report()["dropcompute"])
    return out


@pytest.fixture(scope="module")
def results():
    return run_world(_world, WORLD)


def test_one_part_and_no_drop_is_allreduce_sgd_bit_for_bit(results):
    for res in results:
        assert torch.equal(res["allreduce"], res["dropcompute"])


def _oracle(normalize: str, parts: list[int]) -> torch.Tensor:
    """One SGD step from the common start, over the parts each rank computed, in one process."""
    model = _model()
    total = torch.zeros(())
    for rank, k in enumerate(parts):
        x, y = _batch(rank)
        for i, (xs, ys) in enumerate(zip(torch.tensor_split(x, PARTS), torch.tensor_split(y, PARTS))):
            if i < k:
                per_sample = ((model(xs) - ys) ** 2).sum()  # mse_loss's mean, times the part's samples
                total = total + (
                    per_sample / len(ys) / (WORLD * PARTS) if normalize == "nominal" else per_sample
                )
    if normalize == "computed":
        total = total / sum(k * SAMPLES // PARTS for k in parts)
    total.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * p.grad
    return flat_params(model)


@pytest.mark.parametrize("normalize", ["nominal", "computed"])
def test_every_computed_sample_counts_once_under_drops(results, normalize):
    parts = [res[normalize][1] for res in results]
    assert parts == [3, 2, 1]  # the threshold cut each rank at a different part
    expected = _oracle(normalize, parts)
    for res in results:
        weights, _, extra, report = res[normalize]
        torch.testing.assert_close(weights, expected, rtol=0, atol=1e-6)
        assert extra["drop_rate"] == pytest.approx(1 - 6 / (WORLD * PARTS))
        assert report["dropped_micro_batches"] == WORLD * PARTS - 6


def test_the_automatic_threshold_cuts_a_straggler_and_leaves_a_balanced_world():
    steps, parts = 20, 4
    balanced = (
        torch.arange(1, parts + 1, dtype=torch.float64).repeat(4, steps, 1) * 0.1
    )  # 4 ranks, 0.1 s a part
    tau, gain = best_threshold(balanced, step_s=0.45)
    assert math.isinf(tau) and gain == 0.0
    straggling = balanced.clone()
    straggling[1] *= 3.0  # one rank three times slower in every step
    tau, gain = best_threshold(straggling, step_s=1.25)
    assert 0.4 <= tau < 1.2 and gain > 0.2  # its late parts go, the others' stay
    assert bool((straggling[0] < tau).all())


def _best_threshold_by_masks(ends, step_s):
    """The rule as the authors write it (and this suite did before), one mask of the whole array per
    candidate: the oracle of the sorted-prefix version, which gives the same numbers in a fraction of the
    time."""
    import numpy as np

    ends = np.asarray(ends, dtype=np.float64)
    compute = ends[:, :, -1].max(axis=0)
    overhead = max(step_s - float(compute.mean()), 0.0)
    low, high = float(ends[:, :, ends.shape[2] // 2 :].min()), float(ends.max())
    best, best_gain = math.inf, 0.0
    for tau in np.linspace(low, high, 200).tolist():
        kept = ends < tau
        cut = np.where(kept, ends, 0.0).max(axis=2).max(axis=0)
        dropped = 1.0 - kept.mean(axis=(0, 2))
        gain = (
            float(((1.0 - dropped) * (compute + overhead) / np.maximum(cut + overhead, 1e-12)).mean()) - 1.0
        )
        if gain > best_gain:
            best, best_gain = tau, gain
    return best, best_gain


@pytest.mark.parametrize("seed", range(6))
def test_the_automatic_threshold_is_the_masked_rules_to_the_bit(seed):
    """Random worlds, with ties (times rounded to a grid, so that candidates fall on ends exactly), zeros, one
    rank, one micro-batch, and a tensor as the trainer passes it."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ranks, steps, parts = (1, 3, 1), (5, 20, 2), (1, 4, 8)
    for shape in [(r, s, m) for r in ranks for s in steps for m in parts]:
        step = (
            rng.lognormal(0.0, 0.5, shape[:2])[:, :, None]
            * (1.0 + 3.0 * (rng.random(shape[:2]) < 0.1))[:, :, None]
        )
        ends = step * np.arange(1, shape[2] + 1) / shape[2]
        if seed % 2:
            ends = np.round(ends, 1)  # ties, zeros
        walls = float(ends[:, :, -1].max(0).mean()) + rng.uniform(0.0, 0.5)
        assert best_threshold(ends, walls) == _best_threshold_by_masks(ends, walls), shape
        assert best_threshold(torch.from_numpy(ends), walls) == _best_threshold_by_masks(ends, walls), shape


@pytest.mark.serial
def test_a_run_under_shared_draw_stragglers_drops_and_records_it(tmp_path):
    out = run(
        [
            "optimizer=dropcompute",
            "imbalance=shared_draw",
            "train.max_rounds=20",
            "eval.target=null",
            "optimizer.calibrate_steps=10",
            "logger.progress=off",
            f"hydra.run.dir={tmp_path}",
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "dropcompute threshold" in out.stdout
    record = json.loads((tmp_path / "summary.json").read_text())["dropcompute"]
    assert record["drop_rate"] > 0 and record["threshold_s"] > 0
    steps = [json.loads(line) for line in (tmp_path / "steps" / "rank0.jsonl").read_text().splitlines()]
    assert all(s["drop_rate"] == 0 for s in steps[:10]) and any(s["drop_rate"] > 0 for s in steps[10:])


def test_a_workload_whose_batches_do_not_split_fails_the_config_check():
    """validate(), which the CLI runs before any rank starts (its exit 2: tests/test_faults.py)."""
    from tests.cli_util import compose
    from wagma_bench.config.schema import validate
    from wagma_bench.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        validate(compose("optimizer=dropcompute", "workload=ddppo"))
    assert "optimizer=dropcompute is not allowed with workload=ddppo" in str(err.value)
