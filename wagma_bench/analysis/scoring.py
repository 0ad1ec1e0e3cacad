"""Tuned combinations (``wagma-bench tune``) ranked against each other: each combination's score as a table
row with its ratio to tuned allreduce on the same problem (workload, data, world size, imbalance), and
AlgoPerf's performance profile across problems. The score of one combination is
:mod:`wagma_bench.analysis.tuning`'s (the median over studies of each study's best); this module compares
those scores across optimizers, by one rule for the report's tuned section and its tests."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from wagma_bench.analysis import plots
from wagma_bench.analysis.run_records import variant_labels
from wagma_bench.analysis.tuning import BY_METRIC, REFERENCE, favours, figure_cost, format_score, score

INF = math.inf


@dataclass
class TunedSection:
    """What the report shows of one or more tuning directories: the ranked rows and the profile figure."""

    rows: list[dict]  # one per tuned combination
    figures: dict[str, Path]
    sources: list[str]
    protocol: str  # "S studies x O trials ..." per tuning directory


def tuned_rows(results: Sequence[dict]) -> list[dict]:
    """The tuned table: per combination its score, per-study bests, winner and its ratio to tuned allreduce at
    the same workload, data, world size and imbalance (time: allreduce's score over the row's; with no target,
    the row's best metric over allreduce's: above 1 favours the row either way)."""
    rows = []
    # two tunings of one optimizer under other fixed settings (plain local SGD, streaming DiLoCo) are two rows
    variants = variant_labels([(e.get("optimizer"), e.get("optimizer_settings") or {}) for e in results])
    for e, variant in zip(results, variants, strict=True):
        score_text, bests = format_score(e)
        win = e.get("winner") or {}
        name = f"{e.get('optimizer')} ({variant})" if variant else e.get("optimizer")
        by_metric = e.get("scored_by") == BY_METRIC
        rows.append(
            {
                "workload": e.get("workload"),
                "data": e.get("data"),
                "optimizer": name,
                "world_size": e.get("world_size"),
                "imbalance": e.get("imbalance"),
                "combo": e["combo"],
                "target": e.get("target"),
                "scored_by": e.get("scored_by"),
                "score": score_text,
                "score_s": e.get("score_s"),
                "score_metric": e.get("score_metric"),
                "study_bests": bests,
                "reached": "no target" if by_metric else f"{e['reached']}/{e['trials']}",
                "unfinished": e.get("unfinished"),
                "winner": win.get("trial"),
                "settings": ", ".join(f"{k}={v}" for k, v in (win.get("params") or {}).items()) or None,
                "compute_imbalance": e.get("compute_imbalance"),
                "reference_s": e.get("reference_s"),
            }
        )
    refs = {_problem(r): _figure(r) for r in rows if r["optimizer"] == REFERENCE}
    for r in rows:
        ref, (value, metric) = refs.get(_problem(r), (None, None)), _figure(r)
        r["vs_tuned_allreduce"] = favours(value, ref[0], metric) if ref and ref[1] == metric else None
    return rows


def _figure(row: dict) -> tuple[float | None, str]:
    """A tuned row's score and its metric: its seconds to the target, or with no target its best metric."""
    if row.get("scored_by") == BY_METRIC:
        return row.get("score_metric"), "final_metric"
    return row.get("score_s"), "time_to_target"


def _problem(row: dict) -> tuple:
    """What a tuned score is compared within: a workload on its data, at one world size and imbalance."""
    return (row["workload"], row["data"], row["world_size"], row["imbalance"])


def performance_profile(rows: Sequence[dict], taus: Sequence[float] | None = None) -> dict:
    """AlgoPerf's performance profile: per optimizer, at each tau the fraction of problems (workload, data,
    P, imbalance) where its score is at most tau x the best score of any optimizer there (a best metric: at
    least 1/tau of the best); a missed (infinite) score never counts. Returns {optimizer: (taus, fractions)}
    and the number of problems."""
    scores: dict[tuple, dict[str, float]] = {}
    for r in rows:
        scores.setdefault(_problem(r), {})[r["optimizer"]] = figure_cost(*_figure(r))
    ratios: dict[str, list[float]] = {}
    for per_opt in scores.values():
        best = min(per_opt.values())
        for opt, s in per_opt.items():
            ratios.setdefault(opt, []).append(s / best if math.isfinite(best) else INF)
    finite = [x for rs in ratios.values() for x in rs if math.isfinite(x)]
    if taus is None:
        top = max(finite + [1.0]) * 1.25
        taus = [1.0 + (top - 1.0) * i / 200 for i in range(201)]
    n = len(scores)
    return {
        opt: (list(taus), [sum(x <= t for x in rs) / n for t in taus]) for opt, rs in sorted(ratios.items())
    }, n


def tuned_section(tune_dirs: Sequence[Path], out: Path) -> TunedSection:
    """Score every tuning directory, rank its combinations (:func:`tuned_rows`) and draw their performance
    profile into ``out``: the report's tuned section, apart from its untuned tables."""
    results, protocol = [], []
    for d in tune_dirs:
        scored = score(d)
        results += scored["results"]
        budget = f", tune.max_runtime_s={scored['max_runtime_s']:g}" if scored.get("max_runtime_s") else ""
        protocol.append(
            f"`{d}`: {scored['studies']} studies × {scored['trials_per_study']} trials, "
            f"tune.seed={scored['seed']}{budget}"
        )
    rows = tuned_rows(results)
    profiles, n = performance_profile(rows)
    figures = {
        "performance_profile": plots.plot_performance_profile(
            profiles, out / "tuned_performance_profile.png", n
        )
    }
    return TunedSection(rows, figures, [str(d) for d in tune_dirs], protocol)
