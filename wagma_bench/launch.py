"""World discovery and local spawning.

``wagma-bench run`` runs as one rank of an existing world when started by torchrun (RANK/WORLD_SIZE),
srun (SLURM_PROCID/SLURM_NTASKS) or mpiexec (OMPI_COMM_WORLD_* / PMI_*); otherwise it spawns
``launcher.nproc`` local ranks with torch.multiprocessing. A rank that dies or raises ends the whole run:
the survivors are terminated and the error names the failed rank.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from wagma_bench.config import RunConfig, validate
from wagma_bench.events import finalize


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
    position in the step (SLURM_NODEID); SLURM_NTASKS_PER_NODE is only set when --ntasks-per-node was given."""
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
        return World(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                     int(env.get("LOCAL_WORLD_SIZE", 1)), "torchrun")
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env and "SLURM_NTASKS" in env:
        return World(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)),
                     slurm_tasks_on_this_node(env), "slurm")
    if "OMPI_COMM_WORLD_RANK" in env:
        return World(int(env["OMPI_COMM_WORLD_RANK"]), int(env["OMPI_COMM_WORLD_SIZE"]),
                     int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)), int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE", 1)),
                     "mpi")
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        return World(int(env["PMI_RANK"]), int(env["PMI_SIZE"]), int(env.get("MPI_LOCALRANKID", 0)),
                     int(env.get("MPI_LOCALNRANKS", 1)), "mpi")
    return None


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def slurm_master(env=os.environ) -> tuple[str, int]:
    """First host of the job's node list (via scontrol) and a port derived from the job id."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
    try:
        hosts = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                               timeout=30, check=True).stdout.split()
        host = hosts[0] if hosts else "127.0.0.1"
    except (OSError, subprocess.SubprocessError):
        host = nodelist.split(",")[0]
    port = 20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000
    return host, port


def _pin_threads(local_world_size: int) -> None:
    # Several ranks on one CPU would each start one intra-op thread per core and thrash.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world_size)))


def make_comm(cfg: RunConfig, world: World, master: tuple[str, int] | None):
    """Create this rank's communicator (the one backend every algorithm uses)."""
    # comm=mpi (backend "mpi") also trains on the GPU when there is one; MpiComm stages CUDA tensors.
    use_cuda = torch.cuda.is_available() and cfg.comm.backend in ("auto", "nccl", "mpi")
    device = torch.device(f"cuda:{world.local_rank % torch.cuda.device_count()}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if cfg.comm.name == "mpi":
        from wagma_bench.comm.mpi import MpiComm

        return MpiComm.init(timeout_s=cfg.comm.timeout_s, device=device)
    from datetime import timedelta

    import torch.distributed as dist

    from wagma_bench.comm.torch_dist import TorchComm

    backend = cfg.comm.backend if cfg.comm.backend != "auto" else ("nccl" if use_cuda else "gloo")
    if world.source == "torchrun":  # torchrun's agent hosts the store: join it through env://
        return TorchComm.init(backend, world.rank, world.world_size, None, cfg.comm.timeout_s, device)
    if master is None:
        master = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    store = dist.TCPStore(master[0], master[1], world.world_size, is_master=world.rank == 0,
                          timeout=timedelta(seconds=cfg.launcher.rendezvous_timeout_s))
    return TorchComm.init(backend, world.rank, world.world_size, store, cfg.comm.timeout_s, device)


def run_rank(raw_cfg: dict, run_dir: str, world: World, master: tuple[str, int] | None) -> dict | None:
    """Entry point of one rank, in a spawned process or under an external launcher."""
    from wagma_bench.trainer import train

    cfg = validate(raw_cfg, world.world_size)
    _pin_threads(world.local_world_size)
    comm = make_comm(cfg, world, master)
    try:
        return train(cfg, comm, Path(run_dir))
    except BaseException as err:
        if cfg.comm.name == "mpi":  # end the MPI job now rather than let the peers wait for their timeout
            traceback.print_exc()
            if world.rank != 0:  # MPI_Abort kills rank 0 too, before it can record the failure
                finalize(Path(run_dir), status="failed", error=f"rank {world.rank} failed: {type(err).__name__}: {err}")
            comm.abort(1)
        raise
    finally:
        comm.close()


def _die_with_launcher(launcher_pid: int) -> None:
    """Ask Linux to send SIGTERM to this rank when its launcher dies (SIGKILLed, OOM), so ranks never train
    on unsupervised: the TERM handler checkpoints at the next synchronisation point and ends the run as
    preempted (``run_suspend``), resumable. Elsewhere (no prctl) a watchdog thread does the same."""
    import ctypes
    import signal
    import threading
    import time

    pr_set_pdeathsig = 1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):
        def watch():
            while os.getppid() == launcher_pid:
                time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, name="launcher-watchdog", daemon=True).start()
    if os.getppid() != launcher_pid:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _spawned_rank(index: int, raw_cfg: dict, run_dir: str, nproc: int, master: tuple[str, int],
                  launcher_pid: int | None = None) -> None:
    if launcher_pid is not None:
        _die_with_launcher(launcher_pid)
    try:
        run_rank(raw_cfg, run_dir, World(index, nproc, index, nproc, "local"), master)
    except BaseException:  # noqa: BLE001 - reported, then the process exits non-zero
        sys.stderr.write(f"[rank {index}] failed:\n{traceback.format_exc()}")
        sys.stderr.flush()
        os._exit(1)  # do not wait for communication threads blocked on dead peers


class RunFailed(RuntimeError):
    pass


def spawn_local(raw_cfg: dict, run_dir: Path, nproc: int, addr: str, port: int | None) -> None:
    """Spawn ``nproc`` local ranks and wait; the first failure terminates the others."""
    import torch.multiprocessing as mp

    master = (addr, port or free_port(addr))
    ctx = mp.start_processes(_spawned_rank, args=(raw_cfg, str(run_dir), nproc, master, os.getpid()), nprocs=nproc,
                             join=False, start_method="spawn")
    try:
        while not ctx.join():
            pass
    except mp.ProcessExitedException as err:
        raise RunFailed(f"rank {err.error_index} exited with code {err.exit_code} "
                        f"(signal {err.signal_name})" if err.signal_name else
                        f"rank {err.error_index} exited with code {err.exit_code}") from None
    except mp.ProcessRaisedException as err:
        raise RunFailed(f"rank {err.error_index} raised: {str(err).strip().splitlines()[-1]}") from None
