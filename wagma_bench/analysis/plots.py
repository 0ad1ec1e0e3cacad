"""The report's figures, drawn from tidy tables (lists of dicts) with matplotlib's Agg backend.

Nothing here reads run files or computes statistics: :mod:`wagma_bench.analysis.report` builds the tables, and
other producers (``wagma-bench simulate``) can hand in their own rows, so that predictions and
measurements share one figure format -- see :func:`plot_throughput`'s ``kind``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wagma_bench.record.files import atomic_write

MAX_RANKS_SHOWN = 32  # per-rank step-time figure: beyond this, the slowest ranks only
DPI = 110
PALETTE_COLOURS = 256  # a PNG figure's colours (write_png)


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed), imported only when a figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def colors(labels: Sequence[str]) -> dict[str, Any]:
    """One tab10 colour per distinct label, in order of first appearance."""
    cmap = pyplot().get_cmap("tab10")
    return {label: cmap(i % 10) for i, label in enumerate(dict.fromkeys(labels))}


def save(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` (its suffix picks the format) atomically, then close it; a PNG as a palette
    image (:func:`write_png`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fmt = path.suffix.lstrip(".") or "png"
    try:  # atomically: a full disk leaves no half-written PNG, a planted link is refused (files.atomic_write)
        atomic_write(
            path,
            lambda f: write_png(fig, f) if fmt == "png" else fig.savefig(f, format=fmt, dpi=DPI),
            binary=True,
        )
    finally:
        pyplot().close(fig)
    return path


def write_png(fig, f) -> None:
    """The figure as an 8-bit palette PNG, opaque: its flat colours and antialiased edges fit in 256 colours
    (Pillow's maximum-coverage quantizer: at most 24 levels in 255 from the 32-bit render, at antialiased
    edges, under half a level on average; tests/test_report.py), in a third of the bytes; the results
    committed with the repository carry dozens of figures, and the repository must stay under 20 MB."""
    from PIL import Image

    render = io.BytesIO()
    fig.savefig(render, format="png", dpi=DPI)
    render.seek(0)
    image = Image.open(render).convert("RGB")  # the figures' background is opaque: no alpha to keep
    image.quantize(PALETTE_COLOURS, method=Image.Quantize.MAXCOVERAGE).save(f, format="PNG", optimize=True)


def plot_metric_curves(
    bands: dict[str, dict], path: Path, title: str, metric: str, target: float | None = None
) -> Path:
    """Validation metric against training time (left) and steps (right).

    ``bands[label]``: ``n`` (seeds) and, for ``train_s`` and ``step``, a tuple (x, median, lo, hi) as
    :func:`wagma_bench.analysis.report.seed_band` returns; with several seeds the band and, optionally, each
    seed's own curve (``train_s_seeds``/``round_seeds``: lists of (x, y)) are drawn thin.
    """
    plt = pyplot()
    palette = colors(list(bands))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, xkey, xlabel in (
        (axes[0], "train_s", "training time (s, evaluation excluded)"),
        (axes[1], "round", "round"),
    ):
        for label, band in bands.items():
            xs, med, lo, hi = band[xkey]
            if not xs:
                continue
            ax.plot(
                xs,
                med,
                color=palette[label],
                label=f"{label} (n={band['n']})",
                marker="." if len(xs) < 30 else None,
            )
            if band["n"] > 1:
                ax.fill_between(xs, lo, hi, color=palette[label], alpha=0.2, linewidth=0)
                for sx, sy in band.get(f"{xkey}_seeds", []):
                    ax.plot(sx, sy, color=palette[label], alpha=0.35, linewidth=0.7)
        if target is not None:
            ax.axhline(target, color="k", linestyle="--", linewidth=1, label="target")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(metric)
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{title}\nmedian over seeds (bold), band: min-max, thin: single seeds", fontsize=10)
    return save(fig, path)


def plot_time_to_target(bars: Sequence[dict], path: Path, title: str) -> Path:
    """Bars of time-to-target with the spread over seeds.

    Each bar: ``label``, ``color_key``, ``median`` (None: not reached, drawn hatched), ``lo``/``hi``
    (whiskers), ``seeds`` (the times of the seeds that reached, drawn as dots), ``reached`` and ``n``.
    """
    plt = pyplot()
    palette = colors([b["color_key"] for b in bars])
    top = max([b["hi"] for b in bars if b["hi"] is not None] or [1.0]) * 1.1
    fig, ax = plt.subplots(figsize=(max(6.5, 1.1 * len(bars) + 2), 4))
    for i, b in enumerate(bars):
        if b["median"] is None:
            ax.bar(i, top, color="none", edgecolor="grey", hatch="//")
            ax.text(i, top, "not reached", ha="center", va="bottom", fontsize=8)
        else:
            err = [[b["median"] - b["lo"]], [b["hi"] - b["median"]]]
            ax.bar(i, b["median"], color=palette[b["color_key"]], alpha=0.8, yerr=err, capsize=4)
        ax.scatter([i] * len(b["seeds"]), b["seeds"], color="k", s=12, zorder=3)
        ax.text(
            i,
            0,
            f"{b['reached']}/{b['n']}\nreached",
            ha="center",
            va="bottom",
            fontsize=7,
            color="white" if b["median"] is not None else "k",
        )
    ax.set_xticks(range(len(bars)), [b["label"] for b in bars], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("time to target (s, training clock)")
    ax.set_title(
        f"{title}\nbar: median over seeds; whiskers: min-max of the seeds that reached; dots: seeds",
        fontsize=8,
    )
    ax.grid(axis="y", alpha=0.3)
    return save(fig, path)


def plot_throughput(table: Sequence[dict], path: Path, title: str, ideal: bool = True) -> Path:
    """Throughput against world size, with the ideal linear-scaling line.

    Rows: ``label``, ``world_size``, ``throughput``, optionally ``lo``/``hi`` (spread) and ``kind``:
    ``measured`` (solid, default) or ``predicted`` (dashed, e.g. ``wagma-bench simulate``), so that
    predictions and measurements share one plot. A label's ideal line (dotted) starts from its smallest
    measured world size.
    """
    plt = pyplot()
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    rows = [r for r in table if r.get("throughput")]
    palette = colors([r["label"] for r in rows])
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    lines: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        lines.setdefault((r["label"], r.get("kind", "measured")), []).append(r)
    ideal_drawn = False
    all_sizes = sorted({r["world_size"] for r in rows})
    if len(all_sizes) == 1:  # one world size: show where linear scaling would take it at twice the ranks
        all_sizes.append(2 * all_sizes[0])
    for (label, kind), rs in lines.items():
        rs = sorted(rs, key=lambda r: r["world_size"])
        xs, ys = [r["world_size"] for r in rs], [r["throughput"] for r in rs]
        measured = kind == "measured"
        ax.plot(
            xs,
            ys,
            color=palette[label],
            marker="o" if measured else "x",
            linestyle="-" if measured else "--",
            label=label if measured else f"{label} ({kind})",
        )
        if any(r.get("lo") is not None for r in rs):
            err = [
                [y - (r.get("lo") or y) for r, y in zip(rs, ys)],
                [(r.get("hi") or y) - y for r, y in zip(rs, ys)],
            ]
            ax.errorbar(xs, ys, yerr=err, fmt="none", ecolor=palette[label], capsize=3)
        if ideal and measured:
            p0, t0 = xs[0], ys[0]
            ideal_x = [p for p in all_sizes if p >= p0]
            ax.plot(
                ideal_x,
                [t0 * p / p0 for p in ideal_x],
                color=palette[label],
                linestyle=":",
                linewidth=1,
                label=None if ideal_drawn else "ideal linear scaling (dotted, per optimizer)",
            )
            ideal_drawn = True
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    if all_sizes:
        ax.set_xticks(all_sizes, [str(p) for p in all_sizes])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("world size P (ranks)")
    ax.set_ylabel("throughput (samples/s, training clock)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:  # a group of runs that all diverged has no throughput to draw
        ax.legend(fontsize=8)
    return save(fig, path)


STACKED = (  # the per-rank figure's components, bottom to top
    ("compute", "tab:blue", "compute"),
    ("delay", "tab:red", "injected delay"),
    ("comm", "tab:green", "communication"),
    ("wait", "tab:orange", "wait (for slower ranks)"),
)


def plot_step_times(
    series: dict[str, dict[int, dict[str, float]]], path: Path, title: str, max_ranks: int = MAX_RANKS_SHOWN
) -> Path:
    """Per rank, its mean seconds per step stacked by component (compute, injected delay, communication,
    wait: :mod:`wagma_bench.analysis.step_figures`), one panel per series; a thin line per bar spans the
    rank's p10-p90 step time (the spread, drawn so that an outlier cannot dwarf the means). ``series[label]``:
    rank -> its components and ``p10`` / ``p90``. Beyond ``max_ranks`` ranks only the slowest are drawn."""
    plt = pyplot()
    fig, axes = plt.subplots(len(series), 1, figsize=(10, 2.6 * len(series) + 0.8), squeeze=False)
    for ax, (label, per_rank) in zip(axes[:, 0], series.items()):
        totals = {k: sum(v.get(c, 0.0) for c, _, _ in STACKED) for k, v in per_rank.items()}
        ranks = sorted(totals)
        note = ""
        if len(ranks) > max_ranks:
            ranks = sorted(sorted(ranks, key=totals.get)[-max_ranks:])
            note = f" ({max_ranks} slowest of {len(totals)} ranks)"
        bottom = [0.0] * len(ranks)
        for comp, color, name in STACKED:
            heights = [per_rank[k].get(comp, 0.0) for k in ranks]
            ax.bar(range(len(ranks)), heights, 0.7, bottom=bottom, color=color, alpha=0.75, label=name)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.vlines(
            range(len(ranks)),
            [per_rank[k].get("p10", 0.0) for k in ranks],
            [per_rank[k].get("p90", 0.0) for k in ranks],
            color="black",
            linewidth=0.8,
            label="p10-p90 of step time",
        )
        ax.set_xticks(range(len(ranks)), [str(k) for k in ranks], fontsize=7)
        ax.set_ylabel("seconds per step")
        ax.set_title(label + note, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    # above the first panel, where it covers no bar
    axes[0, 0].legend(fontsize=7, loc="lower right", bbox_to_anchor=(1.0, 1.12), ncol=5, frameon=False)
    axes[-1, 0].set_xlabel("rank")
    fig.suptitle(f"{title}\nper-rank step time: mean per step by component (seeds averaged)", fontsize=10)
    fig.subplots_adjust(top=1 - 1.1 / (2.6 * len(series) + 0.8), hspace=0.45)
    return save(fig, path)


def plot_performance_profile(
    profiles: dict[str, tuple[list[float], list[float]]],
    path: Path,
    problems: int,
    title: str = "performance profile (tuned)",
) -> Path:
    """AlgoPerf's performance profiles: per optimizer, the fraction of workloads (``problems`` in all) on
    which its tuned score is within a factor tau of the best optimizer's, against tau (a step curve; an
    optimizer that missed a workload never reaches 1). ``profiles[label]``: (taus, fractions)."""
    plt = pyplot()
    palette = colors(list(profiles))
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label, (taus, fractions) in profiles.items():
        ax.step(taus, fractions, where="post", color=palette[label], label=label, linewidth=1.8)
    ax.set_xlabel("tau: score / best score on the workload")
    ax.set_ylabel(f"fraction of workloads (of {problems}) within tau")
    ax.set_ylim(-0.02, 1.05)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return save(fig, path)
