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
import signal
import subprocess

# What a rank does after saving its checkpoint, by signal.
# USR1: our sbatch scripts' --signal=USR1@90; USR2: submitit's (hydra/launcher=submitit_slurm), same meaning.
REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)  # before the time limit: save, then requeue the job
# cancelled or preempted: save and exit (SLURM decides about requeue); SIGHUP (a closed terminal) alike
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# Ctrl-C: the first saves and stops the run as `interrupted` (resumable); the second stops it at once.
INTERRUPT_SIGNALS = (signal.SIGINT,)
# The local launcher's Ctrl-C, forwarded to its ranks. They ignore the terminal's SIGINT (inherited SIG_IGN),
# so that one Ctrl-C to the whole process group counts once, not once from the terminal and once from the
# launcher: the launcher alone decides, and forwards each Ctrl-C as this real-time signal of our own.
FORWARDED_INTERRUPT = signal.SIGRTMIN + 2

TERMINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


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
    out = subprocess.run(
        ["scontrol", "requeue", job], check=False, capture_output=True, text=True, timeout=60
    )
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
    out = subprocess.run(
        ["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ",".join(job_ids)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    states = parse_squeue(out.stdout)
    missing = [j for j in job_ids if not any(k == j or k.startswith(f"{j}_") for k in states)]
    if missing:
        out = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(missing)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode == 0:
            states.update(parse_squeue(out.stdout))
    return states
