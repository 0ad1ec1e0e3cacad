"""The simulator at scale: its vectorised pieces against independent oracles (the activation's fixed point,
the hypercube's latencies, the imbalance models' delays for a whole world), each on small worlds where the
oracle is cheap."""

from __future__ import annotations

import bisect
import heapq
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.cli_util import compose
from wagma_bench.comm.topology import random_matching, world_hypercube_neighbours
from wagma_bench.config.plan import RunPlan
from wagma_bench.config.schema import validate
from wagma_bench.imbalance import IMBALANCES, make_imbalance
from wagma_bench.optim.specs import OPTIMIZER_SPECS
from wagma_bench.simulate.busy import busy_between
from wagma_bench.simulate.costs import Link, Network
from wagma_bench.simulate.des import (
    SimConfig,
    SimState,
    Workload,
    _compute_schedule,
    _gossip,
    _step_lag,
    activate,
    hypercube_latencies,
    make_plan,
    simulate,
)
from wagma_bench.simulate.measured import read_measured
from wagma_bench.simulate.spread import draw_persistent, fit_spread

NET = Network(Link(3e-6, 1 / 150e9), Link(1.5e-5, 1 / 9e9), gpus_per_node=4)


def bellman_ford(world: int, net: Network, free: np.ndarray, request: np.ndarray) -> np.ndarray:
    """The activation's equation solved edge by edge from the topology's own neighbour lists:
    start_j = max(free_j, min(request_j, min over neighbours i of start_i + latency(i, j)))."""
    key = request.astype(float).copy()
    while True:
        new = key.copy()
        for j in range(world):
            via = min(
                (key[i] + net.control(i, j) for i in world_hypercube_neighbours(j, world)), default=math.inf
            )
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
    # some ranks ask (ready at a time of their own), the others wait for an activation (inf); sometimes none
    # asks
    request = np.where(
        rng.random(world) < [0.0, 0.1, 0.5, 1.0, 0.3, 0.05][seed], rng.uniform(0, 2e-4, world), math.inf
    )
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
    assert abs(math.sqrt(np.mean(positive**2)) - 0.4) < 0.01  # a half-normal's root mean square is sigma


# --- AD-PSGD: what its exchanges cost, and the barrier `run` gives it ---------------------------------------


def network(bandwidth_GBps: float = 9.0) -> Network:
    return Network(Link(3e-6, 1 / 150e9), Link(1.5e-6, 1 / (bandwidth_GBps * 1e9)), gpus_per_node=4)


def adpsgd(world: int, bandwidth_GBps: float = 9.0, slowdown: float = 0.0, steps: int = 100, settings=None):
    # the exchanges' cost alone: the authors' per-step averaging left out (test_simulate_adpsgd.py charges it)
    workload = Workload(step_s=0.3, params=25.6e6, sigma=0.05, gossip_cost=slowdown, adpsgd_averaging="none")
    imbalance = make_imbalance(IMBALANCES["independent"].Settings(), seed=1)
    return simulate(
        SimConfig(
            "adpsgd", world, workload, network(bandwidth_GBps), imbalance, settings, steps=steps, seed=1
        )
    )


def test_busy_time_inside_windows_matches_a_direct_sum():
    rng = np.random.default_rng(1)
    world, rows = 5, []
    for rank in range(world):  # each rank's exchanges one after another, never overlapping
        t = 0.0
        for _ in range(rng.integers(0, 6)):
            t += rng.uniform(0, 1)
            length = rng.uniform(0, 0.5)
            rows.append((rank, t, t + length))
            t += length
    busy = tuple(np.array(col, dtype=float) for col in zip(*rows)) if rows else (np.zeros(0),) * 3
    lo = rng.uniform(0, 3, (world, 7))
    hi = lo + rng.uniform(0, 2, (world, 7))
    direct = np.array(
        [
            [
                sum(max(0.0, min(e, hi[r, k]) - max(b, lo[r, k])) for q, b, e in rows if q == r)
                for k in range(7)
            ]
            for r in range(world)
        ]
    )
    assert np.allclose(busy_between(busy, world, lo, hi), direct, rtol=0, atol=1e-12)


