"""``wagma-bench report DIR... --out R``: time-to-accuracy tables and figures over runs and sweeps.

Every number comes from the runs' own files (``events.jsonl``, ``summary.json``, ``steps/rank<R>.jsonl``):
the computation is a set of pure functions over tidy rows (lists of dicts), the figures are drawn from
those rows afterwards. Runs are grouped by (workload, data, metric, target) and a table never mixes two
groups. Inside a group one *series* is one (optimizer, world size, imbalance); its runs are the seeds.

Conventions (MLPerf's where it has one):

- time-to-target is the training clock (evaluation and checkpoint time excluded) at the first
  evaluation at or above the target;
- a seed that did not reach the target counts as infinitely slow: it makes the median "not reached"
  when half the seeds or more missed, and with >= 3 seeds the olympic mean drops it as the slowest;
- olympic mean: with >= 3 seeds drop the fastest and the slowest and average the rest (MLPerf's
  scoring); with 1 or 2 seeds nothing can be dropped and it is the plain mean (the table says so);
- speed-up: allreduce's olympic-mean time-to-target over the series', at the same world size and
  imbalance.

This module computes the untuned tables and writes the report; the runs are read by
:mod:`~wagma_bench.analysis.run_records`, their step times by :mod:`~wagma_bench.analysis.step_times`, tuned
combinations are ranked by :mod:`~wagma_bench.analysis.scoring`, and ``--wandb`` logs the result through
:mod:`~wagma_bench.analysis.wandb_report`.
"""

from __future__ import annotations

import math
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from wagma_bench.analysis import fairness, intervals, plots, step_figures
from wagma_bench.analysis.run_records import (
    RunRecord,
    find_runs,
    group_runs,
    load_run,
    name_variants,
    reference_readings,
)
from wagma_bench.analysis.scoring import REFERENCE, TunedSection, tuned_section
from wagma_bench.analysis.step_times import step_time_rows, step_time_summary
from wagma_bench.analysis.tables import fmt, markdown_table, write_csv
from wagma_bench.analysis.tuning import PLAN as TUNE_PLAN
from wagma_bench.analysis.tuning import fairness_line as tuning_fairness
from wagma_bench.metric import METRICS
from wagma_bench.record.events import EVENTS, EVENTS_XZ
from wagma_bench.record.files import staged_outputs, write_text_atomic
from wagma_bench.workloads.specs import throughput_unit

INF = math.inf


# --- statistics (pure) -------------------------------------------------------------------------------


def olympic_mean(values: Sequence[float]) -> float | None:
    """MLPerf's olympic mean: drop one fastest and one slowest value when there are >= 3, average the rest.

    ``inf`` stands for a seed that did not reach the target; the result is None ("not reached") when one
    is left after dropping, and None for no values.
    """
    vals = sorted(values)
    if len(vals) >= 3:
        vals = vals[1:-1]
    if not vals or any(math.isinf(v) for v in vals):
        return None
    return sum(vals) / len(vals)


def median(values: Sequence[float]) -> float | None:
    """Median, None for no values or an infinite median (half or more of the seeds did not reach)."""
    if not values:
        return None
    m = statistics.median(values)
    return None if math.isinf(m) else m


def time_to_target(run: RunRecord) -> float:
    """Training time at the first evaluation at or above the target; inf when never reached."""
    t = run.summary.time_to_target_s
    return INF if t is None else float(t)


def series_rows(runs: Sequence[RunRecord], reference: str | None = None) -> list[dict]:
    """The comparison table of one group: one row per (optimizer, world size, imbalance), seeds folded;
    speed-ups against ``reference`` (:func:`choose_reference`), the rows' fairness flags (:mod:`fairness`)."""
    by_series: dict[tuple, list[RunRecord]] = {}
    for run in runs:
        by_series.setdefault(run.series_key, []).append(run)
    has_target = any(r.meta.get("target") is not None for r in runs)
    ordered = sorted(by_series.items(), key=lambda kv: tuple(str(x) for x in kv[0]))
    rows = [_series_row(key, rs, has_target) for key, rs in ordered]
    reference = choose_reference(rows, reference)
    add_speedups(rows, reference)
    add_flags(rows, dict(ordered), reference)
    return rows


