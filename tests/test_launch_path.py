"""One launch path: ``cli/run.py`` parses and answers, ``runtime/run.py``'s ``launch`` runs the job and
returns one :class:`~wagma_bench.runtime.run.RunOutcome`, and ``-m`` answers a failed job the same way under
every launcher (docs/run-budget-and-exit-codes.md)."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest

import wagma_bench.cli
from tests.cli_util import run

CLI = Path(wagma_bench.cli.__file__).parent


def _package_modules(path: Path) -> set[str]:
    """The package modules a file imports (``from wagma_bench import exits`` is ``wagma_bench.exits``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("wagma_bench")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("wagma_bench"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(
                    sub
                    if importlib.util.find_spec(node.module).submodule_search_locations
                    and importlib.util.find_spec(sub)
                    else node.module
                )
    return found


def test_the_run_command_parses_and_answers_and_the_runtime_launches():
    """cli/run.py is a command, not a launcher: under 160 lines, importing no more package modules than the
    largest of its siblings, and none of the launch's own (the lock, the ranks, their supervision)."""
    source = CLI / "run.py"
    assert len(source.read_text().splitlines()) < 160
    siblings = [p for p in CLI.glob("*.py") if p.name not in ("run.py", "__init__.py")]
    most = max(len(_package_modules(p)) for p in siblings)
    mine = _package_modules(source)
    assert len(mine) <= most, sorted(mine)
    assert not mine & {
        "wagma_bench.runtime.launch",
        "wagma_bench.runtime.supervise",
        "wagma_bench.record.rundir",
    }


def test_the_import_count_sees_each_way_of_importing_a_module(tmp_path):
    """The count above, on a file that imports four package modules three ways (it would pass on nothing
    otherwise)."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import wagma_bench.exits\nfrom wagma_bench import errors\nfrom wagma_bench.runtime import run\n"
        "from wagma_bench.runtime.launch import spawn_local, run_rank\n"
    )
    assert _package_modules(planted) == {
        "wagma_bench.exits",
        "wagma_bench.errors",
        "wagma_bench.runtime.run",
        "wagma_bench.runtime.launch",
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "comm", ["torch", pytest.param("mpi", marks=[pytest.mark.serial, pytest.mark.alone])]
)
def test_a_failed_job_under_m_is_said_and_the_sweep_goes_on_under_every_launcher(tmp_path, comm):
    """Under ``-m`` the first job fails (rank 1 cannot open its step log: a folder is in the way) and the
    second completes, on local ranks and under the mpiexec the command starts itself: one error line naming
    the failure, recorded, the sweep goes on, and the command exits 1 (the first failed job's code). The local
    case (make test-long) is the path that behaved so before; the mpiexec one stopped the command."""
    (tmp_path / "1" / "steps" / "rank1.jsonl").mkdir(parents=True)
    out = run(
        [
            "-m",
            "launcher.nproc=2",
            f"comm={comm}",
            "train.max_rounds=2",
            "eval.every_rounds=2",
            "logger.progress=off",
            "seed=1,2",
            f"hydra.sweep.dir={tmp_path}",
            "hydra.sweep.subdir=${seed}",
        ],
        timeout=300,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    errors = [x for x in out.stderr.splitlines() if x.startswith("wagma-bench run: error:")]
    assert len(errors) == 1 and "IsADirectoryError" in out.stderr, out.stderr[-3000:]
    assert json.loads((tmp_path / "1" / "summary.json").read_text())["status"] == "failed"
    assert json.loads((tmp_path / "2" / "summary.json").read_text())["status"] == "completed"
