"""Where a run came from, for its ``run_start`` event: the code (git commit, package versions), the hosts and
every rank's place on them, and the values the trainer derived from the config. Kept with the record so that
a reader finds what a run logs about itself next to the reader of those events
(:class:`wagma_bench.record.events.RunStart`)."""

from __future__ import annotations

import math
import os
import platform
import socket
import subprocess
from pathlib import Path

import torch

from wagma_bench import __version__
from wagma_bench.comm.base import Comm
from wagma_bench.config.identity import config_hash
from wagma_bench.config.schema import RunConfig, as_recorded


def git_sha() -> str | None:
    """The commit of the suite's checkout, or None outside a git checkout (an installed wheel)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        sha = out.stdout.strip()
        return sha if out.returncode == 0 and sha else None
    except (OSError, subprocess.SubprocessError):
        return None


def versions(comm: Comm) -> dict:
    """The versions a result depends on: the suite, torch, the communication backend and its library."""
    out = {"wagma_bench": __version__, "torch": torch.__version__, "comm": comm.backend_name}
    if comm.backend_name == "nccl":
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    elif comm.backend_name == "mpi":
        from mpi4py import MPI

        out["mpi"] = MPI.Get_library_version().splitlines()[0].strip()
        out["mpi4py"] = __import__("mpi4py").__version__
    return out


def cpu_identity() -> dict:
    """Rank 0's CPU: its model (``/proc/cpuinfo``'s first ``model name``, else ``platform.processor()``) and
    the instruction set torch's CPU kernels dispatch to on it (``torch.backends.cpu.get_cpu_capability()``:
    ``AVX2``, ``AVX512``, ``DEFAULT``...). Two hosts that differ in either may round a float differently, so a
    run repeated bit for bit on one host need not repeat on another (docs/claims.md, repeatability)."""
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    return {
        "model": model or platform.processor() or None,
        "capability": torch.backends.cpu.get_cpu_capability(),
    }


def run_start_fields(cfg: RunConfig, comm: Comm, workload, algo, model: torch.nn.Module, **derived) -> dict:
    """The ``run_start`` event's metadata: what ran, where, and every value derived from the config that a
    reader would otherwise recompute (``derived``: the trainer's schedule, as it computed it).

    Collective (the host names are gathered): every rank calls it, rank 0 logs it. Readers take these
    through :class:`wagma_bench.record.events.RunStart`, which also reads runs logged before a field
    existed."""
    world = comm.world_size
    placement = _placement(comm, derived.pop("local_rank"))
    hosts = sorted({host for host, _, _ in placement})
    return dict(
        workload=cfg.workload.name,
        data=cfg.data.name,
        optimizer=algo.name,
        imbalance=cfg.imbalance.name,
        world_size=world,
        seed=cfg.seed,
        metric=workload.metric_name,
        target=cfg.eval.target,
        global_batch_size=cfg.train.batch_size * world,
        train_samples=workload.train_size,
        eval_samples=workload.eval_size,
        sync_period=algo.sync_period,
        # only group-averaging optimizers (WAGMA) have a group size: the effective one, after the default rule
        group_size=algo.group_size,
        model_params=sum(p.numel() for p in model.parameters()),
        nodes=len(hosts),
        ranks_per_node=math.ceil(world / len(hosts)),
        **derived,
        config_hash=config_hash(as_recorded(cfg)),
        git_sha=git_sha(),
        versions=versions(comm),
        hosts=hosts,
        cpu=cpu_identity(),  # rank 0's host: its CPU model and the instruction set torch used there
        # where each rank ran, by rank: its host and its rank on that host
        rank_hosts=[host for host, _, _ in placement],
        local_ranks=[local for _, local, _ in placement],
        # the CPUs the run's ranks may use on each host: with rank_hosts, how many ranks each core was given
        # by design (record.events.ranks_per_cpu), against which their measured contention is judged
        host_cpus=_host_cpus(placement),
        config=as_recorded(cfg),
    )


def _placement(comm: Comm, local_rank: int) -> list[tuple[str, int, int]]:
    """Every rank's (host name, rank on its host, the CPUs it may run on as a bit mask), by rank
    (collective)."""
    name = socket.gethostname().encode()[:64].ljust(64, b"\0") + local_rank.to_bytes(2, "little")
    row = name + _affinity_mask().to_bytes(AFFINITY_BITS // 8, "little")
    gathered = comm.allgather(torch.tensor(list(row), dtype=torch.uint8, device=comm.device))
    rows = [bytes(r.cpu().tolist()) for r in gathered]
    return [
        (
            r[:64].rstrip(b"\0").decode(errors="replace"),
            int.from_bytes(r[64:66], "little"),
            int.from_bytes(r[66:], "little"),
        )
        for r in rows
    ]


# CPUs 0 to 1,023 are told apart; one numbered higher counts as CPU 1,023 (a host with more CPUs then reads
# fewer, so more ranks per CPU: its runs are judged more leniently, never flagged for it).
AFFINITY_BITS = 1024


def _affinity_mask() -> int:
    """The CPUs this process may run on (its affinity: a launcher's binding, a cgroup's cpuset), as bits."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # no affinity call (macOS): every CPU
        cpus = range(os.cpu_count() or 1)
    mask = 0
    for cpu in cpus:
        mask |= 1 << min(cpu, AFFINITY_BITS - 1)
    return mask


def _host_cpus(placement: list[tuple[str, int, int]]) -> dict[str, int]:
    """Per host, how many CPUs its ranks may use between them (the union of their affinities)."""
    masks: dict[str, int] = {}
    for host, _, mask in placement:
        masks[host] = masks.get(host, 0) | mask
    return {host: mask.bit_count() for host, mask in sorted(masks.items())}