def _series_row(key: tuple, rs: list[RunRecord], has_target: bool) -> dict:
    opt, world, imb = key
    times = [time_to_target(r) for r in rs]
    reached = [t for t in times if not math.isinf(t)]
    finals = [r.summary.final_metric for r in rs if r.summary.final_metric is not None]
    bests = [r.summary.best_metric for r in rs if r.summary.best_metric is not None]
    # a diverged run trained on non-finite numbers: its throughput is no measure of the optimizer's
    tputs = [
        r.summary.throughput_samples_per_s
        for r in rs
        if r.summary.throughput_samples_per_s and r.summary.status != "diverged"
    ]
    spreads = [r.summary.compute_imbalance for r in rs if r.summary.compute_imbalance is not None]
    steps = [r.steps for r in rs if r.steps is not None and r.steps.wait_shares]
    return {
        "optimizer": opt,
        "world_size": world,
        "imbalance": imb,
        "seeds": len(rs),
        "reached": len(reached) if has_target else None,
        "ttt_median_s": median(times) if has_target else None,
        "ttt_olympic_s": olympic_mean(times) if has_target else None,
        "ttt_min_s": min(reached) if reached else None,
        "ttt_max_s": max(reached) if reached else None,
        "ttt_interval_s": ttt_interval(times) if has_target else None,
        "olympic_rule": ("drop fastest+slowest" if len(rs) >= 3 else "plain mean (< 3 seeds)"),
        "final_metric": median(finals),
        "best_metric": median(bests),
        "throughput": median(tputs),
        "throughput_min": min(tputs) if tputs else None,
        "throughput_max": max(tputs) if tputs else None,
        "compute_imbalance": median(spreads),
        "wait_share": median([s.wait_share_mean for s in steps]),
        "wait_share_worst": max((s.wait_share_max for s in steps), default=None),
        "contention": max((c for r in rs if (c := r.summary.compute_contention) is not None), default=None),
        "partial_runs": sum(r.partial for r in rs),
        "diverged_runs": sum(r.summary.status == "diverged" for r in rs),
    }


def ttt_interval(times: Sequence[float]) -> tuple[float, float] | None:
    """The seeds' 95% interval of the median time to target (the exact percentile bootstrap of the median,
    :mod:`~wagma_bench.analysis.intervals`; ``inf`` stands for a seed that missed); None under 3 seeds."""
    if len(times) < 3:
        return None
    draws: dict[float, float] = {}
    for t in times:
        draws[t] = draws.get(t, 0.0) + 1 / len(times)
    return intervals.interval(intervals.median_of_draws(draws, len(times)))


def is_series_of(label: str | None, optimizer: str) -> bool:
    """A row's optimizer label (``local_sgd``, ``local_sgd (sync_period=2)``) is a series of ``optimizer``."""
    return label is not None and (label == optimizer or label.startswith(optimizer + " ("))


def choose_reference(rows: Sequence[dict], asked: str | None) -> str | None:
    """The optimizer the group's speed-ups are against: ``asked`` where it ran here (None where it did not);
    without one, Allreduce-SGD where it ran, else the first series' optimizer."""
    if asked is not None:
        return asked if any(is_series_of(r["optimizer"], asked) for r in rows) else None
    if any(is_series_of(r["optimizer"], REFERENCE) for r in rows):
        return REFERENCE
    return rows[0]["optimizer"] if rows else None


def add_speedups(rows: list[dict], reference: str | None = REFERENCE) -> list[dict]:
    """Speed-up of each row against the reference optimizer at the same world size and imbalance:
    time-to-target (olympic means) and throughput (medians). None when either side is missing."""
    refs: dict[tuple, dict] = {}
    for r in rows:
        if reference is not None and is_series_of(r["optimizer"], reference):
            refs.setdefault((r["world_size"], r["imbalance"]), r)
    for row in rows:
        ref = refs.get((row["world_size"], row["imbalance"]))
        row["speedup_ttt"] = _speedup("time_to_target", row["ttt_olympic_s"], ref and ref["ttt_olympic_s"])
        row["speedup_throughput"] = _speedup("throughput", row["throughput"], ref and ref["throughput"])
    return rows


