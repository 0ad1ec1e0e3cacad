"""A run's summary is read through one type (:class:`wagma_bench.record.summary.RunSummary`): its old field
names read as today's, the fields it does not name kept, and no module reads a summary by string key
(``summary["status"]``, ``summary.get("rounds")``) outside it: an AST walk of the package fails on such a
read, and a planted one is caught."""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

from wagma_bench.record.summary import RunSummary, run_summary

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "wagma_bench"
HOME = "wagma_bench/record/summary.py"
_parse = functools.cache(ast.parse)  # each module parsed once for both walks

# Sites still reading a summary mapping by key, each with why ((module path, function name): reason). None.
ALLOWED: dict[tuple[str, str], str] = {}


def _summaryish(node: ast.AST, aliases: set[str]) -> bool:
    """An expression that is a run summary (or a collection of them) by its name: ``summary``, ``saved``,
    ``r.summary``, ``record.saved_summary``, ``record.summary_or_saved()``, ``summaries[t.name]``,
    ``summaries.values()``, or a local name bound to one."""
    if isinstance(node, ast.BoolOp):  # (summary or {}).get("status")
        return any(_summaryish(v, aliases) for v in node.values)
    if isinstance(node, ast.Subscript):  # summaries[t.name]: one of a collection of summaries
        return _summaryish(node.value, aliases)
    if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.DictComp)):  # [summaries[t] for t in done]
        return _summaryish(node.value if isinstance(node, ast.DictComp) else node.elt, aliases)
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return any(word in node.id for word in ("summary", "summaries")) or node.id in aliases
    if isinstance(node, ast.Attribute) and node.attr in ("values", "items"):  # summaries.values()
        return _summaryish(node.value, aliases)
    return isinstance(node, ast.Attribute) and (
        "summary" in node.attr and node.attr != "summary_after_events" or "summaries" in node.attr
    )


def _aliases(fn: ast.AST) -> set[str]:
    """Names bound to a summary within ``fn`` (``s = r.summary``, ``s = summaries[t.name]``, ``for s in
    summaries.values()``, ``[... for n, s in summaries.items()]``), followed until nothing new."""
    names: set[str] = set()
    while True:
        found = set()
        for a in ast.walk(fn):
            if isinstance(a, ast.Assign) and _summaryish(a.value, names):
                found |= {t.id for t in a.targets if isinstance(t, ast.Name)}
            elif isinstance(a, (ast.For, ast.comprehension)) and _summaryish(a.iter, names):
                found |= {n.id for n in ast.walk(a.target) if isinstance(n, ast.Name)}
        if found <= names:
            return names
        names |= found


def _key_read(node: ast.AST, aliases: set[str]) -> bool:
    """``<summary>["key"]`` read (not written), or ``<summary>.get("key", ...)``."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        key = node.slice
        return (
            isinstance(key, ast.Constant) and isinstance(key.value, str) and _summaryish(node.value, aliases)
        )
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        first = node.args[0] if node.args else None
        return (
            isinstance(first, ast.Constant)
            and isinstance(first.value, str)
            and _summaryish(node.func.value, aliases)
        )
    return False


def summary_key_reads(source: str) -> list[tuple[str, int]]:
    """(function, line) of every string-key read of a run summary in ``source``."""
    out: dict[int, str] = {}  # line -> the innermost function holding it (ast.walk reaches it last)
    for fn in ast.walk(_parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        aliases = _aliases(fn)  # a name bound to a summary (s = r.summary), followed within the function
        name = getattr(fn, "name", "<lambda>")
        out.update((n.lineno, name) for n in ast.walk(fn) if _key_read(n, aliases))
    return [(name, line) for line, name in sorted(out.items())]


def summary_writes(source: str) -> list[int]:
    """Lines of ``source`` that write a file named by ``SUMMARY`` or ``"summary.json"`` (a call whose name
    says write, given such a path)."""

    def names_summary(arg: ast.AST) -> bool:
        return any(
            isinstance(n, ast.Name)
            and n.id == "SUMMARY"
            or isinstance(n, ast.Constant)
            and n.value == "summary.json"
            for n in ast.walk(arg)
        )

    return [
        n.lineno
        for n in ast.walk(_parse(source))
        if isinstance(n, ast.Call)
        and "write" in ast.unparse(n.func).lower()
        and any(names_summary(a) for a in n.args[:1])
    ]


def test_summary_json_is_written_in_one_place():
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if str(path.relative_to(ROOT)) != HOME
        for line in summary_writes(path.read_text())
    ]
    assert not found, "write summary.json through record/summary.py's write_summary:\n" + "\n".join(found)
    planted = "def f(d):\n    write_json_atomic(d / SUMMARY, {})\n    atomic_write(d / 'summary.json', b'')\n"
    assert summary_writes(planted) == [2, 3]


def test_no_summary_is_read_by_key_outside_its_type():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel == HOME:
            continue
        found += [
            f"{rel}:{line} ({fn})"
            for fn, line in summary_key_reads(path.read_text())
            if (rel, fn) not in ALLOWED
        ]
    assert not found, "read through RunSummary (record/summary.py), not by key:\n" + "\n".join(found)


def test_a_planted_key_read_is_caught():
    planted = (
        "def f(run, record):\n"
        "    s = run.summary\n"
        "    a = summary['rounds']\n"
        "    b = record.saved_summary.get('status')\n"
        "    c = s.get('reached')\n"
        "    d = record.summary_or_saved()['train_s']\n"
        "    e = (summary or {}).get('wandb')\n"
        "    summary['error'] = 'x'\n"  # a write: the writer's own business, not a read
        "    t = summaries[name]\n"
        "    f = t['optimizer']\n"  # one of a collection of summaries, by its binding
        "    g = [x.get('reference_s') for x in summaries.values()]\n"
        "    for n, y in summaries.items():\n"
        "        h = y['rounds']\n"
        "    ran = [summaries[n] for n in names]\n"
        "    i = [r.get('compute_imbalance') for r in ran]\n"  # a list of them, by its element
        "    return other['rounds'], other.get('status')\n"
    )
    assert [line for _, line in summary_key_reads(planted)] == [3, 4, 5, 6, 7, 10, 11, 13, 15]


def test_old_names_read_as_today_and_unknown_fields_kept():
    s = RunSummary.from_json(
        {"status": "completed", "steps": 12, "steps_to_target": 8, "train_s": 6.0, "x": 1}
    )
    assert (s.rounds, s.rounds_to_target, s.round_s, s.finished) == (12, 8, 0.5, True)
    assert s.extra == {"x": 1} and list(s.to_json()) == [
        "status",
        "rounds",
        "rounds_to_target",
        "train_s",
        "x",
    ]
    assert run_summary(None) is None and run_summary(s) is s and RunSummary.from_json({}).restarts == 0


def test_every_committed_summary_reads_back_whole():
    """Each field of a committed summary is either named by the type or kept in ``extra``, at its value."""
    paths = sorted((ROOT / "reproduce").rglob("summary.json"))[:40]
    assert paths
    for path in paths:
        raw = json.loads(path.read_text())
        if not {"steps", "steps_to_target"} & raw.keys():  # an old one reads under today's names (above)
            assert json.dumps(RunSummary.load(path).to_json()) == json.dumps(raw), path
