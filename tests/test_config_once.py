"""The configuration is checked once per run and carried typed: one process of a run validates it, on every
launcher (a local run here; run's own mpiexec and a user's mpiexec in tests/test_mpi.py, whose worlds run by
themselves, torchrun in tests/test_launch_conventions.py, srun in tests/test_slurm.py: each a world that file
runs anyway), the other processes take the checked configuration from it (wagma_bench/runtime/handover.py);
RunConfig's sections are typed; nothing outside config/ reads the composed configuration by a section's name,
or takes a live run's composed mapping but whole through config.schema.as_recorded."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.cli_util import run
from tests.validate_count import TINY, counting_env, validated_once

ROOT = Path(__file__).resolve().parents[1]


def test_a_local_run_validates_its_configuration_once_in_all_its_processes(tmp_path):
    """The command checks the configuration; its ranks get the checked RunConfig and check nothing again."""
    env, log = counting_env(tmp_path)
    out = run(["launcher.nproc=2", *TINY, f"hydra.run.dir={tmp_path / 'run'}"], env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()
    validated_once(log, 3)  # the command and its two ranks at least


def test_a_rank_takes_only_its_own_launchs_check_from_the_run_directory(tmp_path):
    """Under srun the other ranks read rank 0's check from the run directory: a file left by an earlier job
    (or the last attempt before a requeue) is not theirs, and they wait for their own; a refusal reaches them
    too."""
    import threading

    from wagma_bench.runtime.handover import FileChannel

    FileChannel(tmp_path, "slurm-7.0.restart-0").publish({"config": {"seed": 1}})
    mine = FileChannel(tmp_path, "slurm-7.0.restart-1")
    threading.Timer(0.3, mine.publish, [{"refused": "train.lr=-1 is not allowed"}]).start()
    assert mine.receive()["refused"] == "train.lr=-1 is not allowed"


def test_a_checked_configuration_is_handed_only_to_its_own_run_directory(tmp_path):
    """A file named by the launching process counts for the run directory it was written for alone (under -m
    every job has its own), and carries the configuration as checked: infinite values, ints and floats
    kept."""
    from wagma_bench.runtime.handover import CHECKED_ENV, handed, write_checked

    raw = {"seed": 3, "train": {"lr": 1, "time_limit_s": float("inf")}}
    path = write_checked(tmp_path, raw, "test")
    assert handed(tmp_path, {CHECKED_ENV: str(path)}) == raw
    assert handed(tmp_path / "other", {CHECKED_ENV: str(path)}) is None
    assert handed(tmp_path, {}) is None


def test_a_checked_configuration_is_built_again_as_validate_built_it():
    """``from_checked`` (what a rank handed a checked configuration runs) gives the RunConfig ``validate``
    gave."""
    from tests.cli_util import compose
    from wagma_bench.config.schema import as_recorded, from_checked, validate

    for overrides in ([], ["optimizer=wagma", "imbalance=fixed", "imbalance.ranks=[1]"], ["workload=ddppo"]):
        checked = validate(compose(*overrides))
        assert from_checked(as_recorded(checked)) == checked, overrides


def test_every_section_of_a_run_configuration_has_a_type():
    """RunConfig declares a type for every section, an option-dependent one as the union of its options'
    schemas, and a validated configuration's sections are of them (no ``Any``)."""
    import dataclasses
    import typing

    from tests.cli_util import compose
    from wagma_bench.config.schema import RunConfig, validate

    hints = typing.get_type_hints(RunConfig)
    assert [name for name, hint in hints.items() if hint is typing.Any] == []
    options = ([], ["workload=transformer", "optimizer=sgp", "imbalance=lognormal"], ["workload=ddppo"])
    for overrides in options:
        checked = validate(compose(*overrides))
        for f in dataclasses.fields(RunConfig):
            if f.name != "composed":
                assert isinstance(getattr(checked, f.name), hints[f.name]), (overrides, f.name)


# The sections of a run's configuration: a mapping read by one of these keys, then by another string key, is
# the composed config read by key (``c["optimizer"]["name"]``, ``raw.get("train", {}).get("lr")``), or
# ``.raw[...]``.
SECTIONS = {
    "launcher",
    "comm",
    "train",
    "eval",
    "optimizer",
    "workload",
    "data",
    "imbalance",
    "checkpoint",
    "logger",
    "env",
}


def _string_key(node: ast.AST) -> str | None:
    """The string key ``node`` reads a mapping by (``x["k"]``, ``x.get("k", ...)``), else None."""
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    ):
        return node.slice.value
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return node.args[0].value
    return None


def _read_from(node: ast.AST) -> ast.AST:
    """The expression whose key ``node`` reads (through a ``x.get(...) or {}`` too)."""
    inner = node.value if isinstance(node, ast.Subscript) else node.func.value
    return inner.values[0] if isinstance(inner, ast.BoolOp) else inner


def config_reads_by_key(source: str) -> list[tuple[int, str]]:
    """Where ``source`` reads the composed configuration by string keys: a section's key read after the
    section's (``c["optimizer"]["name"]``), or any key of ``X.raw``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if _string_key(node) is None:
            continue
        inner = _read_from(node)
        if _string_key(inner) in SECTIONS or (isinstance(inner, ast.Attribute) and inner.attr == "raw"):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_composed_dictionary_is_read_by_key_only_inside_config():
    """Outside config/, no module reads the composed configuration by string keys: the typed RunConfig has
    every value (an AST walk; the regex it replaces missed ``c['optimizer']['name']``, the W&B sink's
    reads)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {code}"
        for path in sorted((ROOT / "wagma_bench").rglob("*.py"))
        if "config" not in path.parts
        for line, code in config_reads_by_key(path.read_text())
    ]
    assert offenders == []


@pytest.mark.parametrize(
    "planted",
    [
        'c["optimizer"]["name"]',
        'raw.get("train", {}).get("lr")',
        '(raw.get("data") or {}).get("root")',
        'cfg.raw["seed"]',
    ],
)
def test_the_key_read_check_finds_a_planted_read(planted):
    assert config_reads_by_key(f"x = {planted}\n") == [(1, ast.unparse(ast.parse(planted).body[0].value))]
    assert config_reads_by_key('summary["optimizer"]; event["metadata"]["world_size"]\n') == []


def composed_reads(source: str) -> list[tuple[int, str]]:
    """Where ``source`` takes a RunConfig's composed mapping (``cfg.composed``), not its typed fields."""
    return [
        (node.lineno, ast.unparse(node))
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr == "composed"
    ]


def test_a_live_configuration_is_read_by_its_typed_fields_outside_config():
    """Outside config/, a run's composed mapping is taken whole, through config.schema.as_recorded (to record
    and hash it), never as ``cfg.composed`` (whose keys could then be read); the check finds a planted one."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {code}"
        for path in sorted((ROOT / "wagma_bench").rglob("*.py"))
        if "config" not in path.parts
        for line, code in composed_reads(path.read_text())
    ]
    assert offenders == []
    assert composed_reads("lr = cfg.composed['train']['lr']\n") == [(1, "cfg.composed")]
