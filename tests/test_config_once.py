"""The configuration is checked once per run and carried typed: the command validates it, a local run's
ranks get the checked RunConfig, and nothing outside config/ subscripts the composed dictionary by a section's
name (record/rundir.py's identity rules read it as data, by .get)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from tests.cli_util import QUICK, run

ROOT = Path(__file__).resolve().parents[1]

# Installed in every Python process of the run (the command, the rank server, the store, each rank) through
# sitecustomize: each call of schema.validate appends its process id to a file.
COUNTING_HOOK = """
import functools, os
import wagma_bench.config.schema as schema

with open(os.environ["WAGMA_TEST_VALIDATE_LOG"] + ".loaded", "a") as f:  # the hook is in this process
    f.write(f"{os.getpid()}\\n")

_validate = schema.validate

@functools.wraps(_validate)
def counting_validate(*args, **kwargs):
    with open(os.environ["WAGMA_TEST_VALIDATE_LOG"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    return _validate(*args, **kwargs)

schema.validate = counting_validate
"""


def test_a_local_run_validates_its_configuration_once_in_all_its_processes(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(COUNTING_HOOK)
    log = tmp_path / "validate.log"
    env = {**os.environ, "WAGMA_TEST_VALIDATE_LOG": str(log),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}
    # two rounds and one evaluation: every process that could validate still starts and runs its part
    out = run([*QUICK[:1], "train.max_rounds=2", "eval.every_rounds=2", *QUICK[3:], f"hydra.run.dir={tmp_path / 'run'}"],
              env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()
    loaded = set(log.with_name(log.name + ".loaded").read_text().split())
    assert len(loaded) >= 3, loaded  # the command and its two ranks at least (a hook that failed to load counts 0)
    calls = log.read_text().split()
    assert calls == [calls[0]], f"schema.validate called {len(calls)} times, in processes {calls}"


# The sections of a run's configuration: a mapping read by one of these keys, then by another string key, is the
# composed config read by key (``c["optimizer"]["name"]``, ``raw.get("train", {}).get("lr")``), or ``.raw[...]``.
SECTIONS = {"launcher", "comm", "train", "eval", "optimizer", "workload", "data", "imbalance", "checkpoint", "logger",
            "env"}


def _string_key(node: ast.AST) -> str | None:
    """The string key ``node`` reads a mapping by (``x["k"]``, ``x.get("k", ...)``), else None."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value
    return None


def _read_from(node: ast.AST) -> ast.AST:
    """The expression whose key ``node`` reads (through a ``x.get(...) or {}`` too)."""
    inner = node.value if isinstance(node, ast.Subscript) else node.func.value
    return inner.values[0] if isinstance(inner, ast.BoolOp) else inner


def config_reads_by_key(source: str) -> list[tuple[int, str]]:
    """Where ``source`` reads the composed configuration by string keys: a section's key read after the section's
    (``c["optimizer"]["name"]``), or any key of ``X.raw``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if _string_key(node) is None:
            continue
        inner = _read_from(node)
        if _string_key(inner) in SECTIONS or (isinstance(inner, ast.Attribute) and inner.attr == "raw"):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_composed_dictionary_is_read_by_key_only_inside_config():
    """Outside config/, no module reads the composed configuration by string keys: the typed RunConfig has every
    value (an AST walk; the regex it replaces missed ``c['optimizer']['name']``, the W&B sink's reads)."""
    offenders = [f"{path.relative_to(ROOT)}:{line}: {code}"
                 for path in sorted((ROOT / "wagma_bench").rglob("*.py")) if "config" not in path.parts
                 for line, code in config_reads_by_key(path.read_text())]
    assert offenders == []


@pytest.mark.parametrize("planted", ['c["optimizer"]["name"]', 'raw.get("train", {}).get("lr")',
                                     '(raw.get("data") or {}).get("root")', 'cfg.raw["seed"]'])
def test_the_key_read_check_finds_a_planted_read(planted):
    assert config_reads_by_key(f"x = {planted}\n") == [(1, ast.unparse(ast.parse(planted).body[0].value))]
    assert config_reads_by_key('summary["optimizer"]; event["metadata"]["world_size"]\n') == []
