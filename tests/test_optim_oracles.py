"""Exact oracles of the baseline optimizers on real gloo worlds: every parameter starts at the rank number.

- D-PSGD: one step with zero gradients gives exactly the mean of the rank and its ring neighbours.
- SGP: the de-biased values follow the push-sum recursion exactly, step by step (synchronous and 1-overlap),
  reach the exact global mean in log2(P) steps on a power-of-two world, and conserve mass.
- Local SGD: models are averaged exactly after rounds that are multiples of ``period`` (after warm-up),
  and are otherwise exactly what the local step made of them; warm-up steps average gradients.
- Local SGD agrees with torch's own ``PeriodicModelAverager`` / ``PostLocalSGDOptimizer`` within 1e-6.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from tests.cli_util import CONF, compose
from tests.optim_util import Vector, flat_params, make_algorithm, run_world, sgd
from wagma_bench.comm.topology import exponential_in_peer, exponential_peer, ring_neighbours
from wagma_bench.optim import OPTIMIZERS

WORLDS = [3, 4, 8]
SGP_STEPS = 40


# --- one world runs every oracle (a world costs more than the oracles) -------------------------------
def _oracles(comm):
    rank = comm.rank
    out = {}
    # D-PSGD: one zero-gradient step
    model = Vector(3, rank)
    algo = make_algorithm("dpsgd", comm, model, sgd())
    algo.zero_grad()
    algo.step()
    out["dpsgd"] = flat_params(model)
    # SGP, synchronous and 1-overlap: zero gradients, record the de-biased model after each step
    for overlap in (False, True):
        model = Vector(3, rank)
        algo = make_algorithm("sgp", comm, model, sgd(), overlap=overlap)
        trace = []
        for _ in range(SGP_STEPS):
            algo.zero_grad()
            algo.step()
            trace.append((flat_params(model), algo.weight))
        algo.close()  # folds the message still in flight into the model
        out[f"sgp{overlap}"] = (trace, flat_params(model) * algo.weight, algo.weight)
    # Local SGD: gradient (rank + 1) everywhere, plain SGD with lr 0.5, warm-up 2, period 3
    model = Vector(3, rank)
    algo = make_algorithm("local_sgd", comm, model, sgd(lr=0.5), sync_period=3, warmup_rounds=2)
    trace = []
    for _ in range(10):
        algo.zero_grad()
        for b in algo.buckets:
            b.grad.fill_(rank + 1.0)
        trace.append((algo.step().round, flat_params(model)))
    out["local_sgd"] = trace
    # Local SGD with average_momentum: the momentum buffers are averaged with the models
    model = Vector(3, rank)
    algo = make_algorithm(
        "local_sgd", comm, model, sgd(lr=0.5, momentum=0.9), sync_period=2, average_momentum=True
    )
    for _ in range(2):
        algo.zero_grad()
        for b in algo.buckets:
            b.grad.fill_(rank + 1.0)
        algo.step()
    out["momentum"] = torch.cat(
        [algo.local_optimizer.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()]
    )
    return out


@pytest.fixture(scope="module", params=WORLDS)
def oracle_results(request):
    return request.param, run_world(_oracles, request.param)


def test_dpsgd_one_step_is_exact_neighbour_mean(oracle_results):
    world, results = oracle_results
    for rank, res in enumerate(results):
        members = {rank, *ring_neighbours(rank, world)}
        expected = torch.full_like(res["dpsgd"], float(sum(members)) / len(members))
        assert torch.equal(res["dpsgd"], expected), (rank, res["dpsgd"], expected)


def _push_sum(world: int, steps: int, overlap: bool):
    """Reference push-sum (float64) of x = rank, w = 1 on the exponential graph; returns z per step and
    the final (x, w) after the last in-flight message is folded in."""
    x, w = [float(r) for r in range(world)], [1.0] * world
    inflight = None  # overlap: messages pushed at the previous step, by receiver
    trace = []
    for t in range(steps):
        x, w = [v / 2 for v in x], [v / 2 for v in w]
        msgs = {exponential_peer(r, world, t): (x[r], w[r]) for r in range(world)}
        assert all(
            exponential_in_peer(dst, world, t) == src
            for src in range(world)
            for dst in [exponential_peer(src, world, t)]
        )
        deliver = inflight if overlap else msgs
        if deliver:
            x = [x[r] + deliver[r][0] for r in range(world)]
            w = [w[r] + deliver[r][1] for r in range(world)]
        inflight = msgs
        trace.append(([x[r] / w[r] for r in range(world)], list(w)))
    if overlap:
        x = [x[r] + inflight[r][0] for r in range(world)]
        w = [w[r] + inflight[r][1] for r in range(world)]
    return trace, x, w


@pytest.mark.parametrize("overlap", [False, True])
def test_sgp_debiased_values_are_exact_and_reach_consensus(oracle_results, overlap):
    world, results = oracle_results
    ref_trace, ref_x, ref_w = _push_sum(world, SGP_STEPS, overlap)
    mean = (world - 1) / 2
    for rank, res in enumerate(results):
        trace, final_x, final_w = res[f"sgp{overlap}"]
        for t, ((z, w), (ref_z, ref_ws)) in enumerate(zip(trace, ref_trace)):
            assert w == pytest.approx(ref_ws[rank], rel=0 if t < 16 else 1e-6), (rank, t, w, ref_ws[rank])
            expected = torch.full_like(z, ref_z[rank])
            if overlap or t >= 16:  # x / w with w != 1, or values with more than 24 bits, round in float32
                torch.testing.assert_close(z, expected, rtol=1e-6, atol=1e-6, msg=f"rank {rank} step {t}")
            else:
                assert torch.equal(z, expected), (rank, t, z, ref_z[rank])
            if not overlap and world & (world - 1) == 0 and t + 1 >= world.bit_length() - 1:
                assert torch.equal(z, torch.full_like(z, mean)), (rank, t, z)  # exact consensus
        assert final_w == pytest.approx(ref_w[rank], rel=1e-6)
        torch.testing.assert_close(final_x, torch.full_like(final_x, ref_x[rank]), rtol=1e-6, atol=1e-6)
        # consensus to the global mean, also for worlds that are not powers of two
        torch.testing.assert_close(trace[-1][0], torch.full_like(final_x, mean), rtol=0, atol=2e-4)
    # push-sum conserves mass: the sums of x and of w over ranks are the initial ones
    assert sum(r[f"sgp{overlap}"][2] for r in results) == pytest.approx(world, abs=1e-6)
    total = sum(float(r[f"sgp{overlap}"][1][0]) for r in results)
    assert total == pytest.approx(world * mean, rel=1e-6)


def test_local_sgd_averages_exactly_at_multiples_of_period(oracle_results):
    world, results = oracle_results
    period, warmup, lr = 3, 2, 0.5
    mean_grad = sum(r + 1.0 for r in range(world)) / world
    x = [torch.full((7,), float(r)) for r in range(world)]
    for t in range(1, 11):
        if t <= warmup:  # Allreduce-SGD: the averaged gradient, every model identical
            x = [v - lr * mean_grad for v in x]
        else:
            x = [v - lr * (r + 1.0) for r, v in enumerate(x)]
        averaged = t > warmup and t % period == 0
        if averaged:
            mean = sum(v.double() for v in x) / world
            x = [mean.float() for _ in x]
        for rank, res in enumerate(results):
            r, got = res["local_sgd"][t - 1]
            assert r == t
            if averaged and world & (world - 1):  # sum / 3 rounds in float32 (order of the gloo sum)
                torch.testing.assert_close(got, x[rank], rtol=1e-6, atol=1e-6)
                x[rank] = got  # continue from the exact values the ranks hold
            else:
                assert torch.equal(got, x[rank]), (t, rank, got, x[rank])
        if averaged:
            assert all(
                torch.equal(results[0]["local_sgd"][t - 1][1], res["local_sgd"][t - 1][1]) for res in results
            ), "models differ right after an averaging"


def test_local_sgd_can_average_momentum_buffers(oracle_results):
    world, results = oracle_results
    # two momentum steps with the constant gradient g: buffer 0.9 g + g, then averaged over ranks
    mean = sum(0.9 * (r + 1.0) + (r + 1.0) for r in range(world)) / world
    for rank, res in enumerate(results):
        torch.testing.assert_close(res["momentum"], torch.full_like(res["momentum"], mean), rtol=1e-6, atol=0)


# --- agreement with torch's post-local SGD ------------------------------------------------------------
def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))


def _batches(rank: int, steps: int):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)) for _ in range(steps)]


def _torch_reference(comm, period, warmup, steps):
    """torch's recipe: DDP + post_localSGD_hook for the warm-up, PostLocalSGDOptimizer with a
    PeriodicModelAverager afterwards (averaging offset so that it averages after multiples of ``period``)."""
    import torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook as post_local
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer
    from torch.nn.parallel import DistributedDataParallel

    module = _net()
    ddp = DistributedDataParallel(module)
    ddp.register_comm_hook(
        post_local.PostLocalSGDState(
            None, None, start_localSGD_iter=warmup, post_local_gradient_allreduce=False
        ),
        post_local.post_localSGD_hook,
    )
    first_average = (warmup // period + 1) * period
    averager = PeriodicModelAverager(period=period, warmup_steps=first_average - 1)
    opt = PostLocalSGDOptimizer(torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9), averager)
    trace = []
    for xb, yb in _batches(comm.rank, steps):
        opt.zero_grad()
        nn.functional.mse_loss(ddp(xb), yb).backward()
        opt.step()
        trace.append(flat_params(module))
    return trace


def _ours(comm, period, warmup, steps):
    model = _net()
    algo = make_algorithm(
        "local_sgd", comm, model, sgd(lr=0.05, momentum=0.9), sync_period=period, warmup_rounds=warmup
    )
    trace = []
    for xb, yb in _batches(comm.rank, steps):
        algo.zero_grad()
        nn.functional.mse_loss(model(xb), yb).backward()
        algo.step()
        trace.append(flat_params(model))
    return trace


def _agreement(comm):
    import warnings

    warnings.filterwarnings("ignore")
    return {
        (period, warmup): (_torch_reference(comm, period, warmup, 14), _ours(comm, period, warmup, 14))
        for period, warmup in [(4, 0), (3, 5), (1, 0)]
    }


def test_local_sgd_agrees_with_torch_post_local_sgd():
    results = run_world(_agreement, 4)
    for rank, res in enumerate(results):
        for (period, warmup), (ref, ours) in res.items():
            for t, (a, b) in enumerate(zip(ref, ours), start=1):
                torch.testing.assert_close(
                    b, a, rtol=0, atol=1e-6, msg=f"rank {rank} period {period} warm-up {warmup} step {t}"
                )
            assert not torch.equal(ref[-1], results[(rank + 1) % 4][(period, warmup)][0][-1]) or period == 1


# --- pure schedules the baselines use -----------------------------------------------------------------
def test_random_initiator_is_shared_and_uniform():
    from wagma_bench.comm.topology import random_initiator

    draws = [random_initiator(4, r, seed=5) for r in range(4000)]
    assert draws == [random_initiator(4, r, seed=5) for r in range(4000)]  # the same on every rank
    assert draws != [random_initiator(4, r, seed=6) for r in range(4000)]
    counts = [draws.count(k) for k in range(4)]
    assert min(counts) > 900 and max(counts) < 1100, counts
    with pytest.raises(ValueError):
        random_initiator(0, 1)


def test_bad_settings_fail_in_the_config_check_naming_what_is_allowed():
    from wagma_bench.config.schema import validate

    for name, key, value, message in [
        ("eager", "mode", "all", "solo, majority"),
        ("local_sgd", "sync_period", 0, "sync_period=0 is not allowed; it must be >= 1"),
        ("local_sgd", "warmup_rounds", -1, "warmup_rounds=-1 is not allowed; it must be >= 0"),
        ("adpsgd", "sync_period", 0, "sync_period=0 is not allowed; it must be >= 1"),
        ("eager", "sync_period", 0, "sync_period=0 is not allowed; it must be >= 1"),
        ("wagma", "catch_up", "late", "catch_up=.late. is not allowed; choose one of: replay, skip"),
    ]:
        cfg = compose(f"optimizer={name}", f"optimizer.{key}={value}")
        with pytest.raises(ValueError, match=message):
            validate(cfg)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_documented_yaml_matches_the_settings(name):
    """Every hyperparameter in the YAML is a Settings field with the same default, and vice versa."""
    import dataclasses

    from omegaconf import OmegaConf

    from tests.test_conformance import yaml_file
    from wagma_bench.config.schema import validate
    from wagma_bench.optim import get_optimizer

    problems = yaml_file(name)
    assert not problems, "\n".join(problems)
    yaml_conf = OmegaConf.to_container(OmegaConf.load(CONF / "optimizer" / f"{name}.yaml"))
    assert yaml_conf == {f.name: f.default for f in dataclasses.fields(get_optimizer(name).Settings)}
    assert validate(compose(f"optimizer={name}")).optimizer.name == name


# --- multi-step oracles with non-zero gradients -------------------------------------------------------
# A quadratic per rank, f_i(x) = |x - c_i|^2 / 2, so the gradient g_i(x) = x - c_i depends on the weights it
# is computed on: the recursions below say on which (the pre-average weights, as every paper does).
ORACLE_STEPS, ORACLE_LR = 14, 0.3


def _centre(rank: int, dim: int) -> torch.Tensor:
    return torch.arange(dim, dtype=torch.float64) + 3.0 * rank


def _lockstep(comm, name, settings, lockstep=True, average_every=0):
    """Train ``name`` on the rank's quadratic for ORACLE_STEPS steps; the ranks meet at a barrier after
    every step when ``lockstep`` (so a wait-avoiding round always has every rank's fresh model). With
    ``average_every``, the test itself replaces the models by their global mean after every such round."""
    model = Vector(3, float(comm.rank)).double()
    algo = make_algorithm(name, comm, model, sgd(lr=ORACLE_LR), seed=1, **settings)
    c = _centre(comm.rank, 7)
    trace = []
    for _ in range(ORACLE_STEPS):
        algo.zero_grad()
        x = torch.cat([p.reshape(-1) for p in model.parameters()])
        (0.5 * (x - c).pow(2).sum()).backward()
        r = algo.step().round
        if average_every and r % average_every == 0:
            for b in algo.buckets:
                comm.allreduce(b.data, op="mean")
        if lockstep:
            comm.barrier()
        trace.append(flat_params(model) * (algo.weight if name == "sgp" else 1.0))
    comm.barrier()
    algo.close()
    return trace


def _x0(world: int) -> list[torch.Tensor]:
    return [torch.full((7,), float(r), dtype=torch.float64) for r in range(world)]


def _wagma_reference(world: int, group_size: int, tau: int) -> list[list[torch.Tensor]]:
    """W_i <- mean over i's butterfly group (the world at synchronous rounds) of W - lr * g_i(W_i)."""
    from wagma_bench.comm.topology import WagmaSchedule

    schedule = WagmaSchedule(world, group_size, tau)
    x, trace = _x0(world), []
    for r in range(1, ORACLE_STEPS + 1):
        grads = [x[i] - _centre(i, 7) for i in range(world)]
        mean = {g: sum(x[j] for j in g) / len(g) for g in {schedule.group(i, r) for i in range(world)}}
        x = [mean[schedule.group(i, r)] - ORACLE_LR * grads[i] for i in range(world)]
        trace.append(x)
    return trace


def _mixing_reference(world: int, name: str) -> list[list[torch.Tensor]]:
    """D-PSGD: x <- W x - lr g(x) with W the ring's uniform mixing; SGP: push-sum of (x - lr g(z), w) over
    the exponential graph, traced as w * z = x."""
    x, w, trace = _x0(world), [1.0] * world, []
    for t in range(ORACLE_STEPS):
        if name == "dpsgd":
            grads = [x[i] - _centre(i, 7) for i in range(world)]
            mixed = [
                sum(x[j] for j in {i, *ring_neighbours(i, world)}) / len({i, *ring_neighbours(i, world)})
                for i in range(world)
            ]
            x = [mixed[i] - ORACLE_LR * grads[i] for i in range(world)]
        else:
            x = [x[i] - ORACLE_LR * (x[i] / w[i] - _centre(i, 7)) for i in range(world)]
            half_x, half_w = [v / 2 for v in x], [v / 2 for v in w]
            x = [half_x[i] + half_x[exponential_in_peer(i, world, t)] for i in range(world)]
            w = [half_w[i] + half_w[exponential_in_peer(i, world, t)] for i in range(world)]
        trace.append(x)
    return trace


@pytest.mark.parametrize("world,group_size", [(4, 2), (8, 2), (8, 4), (6, 2)])
def test_wagma_on_time_equals_group_averaging_then_the_local_step(world, group_size):
    """catch_up=replay (the default). With skip, a rank whose post a passive round already used activates
    one more round, so on-time ranks do not take the same rounds (its test: tests/test_invariants.py)."""
    results = run_world(_lockstep, world, "wagma", {"group_size": group_size, "tau": 4, "catch_up": "replay"})
    reference = _wagma_reference(world, group_size, 4)
    for rank, trace in enumerate(results):
        for t, (got, ref) in enumerate(zip(trace, reference), start=1):
            torch.testing.assert_close(got, ref[rank], rtol=1e-12, atol=1e-12, msg=f"rank {rank} round {t}")


@pytest.mark.parametrize("name", ["dpsgd", "sgp"])
@pytest.mark.parametrize("world", [3, 4])
def test_gossip_with_gradients_follows_the_mixing_recursion(world, name):
    results = run_world(_lockstep, world, name, {}, False)
    reference = _mixing_reference(world, name)
    for rank, trace in enumerate(results):
        for t, (got, ref) in enumerate(zip(trace, reference), start=1):
            torch.testing.assert_close(
                got, ref[rank], rtol=1e-10, atol=1e-10, msg=f"{name} rank {rank} step {t}"
            )


def _adpsgd_consensus(comm, communicate):
    """AD-PSGD with zero gradients from models 0, 10, 20, ...; ``communicate=False`` is the control run:
    the same loop with the gossip replaced by nothing (a world of one per rank)."""
    model = Vector(3, 10.0 * comm.rank).double()
    algo = make_algorithm("adpsgd", comm, model, sgd(lr=0.1), seed=2, sync_period=10) if communicate else None
    for _ in range(40):
        if algo is not None:
            algo.zero_grad()
            algo.step()
        time.sleep(0.005)
    comm.barrier()
    if algo is not None:
        algo.close()
        with algo._lock:
            return float((algo.buckets[0].data + algo._pending).mean())
    return float(flat_params(model).mean())


@pytest.mark.serial
def test_adpsgd_keeps_the_sum_and_shrinks_the_spread():
    world = 4
    initial = [10.0 * r for r in range(world)]
    spread0 = max(initial) - min(initial)
    tolerance = 0.25 * spread0
    for communicate in (True, False):
        final = run_world(_adpsgd_consensus, world, communicate)
        assert sum(final) == pytest.approx(sum(initial), abs=1e-9)  # the pairs' sums are kept
        spread = max(final) - min(final)
        if communicate:
            assert spread < tolerance, (final, spread0)
        else:  # the control: ranks that never communicate fail the same tolerance
            assert spread >= tolerance, (final, spread0)


# Each registered optimizer's exact oracle (an independent computation of what its models must be), by test;
# a new optimizer fails the test below until it names one here (docs/architecture.md, "Adding an optimizer").
ORACLES = {
    "allreduce": "tests/test_allreduce_ddp.py::test_same_weights_as_ddp_after_k_steps",
    "wagma": "tests/test_optim_oracles.py::test_wagma_on_time_equals_group_averaging_then_the_local_step",
    "local_sgd": "tests/test_optim_oracles.py::test_local_sgd_averages_exactly_at_multiples_of_period",
    "dpsgd": "tests/test_optim_oracles.py::test_dpsgd_one_step_is_exact_neighbour_mean",
    "adpsgd": "tests/test_optim_oracles.py::test_adpsgd_keeps_the_sum_and_shrinks_the_spread",
    "sgp": "tests/test_optim_oracles.py::test_sgp_debiased_values_are_exact_and_reach_consensus",
    "eager": "tests/test_optim_async.py::test_slow_rank_clean_shutdown_and_wait_avoidance",
    "dropcompute": "tests/test_dropcompute.py::test_every_computed_sample_counts_once_under_drops",
}


def test_every_registered_optimizer_has_an_oracle():
    from tests.test_conformance import missing, oracle

    problems = missing(oracle)
    problems += [
        f"tests/test_optim_oracles.py: remove {name!r} from ORACLES (not a registered optimizer)"
        for name in ORACLES
        if name not in OPTIMIZERS
    ]
    assert not problems, "\n".join(problems)


# --- outer optimizers (wagma_bench/optim/outer.py) on every base they wrap ------------------------------
# Each base with its own global averaging period 4 (local SGD period 4, WAGMA-SGD tau 3) or an outer period of
# 4 (D-PSGD, SGP: the outer layer takes the global average), in one world of 4 ranks, lock-stepped.
OUTER_BASES = {
    "local_sgd": {"sync_period": 4},
    "wagma": {"group_size": 2, "tau": 3, "catch_up": "replay"},
    "dpsgd": {"outer_period": 4},
    "sgp": {"outer_period": 4},
}
OUTER_RULES = {
    "identity-slowmo": ("slowmo", 1.0, 0.0),
    "identity-nesterov": ("nesterov", 1.0, 0.0),
    "slowmo": ("slowmo", 0.6, 0.7),
    "nesterov": ("nesterov", 0.7, 0.9),
}
OUTER_WORLD = 4


def _outer_traces(comm):
    out = {}
    for name, settings in OUTER_BASES.items():
        out[name, "none"] = _lockstep(comm, name, settings)
        # what SlowMo's identity step (alpha 1, beta 0) must equal: the base with a global average every 4
        # rounds (D-PSGD, SGP: the outer layer's own; local SGD, WAGMA-SGD already average there)
        out[name, "averaged"] = (
            _lockstep(comm, name, settings, average_every=4)
            if "outer_period" in settings
            else out[name, "none"]
        )
        for rule_id, (rule, lr, momentum) in OUTER_RULES.items():
            out[name, rule_id] = _lockstep(
                comm, name, {**settings, "outer": rule, "outer_lr": lr, "outer_momentum": momentum}
            )
    return out


@pytest.fixture(scope="module")
def outer_traces():
    return run_world(_outer_traces, OUTER_WORLD)


def _outer_reference(
    world: int, name: str, rule: str, lr: float, momentum: float
) -> list[list[torch.Tensor]]:
    """The base's recursion (as the references above) with the papers' outer step every 4 rounds, written as
    the papers write it. SlowMo: u <- beta u + (x_prev - x_avg) / gamma, x <- x_prev - alpha gamma u. DiLoCo
    (torch's Nesterov SGD on the pseudo-gradient d = x_prev - x_avg): m <- mu m + d, x <- x_prev - eta (d + mu
    m). x_prev starts as each rank's own initial model (no initial broadcast here)."""
    from wagma_bench.comm.topology import WagmaSchedule

    schedule = WagmaSchedule(world, 2, 3)
    x, w, trace = _x0(world), [1.0] * world, []
    prev, u = [v.clone() for v in x], [torch.zeros(7, dtype=torch.float64) for _ in range(world)]

    def outer(avg: torch.Tensor) -> list[torch.Tensor]:
        new = []
        for i in range(world):
            d = prev[i] - avg
            if rule == "slowmo":
                u[i] = momentum * u[i] + d / ORACLE_LR
                new.append(prev[i] - lr * ORACLE_LR * u[i])
            else:
                u[i] = momentum * u[i] + d
                new.append(prev[i] - lr * (d + momentum * u[i]))
            prev[i] = new[i].clone()
        return new

    for r in range(1, ORACLE_STEPS + 1):
        due = r % 4 == 0
        if name == "wagma":  # the outer step comes between the synchronous average and the local step
            grads = [x[i] - _centre(i, 7) for i in range(world)]
            mean = {g: sum(x[j] for j in g) / len(g) for g in {schedule.group(i, r) for i in range(world)}}
            mixed = [mean[schedule.group(i, r)] for i in range(world)]
            if due:
                mixed = outer(mixed[0])
            x = [mixed[i] - ORACLE_LR * grads[i] for i in range(world)]
        elif name == "local_sgd":
            x = [x[i] - ORACLE_LR * (x[i] - _centre(i, 7)) for i in range(world)]
            if due:
                x = outer(sum(x) / world)
        elif name == "dpsgd":
            grads = [x[i] - _centre(i, 7) for i in range(world)]
            members = [{i, *ring_neighbours(i, world)} for i in range(world)]
            x = [sum(x[j] for j in members[i]) / len(members[i]) - ORACLE_LR * grads[i] for i in range(world)]
            if due:
                x = outer(sum(x) / world)
        else:  # sgp, synchronous: w stays 1
            x = [x[i] - ORACLE_LR * (x[i] / w[i] - _centre(i, 7)) for i in range(world)]
            x = [x[i] / 2 + x[exponential_in_peer(i, world, r - 1)] / 2 for i in range(world)]
            if due:
                x = outer(sum(x) / world)
        trace.append(x)
    return trace


@pytest.mark.parametrize("name", list(OUTER_BASES))
def test_identity_outer_step_is_bit_identical_to_the_base(outer_traces, name):
    """outer_lr 1, outer_momentum 0: every rank's model after every round equals the plain base's, bit for bit
    (D-PSGD and SGP: the plain base with the global average every outer period that the outer layer adds,
    which is what SlowMo says its identity step reduces to)."""
    for rule_id in ("identity-slowmo", "identity-nesterov"):
        for rank, traces in enumerate(outer_traces):
            plain, wrapped = traces[name, "averaged"], traces[name, rule_id]
            for t, (a, b) in enumerate(zip(plain, wrapped), start=1):
                assert torch.equal(a, b), (
                    f"{name} {rule_id}: rank {rank} round {t}: {a.tolist()} != {b.tolist()}"
                )


@pytest.mark.parametrize("rule_id", ["slowmo", "nesterov"])
@pytest.mark.parametrize("name", list(OUTER_BASES))
def test_outer_momentum_follows_the_papers_recursion(outer_traces, name, rule_id):
    rule, lr, momentum = OUTER_RULES[rule_id]
    reference = _outer_reference(OUTER_WORLD, name, rule, lr, momentum)
    for rank, traces in enumerate(outer_traces):
        trace, plain = traces[name, rule_id], traces[name, "none"]
        for t, (got, ref) in enumerate(zip(trace, reference), start=1):
            torch.testing.assert_close(
                got, ref[rank], rtol=1e-11, atol=1e-11, msg=f"{name} {rule_id} rank {rank} round {t}"
            )
        assert not torch.equal(trace[-1], plain[-1])  # the outer momentum did change the models
