"""One ``wagma-bench run`` as a subprocess, run unless its directory already holds a summary: what the scripts
under ``reproduce/`` build their campaigns from, so that rerunning a script resumes it (the runs already
finished are read, not run again)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from wagma_bench.analysis.tuning import trial_finished
from wagma_bench.config import readback
from wagma_bench.record.events import SUMMARY, current_summary
from wagma_bench.record.summary import RunSummary

WAGMA_BENCH = Path(sys.executable).parent / "wagma-bench"


def run_unless_done(run_dir: Path, overrides: list[str], cwd: Path | None = None) -> dict:
    """The summary of ``wagma-bench run OVERRIDES hydra.run.dir=RUN_DIR``, running it first unless ``run_dir``
    already holds an ended one (finished by its own rules, or failed: as tune counts a trial); an interrupted
    or preempted run is run again, which resumes it from its checkpoint. The command and its exit status go to
    stderr. A run that ends without a summary gives ``{"status": "failed (exit N)"}``."""
    summary = Path(run_dir) / SUMMARY
    if not ended(summary):
        cmd = [str(WAGMA_BENCH), "run", *overrides, f"hydra.run.dir={run_dir}"]
        print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, cwd=cwd, check=False)
        print(f"  exit {done.returncode} after {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        if not summary.exists():
            return {"status": f"failed (exit {done.returncode})"}
    # under today's names, also a run of older code
    return current_summary(readback.load(summary, readback.RUN_SUMMARY))


def ended(summary: Path) -> bool:
    """Whether ``summary`` is a run's that ended: finished by its own stop rules, or failed."""
    try:
        # tune's rule for a trial, the same for a run
        return trial_finished(RunSummary.load(summary))
    except (OSError, ValueError):
        return False
