"""Run a function on every rank of a real local gloo world (torch.multiprocessing, a free port)."""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

import torch.multiprocessing as mp

from wagma_bench.launch import free_port


def _entry(rank, fn, world_size, port, out_dir, timeout_s, args):
    import torch

    from wagma_bench.comm.torch_dist import TorchComm

    torch.set_num_threads(1)
    import torch.distributed as dist
    from datetime import timedelta

    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0, timeout=timedelta(seconds=60))
    comm = TorchComm.init("gloo", rank, world_size, store, timeout_s, torch.device("cpu"))
    try:
        result = fn(comm, *args)
        with open(Path(out_dir) / f"{rank}.pkl", "wb") as f:
            pickle.dump(result, f)
    finally:
        comm.close()


def run_world(fn, world_size: int, *args, timeout_s: float = 60.0):
    """Run ``fn(comm, *args)`` on ``world_size`` gloo ranks; return the list of per-rank results.

    ``fn`` must be a module-level function (it is pickled into spawned processes).
    """
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_entry, args=(fn, world_size, free_port(), out, timeout_s, args), nprocs=world_size,
                           start_method="spawn")
        return [pickle.load(open(os.path.join(out, f"{r}.pkl"), "rb")) for r in range(world_size)]
