"""The predictions of ``wagma-bench simulate``: every optimizer at every world size, simulated, with
throughput against Allreduce-SGD's, efficiency, waiting, staleness and time to target; their table, files and
figures."""

from __future__ import annotations

import time
from pathlib import Path

from wagma_bench.analysis import plots
from wagma_bench.config.schema import RunConfig
from wagma_bench.imbalance import Imbalance, make_imbalance
from wagma_bench.simulate.configure import sim_config
from wagma_bench.simulate.convergence import samples_to_target
from wagma_bench.simulate.costs import Network
from wagma_bench.simulate.des import SimResult, Workload, simulate
from wagma_bench.simulate.interval import write_interval
from wagma_bench.simulate.outputs import (
    contended_runs,
    interval_cells,
    markdown,
    missing_target_line,
    origins_line,
    plot_time_to_target,
    write_table,
)
from wagma_bench.simulate.progress import Ticker
from wagma_bench.simulate.request import DEFAULT_GPUS, Request
from wagma_bench.simulate.uncertainty import Inputs


def predict(
    req: Request,
    runs: dict[str, RunConfig],
    network: Network,
    workload: Workload,
    out: Path,
    started: float | None = None,
) -> list[dict]:
    """The predictions, their table and plots (``started``: when the command started, ``time.perf_counter()``;
    its progress lines count from there)."""
    gpus = req.gpus or list(DEFAULT_GPUS)
    first = next(iter(runs.values()))
    imbalance = make_imbalance(first.imbalance, first.seed)
    conv = samples_to_target(req.convergence) if req.convergence else {}
    if "samples_to_target" in req.own:
        conv = {n: float(req.own["samples_to_target"]) for n in runs} | conv
    rows, ticker = [], Ticker(len(gpus) * len(runs), start=started)
    for p in gpus:
        for name, run in runs.items():
            t0 = time.perf_counter()
            res = simulate(
                sim_config(
                    run,
                    p,
                    workload,
                    network,
                    imbalance,
                    req.steps,
                    req.control_every,
                    progress=ticker.simulation(f"{name} at P={p}"),
                )
            )
            rows.append(_row(res, imbalance, workload, conv.get(name), time.perf_counter() - t0))
            ticker.done(f"{rows[-1]['sim_s']:.1f} s")
    ref = {r["world_size"]: r["throughput"] for r in rows if r["optimizer"] == "allreduce"}
    for r in rows:
        r["speedup_vs_allreduce"] = r["throughput"] / ref[r["world_size"]] if r["world_size"] in ref else None
    write_table(rows, out, "predictions")
    title = (
        f"predicted: {workload.name}, imbalance={imbalance.name}, cluster={req.cluster or 'daint'} "
        f"({req.steps} rounds simulated)"
    )
    plots.plot_throughput(
        [dict(r, kind="predicted") for r in rows], out / "throughput.png", title, ideal=False
    )
    if any(r.get("time_to_target_s") for r in rows):
        plot_time_to_target(rows, out / "time_to_target.png", title)
    if req.interval > 0:  # before the table, which shows its 95% intervals
        base = Inputs(workload, network, imbalance, conv, req.control_every, first.seed)
        interval_cells(rows, write_interval(req, runs, gpus, base, out))
    print(f"## Predicted throughput ({title})\n\n{markdown(rows, _columns(req.interval > 0))}\n")
    contended = contended_runs(req.compute_from) if req.compute_from else {}
    print(origins_line(req, bool(req.calibrate), contended))
    missing = missing_target_line(rows, req)
    if missing:
        print(missing)
    return rows


def _columns(interval: bool) -> list[tuple[str, str]]:
    """The printed table's columns; with ``--interval`` each prediction's 95% interval beside it."""
    return [
        ("optimizer", "optimizer"),
        ("world_size", "P"),
        ("throughput", "samples/s"),
        *([("throughput_95", "samples/s 95%")] if interval else []),
        ("speedup_vs_allreduce", "vs allreduce"),
        ("efficiency", "efficiency"),
        ("wait_frac", "wait share"),
        ("staleness", "staleness"),
        ("time_to_target_s", "time to target (s)"),
        *([("time_to_target_95", "time to target 95%")] if interval else []),
    ]


def _row(res: SimResult, imbalance: Imbalance, wl: Workload, stt: float | None, took: float) -> dict:
    r = res.row()
    r.update(
        label=res.optimizer,
        imbalance=imbalance.name,
        workload=wl.name,
        efficiency=res.throughput * wl.step_s / (res.world_size * wl.batch),
        samples_to_target=stt,
        time_to_target_s=stt / res.throughput if stt else None,
        sim_s=round(took, 3),
    )
    return r