def add_flags(rows: list[dict], series: dict[tuple, list[RunRecord]], reference: str | None) -> None:
    """Each row's fairness flags (``flags``: ``; ``-joined, empty where none): contended runs, and a speed
    reference that differs from the reference series' at the same world size and imbalance."""
    readings = {key: [v for r in rs for v in reference_readings(r.summary)] for key, rs in series.items()}
    refs = {
        (r["world_size"], r["imbalance"]): r
        for r in reversed(rows)
        if reference is not None and is_series_of(r["optimizer"], reference)
    }
    for row, (key, rs) in zip(rows, series.items(), strict=True):
        flags = [fairness.contended((r.summary.compute_contention, r.summary.ranks_per_cpu) for r in rs)]
        ref = refs.get((row["world_size"], row["imbalance"]))
        if ref is not None and ref is not row:
            ref_key = (ref["optimizer"], ref["world_size"], ref["imbalance"])
            flags.append(fairness.different_conditions(readings[key], readings[ref_key], ref["optimizer"]))
        row["flags"] = "; ".join(f for f in flags if f)


def touched_ratios(rows: Sequence[dict], reference: str | None) -> list[str]:
    """The speed-ups a flag touches: a flagged row's against the reference, and every row's at a world size
    and imbalance whose reference row is flagged."""
    refs = {
        (r["world_size"], r["imbalance"]): r
        for r in rows
        if reference is not None and is_series_of(r["optimizer"], reference)
    }
    touched = []
    for row in rows:
        ref = refs.get((row["world_size"], row["imbalance"]))
        if ref is None or ref is row or not (row["flags"] or ref["flags"]):
            continue
        touched.append(
            f"{row['optimizer']} vs {ref['optimizer']} (P={row['world_size']}, imbalance={row['imbalance']})"
        )
    return touched


def _speedup(figure: str, value: float | None, reference: float | None) -> float | None:
    return METRICS[figure].ratio(value, reference)


def run_rows(runs: Sequence[RunRecord], root: Path | None = None) -> list[dict]:
    """Every run of a group, one row each (never drops one that did not reach the target)."""
    rows = []
    for r in sorted(runs, key=lambda r: (tuple(str(x) for x in r.series_key), str(r.meta.get("seed")))):
        s = r.summary
        rows.append(
            {
                "run": _rel(r.path, root),
                "optimizer": r.optimizer,
                "world_size": r.meta.get("world_size"),
                "imbalance": r.meta.get("imbalance"),
                "seed": r.meta.get("seed"),
                "status": s.status,
                "reached": s.reached,
                "time_to_target_s": s.time_to_target_s,
                "rounds": s.rounds,
                "final_metric": s.final_metric,
                "best_metric": s.best_metric,
                "throughput": s.throughput_samples_per_s,
                "train_s": s.train_s,
                "restarts": s.restarts,
                "compute_imbalance": s.compute_imbalance,
                "wait_share": r.steps.wait_share_mean if r.steps else None,
                "wait_share_worst": r.steps.wait_share_max if r.steps else None,
                "contention": s.compute_contention,
                "flags": fairness.contended([(s.compute_contention, s.ranks_per_cpu)]) or "",
                "problems": "; ".join(r.problems),
                "signature": r.signature,
            }
        )
    return rows


def _rel(path: Path, root: Path | None) -> str:
    try:
        return str(path.relative_to(root)) if root else str(path)
    except ValueError:
        return str(path)


def seed_band(curves: Sequence[tuple[Sequence[float], Sequence[float]]], points: int = 100):
    """Median and min-max band over seeds of curves y(x).

    Curves evaluated at the same x (e.g. the same steps) are folded point by point; otherwise each is
    interpolated linearly on a common grid that starts where every seed has its first point. A seed
    that ended earlier (at its target, or its budget) holds its last value to the end of the grid, so
    the median does not jump when the fastest seed stops. Returns (x, median, lo, hi) lists.
    """
    import numpy as np

    curves = [(list(x), list(y)) for x, y in curves if len(x)]
    if not curves:
        return [], [], [], []
    if all(c[0] == curves[0][0] for c in curves):
        xs = curves[0][0]
        ys = np.array([c[1] for c in curves], dtype=float)
    else:
        lo_x = max(c[0][0] for c in curves)
        hi_x = max(c[0][-1] for c in curves)
        xs = list(np.linspace(lo_x, hi_x, points))
        ys = np.array([np.where(np.array(xs) >= x[0], np.interp(xs, x, y), np.nan) for x, y in curves])
    keep = ~np.all(np.isnan(ys), axis=0)
    ys, xs = ys[:, keep], [x for x, k in zip(xs, keep) if k]
    return xs, list(np.nanmedian(ys, axis=0)), list(np.nanmin(ys, axis=0)), list(np.nanmax(ys, axis=0))


