"""Budgets that end where they say: every optimizer of the registry trains exactly its budget's rounds,
whatever its sync period, and the last round is a synchronisation point where the model-averaging optimizers
average the models globally, as at their periodic sync rounds.

The oracle, on one real 4-rank gloo world: the ranks start from rank 0's model, compute the gradient
``g(rank, t) = rank + 1 + t / 64`` at local step t < T and a zero gradient at the last step T (WAGMA-SGD
applies its last local step after the final average, so a zero last gradient makes the average itself
visible). Then every rank ends at round T exactly (no round beyond it), the models add up to exactly ``sum x0
- lr * sum of every gradient`` (each step in the sum once: nothing lost at the last round), and the optimizers
that average globally at their sync rounds (or hold one model) end with every rank holding the same model. T
is not a multiple of any sync period here, and the model was changed by local steps after the last periodic
sync, so the last of these fails unless the last round averages.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.dist_util import PAUSABLE
from tests.optim_util import Vector, make_algorithm, run_world, sgd
from tests.test_invariants import mass  # the conserved sum, as the invariant tests read it

# exact oracles that time nothing, on worlds whose timeouts outlast any pause: make test runs this file at
# idle CPU priority beside the serial tests (marker `background`)
pytestmark = pytest.mark.background

LR = 0.25
# rounds of the budget: not a multiple of the periods below (3), local steps since the last sync before it
T = 8
CASES = {  # registry name -> settings with a sync period that does not divide T
    "allreduce": {},
    "dropcompute": {"threshold_s": "inf"},
    "dpsgd": {},
    "sgp": {"overlap": False},
    "wagma": {"tau": 2, "group_size": 2},
    "local_sgd": {"sync_period": 3},
    "eager": {"mode": "solo", "sync_period": 3},
    "adpsgd": {"sync_period": 3},
}
# one model at the end: the global average at the last round (WAGMA-SGD, local SGD) or one model throughout
SAME_MODEL = {"allreduce", "dropcompute", "wagma", "local_sgd", "eager"}


def gradient(rank: int, step: int) -> float:
    return 0.0 if step == T else rank + 1 + step / 64


def _run(comm, name: str, settings: dict) -> dict:
    model = Vector(3, 10.0 * comm.rank + 1.0).double()
    algo = make_algorithm(name, comm, model, sgd(lr=LR), seed=5, **settings)
    algo.broadcast_initial_model()  # as the trainer starts a run: rank 0's model everywhere
    algo.end_at(T)
    x0 = mass(name, algo)
    comm.barrier()
    rounds, steps = [], 0
    while not rounds or rounds[-1] < T:
        steps += 1
        algo.zero_grad()
        for b in algo.buckets:
            b.grad.fill_(gradient(comm.rank, steps))
        rounds.append(algo.step().round)
    comm.barrier()  # the trainer's control exchange at the last round
    algo.close()
    flat = algo.buckets[0].data
    return {"x0": x0, "rounds": rounds, "steps": steps, "mass": mass(name, algo), "model": flat.tolist()}


def _all(comm) -> dict:
    return {name: _run(comm, name, settings) for name, settings in CASES.items()}


@pytest.fixture(scope="module")
def results():
    return run_world(_all, 4, **PAUSABLE)


def test_every_optimizer_of_the_registry_has_a_case():
    from wagma_bench.optim import OPTIMIZERS
    from wagma_bench.optim.specs import OPTIMIZER_SPECS

    assert set(CASES) == set(OPTIMIZERS)
    for name, settings in CASES.items():
        spec = OPTIMIZER_SPECS[name]
        sync = spec.sync_period_of(spec.Settings(**settings))
        assert sync == 1 or T % sync, (name, sync)  # the budget falls between two sync points


@pytest.mark.parametrize("name", list(CASES))
def test_every_optimizer_ends_at_its_budget_with_the_global_average(results, name):
    ranks = [r[name] for r in results]
    assert [r["rounds"][-1] for r in ranks] == [T] * 4  # exactly the budget, on every rank
    assert all(max(r["rounds"]) == T for r in ranks)
    steps = [r["steps"] for r in ranks]
    no_loss = sum(r["x0"] for r in ranks) - LR * 7 * sum(
        gradient(rank, t) for rank, n in enumerate(steps) for t in range(1, n + 1)
    )
    assert sum(r["mass"] for r in ranks) == pytest.approx(no_loss, rel=1e-12, abs=1e-9)
    if name in SAME_MODEL:
        first = ranks[0]["model"]
        assert all(r["model"] == pytest.approx(first, rel=1e-12, abs=1e-12) for r in ranks), [
            r["model"][:2] for r in ranks
        ]


# --- through the trainer: budgets and the evaluation grid ---------------------------------------------------
CONF = Path(__file__).resolve().parents[1] / "conf"
RUN = [
    "workload.arch=resnet8",
    "train.batch_size=8",
    "eval.target=null",
    "checkpoint.every_s=1e9",
    "logger.progress=off",
    "train.max_rounds=7",
]
RUNS = {  # run id -> overrides: the periodic optimizers at a sync period (3 or 4) that does not divide 7
    "allreduce": ["optimizer=allreduce"],
    "wagma": ["optimizer=wagma", "optimizer.tau=2"],
    "local_sgd": ["optimizer=local_sgd", "optimizer.sync_period=4"],
    "eager": ["optimizer=eager", "optimizer.sync_period=4"],
    "adpsgd": ["optimizer=adpsgd", "optimizer.sync_period=3"],
    "local_sgd-no-eval": ["optimizer=local_sgd", "optimizer.sync_period=4", "eval.every_rounds=1000"],
}


def _train_runs(comm, root: str) -> dict:
    """Each run of RUNS through the real trainer (evaluation every 2 rounds unless said); per run: the rounds
    of its evaluations, its last round, and this rank's final model."""
    from hydra import compose, initialize_config_dir

    from wagma_bench.config.schema import validate
    from wagma_bench.record.events import RunEvents
    from wagma_bench.train.trainer import Trainer

    out = {}
    for name, overrides in RUNS.items():
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = validate(compose("wagma", overrides=[*RUN, "eval.every_rounds=2", *overrides]))
        (Path(root) / name).mkdir(exist_ok=True)
        comm.barrier()
        trainer = Trainer(cfg, comm, Path(root) / name)
        trainer.train()
        flat = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
        out[name] = {"model": flat.tolist(), "round": trainer.algo.round}
        if comm.rank == 0:
            events = RunEvents.read(Path(root) / name)
            out[name]["evals"] = [(e.round, e.samples) for e in events.evaluations]
            out[name]["stop"] = [
                (e.get("metadata") or {}).get("round") for e in events.events if e["key"] == "run_stop"
            ]
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return run_world(_train_runs, 2, str(tmp_path_factory.mktemp("budget")), **PAUSABLE)


