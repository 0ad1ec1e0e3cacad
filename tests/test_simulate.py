"""The simulator against cases with known answers (pure: no processes, no timing)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from wagma_bench.cli.simulate import main as simulate_main
from wagma_bench.config.schedules import CONTROL_EVERY, control_period
from wagma_bench.imbalance import FixedImbalance, IndependentImbalance, SharedDrawImbalance
from wagma_bench.optim import OPTIMIZERS
from wagma_bench.optim.specs import OPTIMIZER_SPECS
from wagma_bench.simulate.calibrate import find_inputs, fit_network, fit_run
from wagma_bench.simulate.costs import Link, Network, allreduce_time
from wagma_bench.simulate.des import SIMULATIONS, SimConfig, SimState, Workload, local_state_tensors, simulate

STEP, BATCH = 0.1, 16
WL = Workload(step_s=STEP, batch=BATCH, params=1e6, compute="constant")


def typed(optimizer: str, **settings):
    """The optimizer's own Settings dataclass, as `run` and `simulate` compose it."""
    return OPTIMIZERS[optimizer].Settings(**settings)


def slow_rank(k: float, rank: int = 0) -> FixedImbalance:
    return FixedImbalance(FixedImbalance.Settings(ranks=[rank], factor=k), seed=1)


@pytest.mark.parametrize("world", [1, 3, 4, 8])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_balanced_free_network_runs_at_p_over_step_time(optimizer, world):
    """Every step its compute alone; AD-PSGD's also the authors' per-step averaging with the shared buffer,
    which no network removes (sim_adpsgd; with a peer only)."""
    res = simulate(SimConfig(optimizer, world, WL, Network.free(), steps=60))
    averaging = WL.params * WL.averaging_s_per_param if optimizer == "adpsgd" and world > 1 else 0.0
    assert res.throughput == pytest.approx(world * BATCH / (STEP + averaging), rel=1e-9)
    assert res.wait_frac == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("k", [2.0, 3.5])
def test_allreduce_runs_at_the_slow_ranks_pace(k):
    res = simulate(SimConfig("allreduce", 8, WL, Network.free(), slow_rank(k, rank=5), steps=50))
    assert res.throughput == pytest.approx(8 * BATCH / (k * STEP), rel=1e-9)


def test_wagma_straggler_costs_only_the_limiter():
    """tau=3, one rank 6x slower (k >= tau+1): per sync period of tau+1 rounds the fast ranks take tau+1
    steps and then wait at the synchronous round for the slow rank's one step -- exactly k steps' time."""
    tau, k, world, periods = 3, 6.0, 8, 10
    res = simulate(
        SimConfig(
            "wagma",
            world,
            WL,
            Network.free(),
            slow_rank(k),
            typed("wagma", tau=tau, catch_up="skip"),
            steps=periods * (tau + 1),
        )
    )
    samples_per_period = ((world - 1) * (tau + 1) + 1) * BATCH
    assert res.time_s == pytest.approx(periods * k * STEP, rel=1e-9)
    assert res.throughput == pytest.approx(samples_per_period / (k * STEP), rel=1e-9)
    allreduce = simulate(
        SimConfig("allreduce", world, WL, Network.free(), slow_rank(k), steps=periods * (tau + 1))
    )
    assert res.throughput > 3 * allreduce.throughput


@pytest.mark.parametrize("k", [1.5, 2.0, 3.0])
def test_wagma_mild_straggler_within_limiter_bound(k):
    """k < tau+1: a sync period needs one slow step at least (the synchronous round waits for it) and lasts at
    most the fast ranks' tau+1 steps plus one slow step (the limiter). Rounds can outpace steps: a rank's
    activation pulls its group into the next round, so the fast ranks skip rounds too."""
    tau, world, periods = 10, 8, 6
    res = simulate(
        SimConfig(
            "wagma",
            world,
            WL,
            Network.free(),
            slow_rank(k, rank=3),
            typed("wagma", tau=tau, catch_up="skip"),
            steps=periods * (tau + 1),
        )
    )
    assert periods * k * STEP <= res.time_s + 1e-9
    assert res.time_s <= periods * (tau + 1 + k) * STEP + 1e-9
    allreduce = simulate(SimConfig("allreduce", world, WL, Network.free(), slow_rank(k, rank=3), steps=66))
    assert res.throughput > allreduce.throughput
    assert res.local_steps < periods * (tau + 1)  # the slow rank skipped rounds it joined passively
    assert res.staleness > 0


@pytest.mark.parametrize("catch_up", ["skip", "replay"])
def test_wagma_contributions_are_at_most_tau_rounds_stale_under_noise(catch_up):
    """The limiter's bound (docs/optimizers.md), in the model as in the engine (tests/test_wait_avoiding.py):
    under lognormal noise a rank whose post no round used fresh was dated to round 0, and the simulated mean
    staleness grew with the round number (77 at P = 64, 87 at 1,024, where tau = 10)."""
    from wagma_bench.imbalance import LognormalImbalance

    tau = 4
    noise = LognormalImbalance(LognormalImbalance.Settings(sigma=0.8), seed=3)
    res = simulate(
        SimConfig(
            "wagma",
            16,
            WL,
            Network.free(),
            noise,
            typed("wagma", tau=tau, catch_up=catch_up),
            steps=30 * (tau + 1),
        )
    )
    assert 0 < res.staleness <= tau


