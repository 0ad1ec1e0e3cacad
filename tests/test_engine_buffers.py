"""The wait-avoiding engine's memory: at most two model-sized buffers beyond the model.

The count does not ask the engine: it walks every tensor the engine object holds (attributes, lists,
queues) and counts the distinct storages of at least the model's size, other than the model's own. It is
sampled after every step of a real WAGMA-SGD run with a straggler, so passive rounds, results kept for a
late rank and rounds in flight are all seen. What comm-bench reports of it (extra buffers, the round's
breakdown): tests/test_commbench.py."""

from __future__ import annotations

import time
from collections import deque

import pytest
import torch

from tests.optim_util import Vector, make_algorithm, run_world, sgd

DIM = 4096


def model_sized_storages(obj, numel: int, out: set[int] | None = None) -> set[int]:
    """Storage addresses of the tensors of at least ``numel`` elements reachable from ``obj``'s attributes
    and containers (not through other objects: the communicators are not the engine's memory)."""
    out = set() if out is None else out
    if isinstance(obj, torch.Tensor):
        if obj.numel() >= numel:
            out.add(obj.untyped_storage().data_ptr())
    elif isinstance(obj, (list, tuple, deque, set)):
        for item in obj:
            model_sized_storages(item, numel, out)
    elif isinstance(obj, dict):
        for item in obj.values():
            model_sized_storages(item, numel, out)
    return out


def _count_during_run(comm, catch_up):
    algo = make_algorithm(
        "wagma", comm, Vector(DIM, comm.rank), sgd(lr=0.01), group_size=2, tau=3, catch_up=catch_up
    )
    model = algo.data.untyped_storage().data_ptr()
    numel = algo.data.numel()
    counts, reported = [], []
    while True:
        for p in algo.model.parameters():
            p.grad.fill_(1.0)
        time.sleep(0.03 if comm.rank == 0 else 0.0)  # rank 0 late: its progress thread runs rounds passively
        info = algo.step()
        counts.append(len(model_sized_storages(vars(algo.engine), numel) - {model}))
        reported.append(algo.engine.extra_buffers())
        if info.round >= 12 and info.round % algo.sync_period == 0:
            break
    comm.barrier()
    algo.close()
    return {"counts": counts, "reported": reported, "bytes": numel * 4}


@pytest.mark.parametrize("catch_up", ["replay", "skip"])
def test_the_engine_holds_at_most_two_model_sized_buffers_beyond_the_model(catch_up):
    for res in run_world(_count_during_run, 2, catch_up):
        assert max(res["counts"]) <= 2, res["counts"]
        # what the engine reports (comm-bench prints it) is what it holds
        assert [n for n, _ in res["reported"]] == res["counts"]
        assert all(nbytes == n * res["bytes"] for n, nbytes in res["reported"])