def test_runs_end_at_their_budget_and_are_evaluated_on_the_same_grid(trained):
    """Every periodic optimizer trains exactly train.max_rounds=7 rounds (once 8 or 9: the budget rounded up
    to the sync period) and is evaluated at the grid rounds 2, 4, 6 and the end, 7, as Allreduce-SGD is (once
    at the first sync point after each grid round: 3, 6, 9 under WAGMA-SGD's period 3), each evaluation dated
    at its round: the samples of 2 ranks x 8 per round."""
    for name in RUNS:
        assert [rank[name]["round"] for rank in trained] == [7, 7], name
        assert trained[0][name]["stop"] == [7], name
    for name in ("allreduce", "wagma", "local_sgd", "eager", "adpsgd"):
        assert trained[0][name]["evals"] == [(g, 16 * g) for g in (2, 4, 6, 7)], (
            name,
            trained[0][name]["evals"],
        )
    assert trained[0]["local_sgd-no-eval"]["evals"] == [(7, 112)]


def test_training_is_bit_identical_with_evaluation_on_and_off(trained):
    """Snapshots at the grid rounds and their evaluations at the sync points change nothing that is trained:
    local SGD's final models are the same bits with evaluations at 2, 4, 6 and without; and the final average
    makes every rank's model the same."""
    for rank in trained:
        assert rank["local_sgd"]["model"] == rank["local_sgd-no-eval"]["model"]
    assert trained[0]["local_sgd"]["model"] == trained[1]["local_sgd"]["model"]
