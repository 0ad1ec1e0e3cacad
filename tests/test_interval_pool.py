"""``simulate --interval``'s simulations memoised and run in worker processes (simulate/pool.py): the same
interval to the bit as every prediction simulated afresh in one process, whatever the number of processes; a
worker's failure ends the command in one line and leaves no process running; a rerun after a failure
simulates only what the failed run had not (simulate/resume.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from concurrent.futures import Future

import pytest

from wagma_bench.cli.simulate import parse
from wagma_bench.errors import OperationFailed, SymlinkRefused
from wagma_bench.imbalance import make_imbalance
from wagma_bench.simulate import pool as pool_module
from wagma_bench.simulate.configure import compose_runs, load_network, model_inputs, sim_config
from wagma_bench.simulate.des import SimConfig, Workload, simulate, simulated_optimizers
from wagma_bench.simulate.feed import LATER, URGENT, Feed
from wagma_bench.simulate.gossip_inputs import mixed_samples_to_target
from wagma_bench.simulate.pool import ADPSGD_ONLY, SimulationPool, sim_key
from wagma_bench.simulate.progress import Ticker
from wagma_bench.simulate.resume import fingerprint
from wagma_bench.simulate.uncertainty import Inputs, Sources, uncertainty

GPUS, STEPS = [4], 12


@pytest.fixture(scope="module")
def case():
    """Three optimizers at 4 ranks, an injected imbalance, a measured spread and c resampled, samples
    to target (AD-PSGD's mixed with its exchanges per step): every knob, structure and metric."""
    req, _ = parse(["gpus=4", "optimizer=wagma,adpsgd,allreduce", "imbalance=independent", "control_every=0"])
    runs = compose_runs(req)
    workload, network = model_inputs(req, runs)
    workload = dataclasses.replace(workload, compute="empirical", samples=(0.3, 0.33, 0.36, 0.5))
    first = next(iter(runs.values()))
    conv = {"wagma": 4e5, "adpsgd": 3e5, "allreduce": 5e5}
    base = Inputs(workload, network, make_imbalance(first.imbalance, first.seed), conv, 0, first.seed)
    sources = Sources([[0.9, 1.0, 1.3], [1.0, 1.1], [0.8, 1.0, 2.0]], "empirical", {}, [0.2, 0.35, 0.5])
    return runs, base, sources


def plain(runs, base):
    """Every optimizer simulated afresh for every prediction, in this process (the code before the pool)."""

    def predict(inputs):
        out = {}
        for p in GPUS:
            for name, run in runs.items():
                res = simulate(
                    sim_config(
                        run,
                        p,
                        inputs.workload,
                        inputs.network,
                        inputs.imbalance,
                        STEPS,
                        inputs.control_every,
                        inputs.seed,
                    )
                )
                stt, _ = mixed_samples_to_target(res.row(), inputs.samples_to_target.get(name))
                out.setdefault(p, {})[name] = {
                    "throughput": res.throughput,
                    "time_to_target_s": stt / res.throughput if stt else None,
                }
        return out

    return predict


@pytest.fixture(scope="module")
def expected(case):
    """The interval with every prediction simulated afresh in one process, as JSON (every float to the
    bit: its shortest exact repr)."""
    runs, base, sources = case
    text = json.dumps(uncertainty(plain(runs, base), base, sources, 2))
    assert '"crossings": [0.' in text or '"crossings": [1' in text, "the case must find a flip"
    return text


def test_memoised_pooled_interval_in_two_processes_equals_the_plain_one_to_the_bit(case, expected):
    runs, base, sources = case
    with SimulationPool(runs, GPUS, STEPS, 2, Ticker(0)) as pool:
        got = uncertainty(pool.predict, base, sources, 2, many=pool.predict_many, threads=2)
        asked, simulated = pool.asked, pool.simulated
    assert json.dumps(got) == expected
    assert simulated < asked, (simulated, asked)  # the memo is used


def test_a_rerun_after_a_late_failure_simulates_only_the_rest_and_gives_the_same_interval(
    case, expected, tmp_path, monkeypatch
):
    runs, base, sources = case
    keep, command = tmp_path / ".sim.interval-resume.json", fingerprint(runs, STEPS)
    real, calls = pool_module._simulate_row, []

    def fails_late(*args):
        calls.append(args)
        if len(calls) > 100:
            raise RuntimeError("a late failure")
        return real(*args)

    monkeypatch.setattr(pool_module, "_simulate_row", fails_late)
    first = SimulationPool(runs, GPUS, STEPS, 1, Ticker(0), keep, command)
    with pytest.raises(RuntimeError, match="a late failure"), first:
        uncertainty(first.predict, base, sources, 2, many=first.predict_many)
    monkeypatch.setattr(pool_module, "_simulate_row", real)
    with SimulationPool(runs, GPUS, STEPS, 1, Ticker(0), keep, command) as pool:
        got = uncertainty(pool.predict, base, sources, 2, many=pool.predict_many)
        assert pool.resumed == 100 and pool.simulated > 100
    assert json.dumps(got) == expected
    # another command's file (other rounds: another fingerprint) is not used
    with SimulationPool(runs, GPUS, STEPS, 1, Ticker(0), keep, fingerprint(runs, STEPS + 1)) as pool:
        pool.predict(base)
        assert pool.resumed == 0
    keep.unlink()  # a link planted there is refused, never read or written through
    keep.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(SymlinkRefused, match="symbolic link"):
        SimulationPool(runs, GPUS, STEPS, 1, Ticker(0), keep, command)


def test_the_keys_only_adpsgd_reads_leave_every_other_optimizer_the_same_to_the_bit():
    """The memo's claim (pool.ADPSGD_ONLY): moving them changes no other optimizer's simulation."""
    wl = Workload(step_s=0.3, sigma=0.3, params=1e6)
    moved = dataclasses.replace(wl, gossip_cost=0.9, adpsgd_averaging="none", averaging_s_per_param=1e-8)
    assert {f.name for f in dataclasses.fields(Workload)} >= set(ADPSGD_ONLY)
    for name in simulated_optimizers():
        rows = [
            simulate(SimConfig(name, 4, w, daint(), steps=12, control_every=0)).row() for w in (wl, moved)
        ]
        assert (repr(rows[0]) == repr(rows[1])) == (name != "adpsgd"), name
        inputs = [Inputs(w, daint(), None, {}, 0, 1) for w in (wl, moved)]
        assert (sim_key(name, 4, inputs[0]) == sim_key(name, 4, inputs[1])) == (name != "adpsgd"), name


def daint():
    return load_network("daint", [])


def _fails(how):
    """A stand-in for one simulation in a worker: AD-PSGD's fails as ``how`` says, the others' end."""

    def run(run, world, inputs, steps, ticker):
        if run.optimizer.name != "adpsgd":
            return {"optimizer": run.optimizer.name, "world_size": world, "throughput": 1.0}
        if how == "raise":
            raise ValueError("adpsgd: a value the model cannot take")
        if how == "die":
            os._exit(9)
        time.sleep(60)  # hangs

    return run


@pytest.mark.parametrize(
    "how,said",
    [
        ("raise", "adpsgd: a value the model cannot take"),
        ("die", "simulate --interval: a worker process died during the first prediction"),
        ("hang", "simulate --interval: no simulation finished in 0.5 s during the first prediction"),
    ],
)
def test_a_failing_worker_ends_the_predictions_in_one_line_and_leaves_nothing_running(
    case, monkeypatch, how, said
):
    runs, base, _ = case
    monkeypatch.setattr(pool_module, "_simulate_row", _fails(how))
    monkeypatch.setattr(pool_module, "STALL_S", 0.5)
    started = time.monotonic()
    pool = SimulationPool(runs, GPUS, STEPS, 2, Ticker(0))
    with pytest.raises((ValueError, OperationFailed)) as err, pool:
        list(pool.predict_many([base, base]))
    assert said in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, ValueError if how == "raise" else OperationFailed)
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 5  # a broken pool's own thread may be reaping them as we look
    while time.monotonic() < deadline and any(alive(p.pid) for p in pool._processes):
        time.sleep(0.05)
    assert not any(alive(p.pid) for p in pool._processes)


