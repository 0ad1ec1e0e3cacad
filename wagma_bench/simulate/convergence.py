"""The convergence model of time-to-target: samples to the target per optimizer, from real runs that reached
it (``--convergence RUN_DIR...``; a ``wagma-bench tune`` directory stands for its winning trials)."""

from __future__ import annotations

import statistics
from pathlib import Path

from wagma_bench.record.events import RunEvents


def samples_to_target(run_dirs: list[str]) -> dict[str, float]:
    """Per optimizer: median global samples at the first evaluation reaching the target, over the runs at
    the smallest world size that reached it. A tuning directory (``wagma-bench tune``) stands for its
    winning trials (:func:`wagma_bench.analysis.tuning.winning_runs`), so predictions rest on tuned
    convergence."""
    return {opt: statistics.median(hits) for opt, hits in target_hits(run_dirs).items()}


def target_hits(run_dirs: list[str]) -> dict[str, list[float]]:
    """Per optimizer: the samples of each run's first evaluation at the target, at the smallest world size
    that reached it (what :func:`samples_to_target` takes the median of, and the interval resamples)."""
    from wagma_bench.analysis.run_records import find_runs
    from wagma_bench.analysis.tuning import winning_runs

    dirs: list[Path] = []
    for p in map(Path, run_dirs):
        dirs += winning_runs(p) if is_tuning_dir(p) else [p]
    found: dict[str, dict[int, list[float]]] = {}
    for d in find_runs(dirs):
        record = RunEvents.read(d)
        hit = record.first_at_target
        if hit is not None:
            found.setdefault(record.start.optimizer, {}).setdefault(int(record.start.world_size), []).append(
                float(hit.samples)
            )
    return {opt: by_p[min(by_p)] for opt, by_p in found.items()}


def is_tuning_dir(path: Path) -> bool:
    from wagma_bench.analysis.tuning import PLAN

    return (Path(path) / PLAN).exists()
