"""The package as a user installs and calls it: Python floor, extras, --version, run --help, the docs'
images."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.cli_util import BIN
from wagma_bench import __version__

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OPTIONAL = {
    "mpi": ["mpi4py", "mpich"],
    "wandb": ["wandb", "wandb-workspaces"],
    "transformer": ["sacrebleu", "sacremoses"],
    "ddppo": ["miniworld"],
}

# Names that need a newer Python than 3.10 (attribute or imported name -> first version that has it).
NEWER_NAMES = {
    "UTC": (3, 11),
    "tomllib": (3, 11),
    "TaskGroup": (3, 11),
    "StrEnum": (3, 11),
    "ExceptionGroup": (3, 11),
    "Self": (3, 11),
    "batched": (3, 12),
    "override": (3, 12),
}


def python_needed(tree: ast.AST) -> tuple[int, int]:
    """The oldest Python that has every name and statement of NEWER_NAMES / ``except*`` / ``type X = ...``."""
    need = (3, 10)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            need = max(need, NEWER_NAMES.get(node.attr, need))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            need = max([need, *(NEWER_NAMES.get(a.name, need) for a in node.names)])
        elif isinstance(node, ast.TryStar):
            need = max(need, (3, 11))
        elif type(node).__name__ == "TypeAlias":
            need = max(need, (3, 12))
    return need


def test_requires_python_is_true_to_the_code():
    floor = tuple(
        int(x) for x in re.fullmatch(r">=(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"]).groups()
    )
    needed = max(
        python_needed(ast.parse(p.read_text(), str(p))) for p in (ROOT / "wagma_bench").rglob("*.py")
    )
    assert floor >= needed, f"the code needs Python {needed}, pyproject.toml says >={floor}"
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{floor[0]}{floor[1]}"


def test_optional_stacks_are_extras_and_make_installs_them():
    core = " ".join(PYPROJECT["project"]["dependencies"])
    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra, packages in OPTIONAL.items():
        for package in packages:
            assert any(d.startswith(package) for d in extras[extra]), (extra, package)
            assert not re.search(rf"(^|\s){package}\b", core), f"{package} is a core dependency"
    assert "mlperf-logging" in " ".join(extras["dev"]) and "pytest" in " ".join(extras["dev"])
    makefile = (ROOT / "Makefile").read_text()
    listed = re.search(r"^EXTRAS\s*:=\s*(\S+)", makefile, re.MULTILINE).group(1).split(",")
    assert set(listed) == set(OPTIONAL) | {"dev"}
    assert "-e '.[$(EXTRAS)]'" in makefile


def cli(*args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN), *args], capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def test_version():
    out = cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"wagma-bench {__version__}"


def test_run_help_lists_the_groups_run_uses():
    out = cli("run", "--help")
    assert out.returncode == 0, out.stderr
    section = out.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    groups = dict(
        line.split(": ", 1) for line in section.splitlines() if re.fullmatch(r"[a-z_]+: [a-z0-9_, ]+", line)
    )
    assert set(groups) == {
        "comm",
        "data",
        "env",
        "experiment",
        "imbalance",
        "launcher",
        "logger",
        "optimizer",
        "workload",
    }
    assert "wagma" in groups["optimizer"] and "powered by Hydra" not in out.stdout


def test_hydra_job_name():
    out = cli("run", "--cfg", "hydra")
    assert out.returncode == 0, out.stderr
    job = re.search(r"^  job:\n((?:    .*\n)+)", out.stdout, re.MULTILINE).group(1)
    assert "    name: wagma-bench\n" in job


def hiding(modules: list[str], tmp_path: Path, on_path: list[str] | None = None) -> dict[str, str]:
    """An environment in which ``modules`` cannot be imported, in this process's children and theirs
    (a sitecustomize on PYTHONPATH marks them missing in sys.modules): a fresh install without extras.
    ``on_path``: the rest of PYTHONPATH (by default this checkout, then the caller's PYTHONPATH)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nfor m in {modules!r}:\n    sys.modules[m] = None\n")
    env = dict(os.environ)
    rest = [str(ROOT), env.get("PYTHONPATH", "")] if on_path is None else on_path
    env["PYTHONPATH"] = os.pathsep.join([str(site), *rest])
    return env


EVERY_OPTIONAL = [
    "mpi4py",
    "mpich",
    "wandb",
    "wandb_workspaces",
    "sacrebleu",
    "sacremoses",
    "miniworld",
    "fairseq",
    "fairseq_cli",
]


# Through the CLI, a fresh process with the extras missing: the workloads whose modules could import a missing
# package before the check (a traceback instead of the hint). The other two: the same check in-process.
@pytest.mark.parametrize(
    ("override", "extra"), [("workload=transformer", "transformer"), ("workload=ddppo", "ddppo")]
)
def test_a_missing_extra_is_named(tmp_path, override, extra):
    out = cli("run", override, f"hydra.run.dir={tmp_path / 'run'}", env=hiding(EVERY_OPTIONAL, tmp_path))
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"pip install 'wagma-bench[{extra}]'" in out.stderr


@pytest.mark.parametrize(("override", "extra"), [("comm=mpi", "mpi"), ("logger=wandb", "wandb")])
def test_a_missing_extra_fails_the_launchers_check(monkeypatch, override, extra):
    from tests.cli_util import compose
    from wagma_bench.config.schema import validate
    from wagma_bench.errors import ConfigError
    from wagma_bench.runtime.extras import check_extras

    for module in EVERY_OPTIONAL:
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ConfigError) as err:
        check_extras(validate(compose(override)))
    assert f"pip install 'wagma-bench[{extra}]'" in str(err.value)