def test_wagma_replay_persistent_straggler_paces_every_period():
    """catch_up=replay: every rank runs every iteration, so the synchronous round waits for the slow
    rank's tau+1 steps: a persistent straggler is not hidden (the paper's imbalance is random)."""
    tau, k, world, periods = 3, 4.0, 8, 5
    res = simulate(
        SimConfig(
            "wagma",
            world,
            WL,
            Network.free(),
            slow_rank(k),
            typed("wagma", tau=tau),
            steps=periods * (tau + 1),
        )
    )
    assert res.time_s == pytest.approx(periods * (tau + 1) * k * STEP, rel=1e-9)
    assert res.local_steps == pytest.approx(periods * (tau + 1))


def test_wagma_replay_random_stragglers_between_the_bounds():
    """One random rank of 8 sleeps 3 steps per step: replay beats Allreduce-SGD's bound (c + d) and stays
    under the mean-speed bound c + d k / P."""
    world, d = 8, 3 * STEP
    imb = SharedDrawImbalance(SharedDrawImbalance.Settings(num_slow=1, delay_s=d), seed=2)
    res = simulate(SimConfig("wagma", world, WL, Network.free(), imb, typed("wagma", tau=10), steps=110))
    mean_bound = world * BATCH / (STEP + d / world)
    assert world * BATCH / (STEP + d) < res.throughput <= mean_bound * (1 + 1e-9)


def test_network_costs_slow_everyone_and_wagma_groups_are_cheaper():
    """Latency-bound (small model, slow network): a ring over a group of 4 takes 6 alphas, over 16 ranks
    30."""
    net = Network(Link(1e-3, 1e-9), Link(1e-3, 1e-9), 1, "ring")
    wl = Workload(step_s=STEP, batch=BATCH, params=1e3, compute="constant")
    ar = simulate(SimConfig("allreduce", 16, wl, net, steps=40))
    wg = simulate(SimConfig("wagma", 16, wl, net, steps=44))
    assert ar.throughput < 16 * BATCH / STEP
    assert wg.throughput > ar.throughput


def test_shared_draw_imbalance_delays_someone_every_step():
    imb = SharedDrawImbalance(SharedDrawImbalance.Settings(num_slow=2, delay_s=0.3), seed=1)
    res = simulate(
        SimConfig("local_sgd", 8, WL, Network.free(), imb, typed("local_sgd", sync_period=1), steps=20)
    )
    # every step someone sleeps 0.3 s and period=1 averages (a barrier) after every step
    assert res.time_s == pytest.approx(20 * (STEP + 0.3), rel=1e-9)


def test_independent_imbalance_paces_a_barrier_at_each_steps_slowest_rank():
    """period=1 averages after every step: a step lasts STEP plus delay_s where any rank drew a delay, STEP
    where none did. The simulator asks the model the trainer asks."""
    imb = IndependentImbalance(IndependentImbalance.Settings(delay_s=0.3, probability=0.1), seed=4)
    slow_steps = sum(any(imb.delay(r, 8, k, STEP) for r in range(8)) for k in range(20))
    assert 0 < slow_steps < 20
    res = simulate(
        SimConfig("local_sgd", 8, WL, Network.free(), imb, typed("local_sgd", sync_period=1), steps=20)
    )
    assert res.time_s == pytest.approx(20 * STEP + 0.3 * slow_steps, rel=1e-9)


def test_collective_formulas():
    link = Link(1e-6, 1e-9)
    assert allreduce_time("ring", 4, 1e6, link) == pytest.approx(6e-6 + 1.5e-3)
    assert allreduce_time("recursive_doubling", 8, 1e6, link) == pytest.approx(3 * (1e-6 + 1e-3))
    assert allreduce_time("tree", 8, 1e6, link) == pytest.approx(6 * (1e-6 + 1e-3))
    assert allreduce_time("auto", 8, 1.0, link) == allreduce_time("recursive_doubling", 8, 1.0, link)
    with pytest.raises(ValueError, match="ring"):
        allreduce_time("butterfly", 4, 1.0, link)


def test_calibration_recovers_alpha_beta_from_comm_bench_json(tmp_path):
    alpha, beta = 2.5e-5, 1 / 1.5e9
    link = Link(alpha, beta)
    results = [
        {
            "op": op,
            "impl": "ours",
            "group_size": p,
            "bytes": n,
            "median_s": allreduce_time("ring", p, n, link),
            "p10_s": 0.0,
            "p90_s": 0.0,
            "repeats": 10,
        }
        for op, p in (("allreduce", 4), ("group_allreduce", 2))
        for n in (4, 4096, 2**20, 2**24)
    ]
    results.append(
        {
            "op": "wait_avoiding",
            "impl": "ours",
            "group_size": 2,
            "bytes": 4,
            "median_s": 1.0,
            "p10_s": 1.0,
            "p90_s": 1.0,
            "repeats": 1,
        }
    )
    path = tmp_path / "bench.json"
    path.write_text(
        json.dumps(
            {
                "backend": "gloo",
                "world_size": 4,
                "hostname": "h",
                "copy_bandwidth_GBps": 5.0,
                "results": results,
            }
        )
    )
    runs, benches = find_inputs([path])
    assert runs == [] and len(benches) == 1
    net, report = fit_network(benches)
    assert report["algorithm"] == "ring"
    assert net.intra.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert net.intra.beta_s_per_byte == pytest.approx(beta, rel=1e-6)
    assert report["rel_rms"] < 1e-6