KILLED_COMMAND = """
import sys, time
from types import SimpleNamespace
from wagma_bench.simulate import pool
from wagma_bench.simulate.costs import Network
from wagma_bench.simulate.des import Workload
from wagma_bench.simulate.progress import Ticker
from wagma_bench.simulate.uncertainty import Inputs

pool._simulate_row = lambda *args: time.sleep(600)  # a long simulation
runs = {"x": SimpleNamespace(optimizer=SimpleNamespace(name="x"))}
p = pool.SimulationPool(runs, [4, 8], 10, 2, Ticker(0))
pending = p.predict_many([Inputs(Workload(), Network.free(), None, {}, 0, 1)])
print(" ".join(str(pid) for pid in p._executor._processes), flush=True)
time.sleep(600)
"""


def test_workers_end_with_a_command_killed_before_it_could_stop_them():
    """SIGKILL runs no ``finally``: the workers end by themselves (PR_SET_PDEATHSIG), never left running."""
    import signal
    import subprocess
    import sys

    command = subprocess.Popen([sys.executable, "-c", KILLED_COMMAND], stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in command.stdout.readline().split()]
    assert len(workers) == 2
    command.send_signal(signal.SIGKILL)
    command.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(pid) for pid in workers):
        time.sleep(0.05)
    assert not any(alive(pid) for pid in workers), workers


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie has ended (its parent, init, reaps it)
    except FileNotFoundError:
        return False


