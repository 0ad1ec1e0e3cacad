"""What a registered optimizer or workload needs besides its class, walked for every entry of the registries
(``wagma_bench.optim.OPTIMIZERS``, ``wagma_bench.workloads.WORKLOADS``): each missing piece is reported as
``NAME: add X to FILE``, so a contributor adding one (docs/architecture.md, "Adding an optimizer", "Adding a
workload") runs one test and reads a list of edits. The per-piece tests elsewhere call the same checks
(``missing(piece, name)``).

A piece is a check of one file; the architecture page's list names every piece's file, and that is
checked here too, so the list and this test cannot drift apart."""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from omegaconf import OmegaConf

from wagma_bench.optim import OPTIMIZERS
from wagma_bench.optim.registry import UNFOUND
from wagma_bench.optim.specs import OPTIMIZER_SPECS
from wagma_bench.ranges import range_of
from wagma_bench.workloads import WORKLOADS
from wagma_bench.workloads.specs import WORKLOAD_SPECS

ROOT = Path(__file__).resolve().parents[1]
MD = MarkdownIt("commonmark").enable("table")
SPECS = "wagma_bench/optim/specs.py"  # the optimizers' settings and rules, read by the config check
WORKLOAD_SPECS_FILE = "wagma_bench/workloads/specs.py"  # the workloads'


@dataclass(frozen=True)
class Piece:
    what: str
    file: str  # the file to edit, NAME standing for the optimizer's name
    check: Callable[[str], list[str]]  # name -> what is missing, each "NAME: add X to FILE"


def registered() -> list[str]:
    """Every optimizer a contributor has begun: a spec in the table, or a class in the registry."""
    return list(dict.fromkeys([*OPTIMIZER_SPECS, *OPTIMIZERS]))


def settings_of(name: str) -> type:
    """Its Settings: the spec's (what the config check reads), else its class's."""
    return (OPTIMIZER_SPECS.get(name) or OPTIMIZERS[name]).Settings


def module_and_attributes(name: str) -> list[str]:
    path = f"wagma_bench/optim/{name}.py"
    if name not in OPTIMIZERS:  # the registry found no class inheriting the spec there
        return [f"{name}: {UNFOUND.get(name, f'add {path}, its algorithm')}"]
    cls = OPTIMIZERS[name]
    if cls.__module__ != f"wagma_bench.optim.{name}":
        return [
            (
                f"{name}: add the class {cls.__name__} to {path} (it is in {cls.__module__}; one module per "
                f"optimizer, named after its option)"
            )
        ]
    return [
        f"{name}: add `{attr}` ({why}) to {cls.__name__} in {path}"
        for attr, why in (
            ("paper", "what the tables print"),
            ("models_identical", "every rank holds the same model at a sync point"),
        )
        if attr not in cls.__dict__
    ]


def spec(name: str) -> list[str]:
    cls, spec = OPTIMIZERS.get(name), OPTIMIZER_SPECS.get(name)
    if spec is None or (cls is not None and not issubclass(cls, spec)):
        return [
            (
                f"{name}: add a spec class (name, Settings, its rules) to OPTIMIZER_SPECS in {SPECS} and "
                "make its algorithm inherit it (the config check reads the spec, without torch)"
            )
        ]
    return [
        f"{name}: add `{attr}` ({why}) to {spec.__name__} in {SPECS}"
        for attr, why in (
            ("name", f"= {name!r}, its option name"),
            ("Settings", "a dataclass of its settings"),
        )
        if attr not in spec.__dict__
    ] + (
        [f"{name}: set `name = {name!r}` in {spec.__name__} in {SPECS} (the registry's key is {name!r})"]
        if spec.__dict__.get("name", name) != name
        else []
    )


def yaml_file(name: str) -> list[str]:
    path = f"conf/optimizer/{name}.yaml"
    settings = settings_of(name)
    defaults = {f.name: f.default for f in dataclasses.fields(settings)}
    listing = ", ".join(f"{k}: {v!r}" for k, v in defaults.items())
    if not (ROOT / path).is_file():
        return [
            (
                f"{name}: add {path} (every setting of {settings.__qualname__} with its default and a "
                f"comment: {listing})"
            )
        ]
    node = OmegaConf.to_container(OmegaConf.load(ROOT / path))
    lines = {line.split(":")[0]: line for line in (ROOT / path).read_text().splitlines() if ":" in line}
    out = []
    for key, default in defaults.items():
        if key not in node:
            out.append(f"{name}: add `{key}: {default}` with a comment to {path}")
        elif node[key] != default:
            out.append(
                f"{name}: make `{key}` in {path} ({node[key]!r}) equal {settings.__qualname__}'s default "
                f"({default!r}), in one of the two files"
            )
        elif key != "name" and "#" not in lines.get(key, ""):
            out.append(f"{name}: add a comment (what `{key}` does, its values) to its line in {path}")
    out += [
        f"{name}: remove `{key}` from {path} (not a field of {settings.__qualname__})"
        for key in node
        if key not in defaults
    ]
    return out


