"""The asynchronous baselines (AD-PSGD, eager-SGD) on real gloo worlds with a slow rank.

- Shut down cleanly: ``close`` at a common point stops every background thread.
- Wait avoidance: a rank that is 30x slower (and several times slower than a round) does not slow the others'
  steps (AD-PSGD, solo eager-SGD; with majority the others wait whenever the slow rank is the round's
  initiator, by design).
- eager-SGD's oracle: with constant per-rank gradients a stale contribution equals a fresh one, so, however
  the rounds were activated, every rank applies exactly the global mean gradient every round and all
  models stay bit-identical.
- A peer killed mid-run (SIGKILL, no goodbye) makes the survivors fail with a CommError that says what
  failed, within the communicator's timeout, instead of hanging.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from tests.optim_util import Vector, flat_params, make_algorithm, run_world, sgd

STEPS = 20
# A rank's step: 5 ms of compute, or 150 ms for the slow rank. A round's communication alone costs 15-40 ms
# here (four ranks' progress, listener and gloo threads on two cores; 90 ms seen), so the slow rank must be
# far slower than a round, not just than the others' compute, for its pace to show in the others' time.
FAST_S, SLOW_S = 0.005, 0.15
CASES = {  # id: (optimizer, settings, checks wait avoidance)
    "adpsgd": ("adpsgd", {}, True),
    "eager-solo": ("eager", {"mode": "solo", "sync_period": STEPS}, True),
    "eager-majority": ("eager", {"mode": "majority", "sync_period": STEPS}, False),
}


def _step(algo, rank, sleep_s, constant):
    algo.zero_grad()
    for b in algo.buckets:
        if constant:
            b.grad.fill_(rank + 1.0)
        else:
            b.grad.normal_()
    time.sleep(sleep_s)
    return algo.step()


def _slow_rank_run(comm, name, settings):
    eager = name == "eager"
    algo = make_algorithm(
        name, comm, Vector(64, 0.0 if eager else comm.rank), sgd(lr=0.5 if eager else 0.01), **settings
    )
    slow = comm.rank == 1
    t0 = time.perf_counter()
    rounds = [_step(algo, comm.rank, SLOW_S if slow else FAST_S, eager).round for _ in range(STEPS - 1)]
    elapsed = time.perf_counter() - t0  # before the last round, a synchronous one for eager
    rounds.append(_step(algo, comm.rank, 0.0, eager).round)
    comm.barrier()  # the common point where the trainer would call close()
    algo.close()
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
    return {
        "elapsed": elapsed,
        "slow": slow,
        "exchanges": getattr(algo, "exchanges", None),
        "threads": threads,
        "rounds": rounds,
        "params": flat_params(algo.model),
    }


@pytest.mark.serial
@pytest.mark.parametrize("case", list(CASES))
def test_slow_rank_clean_shutdown_and_wait_avoidance(case):
    name, settings, wait_avoiding = CASES[case]
    world = 4
    results = run_world(_slow_rank_run, world, name, settings, timeout_s=90)
    for rank, res in enumerate(results):
        assert res["threads"] == [], f"rank {rank} still runs {res['threads']} after close()"
        assert res["rounds"] == list(range(1, STEPS + 1)), res["rounds"]
        if res["exchanges"] is not None:
            assert res["exchanges"] > 0, f"rank {rank} never averaged"
    if name == "eager":
        mean_grad = sum(r + 1.0 for r in range(world)) / world
        expected = torch.zeros_like(results[0]["params"])
        for _ in range(STEPS):
            expected -= 0.5 * mean_grad
        for rank, res in enumerate(results):
            assert torch.equal(res["params"], expected), (rank, res["params"][:4], expected[:4])
    if wait_avoiding:
        slow = next(r["elapsed"] for r in results if r["slow"])
        fast = [r["elapsed"] for r in results if not r["slow"]]
        # dragged to the slow rank's pace, the fast ranks would take as long as it does (19 x 150 ms); not
        # dragged, 19 x (5 ms + a round), 0.2-0.4 of that here
        assert max(fast) < 0.6 * slow, (fast, slow)


def _killed_peer(comm, name, settings):
    algo = make_algorithm(name, comm, Vector(64, comm.rank), sgd(lr=0.01), **settings)
    for _ in range(5):
        _step(algo, comm.rank, 0.01, False)
    comm.barrier()
    if comm.rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    # the survivors keep training and then meet at a synchronisation point, as under the trainer
    for _ in range(40):
        _step(algo, comm.rank, 0.01, False)
    comm.barrier()
    algo.close()
    return "no error"


@pytest.mark.parametrize("case", ["adpsgd", "eager-solo"])
def test_killed_peer_gives_a_clear_error_not_a_hang(case):
    name, settings, _ = CASES[case]
    results = run_world(_killed_peer, 4, name, settings, comm_timeout_s=15, timeout_s=90, allow_errors=True)
    assert results[3] is None  # killed: no report
    for rank in range(3):
        res = results[rank]
        assert isinstance(res, tuple) and res[0] == "error", (
            f"rank {rank} did not notice the dead peer: {res}"
        )
        assert res[1] == "CommError", res
        assert "failed" in res[2], res
