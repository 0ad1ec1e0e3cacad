"""What the tests that drive the real command line share: the installed ``wagma-bench``, a quick 2-rank run,
one way to call a command, the keys of a run's event log, and the configuration a command line composes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

from wagma_bench.record.files import read_jsonl

BIN = Path(sys.executable).parent / "wagma-bench"
CONF = Path(__file__).resolve().parents[1] / "conf"


def load_script(path: Path):
    """A script of the repository (reproduce/...: not a package) imported as a module, to call its
    functions."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


QUICK = ["launcher.nproc=2", "train.max_rounds=12", "eval.every_rounds=6", "logger.progress=off"]


def compose(*overrides: str):
    """The configuration `wagma-bench run OVERRIDES` composes (Hydra over conf/), before validation."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="wagma", overrides=list(overrides))


def run(args: list[str], timeout: float = 600, command: str = "run", **kw) -> subprocess.CompletedProcess:
    """``wagma-bench COMMAND ARGS``, its output captured; never raises for a non-zero exit."""
    return subprocess.run(
        [str(BIN), command, *args], capture_output=True, text=True, timeout=timeout, check=False, **kw
    )


def keys(run_dir: Path) -> list[str]:
    """The event keys of a run's ``events.jsonl``, in order."""
    return [e["key"] for e in read_jsonl(run_dir / "events.jsonl")]


def wait_started(run_dir: Path, launcher: subprocess.Popen, first_step: bool = True) -> None:
    """Until both ranks have logged steps, or (``first_step`` false) until the run has started: run_start is
    logged after a barrier that every rank reaches with its signal handlers installed."""
    deadline = time.monotonic() + 240
    logs = [run_dir / "steps" / f"rank{r}.jsonl" for r in (0, 1)]
    while not (
        all(p.exists() and p.stat().st_size for p in logs) if first_step else "run_start" in keys(run_dir)
    ):
        assert launcher.poll() is None, launcher.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.1)