def _without_range(settings: type, name: str, file: str) -> list[str]:
    hints = typing.get_type_hints(settings)
    numeric = [
        f
        for f in dataclasses.fields(settings)
        if hints[f.name] is not bool and any(t in str(hints[f.name]) for t in ("int", "float"))
    ]
    return [
        f"{name}: declare `{f.name}` in the Settings of {file} with its range of allowed values, "
        f"`{f.name}: ... = setting(DEFAULT, RANGE)` (wagma_bench/ranges.py)"
        for f in numeric
        if range_of(f) is None
    ]


def ranges(name: str) -> list[str]:
    return _without_range(settings_of(name), name, SPECS)


def search_space(name: str) -> list[str]:
    from wagma_bench.config import search_space as spaces

    path = f"conf/search_space/{name}.yaml"
    if not spaces.space_path(name).exists():
        return [
            (
                f"{name}: add {path} (its one search space for `wagma-bench tune`: lr_multiplier, "
                "warmup_fraction and its own settings that change convergence; docs/tuning.md)"
            )
        ]
    if not (ROOT / f"conf/optimizer/{name}.yaml").is_file():
        return []  # its keys are checked by composing the option: its YAML comes first (that piece names it)
    keys = [d.key for d in spaces.load_space(name).dims]  # refuses what the run config would refuse
    return [
        f"{name}: add `{key}` to {path} (every optimizer tunes it, over the same range)"
        for key in ("lr_multiplier", "warmup_fraction")
        if key not in keys
    ]


def simulation(name: str) -> list[str]:
    from wagma_bench.simulate.des import SIMULATIONS

    if OPTIMIZER_SPECS.get(name) in SIMULATIONS:  # keyed by the spec: the simulator imports no torch
        return []
    return [
        (
            f'{name}: add its model to wagma_bench/simulate/des.py, `@simulates("{name}")` over '
            f"`def sim_{name}(cfg)` (its communication as a discrete-event model)"
        )
    ]


def invariant_case(name: str) -> list[str]:
    from tests.test_invariants import CONFIGS

    if any(optimizer == name for optimizer, _ in CONFIGS.values()):
        return []
    return [
        (
            f'{name}: add a case `"{name}": ("{name}", {{settings}})` to CONFIGS in tests/test_invariants.py '
            f"(the sum of the models under every straggler pattern)"
        )
    ]


def oracle(name: str) -> list[str]:
    from tests.test_optim_oracles import ORACLES

    if name not in ORACLES:
        return [
            (
                f'{name}: add `"{name}": "tests/FILE.py::TEST"` (a test of its exact recursion) to ORACLES '
                "in tests/test_optim_oracles.py"
            )
        ]
    path, test = ORACLES[name].split("::")
    tests = (
        {n.name for n in ast.parse((ROOT / path).read_text()).body if isinstance(n, ast.FunctionDef)}
        if (ROOT / path).is_file()
        else set()
    )
    if test not in tests:
        return [
            (
                f"{name}: add the test {ORACLES[name]} that ORACLES in tests/test_optim_oracles.py names "
                f"(it does not exist), or name an existing one there"
            )
        ]
    return []


def resume_entry(name: str) -> list[str]:
    from tests.test_faults import ASYNCHRONOUS, DETERMINISTIC

    if any(p.values[0] == name for p in DETERMINISTIC + ASYNCHRONOUS):
        return []
    return [
        (
            f'{name}: add `pytest.param("{name}")` to DETERMINISTIC (a resume ends bit-identical) or '
            f"ASYNCHRONOUS (every step logged once) in tests/test_faults.py"
        )
    ]


