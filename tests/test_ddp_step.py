"""Allreduce-SGD against DistributedDataParallel (reproduce/engine/ddp_step.py): the statistic the docs
declare (the median of the block ratios and its percentile bootstrap interval over blocks) checked against a
literal enumeration of every resample, and the docs' table against the script's table of the committed
result."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest

from tests.cli_util import load_script
from tests.test_generated_docs import _block

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "reproduce" / "engine" / "ddp_step.py"
RESULT = ROOT / "reproduce" / "engine" / "ddp-step-2core-20261207.json"


def _enumerated_interval(ratios: list[float]) -> tuple[float, float]:
    """The 2.5% and 97.5% percentiles (smallest value whose CDF reaches q) of the median over all n^n
    equally likely resamples of the blocks, listed one by one."""
    medians = sorted(statistics.median(s) for s in itertools.product(ratios, repeat=len(ratios)))
    n = len(medians)

    def q(p):
        return next(m for i, m in enumerate(medians) if (i + 1) / n >= p - 1e-12)

    return q(0.025), q(0.975)


@pytest.mark.parametrize(
    "ratios", [[0.8, 0.9, 1.1], [0.85, 0.78, 0.91, 0.88], [0.9, 0.7, 0.95, 0.81, 0.86], [0.8, 0.8, 0.9, 1.0]]
)
def test_the_ratio_and_interval_are_the_median_of_blocks_and_its_enumerated_bootstrap(ratios):
    got = load_script(SCRIPT).summarize(ratios)
    low, high = _enumerated_interval(ratios)
    assert got["ratio"] == statistics.median(ratios)
    assert got["low"] == pytest.approx(low, abs=1e-12) and got["high"] == pytest.approx(high, abs=1e-12)
    assert got["blocks"] == len(ratios)


def test_the_docs_table_is_the_scripts_table_of_the_committed_result():
    doc = ROOT / "docs" / "benchmarks.md"
    result = json.loads(RESULT.read_text())
    assert _block(doc, "ddp-step") == load_script(SCRIPT).table(result), (
        f"docs/benchmarks.md differs from `reproduce/engine/ddp_step.py --table {RESULT.relative_to(ROOT)}`"
    )
    for world in result["worlds"]:  # each world's figure is the statistic of its own blocks
        ratios = [b["allreduce"] / b["ddp"] for b in world["per_block"]]
        assert world["ratio"] == statistics.median(ratios)
        assert [b["first"] for b in world["per_block"]][:2] == ["allreduce", "ddp"]  # ABBA, interleaved
