"""What each test costs in CPU: the CPU time of the pytest process and of every process it starts (ranks, fork
servers, launchers, SLURM's and MPI's daemons), from a cgroup that holds them all.

    pytest -p tests.cpu_cost -p no:xdist -m "not long"    # a table of the costliest files and tests

Not loaded by default; needs root (it makes a cgroup: cgroup v1's ``cpuacct`` hierarchy, or cgroup v2). The
pytest process moves itself into the cgroup when the session starts, so every process it starts afterwards is
counted, whatever else the machine runs: unlike ``tests/cpu_idle.py``'s machine-wide share, the figure holds
beside another workload (a busy machine inflates it a little: two processes on one core's caches). A module's
fixtures count toward the test that made them. ``CPU_COST_OUT=FILE`` also writes one JSON line per test (id,
wall seconds, CPU seconds).
"""

from __future__ import annotations

import collections
import json
import os
import time
from pathlib import Path

import pytest

_V1 = Path("/sys/fs/cgroup/cpuacct")
_V2 = Path("/sys/fs/cgroup")
_rows: list[dict] = []
_usage_file: Path | None = None


def _cgroup() -> Path:
    """This session's cgroup (made on first use), whose usage file counts its processes' CPU time."""
    group = (_V1 if (_V1 / "cpuacct.usage").exists() else _V2) / f"wagma-bench-tests-{os.getpid()}"
    group.mkdir(exist_ok=True)
    return group


def _seconds() -> float:
    text = _usage_file.read_text()
    if _usage_file.name == "cpuacct.usage":
        return int(text) / 1e9  # nanoseconds
    usage = dict(line.split() for line in text.splitlines())
    return int(usage["usage_usec"]) / 1e6


def pytest_sessionstart(session):
    global _usage_file
    group = _cgroup()
    (group / "cgroup.procs").write_text(str(os.getpid()))
    _usage_file = group / ("cpuacct.usage" if (group / "cpuacct.usage").exists() else "cpu.stat")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    t0, cpu0 = time.monotonic(), _seconds()
    yield
    _rows.append(
        {"id": item.nodeid, "wall": round(time.monotonic() - t0, 2), "cpu": round(_seconds() - cpu0, 2)}
    )


def pytest_unconfigure(config):
    """Back to the parent cgroup; the session's own goes once nothing is left in it."""
    if _usage_file is None:
        return
    group = _usage_file.parent
    try:
        (group.parent / "cgroup.procs").write_text(str(os.getpid()))
        group.rmdir()
    except OSError:  # a process the session started still runs in it (a daemon): left for the next boot
        pass


def pytest_terminal_summary(terminalreporter):
    if not _rows:
        return
    by_file = collections.Counter()
    for r in _rows:
        by_file[r["id"].split("::")[0]] += r["cpu"]
    write = terminalreporter.write_line
    write(
        f"cpu cost: {sum(r['cpu'] for r in _rows):.0f} CPU-seconds in {sum(r['wall'] for r in _rows):.0f} s "
        "of tests"
    )
    for name, seconds in by_file.most_common(10):
        write(f"  {seconds:6.1f} CPU-s  {name}")
    for r in sorted(_rows, key=lambda r: -r["cpu"])[:20]:
        write(f"  {r['cpu']:6.1f} CPU-s  {r['id']}")
    if out := os.environ.get("CPU_COST_OUT"):
        with open(out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in _rows)
