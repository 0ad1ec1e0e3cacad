"""Budgets that end where they say (issue 68): every optimizer of the registry trains exactly its budget's rounds,
whatever its sync period, and the last round is a synchronisation point where the model-averaging optimizers
average the models globally, as at their periodic sync rounds.

The oracle, on one real 4-rank gloo world: the ranks start from rank 0's model, compute the gradient
``g(rank, t) = rank + 1 + t / 64`` at local step t < T and a zero gradient at the last step T (WAGMA-SGD applies
its last local step after the final average, so a zero last gradient makes the average itself visible). Then
every rank ends at round T exactly (no round beyond it), the models add up to exactly
``sum x0 - lr * sum of every gradient`` (each step in the sum once: nothing lost at the last round), and the
optimizers that average globally at their sync rounds (or hold one model) end with every rank holding the same
model. T is not a multiple of any sync period here, and the model was changed by local steps after the last
periodic sync, so the last of these fails unless the last round averages.
"""

from __future__ import annotations

import pytest

from tests.dist_util import PAUSABLE
from tests.optim_util import Vector, make_algorithm, run_world, sgd

LR = 0.25
T = 5  # rounds of the budget: not a multiple of the periods below (3, 4)
CASES = {  # registry name -> settings with a sync period that does not divide T
    "allreduce": {}, "dropcompute": {"threshold_s": "inf"}, "dpsgd": {}, "sgp": {"overlap": False},
    "wagma": {"tau": 3, "group_size": 2}, "local_sgd": {"period": 3}, "eager": {"mode": "solo", "sync_every": 3},
    "adpsgd": {"sync_every": 4},
}
# one model at the end: the global average at the last round (WAGMA-SGD, local SGD) or one model throughout
SAME_MODEL = {"allreduce", "dropcompute", "wagma", "local_sgd", "eager"}


def gradient(rank: int, step: int) -> float:
    return 0.0 if step == T else rank + 1 + step / 64


def mass(name: str, algo) -> float:
    """This rank's share of the conserved sum (push-sum: w * z; AD-PSGD: with its queued corrections)."""
    flat = algo.buckets[0].data
    if name == "sgp":
        return float(flat.sum()) * algo.weight
    if name == "adpsgd":
        with algo._lock:
            return float((flat + algo._pending).sum())
    return float(flat.sum())


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
    no_loss = sum(r["x0"] for r in ranks) - LR * 7 * sum(gradient(rank, t) for rank, n in enumerate(steps)
                                                          for t in range(1, n + 1))
    assert sum(r["mass"] for r in ranks) == pytest.approx(no_loss, rel=1e-12, abs=1e-9)
    if name in SAME_MODEL:
        first = ranks[0]["model"]
        assert all(r["model"] == pytest.approx(first, rel=1e-12, abs=1e-12) for r in ranks), \
            [r["model"][:2] for r in ranks]