def _tables(path: Path) -> list[tuple[int, list[list[str]]]]:
    """(line, rows of cell texts, the header first) of every table of a Markdown page."""
    tables, rows, start = [], None, 0
    tokens = MD.parse(path.read_text())
    for i, tok in enumerate(tokens):
        if tok.type == "table_open":
            rows, start = [], tok.map[0] + 1
        elif tok.type == "tr_open":
            rows.append([])
        elif tok.type == "inline" and rows is not None and tokens[i - 1].type in ("th_open", "td_open"):
            rows[-1].append(tok.content.strip())
        elif tok.type == "table_close":
            tables.append((start, rows))
            rows = None
    return tables


def docs_rows(name: str) -> list[str]:
    out = []
    page = "docs/optimizers.md"
    for line, rows in _tables(ROOT / page):
        if rows[0][0] == "optimizer" and name not in {row[0].strip("`") for row in rows[1:]}:
            out.append(
                f"{name}: add a row `| {name} | ...` to the optimizer table at line {line} of {page} "
                f"(its measured record, or 'not measured yet')"
            )
    page = "docs/configuration.md"
    option_rows = [row for _, rows in _tables(ROOT / page) for row in rows if row[0] == "`optimizer`"]
    if not option_rows:
        out.append(f"{name}: add the row | `optimizer` | ... | to the option table of {page}")
    elif f"`{name}`" not in option_rows[0][1]:
        out.append(f"{name}: add `{name}` to the `optimizer` row of the option table in {page}")
    return out


PIECES = [
    Piece("the algorithm's module and class attributes", "wagma_bench/optim/NAME.py", module_and_attributes),
    Piece("the option's YAML", "conf/optimizer/NAME.yaml", yaml_file),
    Piece("the spec the configuration check reads", SPECS, spec),
    Piece("the range of every numeric setting", SPECS, ranges),
    Piece("the search space", "conf/search_space/NAME.yaml", search_space),
    Piece("the simulation", "wagma_bench/simulate/des.py", simulation),
    Piece("the invariant case", "tests/test_invariants.py", invariant_case),
    Piece("the oracle", "tests/test_optim_oracles.py", oracle),
    Piece("the resume test", "tests/test_faults.py", resume_entry),
    Piece("the documentation's rows", "docs/optimizers.md", docs_rows),
    Piece("the option table", "docs/configuration.md", docs_rows),
]


def missing(check: Callable[[str], list[str]], names: list[str] | None = None) -> list[str]:
    """What the registry's optimizers (or ``names``) lack for one piece; empty when nothing."""
    return [problem for name in (names or registered()) for problem in check(name)]


def test_optimizer_conformance():
    """Every registered optimizer has every piece; the failure lists each missing one as NAME: add X to
    FILE."""
    checks = list(dict.fromkeys(piece.check for piece in PIECES))
    problems = [problem for name in registered() for check in checks for problem in check(name)]
    assert not problems, "a registered optimizer lacks pieces:\n" + "\n".join(problems)


def test_adding_an_optimizer_adds_one_entry_to_one_table():
    """OPTIMIZER_SPECS is the one table of the optimizers: the algorithm registry and the simulator's are
    built from it, in its order, and neither module names an optimizer's spec or class itself."""
    from wagma_bench.optim.registry import algorithm_of
    from wagma_bench.simulate.des import SIMULATIONS

    assert list(OPTIMIZERS) == list(OPTIMIZER_SPECS)
    assert all(OPTIMIZERS[name] is algorithm_of(spec) for name, spec in OPTIMIZER_SPECS.items())
    assert list(SIMULATIONS) == list(OPTIMIZER_SPECS.values())
    for path in ("wagma_bench/optim/registry.py", "wagma_bench/simulate/des.py"):
        tree = ast.parse((ROOT / path).read_text())
        used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} | {
            alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names
        }
        named = [name for name, spec in OPTIMIZER_SPECS.items() if spec.__name__ in used]
        assert not named, f"{path} names {named} in its code: read them from OPTIMIZER_SPECS"


def _listed_under(heading: str) -> str:
    """The text of the numbered list under ``heading`` (bold) in docs/architecture.md."""
    tokens = MD.parse((ROOT / "docs" / "architecture.md").read_text())
    start = next(i for i, tok in enumerate(tokens) if tok.type == "inline" and heading in tok.content)
    first = next(i for i in range(start, len(tokens)) if tokens[i].type == "ordered_list_open")
    last = next(i for i in range(first, len(tokens)) if tokens[i].type == "ordered_list_close")
    return "\n".join(tok.content for tok in tokens[first:last] if tok.type == "inline")