def test_a_window_that_starts_where_the_one_before_ended_reads_its_busy_time_to_the_bit(monkeypatch):
    """Half the windows begin where the one before ended (no delay, no overhead): their busy time at the start
    is read from the end before: the same numbers as searched anew."""
    from wagma_bench.simulate import busy as busy_module

    rng = np.random.default_rng(4)
    world, n, cols = 6, 300, 9
    rank = rng.integers(0, world, n).astype(float)
    begin = rng.uniform(0, 20, n)
    busy = (rank, begin, begin + rng.uniform(0, 0.05, n))  # (overlaps within a rank do not matter here)
    hi = np.cumsum(rng.uniform(0.5, 2.5, (world, cols)), axis=1)
    lo = hi - rng.uniform(0.2, 0.5, (world, cols))
    lo[:, 1:] = np.where(rng.random((world, cols - 1)) < 0.5, hi[:, :-1], lo[:, 1:])
    got = busy_between(busy, world, lo, hi)
    monkeypatch.setattr(busy_module._RankBlock, "busy_at_starts", lambda self, lo, hi, _: self.busy_until(lo))
    assert np.array_equal(got, busy_between(busy, world, lo, hi))


@pytest.mark.parametrize("chunk", [3, 200, 1 << 21])
def test_busy_time_and_its_sort_a_chunk_at_a_time_are_the_whole_arrays_to_the_bit(monkeypatch, chunk):
    """At 65,536 ranks the busy time is searched a block of ranks at a time (busy.SEARCH_BLOCK, each block in
    its own stretch of the axis) and its intervals sorted a block of ranks at a time (busy.CHUNK), each saying
    where it is: the same numbers as one pass over the whole arrays, ties included (intervals shuffled, times
    rounded so that keys tie), saying where it is in order."""
    from wagma_bench.simulate import busy as busy_module

    rng = np.random.default_rng(chunk)
    world, n = 40, 2000
    rank = rng.integers(0, world, n).astype(float)
    begin = np.round(rng.uniform(0, 5, n), 1)
    busy = (rank, begin, begin + np.round(rng.uniform(0, 0.5, n), 1))
    lo = np.round(rng.uniform(0, 5, (world, 11)), 1)
    hi = lo + rng.uniform(0, 2, (world, 11))
    whole = busy_between(busy, world, lo, hi)  # CHUNK as shipped: one block, one chunk at this size
    monkeypatch.setattr(busy_module, "CHUNK", chunk)
    monkeypatch.setattr(busy_module, "SEARCH_BLOCK", chunk)
    told: list[float] = []
    assert np.array_equal(
        busy_module._by_rank_then_key(rank, begin, 13.0, world),
        np.argsort(rank * 13.0 + begin, kind="stable"),
    )
    assert np.array_equal(busy_between(busy, world, lo, hi, lambda _, f: told.append(f)), whole)
    assert told == sorted(told) and told[0] == 0.0 and (chunk > n or len(told) > 2), told


@pytest.mark.parametrize("lexsort_up_to", [0, 1024])
def test_the_batch_service_order_and_the_stretch_search_are_numpys_to_the_element(monkeypatch, lexsort_up_to):
    """The gossip's cheaper sorts (des._service_order) are np.lexsort's order, wakes tied or not, actives in
    order or not; a search in the keys' stretch of the axis (busy.search_right) is np.searchsorted's."""
    from wagma_bench.simulate import busy as busy_module
    from wagma_bench.simulate import des

    monkeypatch.setattr(des, "LEXSORT_UP_TO", lexsort_up_to)  # (the radix sort and fixes, or one lexsort)
    rng = np.random.default_rng(5)
    for n, tie, passives in [(0, 0, 40), (1, 0, 40), (50, 0, 40), (400, 1, 40), (400, 0, 40), (400, 1, 500)]:
        p = rng.integers(0, passives, n)  # (500: most passives asked once or twice, as in a batch)
        t = np.round(rng.uniform(0, 3, n), 1) if tie else rng.uniform(0, 3, n)
        for a in (np.arange(n) * 2, rng.permutation(n) * 2):
            for given in (a, None) if np.all(a[1:] > a[:-1]) else (a,):  # (None: the actives in order)
                order, to, starts, sizes = des._service_order(p, t, given)
                assert np.array_equal(order, np.lexsort((a, t, p)))
            assert np.array_equal(to, p[order]) and sizes.sum() == n and np.all(sizes > 0)
            assert np.array_equal(np.repeat(to[starts], sizes), to) and len(set(to[starts])) == len(starts)
    axis = np.sort(np.round(rng.uniform(0, 100, 500), 0))
    for keys in (np.round(rng.uniform(20, 30, (7, 9)), 0), rng.uniform(-5, 105, 40), np.zeros(0)):
        assert np.array_equal(busy_module.search_right(axis, keys), np.searchsorted(axis, keys, side="right"))


