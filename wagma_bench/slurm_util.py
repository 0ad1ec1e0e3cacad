"""SLURM helpers: preemption signals, requeue, job states, and stand-in partitions for script checks.

Signal semantics (measured on SLURM 22.05 with the repo's local cluster): ``--signal=USR1@90`` and
``scancel --signal=USR1 JOB`` deliver the signal to every task of the job's steps (our ranks under srun) and
not to the batch shell; ``--signal=B:USR1@90`` would reach only the batch shell, which would then have to
forward it. SLURM may send it up to a minute earlier than asked (its event resolution). When the job is
cancelled, preempted or hits its limit, every task and the batch shell get TERM, then KILL after
``KillWait`` seconds.

submitit (``sweep --submitit``) asks for ``--signal=USR2@90`` in the same form, so USR2 reaches the same ranks
and means the same; the trainer's handler replaces submitit's own in the rank processes, so the trainer, not
submitit, saves and requeues.

The trainer reacts at its next synchronisation point: every rank saves its checkpoint; after USR1 or USR2
rank 0 also requeues the job, which SLURM starts again with the same job id and ``SLURM_RESTART_COUNT`` + 1.
Outside SLURM there is no job to requeue: the run stops as ``preempted`` with its checkpoint, and says so.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# What a rank does after saving its checkpoint, by signal.
# USR1: our sbatch scripts' --signal=USR1@90; USR2: submitit's (hydra/launcher=submitit_slurm), same meaning.
REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)  # before the time limit: save, then requeue the job
EXIT_SIGNALS = (signal.SIGTERM,)  # cancelled or preempted: save and exit (SLURM decides about requeue)
# Ctrl-C: the first saves and stops the run as `interrupted` (resumable); the second stops it at once.
INTERRUPT_SIGNALS = (signal.SIGINT,)
# The local launcher's Ctrl-C, forwarded to its ranks. They ignore the terminal's SIGINT (inherited SIG_IGN), so
# that one Ctrl-C to the whole process group counts once, not once from the terminal and once from the
# launcher: the launcher alone decides, and forwards each Ctrl-C as this real-time signal of our own.
FORWARDED_INTERRUPT = signal.SIGRTMIN + 2

TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                   "DEADLINE", "PREEMPTED"}


def job_id(env=os.environ) -> str | None:
    """The id to requeue: an array task's own job id (SLURM_JOB_ID), not the array's."""
    return env.get("SLURM_JOB_ID")


def requeue_job(job: str | None = None, env=os.environ) -> bool:
    """``scontrol requeue`` this job (needs ``--requeue`` or JobRequeue=1). False outside SLURM.

    A failure raises: a run that was told it would be killed and cannot requeue itself must say so.
    """
    job = job or job_id(env)
    if job is None:
        return False
    out = subprocess.run(["scontrol", "requeue", job], check=False, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"scontrol requeue {job} failed: {out.stderr.strip() or out.stdout.strip()}")
    return True


def parse_squeue(text: str) -> dict[str, str]:
    """``squeue -h -r -o %i|%T`` output: state by id (``ID``, or ``ARRAYID_TASK``: -r lists every task)."""
    states = {}
    for line in text.splitlines():
        jid, sep, state = line.strip().partition("|")
        if sep and jid:
            states[jid] = state.split()[0] if state.strip() else "UNKNOWN"
    return states


def job_states(job_ids: list[str]) -> dict[str, str]:
    """State of each job or array task, keyed ``ID`` or ``ARRAYID_TASK``, in one ``squeue`` call for them all.

    ``squeue -t all`` answers for pending, running and recently finished jobs (MinJobAge; array tasks one a
    line, even while pending); one ``sacct`` call fills in older ones where accounting is enabled. Unknown
    ids are left out. (squeue exits 1 when it knows none of the ids: that is an empty answer.)
    """
    out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ",".join(job_ids)],
                         check=False, capture_output=True, text=True, timeout=60)
    states = parse_squeue(out.stdout)
    missing = [j for j in job_ids if not any(k == j or k.startswith(f"{j}_") for k in states)]
    if missing:
        out = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(missing)],
                             check=False, capture_output=True, text=True, timeout=60)
        if out.returncode == 0:
            states.update(parse_squeue(out.stdout))
    return states


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
    return (f"NodeName={nodes} CPUs={hw['cpus_per_node']}{gres}{feats} State=CLOUD\n"
            f"PartitionName={profile['partition']} Nodes={nodes} MaxTime={hw['max_time']} State=UP\n")


def local_cluster_script() -> Path:
    from wagma_bench.paths import SLURM_DIR

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
        yield {"SLURM_CONF": str(directory / "cluster" / "slurm.conf"), "WAGMA_SLURM_DIR": str(directory / "cluster")}
    finally:
        subprocess.run([str(local_cluster_script()), "stop"], env=env, check=False, capture_output=True, timeout=300)
        shutil.rmtree(directory, ignore_errors=True)


def on_host(cluster: dict[str, str], node: str, cmd: list[str]) -> list[str]:
    """``cmd`` run on ``node`` of a local multi-host cluster (its network and UTS namespaces)."""
    return ["env", f"WAGMA_SLURM_DIR={cluster['WAGMA_SLURM_DIR']}", str(local_cluster_script()), "exec", node, *cmd]
