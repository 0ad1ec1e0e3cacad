"""The files and figures of ``wagma-bench simulate``: its tables as Markdown (printed), JSON and CSV, and the
time-to-target figure (the throughput figure is the report's,
:func:`wagma_bench.analysis.plots.plot_throughput`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from wagma_bench.analysis import plots
from wagma_bench.analysis.tables import fmt, markdown_table, write_csv
from wagma_bench.record.files import staged_outputs, strict_json, write_text_atomic


def markdown(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    return markdown_table(rows, [(key, header, "sig") for key, header in cols])


# every file simulate may write into --out (predict, interval, compare): an earlier run's that this run did
# not write are removed when its outputs are moved in (files.staged_outputs)
OUTPUTS = (
    "predictions.csv",
    "predictions.json",
    "throughput.png",
    "time_to_target.png",
    "interval.json",
    "validation.csv",
    "validation.json",
    "validation.png",
    "calibration.json",
)


@contextlib.contextmanager
def staged_prediction(out: Path) -> Iterator[Path]:
    """A folder to write ``simulate``'s outputs into, moved into ``out`` at the end as report's are
    (:func:`~wagma_bench.record.files.staged_outputs`: a full disk leaves ``out`` as it was; an earlier run's
    outputs this run did not write go); only then is what ``--interval`` kept to resume from removed
    (:func:`~wagma_bench.simulate.resume.forget`), never before ``out`` is whole."""
    from wagma_bench.simulate.resume import forget

    with staged_outputs(out, owned=OUTPUTS) as stage:
        yield stage
    forget(out)


def write_table(rows: list[dict], out: Path, stem: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # strict JSON: a NaN or an infinity (an overflowed spread) as null, never the bare tokens
    write_text_atomic(out / f"{stem}.json", strict_json(rows, indent=2, default=float) + "\n")
    write_csv(rows, out / f"{stem}.csv")


def plot_time_to_target(rows: list[dict], path: Path, title: str) -> Path:
    plt = plots.pyplot()
    palette = plots.colors([r["label"] for r in rows])
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label in palette:
        rs = sorted(
            (r for r in rows if r["label"] == label and r.get("time_to_target_s")),
            key=lambda r: r["world_size"],
        )
        if rs:
            ax.plot(
                [r["world_size"] for r in rs],
                [r["time_to_target_s"] / 3600 for r in rs],
                color=palette[label],
                marker="x",
                linestyle="--",
                label=f"{label} (predicted)",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    sizes = sorted({r["world_size"] for r in rows})
    ax.set_xticks(sizes, [str(p) for p in sizes])
    ax.set_xlabel("world size P (ranks)")
    ax.set_ylabel("time to target (h, training clock)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return plots.save(fig, path)


# --- what the predictions rest on -----------------------------------------------------------------------

NEEDS_CONVERGENCE = "--convergence RUN_DIR|TUNE_DIR (runs that reached the target) or samples_to_target=N"


def interval_cells(rows: list[dict], data: dict) -> None:
    """``--interval``'s 95% interval (the 2.5th and 97.5th percentiles over the replicates, as ``claims``
    reads them) of each row's throughput and time to target, as cells ``throughput_95`` and
    ``time_to_target_95``."""
    import numpy as np

    for row in rows:
        for key, cell in (("throughput", "throughput_95"), ("time_to_target_s", "time_to_target_95")):
            values = [
                v
                for rep in data["predictions"]
                if (v := ((rep.get(row["world_size"]) or {}).get(row["optimizer"]) or {}).get(key))
                is not None
            ]
            if values:
                lo, hi = np.percentile(values, [2.5, 97.5])
                row[cell] = f"[{fmt(float(lo), 'sig')}, {fmt(float(hi), 'sig')}]"


def origins_line(req, calibrated: bool, contended: dict[str, float]) -> str:
    """One line naming where each input came from: the cost model and network (defaults, calibrated runs,
    the command line), the compute spread (the preset's, or ``--compute-from``'s runs with those flagged
    contended named), ``--measured``'s file, and time to target's convergence input."""
    from wagma_bench.analysis.fairness import CONTENDED_FACTOR

    own = sorted(k for k in req.own if k not in ("gpus", "control_every", "steps"))
    model = "calibrated from the --calibrate runs" if calibrated else "the workload's preset (defaults)"
    parts = [
        f"cost model: {model}" + (f", {', '.join(own)} from the command line" if own else ""),
        "network: "
        + (f"cluster profile {req.cluster}" if req.cluster else "cluster profile daint (default)")
        + (f" with {', '.join(req.cluster_overrides)}" if req.cluster_overrides else "")
        + (" (or comm-bench JSON given to --calibrate)" if calibrated else ""),
    ]
    if req.compute_from:
        flagged = ", ".join(f"{name} ({factor:.2f}x)" for name, factor in contended.items())
        parts.append(
            f"compute spread: --compute-from {' '.join(req.compute_from)}"
            + (
                f"; contended (wall/CPU compute above {CONTENDED_FACTOR:g}x), so their spread includes "
                f"waiting for a core: {flagged}"
                if contended
                else "; none contended"
            )
        )
    else:
        parts.append("compute spread: the preset's assumed distribution (default)")
    if req.measured:
        parts.append(f"measured inputs: {req.measured}")
    if req.convergence:
        parts.append(f"samples to target: --convergence {' '.join(req.convergence)}")
    elif "samples_to_target" in req.own:
        parts.append("samples to target: samples_to_target from the command line")
    return "Inputs: " + "; ".join(parts) + "."


def missing_target_line(rows: list[dict], req) -> str | None:
    """Which optimizers have no time to target and the input that would give them one; None when all have."""
    missing = sorted({r["optimizer"] for r in rows if r.get("time_to_target_s") is None})
    if not missing:
        return None
    if req.convergence:
        return (
            f"Time to target: — for {', '.join(missing)}: no run of theirs under --convergence reached its "
            f"target (give runs that did, or samples_to_target=N)."
        )
    return f"Time to target: — for every optimizer: it needs {NEEDS_CONVERGENCE}."


def contended_runs(paths: list[str]) -> dict[str, float]:
    """The runs under ``paths`` whose wall over CPU compute is above the contended factor, by folder name."""
    from wagma_bench.analysis.fairness import CONTENDED_FACTOR
    from wagma_bench.analysis.run_records import find_runs
    from wagma_bench.record.rundir import contention_of
    from wagma_bench.record.steps import read_step_records

    out = {}
    for run_dir in find_runs([Path(p) for p in paths]):
        try:
            factor = contention_of(list(read_step_records(run_dir).values()))
        except ValueError:  # a damaged compact table: the spread's own reader refuses it
            continue
        if factor is not None and factor > CONTENDED_FACTOR:
            out[run_dir.name] = factor
    return out