def test_adpsgd_in_threads_is_the_same_to_the_bit(monkeypatch):
    """The blocks of ranks that run in threads from 4,096 ranks at 500 rounds (simulate/threads.py: the busy
    time, the exchanges turned rank after rank, the step lag, the row-major sums, the compute schedule's
    parts) give every figure of the result to the bit as one thread does: small blocks in 3 threads from the
    first element, against one thread."""
    from wagma_bench.simulate import busy as busy_module
    from wagma_bench.simulate import exchanges, threads

    imbalance = make_imbalance(IMBALANCES["lognormal"].Settings(sigma=0.5), 1)
    wl = Workload(step_s=0.3, sigma=0.2, params=2e7, gossip_cost=0.5)
    cfg = SimConfig("adpsgd", 37, wl, NET, imbalance, steps=40, seed=3, control_every=10)
    monkeypatch.setattr(threads, "_threads", 1)
    alone = simulate(cfg).row()
    monkeypatch.setattr(threads, "THREADED_FROM", 0)
    monkeypatch.setattr(threads, "_threads", 3)
    for module, name, size in ((busy_module, "SEARCH_BLOCK", 50), (busy_module, "CHUNK", 64)):
        monkeypatch.setattr(module, name, size)
    monkeypatch.setattr(exchanges, "TRANSPOSE_BLOCK", 2)
    monkeypatch.setattr("wagma_bench.simulate.des.SEARCH_BLOCK", 50)
    said: list[tuple[str, float]] = []
    cfg.progress = lambda phase, f: said.append((phase, f))
    assert {k: repr(v) for k, v in simulate(cfg).row().items()} == {k: repr(v) for k, v in alone.items()}
    told = [f for phase, f in said if phase == "time in exchanges"]  # said in order, pass by pass
    assert told and all(b >= a for a, b in itertools.pairwise(told) if b != 0.0)
    schedule = [f for phase, f in said if phase == "compute schedule"]  # every round, by one thread
    assert len(schedule) == 40 * alone["gossip_rounds"] and schedule[:40] == sorted(schedule[:40])


def test_adpsgd_with_a_free_exchange_runs_at_its_compute_schedule():
    """c = 0 (and the per-step averaging left out): the compute thread never waits but at the sync points, so
    the clock is the compute schedule's
    (computed here step by step, ranks meeting every sync_every rounds in the trainer's control allreduce of
    seven float64), whatever the exchanges do."""
    res = adpsgd(8, steps=60)
    cfg = SimConfig(
        "adpsgd",
        8,
        Workload(step_s=0.3, params=25.6e6, sigma=0.05),
        network(),
        make_imbalance(IMBALANCES["independent"].Settings(), seed=1),
        None,
        steps=60,
        seed=1,
    )
    drawn = SimState(cfg, 10)  # the compute times and delays the simulation draws
    clock = np.zeros(8)
    for r in range(1, 61):
        clock = clock + drawn.compute[:, r - 1] + drawn.delay[:, r - 1]
        if r % 10 == 0:
            clock[:] = clock.max() + network().world_allreduce(8, 7 * 8)
    assert res.time_s == pytest.approx(clock.max(), rel=1e-12)
    assert res.extra["gossip_cost_share"] == 0.0 and res.extra["exchanges_per_step"] > 0.9


MEASURED = (
    Path(__file__).resolve().parents[1]
    / "reproduce"
    / "scaling"
    / "results-2core-20261206"
    / "measured-cpu.json"
)


