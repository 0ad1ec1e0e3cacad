"""Each optimizer reaches the embedded ResNet target with `wagma-bench run`, as a user types it
(4 local gloo ranks, the embedded default: ResNet-20 on the 5,000-image MNIST subset, target 97%).

WAGMA-SGD runs in `make test` (by itself: markers serial and alone) to top-1 0.85: the run trains from
scratch, end to end as a user types it, far past chance (0.10) in about 40% of the rounds the default target
takes. At the defaults, evaluated every 11 rounds (the period rounded up to its tau), one run of 2026-12-06
read 0.11-0.14 to round 33, 0.836 at 44, 0.888 at 66, 0.902 at 88, 0.958 at 143 and 0.968 at 165 (47 s and 91
CPU-seconds, the suite's costliest test; 0.96, its make-test target until then, at 165 in two earlier runs
too). Every registered optimizer, WAGMA-SGD included (about 1.5 minutes each on this 2-core machine), runs to
the default target 0.97 with `make test-long`. The optimizer tables of docs/optimizers.md are the measured
record of each."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.cli_util import BIN
from wagma_bench.optim import OPTIMIZERS

# Evaluate often so the run stops soon after it reaches the target (the period is rounded up to the
# optimizer's sync period).
ARGS = ["workload=resnet", "launcher.nproc=4", "eval.every_rounds=10", "logger.progress=off"]


LONG = pytest.mark.long


# serial and alone in make test: an asynchronous optimizer's progress per step depends on the ranks' relative
# speed (beside another test's ranks WAGMA-SGD once ended its budget at top-1 0.968 of the 0.97 target), and
# its four ranks keep both cores busy for half a minute, which would starve make test's idle-priority tests
@pytest.mark.serial
@pytest.mark.alone
@pytest.mark.slow
@pytest.mark.parametrize(
    "optimizer,target",
    [pytest.param("wagma", 0.85, id="wagma-to-0.85")]
    + [  # make test's
        pytest.param(name, None, marks=LONG, id=name) for name in OPTIMIZERS
    ],
)  # each to the default target (40-100 s)
def test_reaches_the_embedded_target(optimizer, target, tmp_path):
    target = [f"eval.target={target}"] if target else []
    out = subprocess.run(
        [str(BIN), "run", f"optimizer={optimizer}", *ARGS, *target, f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["optimizer"] == optimizer and summary["world_size"] == 4
    assert summary["reached"], (
        f"best {summary['best_metric']} < target {summary['target']} in {summary['steps']} steps"
    )
    assert summary["status"] == "completed"