# --- figure data (pure): what plots.py draws ---------------------------------------------------------


def series_label(key: tuple, vary: set[str]) -> str:
    """A series' legend label: the optimizer, plus world size / imbalance where they vary in the group."""
    opt, world, imb = key
    parts = [str(opt)]
    if "world_size" in vary:
        parts.append(f"P={world}")
    if "imbalance" in vary:
        parts.append(f"imbalance={imb}")
    return " ".join(parts)


def varying(runs: Sequence[RunRecord]) -> set[str]:
    """Which of world size and imbalance take more than one value among the runs."""
    return {
        name for i, name in ((1, "world_size"), (2, "imbalance")) if len({r.series_key[i] for r in runs}) > 1
    }


def by_label(runs: Sequence[RunRecord]) -> dict[str, list[RunRecord]]:
    vary = varying(runs)
    out: dict[str, list[RunRecord]] = {}
    for r in sorted(runs, key=lambda r: tuple(str(x) for x in r.series_key)):
        out.setdefault(series_label(r.series_key, vary), []).append(r)
    return out


def metric_bands(runs: Sequence[RunRecord]) -> dict[str, dict]:
    """Per series: number of seeds; :func:`seed_band` of the metric against ``train_s`` and ``step``; and
    each seed's own curve (``train_s_seeds``, ``round_seeds``)."""
    out = {}
    for label, rs in by_label(runs).items():
        with_evals = [r for r in rs if r.evals]
        if with_evals:
            out[label] = {"n": len(with_evals)}
            for x in ("train_s", "round"):
                curves = [([e[x] for e in r.evals], [e["value"] for e in r.evals]) for r in with_evals]
                out[label][x], out[label][f"{x}_seeds"] = seed_band(curves), curves
    return out


def ttt_bars(rows: Sequence[dict], runs: Sequence[RunRecord]) -> list[dict]:
    """The time-to-target figure's bars: one per comparison row (median, min-max of the seeds that
    reached, those seeds' times, reached / seeds)."""
    vary = varying(runs)
    bars = []
    for row in rows:
        label = series_label((row["optimizer"], row["world_size"], row["imbalance"]), vary)
        times = [time_to_target(r) for r in runs if series_label(r.series_key, vary) == label]
        bars.append(
            {
                "label": label,
                "color_key": str(row["optimizer"]),
                "median": row["ttt_median_s"],
                "lo": row["ttt_min_s"],
                "hi": row["ttt_max_s"],
                "seeds": [t for t in times if not math.isinf(t)],
                "reached": row["reached"],
                "n": row["seeds"],
            }
        )
    return bars


def throughput_table(rows: Sequence[dict], imbalance_in_label: bool) -> list[dict]:
    """The comparison rows as the tidy table :func:`wagma_bench.analysis.plots.plot_throughput` takes."""
    return [
        {
            "label": f"{r['optimizer']}" + (f" imbalance={r['imbalance']}" if imbalance_in_label else ""),
            "world_size": r["world_size"],
            "throughput": r["throughput"],
            "lo": r["throughput_min"],
            "hi": r["throughput_max"],
            "kind": "measured",
        }
        for r in rows
        if r["throughput"]
    ]


def _ttt_cell(row: dict, key: str) -> str:
    if row[key] is not None:
        return fmt(row[key])
    return "not reached" if row["reached"] is not None else "no target"


# what a row's step records say of its runs (compute imbalance, waits, contention) and its fairness flags: the
# same columns in the comparison and the run tables
FAIRNESS_COLUMNS = [
    ("compute_imbalance", "compute imbalance", ""),
    ("wait_share", "wait share (mean rank)", "share"),
    ("wait_share_worst", "wait share (worst rank)", "share"),
    ("contention", "wall/CPU compute", "x"),
    ("flags", "flags", ""),
]


def comparison_columns(unit: str = "samples/s", reference: str | None = REFERENCE) -> list[tuple]:
    """The comparison table's columns: throughput in the workload's unit, speed-ups against ``reference``."""
    versus = f"vs {reference}" if reference else "vs (no reference)"
    return [
        ("optimizer", "optimizer", ""),
        ("world_size", "P", ""),
        ("imbalance", "imbalance", ""),
        ("seeds", "seeds", ""),
        ("reached", "reached", ""),
        ("ttt_median", "TTT median (s)", ""),
        ("ttt_interval", "TTT median 95% interval (s)", ""),
        ("ttt_olympic", "TTT olympic mean (s)", ""),
        ("speedup_ttt", f"speed-up {versus}", "x"),
        ("final_metric", "final metric", "metric"),
        ("best_metric", "best metric", "metric"),
        ("throughput", f"throughput ({unit})", ""),
        ("speedup_throughput", f"throughput {versus}", "x"),
        *FAIRNESS_COLUMNS,
        ("partial_runs", "half-written", ""),
        ("diverged_runs", "diverged", ""),
    ]