# make test: the installed wheel's run below, every extra hidden there too (one run, where each made its own)
@pytest.mark.slow
@pytest.mark.long
def test_runs_the_embedded_default_without_any_extra(tmp_path):
    run_dir = tmp_path / "run"
    out = cli(
        "run",
        "launcher.nproc=2",
        "train.max_rounds=6",
        "eval.every_rounds=6",
        "logger.progress=off",
        f"hydra.run.dir={run_dir}",
        env=hiding(EVERY_OPTIONAL, tmp_path),
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert (run_dir / "mllog.txt").exists()


def readme_images() -> list[tuple[str, Path]]:
    """(page, image path from the repository root) of every image README.md and docs/*.md show."""
    images = []
    for page in [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]:
        text = page.read_text()
        for src in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", text) + re.findall(r'<img[^>]+src="([^"]+)"', text):
            images.append((str(page.relative_to(ROOT)), (page.parent / src).resolve().relative_to(ROOT)))
    return images


def test_every_image_the_readme_shows_is_in_the_repository():
    images = readme_images()
    assert any(page == "README.md" for page, _ in images), "README.md shows no figure"
    for page, image in images:
        assert (ROOT / image).is_file(), f"{page} shows {image}, which does not exist"
        ignored = (
            subprocess.run(["git", "check-ignore", "-q", str(image)], cwd=ROOT, check=False).returncode == 0
        )
        assert not ignored, f"{page} shows {image}, which .gitignore excludes"
        assert (ROOT / image).stat().st_size < 200_000, f"{image} is large for a README figure"


# --- installable anywhere: the wheel carries conf/ and slurm/ -------------------------------------------


def test_the_listed_packages_are_every_package_and_data_folder():
    """pyproject.toml lists the packages (conf/ and slurm/ are mapped into the package, which finding cannot
    do): the list must hold every folder of the code and of conf/ and slurm/, and each data folder its
    files."""
    from setuptools import find_packages

    tool = PYPROJECT["tool"]["setuptools"]
    expected = set(find_packages(where=str(ROOT), include=["wagma_bench*"]))
    for name in ("conf", "slurm"):
        expected |= {f"wagma_bench.{name}"} | {
            f"wagma_bench.{name}.{d.name}" for d in (ROOT / name).iterdir() if d.is_dir()
        }
    assert set(tool["packages"]) == expected
    assert tool["package-dir"] == {"wagma_bench.conf": "conf", "wagma_bench.slurm": "slurm"}
    data = tool["package-data"]
    for package in expected - set(find_packages(where=str(ROOT), include=["wagma_bench*"])):
        folder = ROOT / package.removeprefix("wagma_bench.").replace(".", "/")
        files = {p.name for p in folder.iterdir() if p.is_file()}
        kept = {f for f in files if any(Path(f).match(pattern) for pattern in data[package])}
        assert kept == files, f"{package}: {sorted(files - kept)} would be left out of the wheel"


@pytest.mark.slow
def test_a_wheel_installed_elsewhere_runs_from_another_directory(tmp_path):
    """`pip wheel` of this repository, installed into a folder of its own (no clone on the path), then a run
    from another directory: Hydra finds the configuration inside the installed package. Without any extra
    (every optional package hidden, as a fresh install without extras has none): the embedded default runs and
    writes its MLPerf log."""
    wheels, site, elsewhere, source = (
        tmp_path / "wheels",
        tmp_path / "site",
        tmp_path / "elsewhere",
        tmp_path / "source",
    )
    elsewhere.mkdir()
    # built from a copy: setuptools leaves build/ beside the sources, and the checkout must stay as it was
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for name in ("wagma_bench", "conf", "slurm"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", str(source), "-w", str(wheels)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("wagma_bench-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    env = hiding(EVERY_OPTIONAL, hidden, on_path=[str(site)])  # no clone on the path, no extra
    where = subprocess.run(
        [sys.executable, "-c", "import wagma_bench.config.paths as p; print(p.CONF_DIR)"],
        env=env,
        cwd=elsewhere,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where == str(site / "wagma_bench" / "conf")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "wagma_bench",
            "run",
            "launcher.nproc=2",
            "train.max_rounds=2",
            "eval.target=null",
            "logger.progress=off",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        env=env,
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "completed"
    assert (tmp_path / "run" / "mllog.txt").exists()
    assert (site / "wagma_bench" / "slurm" / "local" / "slurmctl.sh").exists()
