"""Figures in the docs that a command generates from committed results: the text must equal the command's output
(a table changed by hand, or a new result committed without regenerating the text, fails here). The claims table
of the README has its own test (tests/test_claims.py)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRAGGLERS = ROOT / "reproduce" / "imbalance" / "results-2core-20261201-divide-first-idle.json"


def _bench():
    spec = importlib.util.spec_from_file_location("bench", ROOT / "reproduce" / "imbalance" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_straggler_table_is_the_bench_scripts_table_of_the_committed_run():
    rows = json.loads(STRAGGLERS.read_text())
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    block = re.search(r"<!-- bench:begin -->\n(.*?)\n<!-- bench:end -->", doc, re.DOTALL)
    assert block, "docs/benchmarks.md has no <!-- bench:begin --> ... <!-- bench:end --> block"
    assert block.group(1) == _bench().table(rows), (
        f"docs/benchmarks.md differs from `reproduce/imbalance/bench.py --table {STRAGGLERS.relative_to(ROOT)}`")
    assert STRAGGLERS.name in doc


def test_readme_straggler_figures_are_the_committed_runs():
    p4 = next(r for r in json.loads(STRAGGLERS.read_text()) if (r["P"], r["k"]) == (4, 1))
    bullet = next(line for line in (ROOT / "README.md").read_text().split("\n- ") if line.startswith("**Stragglers**"))
    said = " ".join(bullet.split())
    assert f"{p4['wagma_of_mean_bound']:.2f} of the mean-speed bound" in said
    assert f"{p4['wagma_over_allreduce']:.2f}x Allreduce-SGD" in said
    assert f"the bound is {p4['bound_ratio']:.2f}x" in said


def _script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STARTUP = [ROOT / "reproduce" / "startup" / name
           for name in ("results-2core-20261202-before.json", "results-2core-20261202.json",
                        "results-2core-20261202-server-first.json")]


def test_readme_startup_table_is_the_bench_scripts_table_of_the_committed_runs():
    table = _script(ROOT / "reproduce" / "startup" / "bench.py").table([json.loads(p.read_text()) for p in STARTUP])
    block = re.search(r"<!-- startup:begin -->\n(.*?)\n<!-- startup:end -->", (ROOT / "README.md").read_text(),
                      re.DOTALL)
    assert block, "README.md has no <!-- startup:begin --> ... <!-- startup:end --> block"
    assert block.group(1) == table, ("README.md differs from `reproduce/startup/bench.py --table "
                                     + " ".join(str(p.relative_to(ROOT)) for p in STARTUP) + "`")


def test_engine_page_compute_gap_table_is_the_scripts_table_of_the_committed_run():
    result = ROOT / "reproduce" / "engine" / "results-2core-20261202.json"
    table = _script(ROOT / "reproduce" / "engine" / "compute_gap.py").table(json.loads(result.read_text())["rows"])
    doc = (ROOT / "docs" / "wait-avoiding-engine.md").read_text()
    block = re.search(r"<!-- compute-gap:begin -->\n(.*?)\n<!-- compute-gap:end -->", doc, re.DOTALL)
    assert block, "docs/wait-avoiding-engine.md has no <!-- compute-gap:begin --> ... <!-- compute-gap:end --> block"
    assert block.group(1) == table, f"the page differs from `reproduce/engine/compute_gap.py --table {result.relative_to(ROOT)}`"
    assert result.name in doc


def test_after_wagma_tables_are_the_scripts_tables_of_the_committed_tunings():
    doc = (ROOT / "docs" / "optimizers.md").read_text()
    block = re.search(r"<!-- after-wagma:begin -->\n(.*?)\n<!-- after-wagma:end -->", doc, re.DOTALL)
    assert block, "docs/optimizers.md has no <!-- after-wagma:begin --> ... <!-- after-wagma:end --> block"
    assert block.group(1) == _script(ROOT / "reproduce" / "tuning" / "after_wagma.py").tables(), (
        "docs/optimizers.md differs from `reproduce/tuning/after_wagma.py`")
