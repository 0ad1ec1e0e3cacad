"""Where a process's CPU time went, by thread: the compute thread, the wait-avoiding engine's progress and
listener threads, the heartbeat, and the native threads (gloo's workers and transport, torch's and OpenMP's
pools) together. Read from /proc (clock ticks, 10 ms), so meaningful over a run, not a step."""

from __future__ import annotations

import os
import re
import threading


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) by thread name, trailing rank numbers dropped (``wagma-progress-0`` is
    ``wagma-progress``); ``native``: threads Python did not start; ``exited``: threads that have ended. Empty
    where there is no /proc."""
    names = {t.native_id: re.sub(r"-\d+$", "", t.name) for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    try:
        total = _cpu_ticks("/proc/self/stat")
        live = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                ticks = _cpu_ticks(f"/proc/self/task/{tid}/stat")
            except OSError:  # ended meanwhile
                continue
            live += ticks
            name = names.get(int(tid), "native")
            out[name] = out.get(name, 0.0) + ticks / tick
    except OSError:
        return {}
    out["exited"] = max(0, total - live) / tick
    return {name: round(seconds, 2) for name, seconds in sorted(out.items())}


def _cpu_ticks(stat_path: str) -> int:
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5), after the name