COMPARISON_COLUMNS = comparison_columns()


def run_columns(unit: str = "samples/s") -> list[tuple]:
    """The run table's columns, throughput in the workload's unit."""
    return [
        ("run", "run", ""),
        ("optimizer", "optimizer", ""),
        ("world_size", "P", ""),
        ("imbalance", "imbalance", ""),
        ("seed", "seed", ""),
        ("status", "status", ""),
        ("reached", "reached", ""),
        ("time_to_target_s", "TTT (s)", ""),
        ("rounds", "rounds", ""),
        ("final_metric", "final", "metric"),
        ("best_metric", "best", "metric"),
        ("throughput", unit, ""),
        ("restarts", "restarts", ""),
        *FAIRNESS_COLUMNS,
        ("problems", "marked", ""),
    ]


RUN_COLUMNS = run_columns()


def group_title(key: tuple) -> str:
    workload, data, metric, target = key
    goal = f"{metric} ≥ {target}" if target is not None else f"{metric}, no target (throughput only)"
    return f"{workload} / {data} — {goal}"


def group_slug(key: tuple) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", "_".join(str(k) for k in key)).strip("_")


@dataclass
class GroupReport:
    key: tuple
    runs: list[RunRecord]
    comparison: list[dict]
    run_table: list[dict]
    step_times: dict[str, dict]
    figures: dict[str, Path]
    reference: str | None = REFERENCE  # the optimizer its speed-ups are against (None: none ran here)
    unit: str = "samples/s"  # what its throughput counts (the workload's)
    reference_asked: str | None = None  # the --reference given (None: the default rule chose)

    @property
    def columns(self) -> list[tuple]:
        return comparison_columns(self.unit, self.reference)


def build_group(
    key: tuple, runs: list[RunRecord], out: Path, root: Path | None, reference: str | None = None
) -> GroupReport:
    """One group's tables and figures, speed-ups against ``reference`` (:func:`choose_reference`); a run in
    progress is listed in the run table only."""
    listed, runs = runs, [r for r in runs if not r.running]
    rows = series_rows(runs, reference)
    chosen = choose_reference(rows, reference)
    for r in rows:
        r["ttt_median"], r["ttt_olympic"] = _ttt_cell(r, "ttt_median_s"), _ttt_cell(r, "ttt_olympic_s")
        r["ttt_interval"] = _interval_cell(r["ttt_interval_s"])
    title, slug = group_title(key), group_slug(key)
    _, _, metric, target = key
    figures = {
        "metric": plots.plot_metric_curves(
            metric_bands(runs), out / f"{slug}_metric.png", title, metric or "metric", target
        )
    }
    if target is not None:
        figures["time_to_target"] = plots.plot_time_to_target(
            ttt_bars(rows, runs), out / f"{slug}_time_to_target.png", title
        )
    figures["throughput"] = plots.plot_throughput(
        throughput_table(rows, "imbalance" in varying(runs)), out / f"{slug}_throughput.png", title
    )
    steps = {label: step_time_rows(rs) for label, rs in by_label(runs).items()}
    steps = {k: v for k, v in steps.items() if v}
    stacked = {label: stacked_components(rs) for label, rs in by_label(runs).items()}
    stacked = {k: v for k, v in stacked.items() if v}
    if stacked:
        figures["step_times"] = plots.plot_step_times(stacked, out / f"{slug}_step_times.png", title)
    return GroupReport(
        key,
        listed,
        rows,
        run_rows(listed, root),
        {k: step_time_summary(v) for k, v in steps.items()},
        figures,
        chosen,
        throughput_unit(key[0]),
        reference,
    )