def test_the_architecture_pages_list_names_every_piece_and_only_files_that_exist():
    text = _listed_under("Adding an optimizer")
    unnamed = [f"{piece.file} ({piece.what})" for piece in PIECES if f"`{piece.file}`" not in text]
    assert not unnamed, "docs/architecture.md, 'Adding an optimizer': name " + ", ".join(unnamed)
    paths = re.findall(r"`([\w./-]+/[\w.-]+\.(?:py|yaml|md))`", text)
    gone = [
        p for p in paths if not any((ROOT / p.replace("NAME", name)).is_file() for name in OPTIMIZER_SPECS)
    ]
    assert not gone, f"docs/architecture.md, 'Adding an optimizer' names files that do not exist: {gone}"


@pytest.mark.parametrize("piece", PIECES, ids=[p.what for p in PIECES])
def test_a_new_optimizer_without_any_piece_is_told_each_file_to_edit(piece, monkeypatch):
    """The check itself: an optimizer registered with nothing else fails every piece, naming its file."""

    @dataclass
    class Settings:
        name: str = "newopt"
        beta: float = 0.5

    class NewOpt(OPTIMIZERS["allreduce"]):
        pass

    NewOpt.Settings = Settings
    NewOpt.__module__ = "somewhere.else"
    monkeypatch.setitem(OPTIMIZERS, "newopt", NewOpt)
    found = piece.check("newopt")
    assert found and all(p.startswith("newopt: ") for p in found), found
    assert any(piece.file.replace("NAME", "newopt") in p for p in found), found


# --- workloads ---------------------------------------------------------------------------------------------


def workload_module(name: str) -> list[str]:
    cls = WORKLOADS[name]
    if cls.__module__ not in (f"wagma_bench.workloads.{name}", f"wagma_bench.workloads.{name}.workload"):
        return [
            (
                f"{name}: add the class {cls.__name__} to wagma_bench/workloads/{name}.py (or a package "
                f"wagma_bench/workloads/{name}/; it is in {cls.__module__})"
            )
        ]
    return []


def workload_spec(name: str) -> list[str]:
    cls, spec = WORKLOADS[name], WORKLOAD_SPECS.get(name)
    if spec is None or not issubclass(cls, spec):
        return [
            (
                f"{name}: add a spec class (name, Settings, DATA, its checks) to WORKLOAD_SPECS in "
                f"{WORKLOAD_SPECS_FILE} and make {cls.__name__} inherit it (the config check reads the spec, "
                "without torch)"
            )
        ]
    out = [
        f"{name}: add `{attr}` ({why}) to {spec.__name__} in {WORKLOAD_SPECS_FILE}"
        for attr, why in (
            ("name", f"= {name!r}"),
            ("Settings", "a dataclass of its settings"),
            ("DATA", "its data options and their schemas"),
            ("RANK_MEMORY_MB", "one rank's peak memory, reproduce/memory/footprint.py"),
        )
        if attr not in vars(spec)
    ]
    if spec.metric_name not in spec.METRIC_RANGES:
        out.append(
            f"{name}: add the range of its metric {spec.metric_name!r} to {spec.__name__}.METRIC_RANGES"
        )
    return out


def workload_yaml(name: str) -> list[str]:
    path = f"conf/workload/{name}.yaml"
    if not (ROOT / path).is_file():
        return [f"{name}: add {path} (every setting of its Settings with its default and a comment)"]
    node = OmegaConf.to_container(OmegaConf.load(ROOT / path))
    node = node.get("workload", node)  # a `@package _global_` file sets its section and the data's defaults
    keys = {f.name for f in dataclasses.fields(WORKLOADS[name].Settings)}
    return [
        f"{name}: add `{key}` with its default and a comment to {path}" for key in sorted(keys - set(node))
    ]


def workload_data(name: str) -> list[str]:
    cls = WORKLOADS[name]
    return [
        f"{name}: add conf/{cls.DATA_SECTION}/{option}.yaml (the settings of its data option {option!r})"
        for option in cls.DATA
        if not (ROOT / "conf" / cls.DATA_SECTION / f"{option}.yaml").is_file()
    ]


def workload_ranges(name: str) -> list[str]:
    return _without_range(WORKLOADS[name].Settings, name, WORKLOAD_SPECS_FILE)


def workload_trained(name: str) -> list[str]:
    """A test that trains it: some test runs `workload=NAME`."""
    if any(f"workload={name}" in path.read_text() for path in (ROOT / "tests").glob("test_*.py")):
        return []
    return [f"{name}: add a test that trains it (a run with workload={name}) to tests/test_{name}.py"]


