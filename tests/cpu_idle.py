"""Where the suite waits: each test's wall time and the machine's idle share over it, from /proc/stat.

    pytest -p tests.cpu_idle            # a table of the files and tests that left the cores idle longest

Not loaded by default. Idle is counted for the whole machine (all cores), so it is only meaningful with
nothing else running; a module's set-up and teardown count toward the test that triggered them.
``CPU_IDLE_OUT=FILE`` also writes one JSON line per test (id, wall, busy fraction).
"""

from __future__ import annotations

import collections
import json
import os
import time

import pytest

_rows: list[dict] = []


def _cpu_jiffies() -> tuple[int, int]:
    """(all, idle) jiffies of the machine since boot; idle includes I/O wait."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return sum(values), values[3] + values[4]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    t0, (all0, idle0) = time.monotonic(), _cpu_jiffies()
    yield
    wall, (all1, idle1) = time.monotonic() - t0, _cpu_jiffies()
    busy = 1 - (idle1 - idle0) / (all1 - all0) if all1 > all0 else 1.0
    _rows.append({"id": item.nodeid, "wall": round(wall, 2), "busy": round(busy, 3)})


def pytest_terminal_summary(terminalreporter):
    if not _rows:
        return
    idle = {r["id"]: r["wall"] * (1 - r["busy"]) for r in _rows}
    by_file = collections.Counter()
    for r in _rows:
        by_file[r["id"].split("::")[0]] += idle[r["id"]]
    wall = sum(r["wall"] for r in _rows)
    write = terminalreporter.write_line
    write(f"cpu idle: {sum(idle.values()):.0f} s of {wall:.0f} s in tests (machine-wide share x wall time)")
    for name, seconds in by_file.most_common(10):
        write(f"  {seconds:6.1f} s  {name}")
    for test, seconds in sorted(idle.items(), key=lambda kv: -kv[1])[:15]:
        write(f"  {seconds:6.1f} s  {test}")
    if out := os.environ.get("CPU_IDLE_OUT"):
        with open(out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in _rows)