def stacked_components(runs: Sequence[RunRecord]) -> dict[int, dict[str, float]]:
    """Per rank, the series' mean seconds per step of each component (the mean of its seeds'), with the
    widest p10-p90 of its seeds' step times: what the per-rank figure stacks."""
    per_rank: dict[int, list[dict]] = {}
    for run in runs:
        for rank, comps in (run.steps.components if run.steps else {}).items():
            per_rank.setdefault(rank, []).append(comps)
    out = {}
    for rank, seeds in sorted(per_rank.items()):
        out[rank] = {c: statistics.fmean(s[c] for s in seeds) for c in step_figures.COMPONENTS}
        out[rank].update(p10=min(s["p10"] for s in seeds), p90=max(s["p90"] for s in seeds))
    return out


def _interval_cell(interval: tuple[float, float] | None) -> str | None:
    if interval is None:
        return None
    return "[" + ", ".join("not reached" if math.isinf(v) else fmt(v) for v in interval) + "]"


HOW_TO_READ = (
    "How to read it: runs are grouped by workload, data, metric and target; a table never mixes two "
    "groups. A *series* is one optimizer at one world size P and imbalance; its runs are the seeds. Time-"
    "to-target (TTT) is the training clock (evaluation and checkpoints excluded) at the first evaluation "
    "at or above the target. A seed that did not reach the target counts as infinitely slow: the median "
    "says *not reached* when half the seeds or more missed; with ≥ 3 seeds its 95% interval is the exact "
    "percentile bootstrap of the seeds' median. The olympic mean is MLPerf's score: with ≥ 3 seeds the "
    "fastest and slowest are dropped and the rest averaged; with 1–2 seeds it is the plain mean. Speed-"
    "ups compare olympic means (throughput: medians) with the reference optimizer at the same P and "
    "imbalance (each group names it). Runs marked *half-written* crashed or were cut off; they are read "
    "up to their last complete event. *Compute imbalance* is how uneven the ranks' compute was: the mean "
    "over steps of the slowest rank's compute time (injected delay included) over the ranks' mean (1.00: "
    "even; median over seeds; recomputed from the step records, so older runs have it too). *Wait share*:"
    " the fraction of a rank's training time spent in communication beyond the least any rank spent in "
    "the same step, i.e. waiting for slower ranks (mean over ranks, median over seeds; worst rank, worst "
    "seed). *Wall/CPU compute*: the ranks' wall-clock compute over their CPU compute (the worst seed); "
    f"above {fairness.CONTENDED_FACTOR:g}x a run waited for a core and is flagged *contended*. Series "
    "whose speed references (timed before and after each tuning trial) differ beyond their noise are "
    "flagged as measured under *different conditions*."
)


def render_markdown(
    groups: Sequence[GroupReport], unreadable: Sequence[RunRecord], sources: Sequence[str], out: Path
) -> str:
    n = sum(len(g.runs) for g in groups) + len(unreadable)
    header = (
        f"{n} run(s) from {', '.join(f'`{s}`' for s in sources)}; generated "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}."
    )
    lines = ["# wagma-bench report", "", header, "", *([fairness_line(groups), ""] if groups else [])]
    lines += [HOW_TO_READ, ""]
    for g in groups:
        lines += [
            f"## {group_title(g.key)}",
            "",
            "### Comparison",
            "",
            reference_line(g),
            "",
            markdown_table(g.comparison, g.columns),
            "",
        ]
        touched = touched_ratios(g.comparison, g.reference)
        if touched:
            lines += [
                f"Flagged ratios (read them with the flags beside their rows): {'; '.join(touched)}.",
                "",
            ]
        rules = sorted({r["olympic_rule"] for r in g.comparison})
        lines += [f"Olympic mean: {'; '.join(rules)}.", ""]
        lines += signature_lines(g.runs)
        captions = {
            "metric": "Validation metric against training time and steps (median over seeds, band min–max).",
            "time_to_target": "Time to target per series (bar: median; whiskers: min–max of the seeds "
            "that reached it; dots: seeds; hatched: not reached).",
            "throughput": "Throughput against world size, with the ideal linear scaling from the "
            "smallest measured P (dotted).",
            "step_times": "Per rank, its mean seconds per step stacked by component: compute, injected "
            "delay, communication and wait (for slower ranks); the thin line spans its p10–p90 step time. A "
            "straggler shows as high delay or compute; its peers show it as wait.",
        }
        for name, path in g.figures.items():
            lines += [f"![{name}]({path.relative_to(out)})", "", f"*{captions[name]}*", ""]
        if g.step_times:
            st_rows = [{"series": k, **v} for k, v in g.step_times.items()]
            lines += [
                "### Step time (median over ranks and steps, seconds)",
                "",
                markdown_table(
                    st_rows,
                    [
                        ("series", "series", ""),
                        ("compute_median_s", "compute", "metric"),
                        ("delay_median_s", "injected delay", "metric"),
                        ("comm_median_s", "comm", "metric"),
                        ("slowest_rank", "slowest rank (mean)", ""),
                    ],
                ),
                "",
            ]
        lines += ["### Runs", "", markdown_table(g.run_table, run_columns(g.unit)), ""]
    if unreadable:
        lines += [
            "## Runs that could not be grouped",
            "",
            "These directories hold an event log without a readable `run_start` event.",
            "",
        ]
        lines += [f"- `{r.path}`: {'; '.join(r.problems)}" for r in unreadable] + [""]
    return "\n".join(lines)


