"""A rank's step records are read through one type (:class:`wagma_bench.record.steps.StepRecord`), in one
module: no module reads a step record by string key (``r["compute_s"]``, ``rec.get("local_step")``) outside
``record/steps.py``. An AST walk of the package fails on such a read, and planted ones are caught; the type
itself cannot be read by key."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from wagma_bench.record.steps import STEP_FIELDS, StepRecord

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "wagma_bench"
HOME = "wagma_bench/record/steps.py"
_parse = functools.cache(ast.parse)

# keys that only a step record has: a read of one by key is a step record read by key, whatever its name
STEP_ONLY = {"local_step", "compute_s", "compute_cpu_s", "delay_s", "comm_s"}
# what gives step records (a call of one of these), so that a name bound from it is a step record's
SOURCES = {"read_step_records", "read_step_log", "step_logs", "load_step_records", "StepRecord.from_json"}


def _source_call(node: ast.AST) -> bool:
    """A call of one of :data:`SOURCES` (``steps.read_step_records(...)``, ``StepRecord.from_json(...)``)."""
    name = ast.unparse(node.func) if isinstance(node, ast.Call) else ""
    return any(name == s or name.endswith("." + s) for s in SOURCES)


def _key(node: ast.AST) -> str | None:
    """The string key ``node`` reads (``x["k"]`` loaded, ``x.get("k", ...)``), else None."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        key = node.slice
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        key = node.args[0] if node.args else None
    else:
        return None
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


def _read_on(node: ast.AST) -> ast.AST:
    """What a key read reads from, to its name: ``recs`` for ``recs[0]["round"]``."""
    on = node.value if isinstance(node, ast.Subscript) else node.func.value
    while isinstance(on, ast.Subscript):
        on = on.value
    return on


def _gives_steps(expr: ast.AST, names: set[str]) -> bool:
    return any(_source_call(n) or isinstance(n, ast.Name) and n.id in names for n in ast.walk(expr))


def _step_names(fn: ast.AST) -> set[str]:
    """Names in ``fn`` that hold step records: its arguments annotated with StepRecord, names bound from a
    call of :data:`SOURCES`, and the loop targets over them (followed until nothing new)."""
    names = {
        a.arg
        for a in (*fn.args.args, *fn.args.kwonlyargs)
        if a.annotation is not None and "StepRecord" in ast.unparse(a.annotation)
    }
    while True:
        found = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                targets, source = node.targets, node.value
            elif isinstance(node, (ast.For, ast.comprehension)):
                targets, source = [node.target], node.iter
            else:
                continue
            if _gives_steps(source, names):
                found |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if found <= names:
            return names
        names |= found


def step_key_reads(source: str) -> list[tuple[str, int]]:
    """(function, line) of every read of a step record by string key in ``source``: a key only a step record
    has, on anything; any key, on a name that holds step records."""
    out: dict[int, str] = {}  # line -> the innermost function holding it (ast.walk reaches it last)
    tree = _parse(source)
    for node in ast.walk(tree):
        if _key(node) in STEP_ONLY:
            out[node.lineno] = "<module>"
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        names = _step_names(fn)
        for node in ast.walk(fn):
            key = _key(node)
            on = _read_on(node) if key is not None else None
            if key in STEP_ONLY or key is not None and isinstance(on, ast.Name) and on.id in names:
                out[node.lineno] = getattr(fn, "name", "<lambda>")
    return [(name, line) for line, name in sorted(out.items())]


def test_no_step_record_is_read_by_key_outside_its_module():
    found = [
        f"{path.relative_to(ROOT)}:{line} ({fn})"
        for path in sorted(PACKAGE.rglob("*.py"))
        if str(path.relative_to(ROOT)) != HOME
        for fn, line in step_key_reads(path.read_text())
    ]
    assert not found, "read step records through StepRecord (record/steps.py), not by key:\n" + "\n".join(
        found
    )


def test_a_planted_key_read_is_caught():
    planted = (
        "def f(run_dir, recs: list[StepRecord], meta):\n"
        "    a = [r['compute_s'] for r in recs]\n"  # a step-only key, on anything
        "    for rank, rs in read_step_records(run_dir).items():\n"
        "        b = rs[-1].get('t')\n"  # a shared key, on a name bound from the reader
        "    c = recs[0]['round']\n"  # a shared key, on an argument typed as step records
        "    d = [x.get('samples', 0) for x in step_logs(run_dir)[0]]\n"
        "    e = meta['round'], meta.get('samples')\n"  # event metadata: its own keys
        "    return a, b, c, d, e, other['comm_s']\n"  # a step-only key, on anything
    )
    assert [line for _, line in step_key_reads(planted)] == [2, 4, 5, 6, 8]


def test_the_guard_fails_on_a_reader_planted_back_into_the_package():
    """calibrate.py's reading as it was before the type (records by key): found, named by function."""
    path = PACKAGE / "simulate" / "calibrate.py"
    source = path.read_text()
    old = "trace = [[float(r.compute_s) for r in recs] for recs in by_rank]"
    assert old in source
    planted = source.replace(old, 'trace = [[float(r["compute_s"]) for r in recs] for recs in by_rank]')
    assert [fn for fn, _ in step_key_reads(planted)] == ["fit_run"]


def test_a_step_record_has_fields_not_keys():
    record = StepRecord.from_json({"step": 3, "round": 2, "compute_s": 0.5, "loss": 1.0})
    assert (record.local_step, record.round, record.compute_s, record.delay_s) == (3, 2, 0.5, None)
    assert STEP_FIELDS == StepRecord._fields[: len(STEP_FIELDS)] and "preempted" not in STEP_FIELDS
    with pytest.raises(TypeError):
        record["compute_s"]
