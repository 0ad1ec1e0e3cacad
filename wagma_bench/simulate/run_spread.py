"""The compute-time spread of real runs in place of a preset's assumed distribution (``--compute-from``): each
run's compute times over its own median, scaled to the modelled machine's step time, drawn i.i.d.; or, with
``compute=persistent``, the persistent model (:mod:`.spread`) fitted from the runs' ranks."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from wagma_bench.simulate.des import Workload
from wagma_bench.simulate.request import UsageError


def measured_spread(paths: list[str]) -> tuple[float, ...]:
    """Every run's compute times (forward and backward; injected delays are the imbalance model's) over that
    run's own median, pooled: the natural imbalance of real runs as a shape, without their machine's speed. A
    tuning directory counts as all its trials. The unit is the simulator's step: one step of a supervised
    run, a rollout with its PPO updates for DD-PPO (:func:`~wagma_bench.simulate.calibrate.cycle_compute`).
    Drawn i.i.d. per rank and step (``compute=empirical``): a rank that is slow in every step is not kept as
    such."""
    return tuple(x for run in spread_by_run(paths) for x in run)


def spread_by_run(paths: list[str]) -> list[list[float]]:
    """:func:`measured_spread`, run by run (what the interval resamples)."""
    from wagma_bench.analysis.run_records import find_runs
    from wagma_bench.simulate.calibrate import cycle_compute

    shapes: list[list[float]] = []
    for d in find_runs(map(Path, paths)):
        try:
            times = cycle_compute(d)
        except ValueError as err:  # no step records (a summary-only copy), too few steps
            raise UsageError(f"--compute-from: {err}") from None
        median = statistics.median(times)
        shapes.append([t / median for t in times])
    if not shapes:
        raise UsageError(f"--compute-from: no run directory under {', '.join(paths)}")
    return shapes


def with_measured_spread(workload: Workload, paths: list[str]) -> Workload:
    """The workload with the runs' measured spread scaled to its median step time (``--compute-from``); with
    ``compute=persistent`` the persistent model's offsets, noise and autocorrelation fitted from the runs'
    ranks (:mod:`wagma_bench.simulate.spread`), else the pooled times drawn i.i.d."""
    if workload.compute == "persistent":
        fit = measured_persistence(paths)
        return dataclasses.replace(
            workload,
            sigma_rank=fit.sigma_rank,
            sigma=fit.sigma,
            rho=fit.rho,
            source=f"{workload.source}; persistent spread fitted in {', '.join(paths)} "
            f"(sigma_rank {fit.sigma_rank:.3g}, sigma {fit.sigma:.3g}, rho {fit.rho:.3g})",
        )
    shape = measured_spread(paths)
    return dataclasses.replace(
        workload,
        compute="empirical",
        samples=tuple(workload.step_s * x for x in shape),
        source=f"{workload.source}; compute spread measured in {', '.join(paths)}",
    )


def measured_persistence(paths: list[str]):
    """The persistent spread model fitted over the runs under ``paths`` (each rank's cycles in order)."""
    from wagma_bench.simulate.spread import fit_spread

    try:
        return fit_spread(ranks_by_run(paths))
    except ValueError as err:
        raise UsageError(f"--compute-from: {err} under {', '.join(paths)}") from None


def ranks_by_run(paths: list[str]) -> list[list[list[float]]]:
    """Per run under ``paths``, each rank's compute time per cycle in order."""
    from wagma_bench.analysis.run_records import find_runs
    from wagma_bench.simulate.calibrate import cycle_compute_by_rank

    runs = []
    for d in find_runs(map(Path, paths)):
        try:
            runs.append(list(cycle_compute_by_rank(d).values()))
        except ValueError as err:
            raise UsageError(f"--compute-from: {err}") from None
    return runs