def workload_docs(name: str) -> list[str]:
    page = "docs/configuration.md"
    rows = [row for _, rows in _tables(ROOT / page) for row in rows if row[0] == "`workload`"]
    if rows and f"`{name}`" in rows[0][1]:
        return []
    return [f"{name}: add `{name}` to the `workload` row of the option table in {page}"]


WORKLOAD_PIECES = [
    Piece("the workload's module and class attributes", "wagma_bench/workloads/NAME.py", workload_module),
    Piece("the option's YAML", "conf/workload/NAME.yaml", workload_yaml),
    Piece("its data options' YAML", "conf/data/OPTION.yaml", workload_data),
    Piece("the spec the configuration check reads", WORKLOAD_SPECS_FILE, workload_spec),
    Piece("the range of every numeric setting", WORKLOAD_SPECS_FILE, workload_ranges),
    Piece("a test that trains it", "tests/test_NAME.py", workload_trained),
    Piece("the option table", "docs/configuration.md", workload_docs),
]


def test_workload_conformance():
    """Every registered workload has every piece; the failure lists each missing one as NAME: add X to
    FILE."""
    problems = [problem for name in WORKLOADS for piece in WORKLOAD_PIECES for problem in piece.check(name)]
    assert not problems, "a registered workload lacks pieces:\n" + "\n".join(problems)


def test_the_architecture_pages_workload_list_names_every_piece():
    text = _listed_under("Adding a workload")
    unnamed = [f"{piece.file} ({piece.what})" for piece in WORKLOAD_PIECES if f"`{piece.file}`" not in text]
    assert not unnamed, "docs/architecture.md, 'Adding a workload': name " + ", ".join(unnamed)


@pytest.mark.parametrize("piece", WORKLOAD_PIECES, ids=[p.what for p in WORKLOAD_PIECES])
def test_a_new_workload_without_any_piece_is_told_each_file_to_edit(piece, monkeypatch):
    @dataclass
    class Settings:
        depth: int = 3

    class NewLoad(WORKLOADS["resnet"]):
        name = "newload"
        metric_name = "recall"
        DATA: typing.ClassVar[dict] = {"newdata": Settings}

    NewLoad.Settings = Settings
    NewLoad.__module__ = "somewhere.else"
    monkeypatch.setitem(WORKLOADS, "newload", NewLoad)
    found = piece.check("newload")
    assert found and all(p.startswith("newload: ") for p in found), found


# --- the contributor's check in a copy with a piece removed -------------------------------------------------


def _without_simulation(copy: Path, name: str) -> None:
    path = copy / "wagma_bench/simulate/des.py"
    path.write_text(path.read_text().replace(f'@simulates("{name}")\n', ""))


REMOVALS = [  # cumulative, as a contributor's half-made optimizer: what is removed, what the check must say
    (["conf/optimizer/sgp.yaml"], "sgp: add conf/optimizer/sgp.yaml"),
    (
        ["conf/optimizer/sgp.yaml", "wagma_bench/optim/sgp.py"],
        "sgp: optimizer sgp: add wagma_bench/optim/sgp.py",
    ),
    (
        ["conf/optimizer/sgp.yaml", "wagma_bench/optim/sgp.py", "simulation"],
        'sgp: add its model to wagma_bench/simulate/des.py, `@simulates("sgp")`',
    ),
]


@pytest.mark.background
@pytest.mark.parametrize("removed, said", REMOVALS, ids=["yaml", "yaml+module", "yaml+module+simulation"])
def test_a_piece_removed_from_a_copy_is_named_with_the_file_to_add_and_no_traceback(tmp_path, removed, said):
    """The conformance check run as a contributor runs it, in a copy of the repository with `sgp`'s pieces
    removed one after another: it fails naming `sgp` and the file to add. With its YAML removed it failed with
    Hydra's MissingConfigException (a traceback), with its module removed every test failed to import."""
    import os
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "repo"
    for part in ("wagma_bench", "conf", "tests", "docs", "slurm", "pyproject.toml"):
        (shutil.copytree if (ROOT / part).is_dir() else shutil.copy)(ROOT / part, copy / part)
    for piece in removed:
        _without_simulation(copy, "sgp") if piece == "simulation" else (copy / piece).unlink()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_conformance.py::test_optimizer_conformance",
        ],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(copy)},
        check=False,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "1 failed" in text, text[-3000:]
    assert said in text, text[-3000:]
    assert "Traceback" not in text and "Exception" not in text and "ImportError" not in text, text[-3000:]
