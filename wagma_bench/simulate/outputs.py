"""The files and figures of ``wagma-bench simulate``: its tables as Markdown (printed), JSON and CSV, and the
time-to-target figure (the throughput figure is the report's,
:func:`wagma_bench.analysis.plots.plot_throughput`)."""

from __future__ import annotations

from pathlib import Path

from wagma_bench.analysis import plots
from wagma_bench.analysis.tables import markdown_table, write_csv
from wagma_bench.record.files import strict_json, write_text_atomic


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
