"""A tuning directory read and scored by MLCommons AlgoPerf's external tuning rule: per study the fastest
trial to the target (training clock, as ``report``), the score the median over the studies of those bests, a
study whose trials all missed counting as infinite (so the score is infinite when half the studies or more
missed). Trials with no target (``eval.target=null``: a fixed budget, what a final-quality claim reads) are
scored the same way by their best metric, higher being better: per study the trial with the highest best
metric, the score the median of those (AlgoPerf scores only time to target; this reading is ours).
``wagma-bench tune`` (:mod:`wagma_bench.campaign.tune`) plans and runs the trials; ``report``, ``claims`` and
``simulate`` read them through this module."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wagma_bench.analysis import drift
from wagma_bench.config import readback
from wagma_bench.errors import ConfigError
from wagma_bench.metric import METRICS
from wagma_bench.record.events import RunEvents
from wagma_bench.record.files import write_json_atomic
from wagma_bench.record.rundir import TUNE_PLAN, TUNE_TRIALS
from wagma_bench.record.summary import RunSummary, run_summary

PLAN = TUNE_PLAN  # what is tuned: the trials and their settings (written before any trial runs)
TUNING = "tuning.json"  # the scores
TRIALS = TUNE_TRIALS
INF = math.inf
REFERENCE = "allreduce"  # the optimizer every other is compared against (speed-ups, tuned ratios)
BY_TIME, BY_METRIC = "time_to_target", "best_metric"  # what a combination's trials are scored by


@dataclass
class Trial:
    name: str
    combo: str
    study: int  # 1..S
    trial: int  # 1..O within its study
    seed: int
    params: dict[str, Any]  # the point: search-space key -> value
    overrides: list[str]  # the combination's axis values, then the trial's settings
    gpus: int = 0  # cluster mode: the world size


def yaml_value(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def describe(params: dict[str, Any]) -> str:
    return ", ".join(f"{k.removeprefix('optimizer.')}={yaml_value(v)}" for k, v in params.items())


def outcome(summary: RunSummary | dict | None, max_runtime_s: float | None) -> str:
    s = run_summary(summary)
    if s is None:
        return "not run"
    if scored_by([s]) == BY_METRIC:
        best = s.best_metric
        return (
            f"{s.status}, best {s.target_metric or 'metric'} "
            f"{'none' if best is None else f'{best:.4g}'} (no target: scored by the best metric)"
        )
    t = trial_time(s, max_runtime_s)
    if math.isfinite(t):
        return f"target reached in {t:.1f} s"
    late = s.reached and not math.isfinite(t)
    return f"{s.status}, target {'reached after tune.max_runtime_s' if late else 'missed'}"


def scored_by(summaries) -> str:
    """:data:`BY_METRIC` when the trials that started ran with no target (``eval.target=null``), else
    :data:`BY_TIME` (also when none has started)."""
    started = [run_summary(s) for s in summaries if s]
    return BY_METRIC if started and all(s.given("target") and s.target is None for s in started) else BY_TIME


def trial_time(summary: RunSummary | dict | None, max_runtime_s: float | None = None) -> float:
    """A trial's time to target (training clock); inf when it missed it, did not finish, or took longer
    than ``max_runtime_s``."""
    s = run_summary(summary or None)
    if s is None or not s.reached or s.time_to_target_s is None:
        return INF
    t = float(s.time_to_target_s)
    return INF if max_runtime_s is not None and t > max_runtime_s else t


def trial_cost(summary: RunSummary | dict | None, max_runtime_s: float | None, by: str) -> float:
    """What a study minimises: the time to target, or the negated best metric of a trial that ended by its own
    rules (inf for one that failed or has not ended)."""
    if by == BY_TIME:
        return trial_time(summary, max_runtime_s)
    s = run_summary(summary or None)
    best = s.best_metric if s is not None else None
    ended = s is not None and s.finished
    return (
        METRICS["final_metric"].key(float(best))
        if ended and best is not None and math.isfinite(best)
        else INF
    )


def median_score(bests: list[float]) -> float:
    """AlgoPerf's score of one workload: the median over studies of each study's best time; a study
    whose trials all missed is inf, so half the studies or more missing makes the score inf."""
    if not bests:
        return INF
    return float(statistics.median(bests))


def score_combo(
    trials: list[Trial], summaries: dict[str, RunSummary | None], max_runtime_s: float | None
) -> dict:
    """One combination's entry of ``tuning.json``: by time, ``score_s`` and each study's ``best_time_s``; with
    no target, ``score_metric`` and each study's ``best_metric`` (``reached`` is then None: there is nothing
    to reach)."""
    by = scored_by(summaries.get(t.name) for t in trials)
    counted = [t for t in trials if trial_finished(summaries.get(t.name))]  # the one rule (trial_finished)
    cost = {t.name: trial_cost(summaries.get(t.name), max_runtime_s, by) for t in counted}

    def value(c: float) -> float | None:  # a cost back as the figure it stands for
        return None if not math.isfinite(c) else c if by == BY_TIME else -c

    best_key = "best_time_s" if by == BY_TIME else "best_metric"
    studies, bests = [], []
    for s in sorted({t.study for t in trials}):
        mine = [t for t in counted if t.study == s]
        planned = sum(1 for t in trials if t.study == s)
        if not mine:  # none finished: the study is left out of the score, not counted as missed
            studies.append(
                {
                    "study": s,
                    best_key: None,
                    "trial": None,
                    "reached": 0 if by == BY_TIME else None,
                    "trials": planned,
                    "finished": 0,
                }
            )
            continue
        best = min(mine, key=lambda t: (cost[t.name], t.trial))
        bests.append(cost[best.name])
        studies.append(
            {
                "study": s,
                best_key: value(cost[best.name]),
                "trial": best.name if math.isfinite(cost[best.name]) else None,
                "reached": sum(math.isfinite(cost[t.name]) for t in mine) if by == BY_TIME else None,
                "trials": planned,
                "finished": len(mine),
            }
        )
    score = median_score(bests)
    winner = min(counted, key=lambda t: (cost[t.name], t.study, t.trial)) if counted else None
    won = winner is not None and math.isfinite(cost[winner.name])
    return {
        "scored_by": by,
        ("score_s" if by == BY_TIME else "score_metric"): value(score),
        "studies": studies,
        "reached": sum(math.isfinite(v) for v in cost.values()) if by == BY_TIME else None,
        "trials": len(trials),
        "unfinished": sum(1 for t in trials if not trial_finished(summaries.get(t.name))),
        "winner": {
            "trial": winner.name,
            ("time_s" if by == BY_TIME else "metric"): value(cost[winner.name]),
            "params": winner.params,
            "run_dir": f"{TRIALS}/{winner.name}",
        }
        if won
        else None,
    }


# The one scoring policy of tune, report, claims and reproduce/claims/paired.py: which way each figure is
# better is its Metric's (wagma_bench/metric.py: favours, figure_cost), and which trials count
# (trial_finished); a trial's cost is trial_cost, a combination's score median_score over its studies' bests.
SCORED = ("time_to_target", "throughput", "final_metric")
LOWER_IS_BETTER = {name: METRICS[name].lower_is_better for name in SCORED}  # read from the one registry


def figure_cost(value: float | None, metric: str) -> float:
    """A figure as a cost, lower being better (:meth:`wagma_bench.metric.Metric.cost`)."""
    return METRICS[metric].cost(value)


def favours(value: float | None, reference: float | None, metric: str) -> float | None:
    """``value`` against ``reference`` as a ratio above 1 when ``value`` is the better (the reference's time
    over the value's; the value's throughput or metric over the reference's); None where either has no finite
    cost (:meth:`wagma_bench.metric.Metric.factor`)."""
    return METRICS[metric].factor(value, reference)


def trial_finished(summary: RunSummary | dict | None) -> bool:
    """Whether a trial counts in a score: it has a final summary, ended by its own rules or failed (a failed
    one counts as a miss). A trial without one (not run yet, or killed) is left out, not counted as a miss,
    and a study none of whose trials finished is left out of its combination's score."""
    s = run_summary(summary or None)
    return s is not None and (s.finished or s.status == "failed")


def load_trials(tune_dir: Path) -> tuple[dict, dict[str, list[Trial]], dict[str, RunSummary | None]]:
    """A tuning directory's plan, its trials by combination (in plan order) and each trial's saved summary
    (None where the trial has not finished a summary)."""
    tune_dir = Path(tune_dir)
    path = tune_dir / PLAN
    if not path.exists():
        raise ConfigError(f"{tune_dir} is not a tuning directory (no {PLAN}); make one with wagma-bench tune")
    plan = readback.load(path, readback.TUNE_PLAN)  # cut short, emptied, or not what tune writes: refused
    trials = [Trial(**{k: t[k] for k in Trial.__dataclass_fields__ if k in t}) for t in plan["trials"]]
    combos = {c: [t for t in trials if t.combo == c] for c in dict.fromkeys(t.combo for t in trials)}
    summaries = {t.name: RunEvents.read(tune_dir / TRIALS / t.name).saved_summary for t in trials}
    return plan, combos, summaries


def score(tune_dir: Path) -> dict:
    """Score every combination of a tuning directory from its trials' run directories."""
    plan, combos, all_summaries = load_trials(tune_dir)
    cap = plan.get("max_runtime_s")
    median_ref = drift.tuning_median([s for s in all_summaries.values() if trial_finished(s)])
    fit = drift.fit_elasticity(
        [all_summaries[t.name] for t in mine if trial_finished(all_summaries[t.name])]
        for mine in combos.values()
    )
    entries = []
    for combo, mine in combos.items():
        summaries = {t.name: all_summaries[t.name] for t in mine}
        entry = {
            "combo": combo,
            **_key_of(summaries.values()),
            "optimizer_settings": _fixed_settings(Path(tune_dir), mine),
            **score_combo(mine, summaries, cap),
            "compute_imbalance": _median_of([s.compute_imbalance for s in summaries.values() if s]),
            "reference_s": _median_of([s.reference_s for s in summaries.values() if s]),
        }
        entries.append({**entry, "drift_adjusted": _drift_adjusted(mine, summaries, median_ref, fit, cap)})
    return {
        "version": 1,
        "protocol": "AlgoPerf external tuning",
        "studies": plan["studies"],
        "trials_per_study": plan["trials_per_study"],
        "seed": plan["seed"],
        "max_runtime_s": cap,
        "command": plan.get("command"),
        "median_reference_s": median_ref,
        "drift_elasticity": {"value": fit.value, "se": fit.se, "trials": fit.trials} if fit else None,
        "optimizer_changes": optimizer_changes(tune_dir, combos),
        "results": entries,
    }


def _drift_adjusted(
    trials: list[Trial],
    summaries: dict,
    median_ref: float | None,
    fit: drift.Elasticity | None,
    cap: float | None,
) -> dict | None:
    """The combination's score with every trial scaled to the tuning's median speed reference by the fitted
    elasticity (:mod:`wagma_bench.analysis.drift`); None unless every finished trial of the tuning has a
    reference and the elasticity can be fitted (a few trials, or references that do not vary, measure no
    effect)."""
    if median_ref is None or fit is None:
        return None
    scaled = {k: drift.adjusted(v, median_ref, cap, fit.value) if v else v for k, v in summaries.items()}
    e = score_combo(trials, scaled, None)
    return {k: e[k] for k in ("score_s", "score_metric") if k in e}


def optimizer_changes(tune_dir: Path, combos: dict[str, list[Trial]]) -> float | None:
    """Of the trials that started, ordered by their start, the fraction of consecutive pairs whose combination
    differs: about 0 when each combination ran as one block, near 1 when interleaved (``tune``'s order). None
    with fewer than two started trials or a single combination."""
    starts = []
    for combo, trials in combos.items():
        for t in trials:
            start = _start_ms(Path(tune_dir) / TRIALS / t.name)
            if start is not None:
                starts.append((start, combo))
    if len(starts) < 2 or len(combos) < 2:
        return None
    order = [c for _, c in sorted(starts)]
    return sum(a != b for a, b in itertools.pairwise(order)) / (len(order) - 1)


def _start_ms(run_dir: Path) -> float | None:
    record = RunEvents.read(run_dir)
    event = next((e for e in record.events if e["key"] == "run_start"), None)
    return event.get("time_ms") if event else None


def _key_of(summaries: Iterable[RunSummary | None]) -> dict:
    """workload, data, optimizer, world size, imbalance, metric and target: from any trial that started."""
    s = next((s for s in summaries if s), RunSummary())
    return {
        "workload": s.workload,
        "data": s.data,
        "optimizer": s.optimizer,
        "world_size": s.world_size,
        "imbalance": s.imbalance,
        "target_metric": s.target_metric,
        "target": s.target,
    }


def _fixed_settings(tune_dir: Path, trials: list[Trial]) -> dict:
    """The optimizer settings every started trial of a combination shares (the tuned ones differ between
    trials): what sets this tuning apart from another of the same optimizer."""
    sections = []
    for t in trials:
        start = RunEvents.read(tune_dir / TRIALS / t.name).start
        if start is not None:
            sections.append(start.config.get("optimizer") or {})
    if not sections:
        return {}
    return {k: v for k, v in sections[0].items() if k != "name" and all(s.get(k) == v for s in sections[1:])}


def _median_of(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


def write_scores(tune_dir: Path) -> dict:
    result = score(tune_dir)
    write_json_atomic(Path(tune_dir) / TUNING, result)
    return result


def winning_runs(tune_dir: Path) -> list[Path]:
    """The run directory of each combination's winning trial (none for a combination that never reached
    the target, or that had none): what ``simulate --convergence`` reads from a tuning directory."""
    result = score(tune_dir)
    return [
        Path(tune_dir) / e["winner"]["run_dir"]
        for e in result["results"]
        if e["winner"] and e["scored_by"] == BY_TIME
    ]


def format_score(entry: dict) -> tuple[str, str]:
    """An entry's score and its per-study bests as text: seconds to the target (∞: missed), or the best metric
    by name (none: no trial ended with one)."""
    if entry.get("scored_by") == BY_METRIC:
        metric = entry.get("target_metric") or "metric"
        bests = ", ".join(
            "none" if s["best_metric"] is None else f"{s['best_metric']:.4g}" for s in entry["studies"]
        )
        score = entry["score_metric"]
        return ("none" if score is None else f"{score:.4g} {metric}"), bests
    bests = ", ".join(
        "∞" if s["best_time_s"] is None else f"{s['best_time_s']:.1f}" for s in entry["studies"]
    )
    text = "∞ (missed)" if entry["score_s"] is None else f"{entry['score_s']:.1f} s"
    adjusted = entry.get("drift_adjusted")
    if adjusted:  # the score with each trial scaled to the tuning's median speed reference
        text += (
            " (drift-adj. " + ("∞" if adjusted["score_s"] is None else f"{adjusted['score_s']:.1f} s") + ")"
        )
    return text, bests


def format_scores(result: dict) -> str:
    lines = [f"{'combination':32} {'score':>16}  per-study best                reached  winner"]
    for e in result["results"]:
        score_text, bests = format_score(e)
        reached = "-" if e["reached"] is None else e["reached"]
        win = describe(e["winner"]["params"]) if e["winner"] else "-"
        lines.append(f"{e['combo']:32} {score_text:>16}  {bests:29} {reached:>3}/{e['trials']:<3}  {win}")
    return "\n".join(lines)


def fairness_line(tune_dir: Path) -> str:
    """The tuning's fairness line (:mod:`~wagma_bench.analysis.fairness`): its combinations whose finished
    trials waited for a core (wall over CPU compute), and those whose speed references differ from the
    reference optimizer's combination beyond their noise; the ratios against it that they touch."""
    from wagma_bench.analysis import fairness
    from wagma_bench.analysis.run_records import reference_readings

    _, combos, summaries = load_trials(tune_dir)
    done = {
        c: [summaries[t.name] for t in ts if trial_finished(summaries[t.name])] for c, ts in combos.items()
    }
    done = {c: ss for c, ss in done.items() if ss}
    readings = {c: [v for s in ss for v in reference_readings(s)] for c, ss in done.items()}
    ref = next((c for c, ss in done.items() if ss[0].optimizer == REFERENCE), None)
    flagged: dict[str, list[str]] = {}
    for combo, ss in done.items():
        flags = [fairness.contended((s.compute_contention, s.ranks_per_cpu) for s in ss)]
        if ref is not None and combo != ref:
            flags.append(fairness.different_conditions(readings[combo], readings[ref], ref))
        if any(flags):
            flagged[combo] = [f for f in flags if f]
    touched = [f"{c} vs {ref}" for c in done if ref and c != ref and (c in flagged or ref in flagged)]
    unmeasured = sum(all(s.compute_contention is None for s in ss) for ss in done.values())
    return fairness.summary_line(flagged, len(done), touched, "combinations", unmeasured)
