"""The package and the tests as ``ruff format`` writes them, within the configured 110 columns (E501
selected in pyproject.toml, with no per-file exception): the same checks as ``make lint``, run by the venv's
own ruff. A failure names the files to format or fix."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).with_name("ruff")
CHECKED = ("wagma_bench", "tests")


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    assert RUFF.exists(), f"no ruff next to {sys.executable}: install the dev extra (pip install -e '.[dev]')"
    return subprocess.run(
        [str(RUFF), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_long_lines_are_selected_for_every_file():
    ruff_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert ruff_config["line-length"] == 110
    lint = ruff_config.get("lint", {})
    assert "E501" in lint.get("extend-select", []), f"E501 is not in [tool.ruff.lint] extend-select: {lint}"
    assert "per-file-ignores" not in ruff_config and "per-file-ignores" not in lint


def test_the_package_and_the_tests_are_formatted():
    out = ruff("format", "--check", "--no-cache", *CHECKED)
    # "Would reformat: PATH" (older ruff) or a diff under "--> PATH:ROW:COL"
    files = sorted(set(re.findall(r"^(?:Would reformat: |\s*--> )(\S+?\.py)", out.stdout, re.MULTILINE)))
    assert out.returncode == 0, f"ruff format would change {files or out.stderr}"


def test_the_package_and_the_tests_pass_ruff_check():
    out = ruff("check", "--no-cache", "--output-format", "concise", *CHECKED)
    files = sorted(
        {line.split(":", 1)[0] for line in out.stdout.splitlines() if re.match(r"\S+\.py:\d+", line)}
    )
    assert out.returncode == 0, f"ruff check fails in {files}:\n{out.stdout[-3000:]}{out.stderr[-2000:]}"


def test_the_checks_catch_a_long_line_and_an_unformatted_file(tmp_path):
    """The project's configuration on a file with a 111-column line, and one that ruff format would change."""
    long_line = tmp_path / "long_line.py"
    long_line.write_text(f'TEXT = "{"x" * 102}"\n')
    assert len(long_line.read_text().splitlines()[0]) == 111
    config = ("--config", str(ROOT / "pyproject.toml"), "--no-cache")
    out = ruff("check", *config, "--output-format", "concise", str(long_line), cwd=tmp_path)
    assert out.returncode == 1 and "E501" in out.stdout, out.stdout + out.stderr
    unformatted = tmp_path / "unformatted.py"
    unformatted.write_text("x = {'a':1}\n")
    out = ruff("format", "--check", *config, str(unformatted), cwd=tmp_path)
    assert out.returncode == 1 and "unformatted.py" in out.stdout, out.stdout + out.stderr
