"""One metric rule (:mod:`wagma_bench.metric`): which way a figure is better and when a run reached its
target, read by the trainer, the records, tuning, claims, the report and a sweep's status. Checked on the
rule itself and on the code: nothing else in the package writes a direction of its own (a ``>=`` against a
target, a ``max`` of a metric, a table of which figure is lower-better), and the check finds each such rule
planted."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

import wagma_bench
from wagma_bench.analysis import tuning
from wagma_bench.metric import METRICS, Metric, metric
from wagma_bench.workloads.specs import WORKLOAD_SPECS

PACKAGE = Path(wagma_bench.__file__).parent


def test_reached_is_at_or_past_the_target_in_its_direction_within_the_time_limit():
    top1, time = metric("top1", 0.75), Metric("time_to_target", lower_is_better=True, target=100.0)
    assert top1.reached(0.75) and top1.reached(0.8, 50.0, 60.0) and not top1.reached(0.74)
    assert not top1.reached(0.8, 61.0, 60.0)  # past train.time_limit_s: too late to count
    assert not top1.reached(math.nan) and not metric("top1").reached(1.0)  # no target: never reached
    assert time.reached(90.0) and not time.reached(110.0)
    assert top1.best([0.5, None, 0.7, 0.6]) == 0.7 and time.best([3.0, 2.0, None]) == 2.0
    assert top1.better(0.7, 0.6) and not time.better(3.0, 2.0) and time.better(3.0, None)
    assert time.ratio(50.0, 100.0) == 2.0 and top1.ratio(0.8, 0.4) == 2.0 and top1.ratio(None, 1.0) is None


def test_every_workloads_metric_and_every_scored_figure_is_in_the_one_registry():
    for spec in WORKLOAD_SPECS.values():
        for name in spec.METRIC_RANGES:
            assert name in METRICS, f"{spec.name}: add {name} to wagma_bench/metric.py's METRICS"
    assert tuning.LOWER_IS_BETTER == {n: METRICS[n].lower_is_better for n in tuning.LOWER_IS_BETTER}


# what the other side of a comparison with a target names when it is a figure (not a round: the engine's
# target round)
FIGURE_WORDS = ("metric", "value", "best", "accuracy", "score")


def _mentions(node: ast.AST, word: str) -> bool:
    for n in ast.walk(node):
        text = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            text = n.value
        if text is not None and word in text.lower():
            return True
    return False


def direction_rules(root: Path) -> list[str]:
    """Each place under ``root`` (a package like wagma_bench/) that decides a direction itself rather than
    through :mod:`wagma_bench.metric`: an order comparison with a target (``value >= target``), a ``max`` or
    ``min`` over metrics (``max(state.best, metric)``), or a table of figures to booleans (``{"throughput":
    False}``)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "metric.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            what = None
            if isinstance(node, ast.Compare) and any(
                isinstance(o, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for o in node.ops
            ):
                sides = [node.left, *node.comparators]
                figures = [s for s in sides if any(_mentions(s, w) for w in FIGURE_WORDS)]
                if figures and any(_mentions(s, "target") for s in sides):
                    what = "a comparison with a target"
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("max", "min")
            ):
                by_metric = any(k.arg == "key" and _mentions(k.value, "key") for k in node.keywords)
                if not by_metric and any(
                    _mentions(a, "metric") for a in [*node.args, *(k.value for k in node.keywords)]
                ):
                    what = f"{node.func.id}() of a metric"
            elif (
                isinstance(node, ast.Dict)
                and node.keys
                and all(isinstance(v, ast.Constant) and isinstance(v.value, bool) for v in node.values)
            ) and any(isinstance(k, ast.Constant) and k.value in METRICS for k in node.keys):
                what = "a table of directions"
            if what is not None:
                found.append(f"{rel}:{node.lineno}: {what}")
    return found


def test_nothing_but_the_metric_decides_which_way_is_better():
    assert not direction_rules(PACKAGE), direction_rules(PACKAGE)


@pytest.mark.parametrize(
    "rel, code",
    [
        ("train/trainer.py", "def reached(value, cfg):\n    return value >= cfg.eval.target\n"),
        ("record/mlperf.py", "def best(state, metric):\n    return max(state.best, metric)\n"),
        ("campaign/sweep_jobs.py", "def best(rows):\n    return max(rows, key=lambda r: r['metric'])\n"),
        ("analysis/tuning.py", "LOWER = {'time_to_target': True, 'throughput': False}\n"),
        (
            "analysis/claims.py",
            "def beats(summary):\n    return summary['best_metric'] > summary['target']\n",
        ),
    ],
)
def test_the_direction_check_finds_a_planted_second_rule(tmp_path, rel, code):
    copy = tmp_path / "wagma_bench" / rel
    copy.parent.mkdir(parents=True)
    copy.write_text((PACKAGE / rel).read_text() + "\n\n" + code)
    found = direction_rules(tmp_path / "wagma_bench")
    assert len(found) == 1 and found[0].startswith(f"{rel}:"), found