def reference_line(g: GroupReport) -> str:
    """Which optimizer the group's speed-ups are against, and why that one."""
    asked = g.reference_asked
    if g.reference is None:
        return f"Speed-ups: none (`{asked}`, asked for with --reference, has no run in this group)."
    why = (
        "asked for with --reference"
        if asked
        else "the default, Allreduce-SGD"
        if g.reference == REFERENCE
        else "the first series: Allreduce-SGD has no run in this group; choose with --reference"
    )
    return f"Speed-ups against `{g.reference}` ({why}); throughput in {g.unit}."


def fairness_line(groups: Sequence[GroupReport]) -> str:
    """The report's one fairness line: the flagged series of every group and the ratios they touch."""
    flagged: dict[str, list[str]] = {}
    touched: list[str] = []
    for g in groups:
        for row in g.comparison:
            if row["flags"]:
                name = f"{row['optimizer']} (P={row['world_size']}, imbalance={row['imbalance']})"
                flagged[name if len(groups) == 1 else f"{group_title(g.key)}: {name}"] = [row["flags"]]
        touched += touched_ratios(g.comparison, g.reference)
    rows = [row for g in groups for row in g.comparison]
    unmeasured = sum(row["contention"] is None for row in rows)
    return fairness.summary_line(flagged, len(rows), touched, unmeasured=unmeasured)


def signature_lines(runs: Sequence[RunRecord]) -> list[str]:
    """How the group's BLEU was computed (sacrebleu's signature); values under two signatures differ in
    tokenisation or smoothing, so the report says so instead of comparing them silently."""
    signatures = sorted({r.signature for r in runs if r.signature})
    if not signatures:
        return []
    if len(signatures) == 1:
        return [f"BLEU: sacrebleu signature `{signatures[0]}`.", ""]
    listed = "; ".join(f"`{s}`" for s in signatures)
    return [
        f"BLEU: **{len(signatures)} different sacrebleu signatures**, values are not comparable: {listed}.",
        "",
    ]


def make_report(
    paths: Sequence[Path], out: Path, reference: str | None = None
) -> tuple[Path, list[GroupReport], TunedSection | None]:
    """Read every run under ``paths``; write ``out/report.md``, the figures and CSV tables. A tuning
    directory (``wagma-bench tune``) gives the tuned section; its trials stay out of the untuned tables.
    Everything is built beside ``out`` and moved in at the end (:func:`staged_outputs`): a full disk partway
    leaves ``out`` with the previous report, not the new figures beside the old report.md."""
    out = Path(out)
    with staged_outputs(out) as stage:
        report, groups, tuned = _write_report(paths, stage, reference)
    for figures in [g.figures for g in groups] + ([tuned.figures] if tuned else []):  # where they are now
        figures.update({k: out / p.relative_to(stage) for k, p in figures.items() if p is not None})
    return out / report.relative_to(stage), groups, tuned