def _level_rows(link: Link, group_sizes: tuple[int, ...]) -> list[dict]:
    return [
        {
            "op": "group_allreduce",
            "impl": "ours",
            "group_size": p,
            "bytes": n,
            "groups": 1,
            "repeats": 2,
            "median_s": allreduce_time("ring", p, n, link),
            "p10_s": 0.0,
            "p90_s": 0.0,
        }
        for p in group_sizes
        for n in (4096, 2**20, 2**24)
    ]


def test_calibration_fits_each_link_level_of_a_comm_bench_across_hosts(tmp_path):
    """A comm-bench across hosts (srun, torchrun) holds its intra- and inter-node rows apart (``levels``):
    each level gets its own alpha and beta, one algorithm for both, and the bench's ranks a host as the node
    size. With one rank a host (no intra rows) the inter-node fit serves both levels, and the report says
    so."""
    intra, inter = Link(2e-6, 1 / 100e9), Link(1e-4, 1 / 10e9)
    hosts = ["n1"] * 4 + ["n2"] * 4 + ["n3"] * 4 + ["n4"] * 4
    bench = {
        "backend": "gloo",
        "world_size": 16,
        "hostname": "n1",
        "hosts": hosts,
        "results": _level_rows(Link(5e-5, 1 / 20e9), (2, 4, 8, 16)),  # mixed levels: not fitted
        "levels": {"intra": _level_rows(intra, (2, 4)), "inter": _level_rows(inter, (2, 4))},
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    net, report = fit_network(find_inputs([path])[1])
    assert report["algorithm"] == "ring" and report["notes"] == [] and net.gpus_per_node == 4
    assert (net.intra.alpha_s, net.intra.beta_s_per_byte) == pytest.approx(
        (intra.alpha_s, intra.beta_s_per_byte)
    )
    assert (net.inter.alpha_s, net.inter.beta_s_per_byte) == pytest.approx(
        (inter.alpha_s, inter.beta_s_per_byte)
    )
    assert report["levels"]["inter"]["bandwidth_GBps"] == pytest.approx(10.0)
    assert report["alpha_s"] == pytest.approx(inter.alpha_s)  # the former top-level keys: the inter-node link
    assert fit_network([bench], gpus_per_node=8)[0].gpus_per_node == 8  # a named cluster's node size wins
    del bench["levels"]["intra"]
    bench["hosts"] = ["n1", "n2", "n3", "n4"]
    net, report = fit_network([bench])
    assert (
        net.intra == net.inter
        and net.inter.alpha_s == pytest.approx(inter.alpha_s)
        and net.gpus_per_node == 1
    )
    assert not report["levels"]["intra"]["measured"] and report["levels"]["intra"]["from"] == "inter"
    note = "intra-node link not measured (one rank a host): the inter-node fit is used for both levels"
    assert report["notes"] == [note]


def test_a_comm_bench_file_from_one_host_still_calibrates_both_levels_alike():
    """The committed comm-bench files (one host, no ``levels``) read as before: their rows are the intra-node
    link's, used for both levels, every simulated group inside one node; the report says inter was not
    measured."""
    path = Path(__file__).parents[1] / "reproduce" / "commbench" / "gloo-4ranks-2core.json"
    net, report = fit_network(find_inputs([path])[1])
    assert net.intra == net.inter and net.gpus_per_node == 1024 and report["rows"] == 15
    assert report["levels"]["intra"]["measured"] and not report["levels"]["inter"]["measured"]
    assert report["notes"] == [
        "inter-node link not measured (one host): the intra-node fit is used for both levels"
    ]


def write_run(tmp_path: Path) -> Path:
    """A run directory as the trainer writes it: 2 ranks, 30 steps of 0.2 s compute, 0.05 s communication."""
    run = tmp_path / "run"
    (run / "steps").mkdir(parents=True)
    start = {
        "key": "run_start",
        "value": None,
        "time_ms": 0,
        "metadata": {
            "optimizer": "allreduce",
            "world_size": 2,
            "seed": 3,
            "imbalance": "none",
            "config": {"optimizer": {"name": "allreduce", "bucket_mb": 25}, "imbalance": {"name": "none"}},
        },
    }
    (run / "events.jsonl").write_text(json.dumps(start) + "\n")
    (run / "summary.json").write_text(json.dumps({"steps": 30, "throughput_samples_per_s": 100.0}))
    for r in range(2):
        t, lines = 0.0, []
        for s in range(1, 31):
            t += 0.2 + 0.05 + 0.01  # compute + comm + overhead
            lines.append(
                json.dumps(
                    {
                        "local_step": s,
                        "round": s,
                        "t": t,
                        "compute_s": 0.2,
                        "delay_s": 0.0,
                        "comm_s": 0.05,
                        "samples": 8,
                        "loss": 1.0,
                        "staleness": 0,
                    }
                )
            )
        (run / "steps" / f"rank{r}.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_fit_run_reads_step_records(tmp_path):
    fit = fit_run(write_run(tmp_path), params=1000)
    assert fit.world_size == 2 and fit.rounds == 30 and fit.seed == 3
    assert fit.overhead_s == pytest.approx(0.01, abs=1e-9)
    wl = fit.to_workload()
    assert wl.step_s == pytest.approx(0.2) and wl.batch == 8 and wl.params == 1000
    assert [len(seq) for seq in wl.trace] == [30, 30]  # every step of every rank, warm-up included


def test_fit_run_reads_a_run_recorded_under_the_former_name_paper(tmp_path):
    """Runs recorded before `paper` was renamed `shared_draw` (the same model) still calibrate."""
    run = write_run(tmp_path)
    events = run / "events.jsonl"
    start = json.loads(events.read_text())
    start["metadata"]["imbalance"] = "paper"
    start["metadata"]["config"]["imbalance"] = {"name": "paper", "num_slow": 1, "delay_s": 0.1}
    events.write_text(json.dumps(start) + "\n")
    assert fit_run(run, params=1000).imbalance == {"name": "shared_draw", "num_slow": 1, "delay_s": 0.1}


def test_calibrate_prints_resampled_and_trace_predictions(tmp_path, capsys):
    from wagma_bench.cli.simulate import main

    run = write_run(tmp_path)
    assert main(["--calibrate", str(run), "params=1000", "--out", str(tmp_path / "sim")]) == 0
    (row,) = json.loads((tmp_path / "sim" / "validation.json").read_text())
    assert row["measured"] == 100.0 and row["ratio"] == pytest.approx(row["predicted"] / 100.0)
    # constant compute times: resampling and replaying them are the same simulation
    assert row["predicted_trace"] == pytest.approx(row["predicted"], rel=1e-9)
    assert "predicted (trace)" in capsys.readouterr().out


def test_trace_replays_each_ranks_steps_in_order():
    """Two ranks whose compute alternates 0.1 s / 0.3 s in phase (as when ranks share cores and a sleeping
    one frees them): replayed, every allreduce step lasts the ranks' common time, mean 0.2 s; resampled iid
    from the pooled times, a step would last the slower of two draws, 0.25 s on average."""
    trace = ((0.1, 0.3) * 5, (0.1, 0.3) * 5)  # 10 recorded steps, simulated for 40
    wl = Workload(step_s=0.2, batch=BATCH, params=1e6, compute="trace", trace=trace)
    res = simulate(SimConfig("allreduce", 2, wl, Network.free(), steps=40, control_every=0))
    assert res.throughput == pytest.approx(2 * BATCH / 0.2, rel=1e-9)
    with pytest.raises(ValueError, match="one recorded sequence per rank"):
        simulate(SimConfig("allreduce", 3, wl, Network.free(), steps=4))


def test_control_exchanges_fall_on_sync_rounds():
    """The trainer's control exchange every CONTROL_EVERY rounds, rounded up to the sync period (the
    schedules module both import): local SGD with period 4 meets at rounds 12, 24, ...; period 11 at 11,
    22."""
    assert CONTROL_EVERY == 10
    assert [control_period(s) for s in (1, 2, 3, 4, 10, 11, 25)] == [10, 10, 12, 12, 10, 11, 25]
    run = SimState(
        SimConfig("local_sgd", 2, WL, Network.free(), settings=typed("local_sgd", sync_period=4), steps=48), 4
    )
    assert [r for r in range(1, 49) if run.is_control(r)] == [12, 24, 36, 48]
    run = SimState(
        SimConfig(
            "local_sgd",
            2,
            WL,
            Network.free(),
            settings=typed("local_sgd", sync_period=4),
            steps=48,
            control_every=0,
        ),
        4,
    )
    assert [r for r in range(1, 49) if run.is_control(r)] == [
        48
    ]  # only the end (the paper's implementations)


@pytest.mark.parametrize(
    "optimizer,settings",
    [
        ("wagma", {"tau": 3}),
        ("local_sgd", {"sync_period": 4}),
        ("eager", {"sync_period": 4}),
        ("adpsgd", {"sync_period": 4}),
        ("allreduce", {}),
    ],
)
def test_a_simulation_runs_exactly_its_budget_with_the_last_round_synchronous(optimizer, settings):
    """As a run does: 10 rounds whatever the sync period (once 12 under a period of 4), every rank's 10 steps
    counted with a slow rank among them, and the last round a control point (the trainer's meeting there)."""
    res = simulate(
        SimConfig(
            optimizer,
            4,
            WL,
            Network.free(),
            slow_rank(2.0, rank=1),
            settings=typed(optimizer, **settings),
            steps=10,
        )
    )
    assert res.rounds == 10 and res.local_steps == 10, res
    run = SimState(
        SimConfig(optimizer, 4, WL, Network.free(), settings=typed(optimizer, **settings), steps=10), 4
    )
    assert run.rounds == 10 and run.is_control(10)


def test_the_simulator_imports_no_torch():
    """`wagma-bench simulate` and the simulator's modules run without torch (about 1.3 s of CPU an import
    here): they read the optimizers' torch-free specs (optim/specs.py) and pure rules (optim/rules.py), never
    their classes. calibrate.py imports torch only inside model_params_of, for a run whose run_start did not
    log its model size. A fresh interpreter, so that what this session imported does not count."""
    from tests.proc_util import heavy_modules_after

    code = (
        "import wagma_bench.simulate.des, wagma_bench.simulate.costs, wagma_bench.simulate.presets\n"
        "import wagma_bench.simulate.calibrate, wagma_bench.cli.simulate"
    )
    assert heavy_modules_after(code, ("torch", "torchvision")) == []


def test_simulators_cover_the_optimizer_registry_and_take_its_settings():
    from tests.test_conformance import missing, simulation

    problems = missing(simulation)  # one model per optimizer, keyed by its spec
    problems += [
        f"wagma_bench/simulate/des.py: remove {spec.__name__} from SIMULATIONS (not a registered optimizer)"
        for spec in SIMULATIONS
        if spec not in OPTIMIZER_SPECS.values()
    ]
    assert not problems, "\n".join(problems)
    for name, algorithm in OPTIMIZERS.items():
        assert isinstance(SimConfig(name, 2, WL, Network.free()).settings, algorithm.Settings)  # its defaults
    assert SimConfig("eager", 2, WL, Network.free()).settings.mode == "majority"  # EagerSGD's, not a copy
    with pytest.raises(TypeError, match="WagmaSpec.Settings"):
        SimConfig("wagma", 2, WL, Network.free(), settings={"tau": 3})
    with pytest.raises(ValueError, match="unknown optimizer 'nope'"):
        SimConfig("nope", 2, WL, Network.free())


def test_local_sgd_momentum_averaging_sends_the_local_optimizers_state():
    """average_momentum sends the model and the local optimizer's state: SGD's momentum buffer (2 model
    sizes), AdamW's two moments (3 model sizes)."""
    assert local_state_tensors("sgd", 0.9) == 1 and local_state_tensors("sgd", 0.0) == 0
    assert local_state_tensors("adam", 0.0) == 2
    net = Network.from_profile({"inter": {"alpha_s": 0.0, "bandwidth_GBps": 1.0}}, 1)
    wl = Workload(step_s=STEP, batch=BATCH, params=1e6, compute="constant")
    avg = typed("local_sgd", sync_period=1, average_momentum=True)

    def comm_time(state: int) -> float:
        res = simulate(
            SimConfig("local_sgd", 2, wl, net, settings=avg, steps=10, control_every=0, local_state=state)
        )
        return res.time_s - 10 * STEP

    one = net.world_allreduce(2, wl.model_bytes)
    assert comm_time(1) == pytest.approx(10 * 2 * one) and comm_time(2) == pytest.approx(10 * 3 * one)


def test_cli_writes_table_and_plot(tmp_path, capsys):
    from wagma_bench.cli.simulate import main

    rc = main(
        [
            "cluster=generic8",
            "gpus=2,16",
            "optimizer=allreduce,wagma",
            "imbalance=shared_draw",
            "train.max_rounds=22",
            "samples_to_target=1e5",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    rows = json.loads((tmp_path / "predictions.json").read_text())
    assert {(r["optimizer"], r["world_size"]) for r in rows} == {
        (o, p) for o in ("allreduce", "wagma") for p in (2, 16)
    }
    assert (tmp_path / "throughput.png").stat().st_size > 0
    assert "| wagma | 16 |" in capsys.readouterr().out
    assert main(["optimizer=nope", "--out", str(tmp_path)]) == 2
    assert main(["cluster=moon", "--out", str(tmp_path)]) == 2


def test_eager_in_order_follows_a_persistent_straggler_but_not_a_random_one():
    """eager-SGD applies every round in order (one round per local step), so a rank that is always slow must
    still step through every round: the world goes at its pace. Random stragglers average out between
    the synchronous rounds, so there it beats Allreduce-SGD."""
    solo = typed("eager", mode="solo", sync_period=4)
    res = simulate(SimConfig("eager", 4, WL, Network.free(), slow_rank(6.0), solo, steps=40))
    assert res.local_steps == res.rounds == 40
    assert res.throughput == pytest.approx(4 * BATCH / (6.0 * STEP), rel=1e-9)
    imb = SharedDrawImbalance(SharedDrawImbalance.Settings(num_slow=1, delay_s=0.3), seed=1)
    eager = simulate(SimConfig("eager", 8, WL, Network.free(), imb, solo, steps=40))
    majority = simulate(
        SimConfig("eager", 8, WL, Network.free(), imb, dataclasses.replace(solo, mode="majority"), steps=40)
    )
    allreduce = simulate(SimConfig("allreduce", 8, WL, Network.free(), imb, steps=40))
    assert eager.throughput > majority.throughput > allreduce.throughput * 0.99
    assert eager.throughput > 1.15 * allreduce.throughput


def test_a_whole_slow_group_does_not_pace_wagma_rounds():
    """Activation spreads over the whole world (as the engine does): with both members of a P=4, S=2
    group 4x slow, skip-mode WAGMA's fast ranks run their rounds without them. With activation inside the
    group only (the engine before) the next stage's rounds waited for the slow pair: 1.42x here."""
    group = FixedImbalance(FixedImbalance.Settings(ranks=[2, 3], factor=4), seed=1)
    ar = simulate(SimConfig("allreduce", 4, WL, Network.free(), imbalance=group, steps=220, control_every=0))
    wa = simulate(
        SimConfig(
            "wagma",
            4,
            WL,
            Network.free(),
            imbalance=group,
            steps=220,
            control_every=0,
            settings=typed("wagma", catch_up="skip", group_size=2),
        )
    )
    assert wa.throughput > 1.8 * ar.throughput, (wa.throughput, ar.throughput)


def _stderr_of(capsys, main, argv: list[str]) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as stop:
        rc = stop.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("bad", [["optimizer=wagma", "optimizer.group_size=3"], ["imbalance.nonsense=1"]])
def test_simulate_refuses_what_run_refuses_with_runs_message(bad, tmp_path, capsys, monkeypatch):
    """One configuration: `simulate` composes conf/ and checks it as `run` does, before anything runs."""
    from wagma_bench.cli import main as wagma_bench
    from wagma_bench.cli.simulate import main as simulate_main

    monkeypatch.chdir(tmp_path)
    run_rc, run_err = _stderr_of(capsys, wagma_bench, ["run", *bad, f"hydra.run.dir={tmp_path}/run"])
    sim_rc, sim_err = _stderr_of(capsys, simulate_main, [*bad, "gpus=8", "--out", str(tmp_path / "sim")])
    assert run_rc != 0 and sim_rc == 2
    message = run_err.replace("wagma-bench run: error: ", "").split("\n\nSet the environment")[0].strip()
    assert message and sim_err == f"wagma-bench simulate: error: {message}\n", (run_err, sim_err)
    assert not (tmp_path / "sim").exists() and not (tmp_path / "run" / "events.jsonl").exists()


def test_simulate_accepts_runs_option_names(tmp_path, capsys):
    """Any override `run` takes is taken (and checked), whether or not the simulation depends on it."""
    from wagma_bench.cli.simulate import main as simulate_main

    rc = simulate_main(
        [
            "workload=resnet",
            "data=imagenet",
            "optimizer=local_sgd",
            "optimizer.sync_period=2",
            "train.lr=0.5",
            "comm=mpi",
            "logger=wandb",
            "eval.target=0.5",
            "seed=2",
            "launcher.nproc=8",
            "imbalance=shared_draw",
            "imbalance.delay_s=0.1",
            "gpus=8",
            "train.max_rounds=20",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    (row,) = json.loads((tmp_path / "predictions.json").read_text())
    assert (row["optimizer"], row["world_size"], row["workload"], row["rounds"]) == (
        "local_sgd",
        8,
        "resnet50",
        20,
    )


def test_simulate_reads_runs_batch_and_steps_and_refuses_epochs(tmp_path, capsys):
    """`run`'s train.max_rounds and train.batch_size are the simulation's rounds and batch (no second name);
    what a throughput model cannot honour is refused, not ignored."""
    from wagma_bench.cli.simulate import main as simulate_main

    base = ["workload=resnet", "data=imagenet", "optimizer=allreduce", "gpus=8"]
    out = ["--out", str(tmp_path)]
    assert simulate_main([*base, "train.max_rounds=30", "train.batch_size=64", "step_s=0.16", *out]) == 0
    (row,) = json.loads((tmp_path / "predictions.json").read_text())
    assert row["rounds"] == 30 and row["samples"] == 30 * 8 * 64
    for args, message in [
        (["train.epochs=3"], "simulate counts rounds, not epochs: give train.max_rounds=N"),
        (["steps=30"], "steps=30: simulate takes run's option names; give train.max_rounds=30"),
        (["batch=64"], "give train.batch_size=64"),
        (["train.batch_size=64"], "preset's step_s=0.32 s is one step at batch 128; give step_s="),
    ]:
        capsys.readouterr()
        assert simulate_main([*base, *args, *out]) == 2, args
        assert message in capsys.readouterr().err, args


def test_no_simulate_module_reads_yaml():
    """The simulator takes its configuration from Hydra's composition, not from its own YAML reading."""
    import ast

    import wagma_bench.simulate

    for path in Path(wagma_bench.simulate.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not [n for n in names if n.split(".")[0] == "yaml"], path.name


@pytest.mark.parametrize(
    "optimizer,settings",
    [
        ("local_sgd", {"sync_period": 4}),
        ("wagma", {"tau": 3}),
        ("dpsgd", {"outer_period": 4}),
        ("sgp", {"outer_period": 4}),
    ],
)
def test_an_outer_optimizer_adds_its_step_and_for_gossip_bases_a_global_average(optimizer, settings):
    """The same communication as the base plus, every outer period, the outer step's memory passes (and the
    global model allreduce D-PSGD and SGP lack); the identity rule costs the same as any other."""
    from wagma_bench.simulate.des import OUTER_PASSES

    net = Network(Link(1e-4, 1e-9), Link(1e-4, 1e-9), 8)
    world, steps = 8, 48
    plain = simulate(
        SimConfig(
            optimizer, world, WL, net, settings=typed(optimizer, **settings), steps=steps, control_every=0
        )
    )
    outer = simulate(
        SimConfig(
            optimizer,
            world,
            WL,
            net,
            steps=steps,
            control_every=0,
            settings=typed(optimizer, **settings, outer="slowmo", outer_lr=1.0, outer_momentum=0.0),
        )
    )
    per_step = OUTER_PASSES * WL.model_bytes / (WL.memory_GBps * 1e9)
    if optimizer in ("dpsgd", "sgp"):
        per_step += net.world_allreduce(world, WL.model_bytes)
    assert outer.time_s == pytest.approx(plain.time_s + steps / 4 * per_step, rel=1e-9)


def test_compute_from_takes_the_measured_spread_at_the_presets_speed(tmp_path, capsys):
    from wagma_bench.cli.simulate import main
    from wagma_bench.simulate.run_spread import measured_spread

    run = write_run(tmp_path)
    for r, times in ((0, [0.1] * 15 + [0.3] * 15), (1, [0.2] * 30)):  # rank 0 uneven, rank 1 even
        lines = [
            json.dumps(
                {
                    "local_step": s,
                    "round": s,
                    "t": 0.3 * s,
                    "compute_s": c,
                    "delay_s": 0.0,
                    "comm_s": 0.0,
                    "samples": 8,
                }
            )
            for s, c in enumerate(times, 1)
        ]
        (run / "steps" / f"rank{r}.jsonl").write_text("\n".join(lines) + "\n")
    shape = measured_spread([str(run)])
    # the calibration's warm-up left out (its first 4 steps per rank): 11 x 0.1, 15 x 0.3, 26 x 0.2; median
    # 0.2
    assert sorted(set(shape)) == pytest.approx([0.5, 1.0, 1.5])
    assert len(shape) == 52 and shape.count(1.0) == 26 and shape.count(0.5) == 11
    out = tmp_path / "sim"
    base = [
        "workload=resnet",
        "data=imagenet",
        "optimizer=allreduce",
        "gpus=8",
        "train.max_rounds=50",
        "control_every=0",
        "--out",
    ]
    assert main([*base, str(out / "preset")]) == 0
    assert main([*base, str(out / "measured"), "--compute-from", str(run)]) == 0
    preset, measured = (
        json.loads((out / k / "predictions.json").read_text())[0]["throughput"]
        for k in ("preset", "measured")
    )
    assert measured < 0.8 * preset  # Allreduce-SGD waits for the slowest of 8 draws of up to 1.5x the median
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*base, str(out / "x"), "--compute-from"])
    (run / "steps" / "rank0.jsonl").unlink()
    (run / "steps" / "rank1.jsonl").unlink()
    assert main([*base, str(out / "y"), "--compute-from", str(run)]) == 2
    assert "--compute-from" in capsys.readouterr().err


def test_compute_from_pools_whole_rollout_cycles_of_a_reinforcement_learning_run(tmp_path):
    """DD-PPO's step records: a rollout step (fresh frames) and then PPO updates on the same rollout (no
    samples). The simulator's RL step is the whole cycle, so the spread is of cycles, not of steps (a pool of
    steps would read the rollout/update alternation as a 20x imbalance)."""
    from wagma_bench.simulate.run_spread import measured_spread

    run = write_run(tmp_path)
    rollouts = {0: [2.0, 2.0, 3.0, 2.0, 2.0, 3.0], 1: [2.0, 1.0, 2.0, 2.0, 2.0, 2.0]}
    for rank, times in rollouts.items():
        steps = [(t, 8) if k == 0 else (0.1, 0) for t in times for k in range(4)] + [(2.0, 8), (0.1, 0)]
        lines = [
            json.dumps(
                {
                    "local_step": s,
                    "round": s,
                    "t": 2.5 * s,
                    "compute_s": c,
                    "delay_s": 0.0,
                    "comm_s": 0.0,
                    "samples": n,
                }
            )
            for s, (c, n) in enumerate(steps, 1)
        ]
        (run / "steps" / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    # per rank: the warm-up steps (the first 4) left out, and the last, unfinished cycle; the cycles 2.3 s
    # (7 of them), 3.3 s (2) and 1.3 s (1), over their median 2.3 s
    shape = sorted(measured_spread([str(run)]))
    assert shape == pytest.approx([1.3 / 2.3] + [1.0] * 7 + [3.3 / 2.3] * 2)


def test_control_exchange_size_is_the_trainers_control_tensor():
    import dataclasses

    from wagma_bench.simulate.des import CONTROL_BYTES
    from wagma_bench.train.state import ControlFlags

    assert (
        CONTROL_BYTES == ControlFlags().to_tensor("cpu").nbytes == 8 * len(dataclasses.fields(ControlFlags))
    )


def test_streaming_diloco_hides_a_fragments_average_behind_its_delay():
    """On a slow network, a fragment's average started a round early is waited for less than one that blocks,
    and the waits are those of F averages of a 1/F share of the model each period."""
    link = Link(alpha_s=1e-3, beta_s_per_byte=STEP / 4e6)  # the whole model (4 MB) in about one step
    net = Network(intra=link, inter=link)
    waits = {}
    for fragments, delay in ((1, 0), (2, 0), (2, 1)):
        settings = typed(
            "local_sgd", sync_period=8, outer="nesterov", fragments=fragments, fragment_delay=delay
        )
        waits[fragments, delay] = simulate(
            SimConfig("local_sgd", 8, WL, net, settings=settings, steps=80)
        ).wait_frac
    assert waits[2, 1] < waits[2, 0]
    assert waits[2, 1] < waits[1, 0]


def test_dropcompute_drops_a_slow_ranks_late_micro_batches_and_gains_throughput():
    slow = slow_rank(4.0, rank=2)
    allreduce = simulate(SimConfig("allreduce", 4, WL, Network.free(), slow, steps=80))
    drop = simulate(
        SimConfig(
            "dropcompute", 4, WL, Network.free(), slow, typed("dropcompute", calibrate_steps=10), steps=80
        )
    )
    assert drop.extra["drop_rate"] > 0.1 and drop.extra["threshold_s"] is not None
    assert drop.throughput > 1.5 * allreduce.throughput


@pytest.mark.parametrize(
    "args,said",
    [
        (
            ["cluster.network.inter.bandwidth_GBps=-1"],
            "cluster.network.inter.bandwidth_GBps=-1 is not allowed",
        ),
        (["cluster.network.inter.bandwidth_GBps=0"], "cluster.network.inter.bandwidth_GBps=0 is not allowed"),
        (["cluster.network.intra.alpha_s=-0.5"], "cluster.network.intra.alpha_s=-0.5 is not allowed"),
        (
            ["cluster.network.inter.bandwidth_GBps=nan"],
            "cluster.network.inter.bandwidth_GBps=nan is not allowed",
        ),
        (["gpus=0"], "gpus=0 is not allowed"),
        (["gpus=10000000"], "gpus=10000000 is not allowed"),
        (["gpus=8,100000", "train.max_rounds=5"], "gpus=100000 is not allowed"),
    ],
)
def test_simulate_refuses_bad_numbers_in_one_line_naming_the_key_as_typed(args, said, tmp_path, capsys):
    """Before anything is simulated or written: exit 2, one line, the key as the user typed it (not the
    cluster file's path for a value given on the command line, not `world_size` for gpus)."""
    rc = simulate_main(["optimizer=allreduce,wagma", *args, "--out", str(tmp_path / "sim")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and said in err[0], err
    assert not (tmp_path / "sim").exists()  # refused before any simulation: nothing written


@pytest.mark.parametrize("content", ["", "not json", '{"world_size": 4}'])
def test_calibrate_refuses_a_file_that_is_not_comm_bench_json(content, tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(content)
    rc = simulate_main(["--calibrate", str(bench), "--out", str(tmp_path / "sim")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"{bench}" in err[0] and "comm-bench JSON" in err[0], err
    assert not (tmp_path / "sim").exists()


def test_calibrate_refuses_a_folder_with_nothing_to_calibrate(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    rc = simulate_main(["--calibrate", str(tmp_path / "empty"), "--out", str(tmp_path / "sim")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "no run directory" in err[0], err
    assert not (tmp_path / "sim").exists()


# the phases each model says it is in (SimConfig.progress), beside "compute times" that every one starts with
PHASES = {
    "adpsgd": {"compute schedule", "matchings", "exchanges", "exchanges' step lag", "time in exchanges"},
    "sgp": {"exponential graph", "rounds"},
}


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_every_model_says_where_it_is_every_round_and_the_numbers_do_not_change(optimizer):
    """A long simulation tells its caller where it is in every phase, every round of a round loop, with
    fractions that only grow within a phase; listening changes no number of the result."""
    told: list[tuple[str, float]] = []
    net = Network(Link(1e-5, 1 / 10e9), Link(1e-5, 1 / 10e9), gpus_per_node=4)
    workload = dataclasses.replace(WL, compute="lognormal", sigma=0.3)
    cfg = SimConfig(
        optimizer,
        16,
        workload,
        net,
        IndependentImbalance(IndependentImbalance.Settings(), seed=1),
        steps=40,
        progress=lambda phase, fraction: told.append((phase, fraction)),
    )
    res = simulate(cfg)
    assert res == simulate(dataclasses.replace(cfg, progress=None))
    phases = {phase for phase, _ in told}
    assert phases >= {"compute times"} | PHASES.get(optimizer, {"rounds"}), phases
    assert all(0.0 <= f <= 1.0 for _, f in told), told
    for phase in phases:
        fractions = [f for p, f in told if p == phase]
        if phase in ("rounds", "compute schedule"):
            assert len(fractions) >= res.rounds, (phase, len(fractions))
            assert fractions[: res.rounds] == sorted(fractions[: res.rounds]), phase


def test_a_long_simulate_prints_progress_at_least_every_period(tmp_path, monkeypatch):
    """At 65,536 GPUs a loaded machine saw a line after 6 s and none for the next 294 s: lines came only
    between simulations. Here a smaller world whose AD-PSGD and DropCompute simulations each take seconds,
    with the period shortened to 0.5 s: every gap between lines stays within it plus a margin for a loaded
    machine, and lines come from inside each long simulation."""
    import sys
    import time

    from wagma_bench.simulate import progress

    lines: list[tuple[float, str]] = []

    class Stamped:  # stderr, each line with the time it was written
        def write(self, text: str) -> None:
            lines.extend((time.monotonic(), line) for line in text.splitlines() if line.strip())

        def flush(self) -> None:
            pass

    period, margin = 0.5, 1.5
    monkeypatch.setattr(progress, "PROGRESS_EVERY_S", period)
    monkeypatch.setattr(sys, "stderr", Stamped())
    assert (
        simulate_main(
            ["gpus=16384", "optimizer=adpsgd,dropcompute", "train.max_rounds=200", "--out", str(tmp_path)]
        )
        == 0
    )
    monkeypatch.undo()
    text = "\n".join(line for _, line in lines)
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(lines)]
    assert len(lines) >= 4 and max(gaps) < period + margin, (max(gaps, default=None), text)
    assert any("adpsgd at P=16384: " in line and "%" in line for _, line in lines), text  # from inside it
    assert any(
        line.startswith("[simulate 2/2 ") and "dropcompute at P=16384: " in line for _, line in lines
    ), text


def test_interval_progress_lines_say_the_last_stage_done(monkeypatch, capsys):
    """simulate --interval's lines come mostly from inside its simulations: each also says the last replicate
    (or sensitivity point, structure, flip search) finished, so a user sees how far the whole command is."""
    from wagma_bench.simulate import progress

    monkeypatch.setattr(progress, "PROGRESS_EVERY_S", 0.0)
    ticker = progress.Ticker(0, "simulate --interval")
    tick = ticker.simulation("adpsgd at P=64")
    tick("exchanges", 0.5)
    ticker.note("replicate 37/100")
    tick("exchanges", 0.75)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith("adpsgd at P=64: exchanges 50%")
    assert lines[1].endswith("] replicate 37/100")
    assert lines[2].split("] ", 1)[1].startswith("adpsgd at P=64: exchanges 75%")
    assert lines[2].endswith(" (done: replicate 37/100)")
