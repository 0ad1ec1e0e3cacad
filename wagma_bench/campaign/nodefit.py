"""Scripts that fit the nodes they ask for: what one node of a sweep's job must have (tasks, CPUs, GPUs,
memory), checked against the profile's node (``cluster.hardware``) before anything is rendered, and, with
``sweep --check``, against SLURM itself (``sbatch --test-only`` on the first script).

A request beyond the node does not fail at submission: SLURM queues it as "Requested node configuration is not
available" or holds it forever. So the refusal names the profile key that made the request too big and the
largest value that fits (``cluster.cpus_per_task=8``), in one line, before the queue.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from wagma_bench.config.cluster import ClusterProfile
from wagma_bench.errors import ConfigError

MEM_UNITS = {"K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0}  # SLURM's --mem suffixes, in GB
TEST_ONLY_TIMEOUT_S = 60


@dataclass(frozen=True)
class NodeRequest:
    """What one node of a job asks SLURM for."""

    tasks: int
    cpus_per_task: int
    gpus: int  # GRES GPUs (0: none requested)
    mem_gb: float | None  # --mem in sbatch_extra (None: SLURM's default)

    @property
    def cpus(self) -> int:
        return self.tasks * self.cpus_per_task


@dataclass(frozen=True)
class Node:
    """What one node has: the profile's ``hardware`` or SLURM's ``sinfo``."""

    cpus: int
    gpus: int  # 0: not declared (the request's GRES is not checked)
    mem_gb: float | None
    source: str  # where it was read, for the message


def requested_mem_gb(sbatch_extra: list[str]) -> float | None:
    """``--mem=SIZE`` among the profile's extra sbatch options, in GB; None where absent."""
    for option in sbatch_extra:
        m = re.fullmatch(r"--mem=(\d+(?:\.\d+)?)([KMGT]?)B?", option.strip(), re.IGNORECASE)
        if m:
            return float(m.group(1)) * MEM_UNITS[(m.group(2) or "M").upper()]
    return None


def node_request(profile: ClusterProfile, tasks_per_node: int) -> NodeRequest:
    return NodeRequest(
        tasks_per_node,
        profile.cpus_per_task,
        tasks_per_node if profile.gres else 0,
        requested_mem_gb(profile.sbatch_extra),
    )


def profile_node(profile: ClusterProfile) -> Node:
    hw = profile.hardware
    return Node(hw.cpus_per_node, hw.gpus_per_node, hw.mem_gb, f"cluster {profile.name}'s node (hardware)")


def misfit(request: NodeRequest, node: Node) -> str | None:
    """Why ``request`` does not fit ``node``, naming the key to change and what fits; None when it fits."""
    if request.cpus > node.cpus:
        fits = node.cpus // request.tasks
        fix = f"cluster.cpus_per_task={fits} fits" if fits else "no cluster.cpus_per_task fits"
        return (
            f"cluster.cpus_per_task={request.cpus_per_task} asks {request.tasks} tasks x "
            f"{request.cpus_per_task} = {request.cpus} CPUs a node; {node.source} has {node.cpus}: {fix}"
        )
    if node.gpus and request.gpus > node.gpus:
        return (
            f"cluster.gpus_per_node={request.tasks} asks {request.gpus} GPUs a node (one task per GPU); "
            f"{node.source} has {node.gpus}: cluster.gpus_per_node={node.gpus} fits"
        )
    if node.mem_gb is not None and request.mem_gb is not None and request.mem_gb > node.mem_gb:
        return (
            f"cluster.sbatch_extra asks --mem={request.mem_gb:g}G a node; {node.source} has "
            f"{node.mem_gb:g} GB: --mem={int(node.mem_gb)}G or less fits"
        )
    return None


def check_fits(profile: ClusterProfile, tasks_per_node: list[int]) -> None:
    """Refuse (ConfigError, one line) a job whose node request exceeds the profile's node."""
    for tasks in sorted(set(tasks_per_node), reverse=True):
        why = misfit(node_request(profile, tasks), profile_node(profile))
        if why:
            raise ConfigError(why)