def test_adpsgds_exchange_cost_slows_it_more_on_a_slower_network():
    """With the exchange cost measured in the suite's own AD-PSGD (the committed measured inputs) and with a
    larger one: slower than the free exchange, and slower on a slower network."""
    c = read_measured(MEASURED).gossip_cost
    assert c > 0
    measured, free = adpsgd(64, slowdown=c), adpsgd(64)
    assert measured.throughput < free.throughput and measured.extra["gossip_cost_share"] > 0
    assert adpsgd(64, bandwidth_GBps=0.1, slowdown=c).throughput < measured.throughput
    charged = adpsgd(64, slowdown=0.5)
    assert charged.throughput < free.throughput and charged.extra["gossip_cost_share"] > 0
    slow_net = adpsgd(64, bandwidth_GBps=0.1, slowdown=0.5)
    assert slow_net.throughput < charged.throughput
    # free exchanges: the network shows only in the control allreduce of 56 bytes
    assert adpsgd(64, bandwidth_GBps=0.1).throughput == pytest.approx(free.throughput, rel=1e-5)
    # a step lengthens by c times the exchange time inside it: at most by half the exchange's duration here
    exchange_s = 2 * network(0.1).inter.p2p(25.6e6 * 4 + 16)
    assert slow_net.time_s <= free.time_s + 0.5 * exchange_s * 100 * 1.001


@pytest.mark.parametrize("sync_every", [1, 3, 10, 25])
def test_adpsgd_meets_in_simulate_where_run_makes_it_meet(sync_every):
    """One rule for AD-PSGD's barrier: the spec's sync period, rounded up by the trainer's control period, in
    the run's plan (RunPlan, what the trainer reads) and in the simulator's state."""
    cfg = validate(compose("optimizer=adpsgd", f"optimizer.sync_period={sync_every}", "train.max_rounds=100"))
    spec = OPTIMIZER_SPECS["adpsgd"]
    sync = spec.sync_period_of(cfg.optimizer)
    plan = RunPlan.of(cfg, sync, 1000, 4)
    trainer_meets = [
        r for r in range(1, plan.total + 1) if plan.is_control(r, math.inf)
    ]  # the trainer's rule
    run = SimState(
        SimConfig("adpsgd", 4, Workload(), Network.free(), settings=cfg.optimizer, steps=100), sync
    )
    assert [r for r in range(1, run.rounds + 1) if run.is_control(r)] == trainer_meets
    assert adpsgd(4, steps=100, settings=cfg.optimizer).rounds == plan.total


# --- compute spread with persistence ------------------------------------------------------------------------


@pytest.mark.parametrize("sigma_rank,sigma,rho", [(0.0, 0.2, 0.0), (0.15, 0.2, 0.0), (0.15, 0.1, 0.6)])
def test_the_persistent_spread_fit_recovers_the_model_it_is_drawn_from(sigma_rank, sigma, rho):
    rng = np.random.default_rng(7)
    runs = [draw_persistent(rng, 8, 300, 0.1, sigma_rank, sigma, rho) for _ in range(12)]
    fit = fit_spread(runs)
    assert fit.runs == 12 and fit.ranks == 96 and fit.steps == 96 * 300
    assert fit.sigma == pytest.approx(sigma, rel=0.03) and fit.rho == pytest.approx(rho, abs=0.03)
    # 96 offsets: their spread is known to about 1 / sqrt(2 * 84) = 8%
    assert fit.sigma_rank == pytest.approx(sigma_rank, abs=0.3 * sigma_rank + 0.02)


def test_a_lasting_slow_rank_costs_a_periodic_average_more_than_the_same_spread_drawn_anew_each_step():
    """Same marginal spread of log step time (0.2), once all of it drawn anew each step and once mostly as
    rank offsets. Local SGD meets every 20 steps: the i.i.d. noise of 20 steps averages out in each rank's
    sum, an offset does not, so the world with lasting offsets waits longer for its slowest rank. (A barrier
    at every step sees no difference: each step's slowest rank is the maximum of as many draws of the same
    spread.) With no rank offset and no autocorrelation the persistent model is the i.i.d. one."""

    def throughput(optimizer, **kw):
        workload = Workload(step_s=0.1, params=1e6, **kw)
        settings = OPTIMIZER_SPECS[optimizer].Settings(
            **({"sync_period": 20} if optimizer == "local_sgd" else {})
        )
        return simulate(
            SimConfig(optimizer, 256, workload, Network.free(), settings=settings, steps=200, seed=2)
        ).throughput

    iid = throughput("local_sgd", compute="lognormal", sigma=0.2)
    persistent = throughput("local_sgd", compute="persistent", sigma_rank=0.16, sigma=0.12, rho=0.5)
    same = throughput("local_sgd", compute="persistent", sigma_rank=0.0, sigma=0.2, rho=0.0)
    assert persistent < 0.85 * iid and same == pytest.approx(iid, rel=0.02)
    every_step = [
        throughput("allreduce", compute="lognormal", sigma=0.2),
        throughput("allreduce", compute="persistent", sigma_rank=0.16, sigma=0.12, rho=0.5),
    ]
    assert every_step[1] == pytest.approx(every_step[0], rel=0.03)


