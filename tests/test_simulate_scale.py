"""The simulator at scale: its vectorised pieces against independent oracles (the activation's fixed point, the
hypercube's latencies, the imbalance models' delays for a whole world), each on small worlds where the oracle is
cheap."""

from __future__ import annotations

import math

import numpy as np
import pytest

from wagma_bench.comm.topology import world_hypercube_neighbours
from wagma_bench.imbalance import IMBALANCES, make_imbalance
from wagma_bench.simulate.costs import Link, Network
from wagma_bench.simulate.des import activate, hypercube_latencies, make_plan

NET = Network(Link(3e-6, 1 / 150e9), Link(1.5e-5, 1 / 9e9), gpus_per_node=4)


def bellman_ford(world: int, net: Network, free: np.ndarray, request: np.ndarray) -> np.ndarray:
    """The activation's equation solved edge by edge from the topology's own neighbour lists:
    start_j = max(free_j, min(request_j, min over neighbours i of start_i + latency(i, j)))."""
    key = request.astype(float).copy()
    while True:
        new = key.copy()
        for j in range(world):
            via = min((key[i] + net.control(i, j) for i in world_hypercube_neighbours(j, world)), default=math.inf)
            new[j] = min(key[j], max(free[j], via))
        if np.array_equal(new, key):
            return key
        key = new


@pytest.mark.parametrize("world", [1, 2, 3, 6, 8, 13, 32])
def test_hypercube_latencies_are_the_topologys_edges(world):
    lat = hypercube_latencies(world, NET)
    for r in range(world):
        edges = {int(r ^ (1 << d)): lat[d, r] for d in range(lat.shape[0]) if math.isfinite(lat[d, r])}
        assert set(edges) == set(world_hypercube_neighbours(r, world))
        assert all(v == NET.control(r, j) for j, v in edges.items())


@pytest.mark.parametrize("world", [2, 5, 8, 12, 16, 31])
@pytest.mark.parametrize("seed", range(6))
def test_activation_reaches_the_edge_by_edge_fixed_point(world, seed):
    rng = np.random.default_rng(seed * 100 + world)
    free = rng.uniform(0, 1e-4, world)
    # some ranks ask (ready at a time of their own), the others wait for an activation (inf); sometimes none asks
    request = np.where(rng.random(world) < [0.0, 0.1, 0.5, 1.0, 0.3, 0.05][seed], rng.uniform(0, 2e-4, world), math.inf)
    request = np.maximum(request, free)
    plan = make_plan([tuple(range(world))], NET, 1e6)
    got = activate(plan, free, request)
    want = bellman_ford(world, NET, free, request)
    assert np.allclose(got, want, rtol=0, atol=1e-15) and np.array_equal(np.isinf(got), np.isinf(want))


@pytest.mark.parametrize("name", sorted(IMBALANCES))
def test_a_worlds_delays_are_each_ranks_own(name):
    """The simulator asks for every rank and step at once what each rank asks for its own step."""
    settings = IMBALANCES[name].Settings(ranks=[1, 4]) if name == "fixed" else IMBALANCES[name].Settings()
    model = make_imbalance(settings, seed=5)
    base = np.random.default_rng(0).uniform(0.05, 0.2, (6, 40))
    together = model.delays(6, base, first_step=7)
    alone = [[model.delay(r, 6, 7 + k, float(base[r, k])) for k in range(40)] for r in range(6)]
    assert together.tolist() == alone


def test_the_independent_rule_delays_at_its_probability_independently():
    model = make_imbalance(IMBALANCES["independent"].Settings(delay_s=0.3, probability=0.05), seed=2)
    slow = model.delays(512, np.zeros((512, 400))) > 0
    rate = slow.mean()
    assert abs(rate - 0.05) < 4 * math.sqrt(0.05 * 0.95 / slow.size)
    # neighbouring ranks and steps are not correlated (the hash's counters are adjacent)
    assert abs(np.corrcoef(slow[:-1].ravel(), slow[1:].ravel())[0, 1]) < 0.01
    assert abs(np.corrcoef(slow[:, :-1].ravel(), slow[:, 1:].ravel())[0, 1]) < 0.01


def test_the_lognormal_rule_draws_its_sigma():
    model = make_imbalance(IMBALANCES["lognormal"].Settings(sigma=0.4), seed=3)
    factor = 1 + model.delays(256, np.ones((256, 400)))
    positive = np.log(factor[factor > 1])
    assert abs((factor > 1).mean() - 0.5) < 0.01  # the lower half is truncated to no delay
    assert abs(math.sqrt(np.mean(positive ** 2)) - 0.4) < 0.01  # a half-normal's root mean square is sigma