def test_simulate_interval_keeps_its_simulations_beside_out_on_a_failure_and_a_rerun_resumes(
    tmp_path, monkeypatch, capsys
):
    from wagma_bench.cli.simulate import main as simulate_main
    from wagma_bench.simulate.resume import resume_path

    out = tmp_path / "sim"
    args = [
        "gpus=4",
        "optimizer=wagma,allreduce",
        "train.max_rounds=10",
        "control_every=0",
        "--interval",
        "1",
    ]
    args += ["--jobs", "1", "--out", str(out)]
    real, calls = pool_module._simulate_row, []

    def disk_fails(*a):
        calls.append(a)
        if len(calls) > 20:
            raise OSError(28, "No space left on device")
        return real(*a)

    monkeypatch.setattr(pool_module, "_simulate_row", disk_fails)
    assert simulate_main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "wagma-bench simulate: error: [Errno 28] No space left on device"
    assert resume_path(out).exists() and not out.exists()
    monkeypatch.setattr(pool_module, "_simulate_row", real)
    assert simulate_main(args) == 0
    assert "resuming: 20 simulations done before" in capsys.readouterr().err
    assert (out / "interval.json").exists() and not resume_path(out).exists()


def test_a_hierarchical_allreduce_on_one_rank_a_node_is_the_rings_simulation():
    """Piz Daint has one GPU a node: its structures' hierarchical allreduce (simulate/structures.py) is the
    flat ring's simulation to the bit, so the memo keys them as one (Network.as_costed); four a node, not."""
    ring = dataclasses.replace(daint(), allreduce="ring", _cache={})
    hier = dataclasses.replace(ring, allreduce="hierarchical", _cache={})
    assert ring.gpus_per_node == 1
    for name in ("allreduce", "wagma", "adpsgd"):
        rows = [
            simulate(SimConfig(name, 6, Workload(sigma=0.3, params=1e6), net, steps=8, control_every=3)).row()
            for net in (ring, hier)
        ]
        assert repr(rows[0]) == repr(rows[1]), name
        keys = [sim_key(name, 6, Inputs(Workload(), net, None, {}, 0, 1)) for net in (ring, hier)]
        assert keys[0] == keys[1], name
    four = [dataclasses.replace(net, gpus_per_node=4, _cache={}) for net in (ring, hier)]
    assert sim_key("allreduce", 8, Inputs(Workload(), four[0], None, {}, 0, 1)) != sim_key(
        "allreduce", 8, Inputs(Workload(), four[1], None, {}, 0, 1)
    )


class _Recording:
    """An executor that runs each simulation at once and records the order it was handed them."""

    def __init__(self):
        self.order = []

    def submit(self, fn, *args):
        self.order.append(args[0])
        done = Future()
        done.set_result(fn(*args))
        return done


def test_the_queue_hands_out_what_is_waited_for_first_then_the_longest_expected_first():
    executor = _Recording()
    feed = Feed(executor, 1, lambda name, world, inputs: name, lambda: None)
    with feed.held():  # a batch queued whole: nothing handed out before its end
        bulk = [feed.put(LATER, cost, name, 4, None) for name, cost in (("a", 1.0), ("b", 3.0), ("c", 2.0))]
        urgent = [feed.put(URGENT, cost, name, 4, None) for name, cost in (("d", 0.1), ("e", 0.5))]
        feed.hurry(bulk[0], URGENT)  # a point something now waits for, queued for later before
        assert executor.order == []
    assert [f.result(timeout=5) for f in bulk + urgent] == ["a", "b", "c", "d", "e"]
    assert executor.order == ["a", "e", "d", "b", "c"]
    late = feed.put(LATER, 1.0, "f", 4, None)
    assert late.result(timeout=5) == "f"
    with feed.held():
        left = feed.put(LATER, 1.0, "g", 4, None)
        feed.close()
    assert left.cancelled() and executor.order[-1] == "f"
