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

from wagma_bench.analysis import plots
from wagma_bench.analysis.run_records import RunRecord, find_runs, group_runs, load_run, name_variants
from wagma_bench.analysis.scoring import REFERENCE, TunedSection, tuned_section
from wagma_bench.analysis.step_times import step_time_rows, step_time_summary
from wagma_bench.analysis.tables import fmt, markdown_table, write_csv
from wagma_bench.analysis.tuning import PLAN as TUNE_PLAN
from wagma_bench.metric import METRICS
from wagma_bench.record.events import EVENTS
from wagma_bench.record.files import staged_outputs, write_text_atomic

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
    t = run.summary.get("time_to_target_s")
    return INF if t is None else float(t)


def series_rows(runs: Sequence[RunRecord]) -> list[dict]:
    """The comparison table of one group: one row per (optimizer, world size, imbalance), seeds folded."""
    by_series: dict[tuple, list[RunRecord]] = {}
    for run in runs:
        by_series.setdefault(run.series_key, []).append(run)
    has_target = any(r.meta.get("target") is not None for r in runs)
    rows = []
    for (opt, world, imb), rs in sorted(by_series.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        times = [time_to_target(r) for r in rs]
        reached = [t for t in times if not math.isinf(t)]
        finals = [r.summary["final_metric"] for r in rs if r.summary.get("final_metric") is not None]
        bests = [r.summary["best_metric"] for r in rs if r.summary.get("best_metric") is not None]
        # a diverged run trained on non-finite numbers: its throughput is no measure of the optimizer's
        tputs = [
            r.summary["throughput_samples_per_s"]
            for r in rs
            if r.summary.get("throughput_samples_per_s") and r.summary.get("status") != "diverged"
        ]
        spreads = [
            r.summary["compute_imbalance"] for r in rs if r.summary.get("compute_imbalance") is not None
        ]
        rows.append(
            {
                "optimizer": opt,
                "world_size": world,
                "imbalance": imb,
                "seeds": len(rs),
                "reached": len(reached) if has_target else None,
                "ttt_median_s": median(times) if has_target else None,
                "ttt_olympic_s": olympic_mean(times) if has_target else None,
                "ttt_min_s": min(reached) if reached else None,
                "ttt_max_s": max(reached) if reached else None,
                "olympic_rule": ("drop fastest+slowest" if len(rs) >= 3 else "plain mean (< 3 seeds)"),
                "final_metric": median(finals),
                "best_metric": median(bests),
                "throughput": median(tputs),
                "throughput_min": min(tputs) if tputs else None,
                "throughput_max": max(tputs) if tputs else None,
                "compute_imbalance": median(spreads),
                "partial_runs": sum(r.partial for r in rs),
                "diverged_runs": sum(r.summary.get("status") == "diverged" for r in rs),
            }
        )
    return add_speedups(rows)


def add_speedups(rows: list[dict], reference: str = REFERENCE) -> list[dict]:
    """Speed-up of each row against the reference optimizer at the same world size and imbalance:
    time-to-target (olympic means) and throughput (medians). None when either side is missing."""
    refs = {(r["world_size"], r["imbalance"]): r for r in rows if r["optimizer"] == reference}
    for row in rows:
        ref = refs.get((row["world_size"], row["imbalance"]))
        row["speedup_ttt"] = _speedup("time_to_target", row["ttt_olympic_s"], ref and ref["ttt_olympic_s"])
        row["speedup_throughput"] = _speedup("throughput", row["throughput"], ref and ref["throughput"])
    return rows


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
                "status": s.get("status"),
                "reached": s.get("reached"),
                "time_to_target_s": s.get("time_to_target_s"),
                "rounds": s.get("rounds"),
                "final_metric": s.get("final_metric"),
                "best_metric": s.get("best_metric"),
                "throughput": s.get("throughput_samples_per_s"),
                "train_s": s.get("train_s"),
                "restarts": s.get("restarts"),
                "compute_imbalance": s.get("compute_imbalance"),
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


COMPARISON_COLUMNS = [
    ("optimizer", "optimizer", ""),
    ("world_size", "P", ""),
    ("imbalance", "imbalance", ""),
    ("seeds", "seeds", ""),
    ("reached", "reached", ""),
    ("ttt_median", "TTT median (s)", ""),
    ("ttt_olympic", "TTT olympic mean (s)", ""),
    ("speedup_ttt", "speed-up vs allreduce", "x"),
    ("final_metric", "final metric", "metric"),
    ("best_metric", "best metric", "metric"),
    ("throughput", "throughput (samples/s)", ""),
    ("speedup_throughput", "throughput vs allreduce", "x"),
    ("compute_imbalance", "compute imbalance", ""),
    ("partial_runs", "half-written", ""),
    ("diverged_runs", "diverged", ""),
]

RUN_COLUMNS = [
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
    ("throughput", "samples/s", ""),
    ("restarts", "restarts", ""),
    ("compute_imbalance", "compute imbalance", ""),
    ("problems", "marked", ""),
]


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


def build_group(key: tuple, runs: list[RunRecord], out: Path, root: Path | None) -> GroupReport:
    """One group's tables and figures; a run in progress is listed in the run table only."""
    listed, runs = runs, [r for r in runs if not r.running]
    rows = series_rows(runs)
    for r in rows:
        r["ttt_median"], r["ttt_olympic"] = _ttt_cell(r, "ttt_median_s"), _ttt_cell(r, "ttt_olympic_s")
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
    if steps:
        figures["step_times"] = plots.plot_step_times(steps, out / f"{slug}_step_times.png", title)
    return GroupReport(
        key,
        listed,
        rows,
        run_rows(listed, root),
        {k: step_time_summary(v) for k, v in steps.items()},
        figures,
    )


HOW_TO_READ = (
    "How to read it: runs are grouped by workload, data, metric and target; a table never mixes two "
    "groups. A *series* is one optimizer at one world size P and imbalance; its runs are the seeds. "
    "Time-to-target (TTT) is the training clock (evaluation and checkpoints excluded) at the first "
    "evaluation at or above the target. A seed that did not reach the target counts as infinitely "
    "slow: the median says *not reached* when half the seeds or more missed. The olympic mean is "
    "MLPerf's score: with ≥ 3 seeds the fastest and slowest are dropped and the rest averaged; with "
    "1–2 seeds it is the plain mean. Speed-ups compare olympic means (throughput: medians) with "
    "`allreduce` at the same P and imbalance. Runs marked *half-written* crashed or were cut off; "
    "they are read up to their last complete event. *Compute imbalance* is how uneven the ranks' compute "
    "was: the mean over steps of the slowest rank's compute time (injected delay included) over the ranks' "
    "mean (1.00: even; median over seeds; — for runs recorded before it was measured)."
)


def render_markdown(
    groups: Sequence[GroupReport], unreadable: Sequence[RunRecord], sources: Sequence[str], out: Path
) -> str:
    n = sum(len(g.runs) for g in groups) + len(unreadable)
    header = (
        f"{n} run(s) from {', '.join(f'`{s}`' for s in sources)}; generated "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}."
    )
    lines = ["# wagma-bench report", "", header, "", HOW_TO_READ, ""]
    for g in groups:
        lines += [
            f"## {group_title(g.key)}",
            "",
            "### Comparison",
            "",
            markdown_table(g.comparison, COMPARISON_COLUMNS),
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
            "step_times": "Per-rank step-time components: compute, injected delay and communication "
            "(which includes waiting for slower ranks). A straggler shows as a high "
            "delay or compute box; its peers show it as communication time.",
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
        lines += ["### Runs", "", markdown_table(g.run_table, RUN_COLUMNS), ""]
    if unreadable:
        lines += [
            "## Runs that could not be grouped",
            "",
            "These directories hold an `events.jsonl` without a readable `run_start` event.",
            "",
        ]
        lines += [f"- `{r.path}`: {'; '.join(r.problems)}" for r in unreadable] + [""]
    return "\n".join(lines)


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


def make_report(paths: Sequence[Path], out: Path) -> tuple[Path, list[GroupReport], TunedSection | None]:
    """Read every run under ``paths``; write ``out/report.md``, the figures and CSV tables. A tuning
    directory (``wagma-bench tune``) gives the tuned section; its trials stay out of the untuned tables.
    Everything is built beside ``out`` and moved in at the end (:func:`staged_outputs`): a full disk partway
    leaves ``out`` with the previous report, not the new figures beside the old report.md."""
    out = Path(out)
    with staged_outputs(out) as stage:
        report, groups, tuned = _write_report(paths, stage)
    for figures in [g.figures for g in groups] + ([tuned.figures] if tuned else []):  # where they are now
        figures.update({k: out / p.relative_to(stage) for k, p in figures.items() if p is not None})
    return out / report.relative_to(stage), groups, tuned


def _write_report(paths: Sequence[Path], out: Path) -> tuple[Path, list[GroupReport], TunedSection | None]:
    tune_dirs = [Path(p) for p in paths if (Path(p) / TUNE_PLAN).exists()]
    tuned = tuned_section(tune_dirs, out) if tune_dirs else None
    run_dirs = [d for d in find_runs(paths) if not any(d.is_relative_to(t.resolve()) for t in tune_dirs)]
    if not run_dirs and tuned is None:
        raise FileNotFoundError(
            f"no run found under {', '.join(map(str, paths))} (a run directory holds {EVENTS})"
        )
    runs = [load_run(d) for d in run_dirs]
    name_variants(runs)
    for warning in (w for r in runs for w in r.warnings):
        print(f"wagma-bench report: warning: {warning}", file=sys.stderr, flush=True)
    root = _common_root(run_dirs)
    groups = [build_group(k, rs, out, root) for k, rs in group_runs(runs).items()]
    unreadable = [r for r in runs if not r.meta]
    comparison = [{"group": group_title(g.key), **r} for g in groups for r in g.comparison]
    write_csv(comparison, out / "comparison.csv")
    write_csv([{"group": group_title(g.key), **r} for g in groups for r in g.run_table], out / "runs.csv")
    report = out / "report.md"
    text = render_markdown(groups, unreadable, [str(p) for p in paths], out)
    if tuned is not None:
        write_csv(tuned.rows, out / "tuned.csv")
        text = _with_tuned(text, tuned, out, untuned=bool(groups))
    write_text_atomic(report, text)
    return report, groups, tuned


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


def _with_tuned(text: str, tuned: TunedSection, out: Path, untuned: bool) -> str:
    """The report with the tuned section after its header, the untuned tables (if any) labelled below it."""
    head, sep, rest = text.partition("\n## ")
    lines = [
        "## Tuned comparisons",
        "",
        TUNED_HOW_TO_READ,
        "",
        *(f"- {p}" for p in tuned.protocol),
        "",
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
