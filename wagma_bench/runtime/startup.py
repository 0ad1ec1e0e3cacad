"""Where a run's start goes, from the command to the end of its first step.

Each process marks the moments it passes (wall-clock seconds, comparable across the processes of one
machine); the local launcher hands its marks to the ranks in :data:`STARTUP_ENV`, and rank 0 logs the phases
in a ``startup`` event after its first step (``summary.json`` carries the last attempt's). The phases, each
named by the mark that ends it:

- ``launcher``: from the command's process start (Python, Hydra, validation) to asking for the ranks;
- ``ranks``: until a rank runs: the fork server importing torch and the suite (once) and forking the rank.
  Under an external launcher (torchrun, srun, mpiexec) there is no ``spawned`` mark: from the rank's own
  process start;
- ``imports``: what the rank imports itself (nothing heavy when the fork server preloaded it);
- ``world``: the rendezvous and the process groups;
- ``data``: the workload with its data;
- ``setup``: the model, the optimizer, the initial broadcast or the checkpoint, the logs;
- ``first_step``: the first training step.
"""

from __future__ import annotations

import itertools
import json
import os
import time

STARTUP_ENV = "WAGMA_BENCH_STARTUP"
MARKS = ("launched", "spawned", "rank", "imported", "world", "data", "ready", "first_step")
PHASE_OF = {
    "spawned": "launcher",
    "rank": "ranks",
    "imported": "imports",
    "world": "world",
    "data": "data",
    "ready": "setup",
    "first_step": "first_step",
}

_marks: dict[str, float] = {}


def process_start_time() -> float:
    """When this process started (wall clock), from /proc: its start in clock ticks since boot, against the
    boot-time clock now (``/proc/stat``'s ``btime`` is whole seconds, up to a second off); now where there is
    none."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of proc(5), counted after the command name's closing parenthesis
        since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - since_start
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


def mark(name: str) -> None:
    """Note that this process passed ``name`` now (the first time only: a resume marks nothing twice)."""
    if name not in MARKS:
        raise ValueError(f"unknown start-up mark {name!r}; one of {', '.join(MARKS)}")
    _launched()
    _marks.setdefault(name, time.time())


def _launched() -> None:
    if "launched" not in _marks:  # this process's own start, unless a launcher's marks or a new job set it
        _marks["launched"] = process_start_time()


def new_job() -> None:
    """A Hydra multirun's next job starts now, not at the process's start."""
    if "spawned" in _marks:
        _marks.clear()
        _marks["launched"] = time.time()


def for_ranks() -> str:
    """The marks so far, for :data:`STARTUP_ENV` of the ranks this process starts."""
    _launched()
    return json.dumps(_marks)


def inherit(env=os.environ) -> None:
    """Take the launcher's marks (a rank's own start is then the launcher's)."""
    try:
        theirs = json.loads(env.get(STARTUP_ENV) or "{}")
    except ValueError:
        return
    _marks.update({k: float(v) for k, v in theirs.items() if k in MARKS and isinstance(v, (int, float))})


def phases() -> dict:
    """Seconds per phase (a phase whose mark is missing is folded into the next one) and ``total_s``."""
    present = [name for name in MARKS if name in _marks]
    out = {f"{PHASE_OF[b]}_s": round(_marks[b] - _marks[a], 4) for a, b in itertools.pairwise(present)}
    if len(present) > 1:
        out["total_s"] = round(_marks[present[-1]] - _marks[present[0]], 4)
    return out
