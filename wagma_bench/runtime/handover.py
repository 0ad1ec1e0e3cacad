"""The configuration a run checked once, handed to every rank however the ranks were started.

One process checks a run's configuration (:func:`wagma_bench.config.schema.validate`, once the world size is
known); every other process of the run takes the checked configuration from it and checks nothing again:

- a launching process of ours that starts a ``wagma-bench run`` process (``comm=mpi``'s re-execution under
  mpiexec, a ``tune`` trial) writes the checked configuration into the run directory
  (:data:`CHECKED_FILE`, atomically) and names the file in :data:`CHECKED_ENV`;
- in a world that an external launcher started, rank 0 checks and publishes, the other ranks receive: through
  torchrun's store (every node reaches it), or through the run directory under SLURM (shared by the job's
  nodes, as its checkpoints are), named by the job, step and restart so that a requeued job never reads the
  last attempt's. A refusal travels the same way, so that every rank ends with rank 0's one line.

With ``comm=mpi`` under a user's mpiexec rank 0 broadcasts over MPI's world. A world with
none of these (``comm=torch`` under mpiexec, torchrun without its agent's store) checks on every rank.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from wagma_bench.config import readback
from wagma_bench.record.files import write_text_atomic
from wagma_bench.runtime.launch import launcher_run_id
from wagma_bench.runtime.world import World

CHECKED_FILE = "checked_config.json"
CHECKED_ENV = "WAGMA_BENCH_CHECKED_CONFIG"  # the checked configuration a launching process wrote for this run
STORE_KEY = "wagma_bench/checked_config"
WAIT_S = 600.0  # how long a rank waits for rank 0's check (its own imports, Hydra's composition, a slow disk)


def write_checked(run_dir: Path, raw: dict, launch: str) -> Path:
    """The checked configuration ``raw`` of the run in ``run_dir``, written there for the processes ``launch``
    names (a rank finds only its own launch's)."""
    path = run_dir / CHECKED_FILE
    _write(path, {"launch": launch, "run_dir": str(run_dir.resolve()), "config": raw})
    return path


def _write(path: Path, record: dict) -> None:
    # every value as composed, an infinite one too (JSON's Infinity, which json reads back): the hashes of the
    # configuration a rank gets are those of the one checked
    write_text_atomic(path, json.dumps(record, indent=2, sort_keys=True) + "\n")


def handed(run_dir: Path, env=os.environ) -> dict | None:
    """The checked configuration that this process's launcher wrote for ``run_dir`` (:data:`CHECKED_ENV`),
    else None (none handed, or one for another run directory: a job of a sweep under ``-m``)."""
    path = env.get(CHECKED_ENV)
    if not path:
        return None
    record = readback.load(path, readback.CHECKED_CONFIG)
    return record.get("config") if record["run_dir"] == str(run_dir.resolve()) else None


class StoreChannel:
    """torchrun's store (its agent's, up before any worker), under this attempt's prefix."""

    def __init__(self, env=os.environ):
        from datetime import timedelta

        import torch.distributed as dist

        store = dist.TCPStore(
            env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=WAIT_S)
        )
        attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")  # a restarted worker reads its own attempt's
        self.store = dist.PrefixStore(f"wagma_bench/attempt-{attempt}", store)

    def publish(self, message: dict) -> None:
        self.store.set(STORE_KEY, json.dumps(message))

    def receive(self) -> dict:
        return json.loads(self.store.get(STORE_KEY))  # waits for rank 0 (the store's timeout)


class FileChannel:
    """The run directory, shared by the ranks; a message names its launch (a SLURM job, step and restart)."""

    def __init__(self, run_dir: Path, launch: str):
        self.path, self.launch = run_dir / CHECKED_FILE, launch

    def publish(self, message: dict) -> None:
        _write(self.path, {"launch": self.launch, "run_dir": str(self.path.parent.resolve()), **message})

    def receive(self) -> dict:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                message = readback.load(self.path, readback.CHECKED_CONFIG)
                if message["launch"] == self.launch:
                    return message
            except (OSError, ValueError):  # not written yet (each write replaces it whole), or damaged
                pass
            if time.monotonic() > deadline:
                return {
                    "refused": f"rank 0 did not hand over the checked configuration within "
                    f"{WAIT_S:.0f} s ({self.path})"
                }
            time.sleep(0.1)


class MpiChannel:
    """MPI's world communicator (``comm=mpi`` under a user's mpiexec: MPI can start before any check)."""

    def __init__(self):
        from wagma_bench.comm.mpi import MPI  # with the thread level the MPI backend asks for

        self.world = MPI.COMM_WORLD

    def publish(self, message: dict) -> None:
        self.world.bcast(message, root=0)

    def receive(self) -> dict:
        return self.world.bcast(None, root=0)


Channel = StoreChannel | FileChannel | MpiChannel


def world_channel(world: World, run_dir: Path, comm: str, env=os.environ) -> Channel | None:
    """How rank 0 of an external launcher's world hands its check to the other ranks (``comm``: the composed
    ``comm.name``); None where there is no way every rank can reach (each rank then checks for itself)."""
    # under srun --mpi too: its ranks start MPI where they did before, in the backend (PMI-2 through SLURM's
    # server is fragile with the mpich wheel: docs/multinode.md)
    if world.source == "slurm" and (run_id := launcher_run_id(env)) is not None:
        return FileChannel(run_dir, f"{run_id}.restart-{env.get('SLURM_RESTART_COUNT', '0')}")
    if comm == "mpi" and world.source == "mpi":
        return MpiChannel()
    if world.source == "torchrun" and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return StoreChannel(env)
    return None