def test_compute_from_fits_the_persistent_spread_of_the_runs_ranks(tmp_path):
    from tests.test_simulate import write_run
    from wagma_bench.simulate.run_spread import with_measured_spread

    run = write_run(tmp_path)  # 2 ranks; rank 1 persistently 30% slower, each with its own step-to-step noise
    rng = np.random.default_rng(3)
    for rank, scale in ((0, 0.2), (1, 0.26)):
        times = scale * np.exp(0.05 * rng.standard_normal(200))
        lines = [
            json.dumps(
                {
                    "local_step": s,
                    "round": s,
                    "t": 0.3 * s,
                    "compute_s": float(c),
                    "delay_s": 0.0,
                    "comm_s": 0.0,
                    "samples": 8,
                }
            )
            for s, c in enumerate(times, 1)
        ]
        (run / "steps" / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    wl = with_measured_spread(Workload(step_s=0.3, compute="persistent"), [str(run)])
    # two offsets +-log(1.3)/2 around their mean: their spread (one degree of freedom) is log(1.3)/sqrt(2)
    assert wl.compute == "persistent" and wl.sigma_rank == pytest.approx(
        math.log(1.3) / math.sqrt(2), rel=0.05
    )
    assert wl.sigma == pytest.approx(0.05, rel=0.15) and abs(wl.rho) < 0.15 and wl.step_s == 0.3
    iid = with_measured_spread(Workload(step_s=0.3), [str(run)])
    assert iid.compute == "empirical" and iid.sigma_rank == 0.0


def event_heap_gossip(
    cfg: SimConfig, ends: np.ndarray, end_time: float
) -> list[tuple[int, int, float, float]]:
    """The gossip model replayed one event at a time on a heap (the simulator's former implementation): each
    active thread wakes after a local step, sends its e-th request to its partner in the e-th matching, the
    passive serves requests in the order the threads woke; returns every exchange (active, passive, begin,
    end)."""
    world, net, nbytes = cfg.world_size, cfg.network, cfg.workload.model_bytes + 16
    steps = [row.tolist() for row in ends]
    free = [0.0] * world
    heap = [(steps[a][0], a, 0) for a in range(0, world, 2)]
    heapq.heapify(heap)
    out = []
    while heap:
        t, a, e = heapq.heappop(heap)
        if t >= end_time:
            continue
        p = random_matching(world, e, cfg.seed)[a]
        finish = t
        if p != a:
            begin = max(t + net.control(a, p), free[p])
            finish = free[p] = begin + 2 * net.p2p(a, p, nbytes)
            out.append((a, p, begin, finish))
        k = bisect.bisect(steps[a], t)
        if k < len(steps[a]):
            heapq.heappush(heap, (max(finish, steps[a][k]), a, e + 1))
    return out


def test_exchanges_stored_by_slot_come_out_rank_after_rank_as_the_sort_by_rank_puts_them():
    """simulate/exchanges.py: batches of exchanges (each active once a batch, a passive's requests in its
    queue's order) stored by slot come out as the stable sort of every interval by rank, each rank's in the
    order it made them, also when a passive serves more often than there are slots (the store grows), in an
    odd world whose last active sits out; each exchange is found at both its ends."""
    from wagma_bench.simulate.exchanges import Exchanges

    world, slots = 7, 3
    partners = np.array([[1, 1, 5, 6], [1, 3, 1, 6], [1, 1, 1, 6]])  # [e, active]; active 3 (rank 6) sits out
    made, rows, clock = Exchanges(world, partners), [], 0.0
    for batch in ([0, 1, 2], [0, 2], [1], [0, 1, 2]):
        i = np.array(batch)
        e = made.active_count[i].copy()
        p = partners[e, i]
        order = np.lexsort((i, p))  # by passive, then active: each passive's queue
        i, e, p = i[order], e[order], p[order]
        position = np.concatenate([np.arange(n) for n in np.unique(p, return_counts=True)[1]])
        begin = clock + np.arange(len(i), dtype=float)
        clock += len(i)
        made.add(i, e, p, position, begin, begin + 0.5)
        rows += [(2 * a, q, b) for a, q, b in zip(i.tolist(), p.tolist(), begin.tolist())]
    rank = np.array([r for a, q, _ in rows for r in (a, q)])
    begin = np.array([b for *_, b in rows for _ in (0, 1)])
    counts, both = made.by_rank()
    assert made.count == len(rows) == 9 and made.passive.shape[1] > slots  # rank 1 served 7 times
    assert np.array_equal(counts, np.bincount(rank, minlength=world))
    assert np.array_equal(both, np.stack([begin, begin + 0.5])[:, np.argsort(rank, kind="stable")])
    a, p, b, f = made.pairs()
    assert sorted(zip(a.tolist(), p.tolist(), b.tolist())) == sorted(rows) and np.array_equal(f, b + 0.5)
    at_active, at_passive = made.in_by_rank()
    assert np.array_equal(both[0, at_active], b) and np.array_equal(both[0, at_passive], b)


@pytest.mark.parametrize(
    "world,bandwidth_GBps,gpus_per_node,control_every",
    [(2, 9.0, 1, 10), (7, 9.0, 2, 10), (16, 1.0, 4, 0), (64, 0.1, 4, 0), (64, 0.05, 1, 10), (130, 0.3, 8, 0)],
)
def test_the_batched_gossip_serves_every_exchange_as_the_event_heap_does(
    world, bandwidth_GBps, gpus_per_node, control_every
):
    """Balanced, congested (0.05-0.3 GB/s: an exchange outlasts a step, queues form), odd worlds, several
    nodes."""
    net = Network(Link(3e-6, 1 / 150e9), Link(1.5e-6, 1 / (bandwidth_GBps * 1e9)), gpus_per_node)
    cfg = SimConfig(
        "adpsgd",
        world,
        Workload(step_s=0.3, params=25.6e6, sigma=0.3),
        net,
        make_imbalance(IMBALANCES["lognormal"].Settings(), seed=1),
        steps=100,
        seed=3,
        control_every=control_every,
    )
    run = SimState(cfg, 10)
    *_, ends, end_time = _compute_schedule(run, np.zeros((world, run.rounds)))
    made = _gossip(cfg, run, ends, end_time)
    lag = _step_lag(run, ends, end_time, made)
    want = sorted(event_heap_gossip(cfg, ends, end_time))
    a, p, begin, end = made.pairs()
    got = sorted(zip(a.tolist(), p.tolist(), begin.tolist(), end.tolist()))
    assert made.count == len(want) > 0 and got == want  # the same exchanges at the same times, to the bit
    # stored by rank: every rank's intervals rank after rank, each rank's in time order (busy_between's axis)
    rank, begin, end = np.concatenate([a, p]), np.concatenate([begin, begin]), np.concatenate([end, end])
    counts, both = made.by_rank()
    assert np.array_equal(counts, np.bincount(rank, minlength=world))
    assert np.array_equal(both, np.stack([begin, end])[:, np.lexsort((begin, rank))])
    lags = [
        abs(bisect.bisect(ends[a].tolist(), b) - bisect.bisect(ends[p].tolist(), b)) for a, p, b, _ in want
    ]
    assert lag == pytest.approx(sum(lags) / len(lags), rel=1e-12)


def test_row_major_is_ascontiguousarray_of_any_dtype_in_threads():
    """busy.row_major turns a column-major [rank, step] array a block of rows at a time, in threads from
    THREADED_FROM elements: the same values and dtype as np.ascontiguousarray (it made float64 of any
    array)."""
    from wagma_bench.simulate import threads
    from wagma_bench.simulate.busy import row_major

    rows = threads.THREADED_FROM // 500 + 1
    for x in (np.arange(rows * 500).reshape(rows, 500), np.random.default_rng(0).random((rows, 500))):
        turned = row_major(np.asfortranarray(x))
        assert turned.dtype == x.dtype and turned.flags.c_contiguous and np.array_equal(turned, x)
