"""make test's first phase hands out the longest test files first (tests/file_order.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from tests import file_order

TESTS = Path(__file__).parent


def test_the_longest_files_come_first_each_file_whole_and_in_its_own_order(tmp_path, monkeypatch):
    table = tmp_path / "durations.json"
    table.write_text(json.dumps({"tests/test_b.py": 30.0, "tests/test_c.py": 5.0}))
    monkeypatch.setattr(file_order, "DURATIONS", table)
    ids = ["tests/test_a.py::one", "tests/test_a.py::two", "tests/test_b.py::one", "tests/test_b.py::two[1]",
           "tests/test_c.py::one", "tests/test_d.py::one", "tests/test_b.py::two[2]"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    file_order.pytest_collection_modifyitems(None, items)
    # unmeasured files (a, d) last, in their collection order
    assert [i.nodeid for i in items] == [
        "tests/test_b.py::one", "tests/test_b.py::two[1]", "tests/test_b.py::two[2]", "tests/test_c.py::one",
        "tests/test_a.py::one", "tests/test_a.py::two", "tests/test_d.py::one"]


def test_the_measured_table_names_only_test_files_that_exist():
    table = file_order.read_durations(file_order.DURATIONS)
    assert table, "tests/durations.json: write it with pytest -p tests.file_order --write-durations"
    missing = [name for name in table if not (TESTS.parent / name).is_file()]
    assert not missing, f"tests/durations.json names files that are gone: {missing}; measure it again"
    assert all(seconds >= 0 for seconds in table.values())
