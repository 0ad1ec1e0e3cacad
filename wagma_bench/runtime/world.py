"""The world a process belongs to, read from its launcher's environment (torchrun, srun, mpiexec) and nothing
else: so light to import that `wagma-bench run` takes its signals before anything heavy is imported (a SIGTERM
0.3 s after the start must find the handler), and shared by the launcher, comm-bench and the ranks."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class World:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    source: str  # torchrun | slurm | mpi | local


def slurm_tasks_on_this_node(env) -> int:
    """Tasks of this job step on this node. srun sets SLURM_STEP_TASKS_PER_NODE (and the job's
    SLURM_TASKS_PER_NODE) in its compressed per-node form, "2(x3),1" = 2, 2, 2, 1, indexed by the node's
    position in the step (SLURM_NODEID); SLURM_NTASKS_PER_NODE is only set when --ntasks-per-node was
    given."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if spec:
        counts = []
        for part in spec.split(","):
            count, _, repeat = part.partition("(x")
            counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
        node = int(env.get("SLURM_NODEID", 0))
        if 0 <= node < len(counts):
            return counts[node]
    return int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0])


def detect_world(env=os.environ) -> World | None:
    """The world this process belongs to, from a launcher's environment; None outside any launcher."""
    if "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env:
        return World(
            int(env["RANK"]),
            int(env["WORLD_SIZE"]),
            int(env.get("LOCAL_RANK", 0)),
            int(env.get("LOCAL_WORLD_SIZE", 1)),
            "torchrun",
        )
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env and "SLURM_NTASKS" in env:
        return World(
            int(env["SLURM_PROCID"]),
            int(env["SLURM_NTASKS"]),
            int(env.get("SLURM_LOCALID", 0)),
            slurm_tasks_on_this_node(env),
            "slurm",
        )
    if "OMPI_COMM_WORLD_RANK" in env:
        return World(
            int(env["OMPI_COMM_WORLD_RANK"]),
            int(env["OMPI_COMM_WORLD_SIZE"]),
            int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)),
            int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE", 1)),
            "mpi",
        )
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        return World(
            int(env["PMI_RANK"]),
            int(env["PMI_SIZE"]),
            int(env.get("MPI_LOCALRANKID", 0)),
            int(env.get("MPI_LOCALNRANKS", 1)),
            "mpi",
        )
    return None
