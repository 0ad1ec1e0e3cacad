"""``wagma-bench simulate --interval N``: the predictions again with their inputs resampled and with one
assumption moved at a time (:func:`wagma_bench.simulate.uncertainty.uncertainty`), written to
``interval.json``, from which ``wagma-bench claims`` takes each prediction's interval and the assumption that
flips it."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from wagma_bench.analysis.predictions import INTERVAL_FILE
from wagma_bench.config.schema import RunConfig
from wagma_bench.record.files import strict_json, write_text_atomic
from wagma_bench.simulate.convergence import target_hits
from wagma_bench.simulate.measured import read_measured
from wagma_bench.simulate.pool import SimulationPool
from wagma_bench.simulate.progress import Ticker
from wagma_bench.simulate.request import Request
from wagma_bench.simulate.resume import fingerprint, resume_path
from wagma_bench.simulate.run_spread import ranks_by_run, spread_by_run
from wagma_bench.simulate.uncertainty import Inputs, Sources, uncertainty


def write_interval(
    req: Request, runs: dict[str, RunConfig], gpus: list[int], base: Inputs, out: Path
) -> dict:
    """``--interval N``: :func:`wagma_bench.simulate.uncertainty.uncertainty` over these runs' predictions,
    written to ``interval.json`` and returned."""
    sources = Sources()
    if req.compute_from:
        persistent = base.workload.compute == "persistent"
        sources.spread_kind = "persistent" if persistent else "empirical"
        by_run = ranks_by_run if persistent else spread_by_run
        sources.spread_runs = by_run(req.compute_from)
    if req.convergence:
        sources.hits = target_hits(req.convergence)
    if req.measured and "gossip_cost" not in req.own:
        sources.gossip_costs = read_measured(req.measured).gossip_replicates

    ticker = Ticker(0, "simulate --interval")  # every prediction's simulations say where they are, too
    start = time.perf_counter()
    keep = resume_path(req.out) if req.out is not None else None  # what is done survives a failure
    command = fingerprint(runs, req.steps) if keep is not None else ""
    with SimulationPool(runs, gpus, req.steps, req.jobs, ticker, keep, command) as pool:

        def progress(
            what: str,
        ) -> None:  # after each prediction: which one (the simulations tick on their own)
            pool.stage = f"the predictions after {what}"  # named if a worker fails
            ticker.note(what)

        data = uncertainty(
            pool.predict,
            base,
            sources,
            req.interval,
            progress,
            many=pool.predict_many,
            threads=pool.jobs,
            bulk=lambda inputs: pool.predict_many(inputs, later=True),
        )
    data["took_s"] = round(time.perf_counter() - start, 1)
    resumed = f", {pool.resumed} of them read back from an earlier run" if pool.resumed else ""
    print(
        f"simulate --interval: {pool.simulated} simulations for the {pool.asked} its predictions asked "
        f"for (the others' inputs the same as one of those){resumed}, in {pool.jobs} processes",
        file=sys.stderr,
    )
    write_text_atomic(out / INTERVAL_FILE, compact_json(data))
    print(
        f"wrote {INTERVAL_FILE}: {req.interval} replicates (resampled: {'; '.join(data['resampled'])}) "
        f"and {len(data['sensitivity'])} sensitivity points in {data['took_s']} s"
    )
    return data


def compact_json(data: Any) -> str:
    """JSON with every number to 6 significant digits, no indentation: ``interval.json`` holds (N + 25) x
    worlds x optimizers predictions, committed for every claim (the repository stays under 20 MB)."""

    def rounded(x: Any) -> Any:
        if isinstance(x, float):
            return float(f"{x:.6g}")
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [rounded(v) for v in x]
        return x

    return strict_json(rounded(data), separators=(",", ":"), default=float) + "\n"  # NaN, inf: null
