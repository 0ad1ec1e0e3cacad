"""The package's layers (``[tool.importlinter]`` in pyproject.toml, drawn in docs/architecture.md) are a
contract that import-linter checks: a module imports only from its own layer or the layers below it, never
from a sibling marked independent. Each test runs the real tool, here on the package and on a copy with one
upward import added."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "wagma_bench"
LINT = Path(sys.executable).with_name("lint-imports")


def contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return [m.strip() for layer in layers["layers"] for m in layer.split("|")]


def lint(package_parent: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        check=False,
        cwd=package_parent,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(package_parent)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_package_keeps_its_layers():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "layers KEPT" in result.stdout
    assert "the trainer imports one run's world only KEPT" in result.stdout


def test_the_trainer_importing_the_analysis_breaks_its_contract(tmp_path):
    """The layers alone let the trainer import the analysis below it; the second contract allows it only
    ``runtime/`` (one run's world), not the campaigns, the simulator or the analysis."""
    shutil.copytree(PACKAGE, tmp_path / "wagma_bench", ignore=shutil.ignore_patterns("__pycache__"))
    state = tmp_path / "wagma_bench" / "train" / "state.py"
    state.write_text(
        state.read_text() + "\n\ndef _sideways():\n    from wagma_bench.analysis import tuning\n"
        "    return tuning\n"
    )
    result = lint(tmp_path)
    assert result.returncode != 0
    assert "layers KEPT" in result.stdout
    assert "the trainer imports one run's world only BROKEN" in result.stdout
    assert "wagma_bench.train.state -> wagma_bench.analysis.tuning" in result.stdout, result.stdout


def test_every_part_of_the_package_is_in_a_layer():
    """A new folder or top-level module outside the contract would be checked by nothing."""
    parts = {
        f"wagma_bench.{p.stem if p.is_file() else p.name}"
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem not in ("__init__", "__main__")) or (p / "__init__.py").is_file()
    }
    assert parts - set(contract_layers()) == set(), (
        "add these to [tool.importlinter]'s layers in pyproject.toml"
    )
    assert set(contract_layers()) - parts == set(), "the contract names parts that do not exist"


def test_an_upward_import_breaks_the_contract_naming_both_modules(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "wagma_bench", ignore=shutil.ignore_patterns("__pycache__"))
    buckets = tmp_path / "wagma_bench" / "comm" / "buckets.py"  # the bottom layer but one
    buckets.write_text(
        buckets.read_text() + "\n\ndef _upward():\n    from wagma_bench.train.trainer import Trainer\n"
        "    return Trainer\n"
    )
    result = lint(tmp_path)
    assert result.returncode != 0
    assert "layers BROKEN" in result.stdout
    assert "wagma_bench.comm.buckets -> wagma_bench.train.trainer" in result.stdout, result.stdout


def _layer_rows() -> list[str]:
    """The rows of docs/architecture.md's layer table (each row's text)."""
    lines = (ROOT / "docs" / "architecture.md").read_text().splitlines()
    return [line for line in lines if line.startswith("| ") and not line.startswith(("| layer", "|---"))]


def test_the_architecture_page_names_every_module_in_its_layers_row():
    """docs/architecture.md draws the layers with every module in its row: a module of FOLDER is named (by its
    path below FOLDER, or its file name) in the row that names `FOLDER/`; a top-level module in some row."""
    rows = _layer_rows()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if path.name == "__init__.py" and relative.parent != Path("cli") or "__pycache__" in relative.parts:
            continue
        if len(relative.parts) == 1:
            mine = rows
        else:
            mine = [row for row in rows if f"`{relative.parts[0]}/" in row]
        names = {
            f"`{relative.as_posix()}",
            f"`{Path(*relative.parts[1:]).as_posix()}`",
            f"`{path.name}`",
            f"`{Path(*relative.parts[-2:]).as_posix()}`",
            f"{path.name}`",
        }
        if not any(name in row for row in mine for name in names):
            missing.append(f"wagma_bench/{relative}")
    assert not missing, "docs/architecture.md's layer table does not name: " + ", ".join(missing)
