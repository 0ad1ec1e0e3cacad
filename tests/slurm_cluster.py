"""The private SLURM the tests start (``slurm/local/slurmctl.sh``, as root): one host, or several hosts in
network namespaces, and a stand-in partition for a cluster profile's limits. Test helpers: the package does
not use them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from wagma_bench.config.paths import SLURM_DIR


def standin_partition(profile: dict) -> str:
    """slurm.conf lines declaring a cluster profile's partition with CLOUD nodes.

    CLOUD nodes are schedulable but never powered up (ResumeProgram fails), so ``sbatch --test-only``
    checks a rendered script against the cluster's real limits (partition name, node count, CPUs, GRES,
    features, MaxTime) without running anything. Profiles may share a partition name (``gpu``), so each
    profile gets its own stand-in controller.
    """
    hw = profile["hardware"]
    prefix = (re.sub(r"[^a-z0-9]", "", profile["name"].lower()) or "x") + "n"
    nodes = f"{prefix}[1-{hw['nodes']}]" if hw["nodes"] > 1 else f"{prefix}1"
    gres = f" Gres=gpu:{hw['gpus_per_node']}" if hw.get("gpus_per_node") else ""
    feats = f" Features={','.join(hw['features'])}" if hw.get("features") else ""
    return (
        f"NodeName={nodes} CPUs={hw['cpus_per_node']}{gres}{feats} State=CLOUD\n"
        f"PartitionName={profile['partition']} Nodes={nodes} MaxTime={hw['max_time']} State=UP\n"
    )


def local_cluster_script() -> Path:
    return SLURM_DIR / "local" / "slurmctl.sh"


@contextmanager
def local_cluster(extra_conf: str | None = None, cpus: int = 8, nodes: int = 1) -> Iterator[dict[str, str]]:
    """Start the repo's private SLURM (slurm/local/slurmctl.sh, as root) in a fresh directory; yield the
    environment its clients need (``SLURM_CONF``, and ``WAGMA_SLURM_DIR`` for ``slurmctl.sh exec``);
    always stop it, even after an error: its daemons, and with ``nodes`` > 1 its hosts' processes,
    namespaces, veths and bridge. A test process killed outright leaves them for ``slurmctl.sh stop``
    (or the next ``start`` in the same directory) to remove.

    The directory is made with mode 755 under /tmp itself, whatever ``TMPDIR`` says: munged runs as ``munge``
    and must reach its log and socket, which a private temporary directory (mode 700, as pytest's) forbids.
    """
    directory = Path(tempfile.mkdtemp(prefix="wagma-slurm-", dir="/tmp"))
    directory.chmod(0o755)
    env = {**os.environ, "WAGMA_SLURM_DIR": str(directory / "cluster"), "WAGMA_SLURM_CPUS": str(cpus)}
    cmd = [str(local_cluster_script()), "start", "--nodes", str(nodes)]
    if extra_conf:
        (directory / "extra.conf").write_text(extra_conf)
        cmd += ["--extra", str(directory / "extra.conf")]
    try:
        out = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"local SLURM did not start:\n{out.stdout}{out.stderr}")
        yield {
            "SLURM_CONF": str(directory / "cluster" / "slurm.conf"),
            "WAGMA_SLURM_DIR": str(directory / "cluster"),
        }
    finally:
        subprocess.run(
            [str(local_cluster_script()), "stop"], env=env, check=False, capture_output=True, timeout=300
        )
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def local_clusters(extra_confs: dict[str, str]) -> Iterator[dict[str, dict[str, str]]]:
    """Several one-host clusters at once (name -> ``extra_conf``, see :func:`local_cluster`), started and
    stopped in parallel: a start or stop is mostly waiting for daemons (16-18% of the CPU), three in turn took
    18 s. Yields each one's environment by name; every one that started is stopped, whatever happens."""
    managers = {name: local_cluster(extra_conf=conf) for name, conf in extra_confs.items()}
    with ThreadPoolExecutor(max_workers=len(managers), thread_name_prefix="cluster") as pool:
        started = {name: pool.submit(cm.__enter__) for name, cm in managers.items()}
        try:
            yield {name: future.result() for name, future in started.items()}
        finally:  # one that failed to start was stopped by its own context manager
            stops = [
                pool.submit(managers[name].__exit__, None, None, None)
                for name, future in started.items()
                if future.exception() is None
            ]
            for stop in stops:
                stop.result()


def on_host(cluster: dict[str, str], node: str, cmd: list[str]) -> list[str]:
    """``cmd`` run on ``node`` of a local multi-host cluster (its network and UTS namespaces)."""
    return [
        "env",
        f"WAGMA_SLURM_DIR={cluster['WAGMA_SLURM_DIR']}",
        str(local_cluster_script()),
        "exec",
        node,
        *cmd,
    ]