def _write_report(
    paths: Sequence[Path], out: Path, reference: str | None = None
) -> tuple[Path, list[GroupReport], TunedSection | None]:
    tune_dirs = [Path(p) for p in paths if (Path(p) / TUNE_PLAN).exists()]
    tuned = tuned_section(tune_dirs, out) if tune_dirs else None
    run_dirs = [d for d in find_runs(paths) if not any(d.is_relative_to(t.resolve()) for t in tune_dirs)]
    if not run_dirs and tuned is None:
        raise FileNotFoundError(
            f"no run found under {', '.join(map(str, paths))} (a run directory holds {EVENTS} or {EVENTS_XZ})"
        )
    runs = [load_run(d) for d in run_dirs]
    name_variants(runs)
    for warning in (w for r in runs for w in r.warnings):
        print(f"wagma-bench report: warning: {warning}", file=sys.stderr, flush=True)
    root = _common_root(run_dirs)
    check_reference(reference, runs)
    groups = [build_group(k, rs, out, root, reference) for k, rs in group_runs(runs).items()]
    unreadable = [r for r in runs if not r.meta]
    comparison = [{"group": group_title(g.key), **r} for g in groups for r in g.comparison]
    write_csv(comparison, out / "comparison.csv")
    write_csv([{"group": group_title(g.key), **r} for g in groups for r in g.run_table], out / "runs.csv")
    report = out / "report.md"
    text = render_markdown(groups, unreadable, [str(p) for p in paths], out)
    if tuned is not None:
        write_csv(tuned.rows, out / "tuned.csv")
        flags = [f"`{d}`: {tuning_fairness(d)}" for d in tune_dirs]
        text = _with_tuned(text, tuned, out, untuned=bool(groups), flags=flags)
    write_text_atomic(report, text)
    return report, groups, tuned


def check_reference(reference: str | None, runs: Sequence[RunRecord]) -> None:
    """``--reference`` names an optimizer with a run among those reported (else a ConfigError: exit 2)."""
    names = sorted({r.meta.get("optimizer") for r in runs if r.meta.get("optimizer")})
    if reference is not None and reference not in names:
        from wagma_bench.errors import ConfigError

        raise ConfigError(
            f"--reference={reference!r} is not allowed: no run of it here; the optimizers run: "
            f"{', '.join(names) or 'none'}"
        )


def _common_root(dirs: Sequence[Path]) -> Path | None:
    import os

    try:
        return (
            Path(os.path.commonpath([str(d) for d in dirs])).parent
            if len(dirs) == 1
            else Path(os.path.commonpath([str(d) for d in dirs]))
        )
    except ValueError:
        return None


# --- the tuned section (scoring.py ranks the combinations) ----------------------------------------

TUNED_COLUMNS = [
    ("workload", "workload", ""),
    ("data", "data", ""),
    ("optimizer", "optimizer", ""),
    ("world_size", "P", ""),
    ("imbalance", "imbalance", ""),
    ("score", "score", ""),
    ("study_bests", "per-study best", ""),
    ("reached", "trials reached", ""),
    ("vs_tuned_allreduce", "against tuned allreduce", "x"),
    ("settings", "winning settings", ""),
    ("compute_imbalance", "compute imbalance", ""),
    ("reference_s", "speed reference (s, median)", ""),
]

TUNED_HOW_TO_READ = (
    "Tuned by MLCommons AlgoPerf's external tuning ruleset (`wagma-bench tune`, docs/tuning.md): each "
    "optimizer's one search space (conf/search_space/), S studies of O quasirandom trials; per study the "
    "fastest trial to the target (training clock); the **score** is the median over studies of those bests, "
    "a study whose trials all missed counting as infinite (∞: half the studies or more missed). The winning "
    "settings are the fastest trial's. A tuning with no target (eval.target=null, a fixed budget) is scored "
    "the same way by each trial's best metric, higher being better (our reading; AlgoPerf scores time only). "
    "Against tuned allreduce: its score over the row's in seconds, the row's over its with a metric (above 1 "
    "favours the row), at the same workload, data, P and imbalance."
)


def _with_tuned(text: str, tuned: TunedSection, out: Path, untuned: bool, flags: Sequence[str] = ()) -> str:
    """The report with the tuned section after its header, the untuned tables (if any) labelled below it."""
    head, sep, rest = text.partition("\n## ")
    lines = [
        "## Tuned comparisons",
        "",
        TUNED_HOW_TO_READ,
        "",
        *(f"- {p}" for p in tuned.protocol),
        "",
        *(f"- {line}" for line in flags),
        *([""] if flags else []),
        markdown_table(tuned.rows, TUNED_COLUMNS),
        "",
    ]
    for name, path in tuned.figures.items():
        lines += [
            f"![{name}]({path.relative_to(out)})",
            "",
            (
                "*Performance profile across workloads: per optimizer, the fraction of workloads (workload, "
                "data, P, imbalance) on which its tuned score is within a factor τ of the best optimizer's.*"
            ),
            "",
        ]
    if untuned:
        lines += ["# Untuned comparisons (every optimizer at the configured defaults)", ""]
    return head + "\n" + "\n".join(lines) + (sep + rest if sep else "")
