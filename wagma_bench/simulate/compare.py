"""``wagma-bench simulate --calibrate``: each run fitted (:mod:`.calibrate`), its own configuration simulated,
and predicted against measured throughput written and drawn, with compute times resampled and trace-driven."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from wagma_bench.analysis import plots
from wagma_bench.config.cluster import load_profile
from wagma_bench.imbalance import IMBALANCES, make_imbalance
from wagma_bench.optim.specs import OPTIMIZER_SPECS
from wagma_bench.record.files import strict_json, write_text_atomic
from wagma_bench.simulate.configure import load_network, typed_settings
from wagma_bench.simulate.costs import Network
from wagma_bench.simulate.des import SimConfig, Workload, simulate
from wagma_bench.simulate.outputs import markdown, write_table
from wagma_bench.simulate.request import Request


def compare_with_runs(req: Request, out: Path) -> tuple[list[dict], Workload | None, Network]:
    """``--calibrate``: fit each run and the network, simulate each run's own configuration, and write
    predicted against measured throughput; returns the rows, the workload pooled over the runs and the
    network."""
    from wagma_bench.simulate.calibrate import find_inputs, fit_network, fit_run

    runs, benches = find_inputs(req.calibrate)
    params = float(req.own["params"]) if "params" in req.own else None
    cal: dict[str, Any] = {"runs": [], "network": None}
    if benches:
        # which ranks share a node: the named cluster's, else the bench's own hosts (report["gpus_per_node"])
        per_node = load_profile(req.cluster, req.cluster_overrides).gpus_per_node if req.cluster else None
        network, report = fit_network(benches, per_node)
        cal["network"] = report
        print(network_lines(report))
    else:
        network = load_network(req.cluster or "local", req.cluster_overrides)
    rows, fits = [], []
    compute = req.own.get("compute", "empirical")
    for d in runs:
        fit = fit_run(d, params)
        fits.append(fit)
        wl = fit.to_workload(compute=compute)
        predicted = replay_run(fit, wl, network)
        # the trace-driven replay: each rank's own recorded compute times, step by step
        traced = (
            predicted
            if compute == "trace"
            else replay_run(fit, dataclasses.replace(wl, compute="trace"), network)
        )
        rows.append(run_row(str(d), fit, wl, predicted, traced))
        cal["runs"].append(
            {k: v for k, v in dataclasses.asdict(fit).items() if k not in ("compute", "trace")}
            | {"compute_median_s": wl.step_s, "compute_sigma": wl.sigma}
        )
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "calibration.json", strict_json(cal, indent=2, default=float) + "\n")
    if rows:
        write_validation(rows, out, compute)
    pooled = None
    if fits:
        samples = [c for f in fits for c in f.compute]
        # a sweep over other world sizes has no per-rank trace: resample the pooled compute times instead
        base = fits[-1].to_workload(compute="empirical" if compute == "trace" else compute)
        pooled = dataclasses.replace(base, samples=tuple(samples), source="pooled over the calibrated runs")
    return rows, pooled, network


def run_row(run: str, fit, wl: Workload, predicted: float, traced: float) -> dict:
    """One calibrated run's row of the validation table: its fit, and predicted
    against measured throughput."""
    measured = fit.measured_throughput
    ratio = predicted / measured if measured else None
    return {
        "run": run,
        "optimizer": fit.optimizer,
        "world_size": fit.world_size,
        "imbalance": fit.imbalance.get("name"),
        "rounds": fit.rounds,
        "compute_median_s": wl.step_s,
        "compute_sigma": wl.sigma,
        "overhead_s": wl.overhead_s,
        "params": wl.params,
        "measured": measured,
        "predicted": predicted,
        "ratio": ratio,
        "within_15pct": ratio is not None and abs(ratio - 1) <= 0.15,
        "predicted_trace": traced,
        "ratio_trace": traced / measured if measured else None,
    }


def write_validation(rows: list[dict], out: Path, compute: str) -> None:
    """The validation table printed and written, and measured against simulated throughput drawn."""
    write_table(rows, out, "validation")
    cols = [
        ("optimizer", "optimizer"),
        ("world_size", "P"),
        ("imbalance", "imbalance"),
        ("measured", "measured"),
        ("predicted", f"predicted ({compute})"),
        ("ratio", "ratio"),
        ("predicted_trace", "predicted (trace)"),
        ("ratio_trace", "ratio"),
        ("run", "run"),
    ]
    print(f"## Validation: predicted vs measured throughput (samples/s)\n\n{markdown(rows, cols)}\n")
    table = [
        {
            "label": f"{r['optimizer']} {r['imbalance']}",
            "world_size": r["world_size"],
            "throughput": r["measured"],
            "kind": "measured",
        }
        for r in rows
        if r["measured"]
    ]
    table += [
        {
            "label": f"{r['optimizer']} {r['imbalance']}",
            "world_size": r["world_size"],
            "throughput": r["predicted"],
            "kind": "predicted",
        }
        for r in rows
    ]
    plots.plot_throughput(
        table, out / "validation.png", "measured (solid) vs simulated (dashed)", ideal=False
    )


def network_lines(report: dict) -> str:
    """The calibrated network as ``--calibrate`` prints it: each level's fit, or where it came from."""
    head = (
        f"## Network fitted from comm-bench ({report['rows']} rows): {report['algorithm']}, "
        f"{report['gpus_per_node']} ranks a node (relative RMS error {report['rel_rms']:.2f})"
    )
    lines = [head]
    for level, fit in report["levels"].items():
        how = "measured" if fit["measured"] else fit["note"]
        lines.append(
            f"- {level}: alpha={fit['alpha_s']:.3g} s, bandwidth={fit['bandwidth_GBps']:.3g} GB/s ({how})"
        )
    return "\n".join(lines) + "\n"


def replay_run(fit, workload: Workload, network: Network, keep: list | None = None) -> float:
    """Simulated throughput of a calibrated run's own configuration (optimizer, world, imbalance, rounds,
    seed); ``keep`` receives the whole result."""
    settings = typed_settings("optimizer", OPTIMIZER_SPECS, fit.settings)
    imbalance = make_imbalance(typed_settings("imbalance", IMBALANCES, fit.imbalance), fit.seed)
    if workload.compute == "trace":  # the run's own stragglers with its own compute times
        from wagma_bench.simulate.calibrate import RecordedDelays

        imbalance = RecordedDelays(fit.delay_trace)
        if "threshold_s" in fit.extra and getattr(settings, "threshold_s", None) == "auto":
            # ... and DropCompute's threshold as the run set it: the rule, fed the model's micro-batch times
            # and communication cost, lands elsewhere (a measured miss of the trace before: docs/simulator.md)
            threshold = fit.extra["threshold_s"]
            settings = dataclasses.replace(
                settings, threshold_s="inf" if threshold is None else str(threshold)
            )
    res = simulate(
        SimConfig(
            fit.optimizer,
            fit.world_size,
            workload,
            network,
            imbalance,
            settings,
            fit.rounds,
            fit.seed,
            local_state=fit.local_state,
        )
    )
    if keep is not None:
        keep.append(res)
    return res.throughput
