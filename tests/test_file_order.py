"""make test's phases: each test in exactly one, and the first hands out the longest test files first
(tests/file_order.py)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from types import SimpleNamespace

from _pytest.mark.expression import Expression  # what `pytest -m` evaluates

from tests import file_order

TESTS = Path(__file__).parent
PHASE_MARKERS = ("long", "serial", "alone", "background")  # the markers the Makefile's selections read


def selects(selection: str, marks: set[str]) -> bool:
    """Whether ``pytest -m selection`` runs a test with these markers."""
    return Expression.compile(selection).evaluate(lambda name, **_: name in marks)


def test_make_tests_phases_run_every_test_exactly_once_whatever_its_markers():
    """The `-m` selections of make test's recipe, against every combination of the markers they read: a test
    not marked `long` falls in exactly one phase (none would drop it silently, two would run it twice), a
    `long` one in none (make test-long runs those)."""
    makefile = (TESTS.parent / "Makefile").read_text()
    recipe = makefile[makefile.index("\ntest: ") :].split("\n\n", 1)[0]
    selections = re.findall(r'-m "([^"]+)"', recipe)
    assert len(selections) == 4, selections
    for flags in itertools.product((False, True), repeat=len(PHASE_MARKERS)):
        marks = {name for name, on in zip(PHASE_MARKERS, flags) if on}
        phases = [s for s in selections if selects(s, marks)]
        assert len(phases) == (0 if "long" in marks else 1), f"a test marked {sorted(marks)} runs in {phases}"


def test_the_longest_files_come_first_each_file_whole_and_in_its_own_order(tmp_path, monkeypatch):
    table = tmp_path / "durations.json"
    table.write_text(json.dumps({"tests/test_b.py": 30.0, "tests/test_c.py": 5.0}))
    monkeypatch.setattr(file_order, "DURATIONS", table)
    ids = [
        "tests/test_a.py::one",
        "tests/test_a.py::two",
        "tests/test_b.py::one",
        "tests/test_b.py::two[1]",
        "tests/test_c.py::one",
        "tests/test_d.py::one",
        "tests/test_b.py::two[2]",
    ]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    file_order.pytest_collection_modifyitems(None, items)
    # unmeasured files (a, d) last, in their collection order
    assert [i.nodeid for i in items] == [
        "tests/test_b.py::one",
        "tests/test_b.py::two[1]",
        "tests/test_b.py::two[2]",
        "tests/test_c.py::one",
        "tests/test_a.py::one",
        "tests/test_a.py::two",
        "tests/test_d.py::one",
    ]


def test_the_measured_table_names_only_test_files_that_exist():
    table = file_order.read_durations(file_order.DURATIONS)
    assert table, "tests/durations.json: write it with pytest -p tests.file_order --write-durations"
    missing = [name for name in table if not (TESTS.parent / name).is_file()]
    assert not missing, f"tests/durations.json names files that are gone: {missing}; measure it again"
    assert all(seconds >= 0 for seconds in table.values())
