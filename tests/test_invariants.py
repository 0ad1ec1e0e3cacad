"""Exactly-once invariants of every optimizer, under every straggler pattern, on real gloo worlds.

Each rank's gradient at its local step ``t`` is ``g(rank, t) = rank + 1 + t / 64`` (every contribution is
distinguishable, so lost or repeated work shows), the local optimizer plain SGD with ``lr``. Averaging
rules must keep the sum of the models (push-sum: the weighted sum ``w * z``); so at every synchronous
round the models must add up to exactly the no-loss value

    sum_i x0_i - lr * sum_i sum_{t <= n_i} g(i, t)

where ``n_i`` is the number of local steps rank ``i`` has taken (equal to the round for every optimizer
but WAGMA-SGD with ``catch_up=skip``). With zero gradients that says: no round changes the sum. Checked
at every synchronous round, and after ``close()`` for the optimizers whose messages may still be in
flight at a synchronous round (AD-PSGD's exchanges, SGP's 1-overlap message). An outer optimizer
(``optim/outer.py``) changes the sum on purpose at its outer rounds: its cases declare the expected sums
from SlowMo's and DiLoCo's recursions instead (``outer_sums``).

Straggler patterns (sleep per local step; ``BASE`` for everyone else): one rank 10x slow, a random
straggler every step, a whole butterfly group slow (P=4 S=2; P=8 S=2 and S=4), and a rank that falls
several rounds behind twice. One world runs every optimizer with the data plane refusing what NCCL
refuses (``comm.emulate=nccl``): any-source receives and tags belong on the control plane.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.dist_util import PAUSABLE
from tests.optim_util import Vector, make_algorithm, run_world, sgd

# make test runs this file at idle CPU priority beside the serial tests (marker `background`): the invariants
# are exact whatever the timing, and the worlds' timeouts (dist_util.PAUSABLE) outlast any pause.
pytestmark = pytest.mark.background

BASE = 0.004
SLOW = 10 * BASE
LR = 0.5
MIN_ROUNDS = 12
CONFIGS = {  # id: (optimizer, settings); sync periods 6 (or 1, 3) so that 12 rounds pass two of them
    "wagma-replay": ("wagma", {"catch_up": "replay", "tau": 5}),
    "wagma-skip": ("wagma", {"catch_up": "skip", "tau": 5}),
    "eager-solo": ("eager", {"mode": "solo", "sync_period": 6}),
    "eager-majority": ("eager", {"mode": "majority", "sync_period": 6}),
    "adpsgd": ("adpsgd", {"sync_period": 6}),
    "sgp": ("sgp", {"overlap": False}),
    "sgp-overlap": ("sgp", {"overlap": True}),
    "dpsgd": ("dpsgd", {}),
    "local_sgd": ("local_sgd", {"sync_period": 3}),
    "allreduce": ("allreduce", {}),
    "dropcompute": ("dropcompute", {"threshold_s": "inf"}),  # its drops: tests/test_dropcompute.py's oracle
    # outer optimizers change the sum on purpose: the expected sums come from the recursion (OUTER below)
    "local_sgd-slowmo": (
        "local_sgd",
        {"sync_period": 3, "outer": "slowmo", "outer_lr": 0.8, "outer_momentum": 0.5},
    ),
    "wagma-nesterov": ("wagma", {"catch_up": "replay", "tau": 5, "outer": "nesterov"}),
    "dpsgd-nesterov": ("dpsgd", {"outer": "nesterov", "outer_period": 3}),
    "sgp-slowmo": ("sgp", {"outer": "slowmo", "outer_period": 3}),
}
# Outer optimizers: (rule, outer lr, momentum, outer period, whether the outer step comes before the round's
# local step). Their declared expected value at each synchronous round is OUTER's recursion on the sums.
OUTER = {
    "local_sgd-slowmo": ("slowmo", 0.8, 0.5, 3, False),
    "wagma-nesterov": (
        "nesterov",
        0.7,
        0.9,
        6,
        True,
    ),  # DiLoCo's defaults; WAGMA: between average and local step
    "dpsgd-nesterov": ("nesterov", 0.7, 0.9, 3, False),
    "sgp-slowmo": ("slowmo", 1.0, 0.5, 3, False),
}
# Only exact once nothing is in flight: checked after close().
AT_CLOSE_ONLY = {"adpsgd", "sgp-overlap"}
# (world, group size, pattern, zero gradients, emulated NCCL: the data plane refuses any-source and tags)
WORLDS = [
    (4, 2, "one_slow", False, None),
    (4, 2, "one_slow", True, None),
    (4, 2, "random", False, None),
    (4, 2, "random", False, "nccl"),
    (4, 2, "group_slow", False, None),
    (4, 2, "late", False, None),
    (8, 2, "group_slow", False, None),
    (8, 4, "group_slow", False, None),
]


def gradient(rank: int, step: int) -> float:
    return rank + 1 + step / 64


def slow_group(world: int, group_size: int) -> tuple[int, ...]:
    """The butterfly group of the first stage that holds the last rank."""
    from wagma_bench.comm.topology import butterfly_stage

    return next(g for g in butterfly_stage(world, group_size, 0) if world - 1 in g)


def delay(pattern: str, rank: int, world: int, group_size: int, step: int) -> float:
    if pattern == "one_slow":
        return SLOW if rank == 1 else BASE
    if pattern == "random":
        return SLOW if random.Random(step).randrange(world) == rank else BASE
    if pattern == "group_slow":
        return SLOW if rank in slow_group(world, group_size) else BASE
    if pattern == "late":  # rank 0 falls several rounds behind, twice
        return 8 * SLOW if rank == 0 and step in (2, 8) else BASE
    raise ValueError(pattern)


def mass(name: str, algo) -> float:
    """This rank's share of the conserved quantity: the model, push-sum's w * z, AD-PSGD's model plus the
    corrections its gossip thread queued."""
    flat = algo.buckets[0].data
    if name == "sgp":
        return float(flat.sum()) * algo.weight
    if name == "adpsgd":
        with algo._lock:
            return float((flat + algo._pending).sum())
    return float(flat.sum())


def _run_config(comm, name, settings, group_size, pattern, zero):
    model = Vector(3, 10.0 * comm.rank).double()
    if name == "wagma":
        settings = {**settings, "group_size": group_size}
    algo = make_algorithm(name, comm, model, sgd(lr=LR), seed=3, **settings)
    records, steps = [], 0
    x0 = mass(name, algo)
    # Every rank reads its starting mass before any rank steps, as the trainer meets its ranks before the
    # first step (Trainer.open_logs): an AD-PSGD passive answers exchanges from construction on, so a rank
    # slow to get here (a starved process) would count a fast active's first exchange in its x0.
    comm.barrier()
    while True:
        steps += 1
        algo.zero_grad()
        for b in algo.buckets:
            b.grad.fill_(0.0 if zero else gradient(comm.rank, steps))
        time.sleep(delay(pattern, comm.rank, comm.world_size, group_size, steps))
        r = algo.step().round
        if r % algo.sync_period == 0:
            records.append((r, steps, mass(name, algo)))
            if r >= MIN_ROUNDS:
                break
    comm.barrier()  # the common point where the trainer closes
    algo.close()
    return {"x0": x0, "records": records, "final": (steps, mass(name, algo))}


def _world(comm, group_size, pattern, zero):
    return {
        cid: _run_config(comm, name, settings, group_size, pattern, zero)
        for cid, (name, settings) in CONFIGS.items()
    }


def _run_one_world(params):
    world, group_size, pattern, zero, emulate = params
    return run_world(_world, world, group_size, pattern, zero, emulate=emulate, **PAUSABLE)


@pytest.fixture(scope="module")
def worlds():
    """Every world of WORLDS, three at a time (each its own gloo world and store): the patterns' sleeps left
    the two cores about 75% idle with one world at a time (measured per test from /proc/stat), and the
    invariants are exact whatever the timing, so the other worlds' load only makes the stragglers later. This
    file took 74 s one world at a time, 54 s two and 38 s three at a time."""
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="world") as pool:
        yield {params: pool.submit(_run_one_world, params) for params in WORLDS}


@pytest.fixture(
    scope="module",
    params=WORLDS,
    ids=lambda w: f"P{w[0]}-S{w[1]}-{w[2]}{'-zero' if w[3] else ''}{'-' + w[4] if w[4] else ''}",
)
def world_results(request, worlds):
    return request.param, worlds[request.param].result()


def no_loss_sum(results, steps_per_rank, zero) -> float:
    total = sum(r["x0"] for r in results)
    if not zero:
        total -= (
            LR * 7 * sum(gradient(rank, t) for rank, n in enumerate(steps_per_rank) for t in range(1, n + 1))
        )
    return total


def outer_sums(config: str, results, zero: bool, rounds: list[int]) -> list[float]:
    """The models' sum at each of ``rounds`` with the outer step of OUTER[config], from the papers' recursions
    on the sums (every rank takes one local step per round; x_prev starts as each rank's initial model).
    SlowMo: U <- beta U + (X_prev - X_avg) / lr, X <- X_prev - alpha lr U; Nesterov (DiLoCo):
    M <- mu M + D, X <- X_prev - eta (D + mu M), with D = X_prev - X_avg; all summed over ranks, which is
    exact because every rank holds the same average."""
    rule, lr, momentum, period, before = OUTER[config]
    world = len(results)
    total = prev = sum(r["x0"] for r in results)
    u, out = 0.0, {}
    for r in range(1, max(rounds) + 1):
        step = 0.0 if zero else LR * 7 * sum(gradient(rank, r) for rank in range(world))
        if not before:
            total -= step
        if r % period == 0:
            d = prev - total
            if rule == "slowmo":
                u = momentum * u + d / LR
                total = prev - lr * LR * u
            else:
                u = momentum * u + d
                total = prev - lr * (d + momentum * u)
            prev = total
        if before:
            total -= step
        out[r] = total
    return [out[r] for r in rounds]


def expected_sums(config: str, results, zero: bool, records: list[int]) -> list[float]:
    """The declared expected value at each record (``records``: indices into the ranks' records, -1: the
    end)."""
    if config in OUTER:
        rounds = [results[0]["records"][k][0] if k >= 0 else results[0]["records"][-1][0] for k in records]
        return outer_sums(config, results, zero, rounds)
    return [
        no_loss_sum(results, [r["records"][k][1] if k >= 0 else r["final"][0] for r in results], zero)
        for k in records
    ]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_the_models_carry_every_gradient_step_exactly_once(world_results, config):
    """Every gradient step exactly once in the sum of the models; with an outer optimizer, the sums its
    recursion declares."""
    (_, _, _, zero, _), all_results = world_results
    results = [r[config] for r in all_results]
    rounds = [[rec[0] for rec in r["records"]] for r in results]
    assert all(rr == rounds[0] for rr in rounds), f"ranks met at different synchronous rounds: {rounds}"
    checks = [] if config in AT_CLOSE_ONLY else list(range(len(rounds[0])))
    declared = expected_sums(config, results, zero, checks + [-1])
    for k, expected in zip(checks, declared):
        steps = [r["records"][k][1] for r in results]
        got = sum(r["records"][k][2] for r in results)
        assert got == pytest.approx(expected, rel=1e-9, abs=1e-5), (
            f"{config}: at synchronous round {rounds[0][k]} the models add up to {got}, declared {expected} "
            f"(local steps per rank {steps})"
        )
    steps = [r["final"][0] for r in results]
    got = sum(r["final"][1] for r in results)
    assert got == pytest.approx(declared[-1], rel=1e-9, abs=1e-5), (config, got, steps)
    if config != "wagma-skip":  # every other optimizer takes one local step per round
        assert all(r["records"][-1][1] == r["records"][-1][0] for r in results)


def test_every_registered_optimizer_has_an_invariant_case():
    """A new optimizer in the registry fails here until CONFIGS gives it a case (docs/architecture.md, "Adding
    an optimizer")."""
    from tests.test_conformance import invariant_case, missing
    from wagma_bench.optim import OPTIMIZERS

    problems = missing(invariant_case)
    problems += [
        f"tests/test_invariants.py: CONFIGS[{case!r}] names {optimizer!r}, which is not a registered "
        f"optimizer; fix or remove it"
        for case, (optimizer, _) in CONFIGS.items()
        if optimizer not in OPTIMIZERS
    ]
    assert not problems, "\n".join(problems)