def request_line(profile: ClusterProfile, tasks_per_node: list[int]) -> str:
    """One line for the dry run: what each node of the largest job asks, beside the profile's node."""
    req = node_request(profile, max(tasks_per_node))
    mem = f"--mem={req.mem_gb:g}G" if req.mem_gb is not None else "memory: SLURM's default"
    gpus = (
        f"{req.gpus} GPUs (--gres={profile.gres}:{req.gpus})" if req.gpus else "no GPUs requested (no gres)"
    )
    node = profile_node(profile)
    has_mem = f"{node.mem_gb:g} GB" if node.mem_gb is not None else "memory not stated"
    has_gpus = f"{node.gpus} GPUs" if node.gpus else "no GPUs declared as GRES"
    tasks = f"{req.tasks} task{'s' if req.tasks > 1 else ''}"
    return (
        f"per node: {tasks} x cluster.cpus_per_task={req.cpus_per_task} = {req.cpus} CPUs, {gpus}, "
        f"{mem}; {node.source}: {node.cpus} CPUs, {has_gpus}, {has_mem}"
    )


# --- SLURM's own answer ---------------------------------------------------------------------------------


def _ask(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=TEST_ONLY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout


def partition_node(partition: str | None) -> Node | None:
    """The node of ``partition`` as SLURM reports it: the smallest that ``sinfo`` lists, else (nodes that
    sinfo hides: powered-down CLOUD nodes) ``scontrol show partition``'s CPUs over its nodes; None where
    neither can say."""
    node = sinfo_node(partition)
    if node is not None or not partition:
        return node
    fields = dict(
        f.split("=", 1) for f in _ask(["scontrol", "-o", "show", "partition", partition]).split() if "=" in f
    )
    cpus, nodes = fields.get("TotalCPUs", ""), fields.get("TotalNodes", "")
    if not (cpus.isdigit() and nodes.isdigit() and int(nodes)):
        return None
    source = f"partition {partition}'s node (scontrol: TotalCPUs/TotalNodes)"
    return Node(int(cpus) // int(nodes), 0, None, source)


def sinfo_node(partition: str | None) -> Node | None:
    """The smallest node of ``partition`` as ``sinfo`` reports it; None where sinfo cannot say."""
    nodes = []
    for line in _ask(
        ["sinfo", "-h", "-o", "%c %G %m"] + (["-p", partition] if partition else [])
    ).splitlines():
        parts = line.split()
        if len(parts) != 3 or not parts[0].rstrip("+").isdigit():
            continue
        gpus = re.search(r"gpu(?::[^:,(]+)?:(\d+)", parts[1])
        mem = parts[2].rstrip("+")
        nodes.append(
            Node(
                int(parts[0].rstrip("+")),
                int(gpus.group(1)) if gpus else 0,
                int(mem) / 1024 if mem.isdigit() and int(mem) > 1 else None,  # sinfo: MB; 1 = not set
                f"partition {partition}'s node (sinfo)",
            )
        )
    return min(nodes, key=lambda n: n.cpus) if nodes else None


def slurm_test_only(
    script: Path, profile: ClusterProfile, tasks_per_node: int, sbatch: str = "sbatch"
) -> str:
    """``sbatch --test-only SCRIPT``: SLURM's answer in one line when it accepts; a ConfigError with its
    answer (and, from ``sinfo``, the key that does not fit) when it refuses. Submits nothing."""
    try:
        out = subprocess.run(
            [sbatch, "--test-only", str(script)],
            capture_output=True,
            text=True,
            timeout=TEST_ONLY_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"sbatch --test-only {script.name}: no answer in {TEST_ONLY_TIMEOUT_S} s"
        ) from None
    answer = " ".join(out.stderr.split()) or " ".join(out.stdout.split())
    if out.returncode == 0:
        return f"--check: SLURM accepts {script.name} (sbatch --test-only): {answer}"
    node = partition_node(profile.partition)
    why = misfit(node_request(profile, tasks_per_node), node) if node else None
    raise ConfigError(
        f"--check: SLURM refuses {script.name} (sbatch --test-only): {answer}" + (f"; {why}" if why else "")
    )


def sbatch_on_path() -> bool:
    return shutil.which("sbatch") is not None
