"""Real local gloo worlds for the tests, started from a fork server.

A fork server that has already imported torch starts a rank in about a second (spawning re-imports torch
in every rank: 10-50 s for 8 ranks on a loaded 2-core machine). Every rank reports its result or its
exception through a queue; the parent gives up after ``timeout_s``, kills the ranks and fails, so a hang
becomes a test failure instead of a stuck suite.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import time
import traceback

import torch
from torch import nn

# This module is preloaded too: importing it builds one torch optimizer, whose first construction
# imports torch._dynamo (5-20 s), so that the ranks forked from the server do not each pay for it; then what
# the preload made is frozen (tests/server_freeze.py).
_PRELOAD = [
    "torch",
    "torch.distributed",
    "wagma_bench.comm.torch_dist",
    "wagma_bench.optim",
    __name__,
    "tests.server_freeze",
]
torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)


class RankFailed(RuntimeError):
    """A rank raised; ``errors`` maps rank -> (exception type name, message, traceback)."""

    def __init__(self, errors: dict):
        self.errors = errors
        first = min(errors)
        # Every failed rank's one-line error first: a rank that timed out waiting names only its own wait;
        # where the others were is what tells a hang from a slow peer.
        each = "\n".join(
            f"  rank {r}: {errors[r][0]}: {str(errors[r][1]).splitlines()[0][:300]}" for r in sorted(errors)
        )
        super().__init__(
            f"{len(errors)} rank(s) raised:\n{each}\nrank {first}'s traceback:\n{errors[first][2]}"
        )


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # used when the server starts (once per test session)
    return ctx


def _rank_main(rank, world_size, port, comm_timeout_s, results, fn, args, emulate=None):
    from datetime import timedelta

    import torch.distributed as dist

    from wagma_bench.comm.torch_dist import TorchComm

    torch.set_num_threads(1)
    torch.manual_seed(1234 + rank)
    ok = False
    try:
        store = dist.TCPStore(
            "127.0.0.1",
            port,
            world_size,
            is_master=False,
            timeout=timedelta(seconds=max(60.0, comm_timeout_s)),
        )
        comm = TorchComm.init("gloo", rank, world_size, store, comm_timeout_s, torch.device("cpu"), emulate)
        value = fn(comm, *args)
        # Pickled here: the queue would share tensors by file descriptor, which dies with this process.
        results.put((rank, "ok", pickle.dumps(value)))
        ok = True
        comm.close()
    except BaseException as err:  # noqa: BLE001 - reported to the parent, whatever it is
        results.put((rank, "error", (type(err).__name__, str(err), traceback.format_exc())))
    finally:
        results.close()
        results.join_thread()
        # A rank whose peers died must not wait in process-group destructors.
        os._exit(0 if ok else 1)


# For the files make test runs at idle CPU priority (marker `background`, see the Makefile): a rank there gets
# no core while a serial test keeps both busy, for as long as it does. They assert no time, so only a hang
# should reach these.
PAUSABLE = {"comm_timeout_s": 300.0, "timeout_s": 900.0}


def run_world(
    fn,
    world_size: int,
    *args,
    comm_timeout_s: float = 30.0,
    timeout_s: float = 120.0,
    allow_errors: bool = False,
    emulate: str | None = None,
) -> list:
    """Run module-level ``fn(comm, *args)`` on ``world_size`` gloo ranks and return the per-rank results.
    ``emulate="nccl"``: the ranks' data plane refuses what NCCL refuses (``comm.emulate=nccl``).

    A rank that raises makes this raise :class:`RankFailed`, unless ``allow_errors``: then its entry is
    the tuple ``("error", type name, message)``; a rank that vanished without a report is ``None``.
    """
    from datetime import timedelta

    import torch.distributed as dist

    ctx = _context()
    results = ctx.Queue()
    # The parent holds the rendezvous store on a port the OS picked: no race for a "free" port.
    server = dist.TCPStore(
        "127.0.0.1", 0, None, is_master=True, timeout=timedelta(seconds=60), wait_for_workers=False
    )
    port = server.port
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(r, world_size, port, comm_timeout_s, results, fn, args, emulate),
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    out: list = [None] * world_size
    errors = {}
    deadline = time.monotonic() + timeout_s
    pending = world_size
    try:
        while pending:
            if all(not p.is_alive() for p in procs) and results.empty():
                break  # every rank is gone; the ones that did not report died
            try:
                rank, status, value = results.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"world of {world_size} ranks still running after {timeout_s} s "
                        f"(a hang); reported: {[r for r, v in enumerate(out) if v is not None]}"
                    )
                continue
            pending -= 1
            if status == "ok":
                out[rank] = pickle.loads(value)
            else:
                errors[rank] = value
                out[rank] = ("error", value[0], value[1])
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    if errors and not allow_errors:
        raise RankFailed(errors)
    return out
