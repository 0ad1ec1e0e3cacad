"""The order of make test's first phase: the longest test files first, so that both xdist workers end
together.

    pytest -p tests.file_order ...                                      # longest files first
    pytest -p tests.file_order --write-durations tests/durations.json   # ... and measure them again

``--dist loadfile`` hands a worker one whole file at a time, in the order it is given (with xdist's
``--no-loadscope-reorder``; by default xdist orders files by their number of tests, which says little about
their length: ``tests/test_faults.py`` and ``tests/test_gpu_check.py`` run long with few tests). A long file
handed out last leaves the other worker idle until it ends; handing out the longest first (the LPT rule)
leaves only short files for the end. The lengths are measured: ``tests/durations.json`` holds each file's
seconds of test time (set-up, call and teardown) in such a run, written by ``--write-durations``. A file
missing from it goes last; a stale table only costs balance, never a test.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

from wagma_bench.record.files import write_text_atomic

DURATIONS = Path(__file__).with_name("durations.json")
_seconds: collections.Counter = (
    collections.Counter()
)  # this run's, by file (written out by --write-durations)


def pytest_addoption(parser):
    parser.addoption(
        "--write-durations",
        metavar="PATH",
        default=None,
        help="write each test file's seconds of test time in this run to PATH (JSON)",
    )


def read_durations(path: Path) -> dict[str, float]:
    return json.loads(path.read_text()) if path.exists() else {}


def pytest_collection_modifyitems(config, items):
    seconds = read_durations(DURATIONS)
    # stable: a file's tests keep their order and stay together (its module fixtures are made once)
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))


def pytest_runtest_logreport(report):
    _seconds[report.nodeid.split("::")[0]] += report.duration


def pytest_sessionfinish(session):
    path = session.config.getoption("--write-durations")
    if not path or hasattr(session.config, "workerinput"):  # under xdist the controller holds every report
        return
    table = {name: round(s, 1) for name, s in sorted(_seconds.items(), key=lambda kv: -kv[1])}
    write_text_atomic(Path(path), json.dumps(table, indent=1) + "\n")
