"""``wagma-bench claims``: the papers' claims as data, measured here with an interval, predicted at the
paper's scale, and a verdict by a written rule.

    wagma-bench claims DIR... [--claims reproduce/claims.yaml] --out DIR [--allow-missing]
    wagma-bench claims @reproduce/claims/sources --out reproduce/claims \\
                       --readme README.md --readme docs/claims.md
                       (the directories listed in a file; the README's verdicts and the docs' table rewritten
                       in place: :mod:`wagma_bench.analysis.claims_pages`)

The claims are records in ``reproduce/claims.yaml`` (:class:`Claim`). The directories given are searched for
tuning directories (``tune.json``, from ``wagma-bench tune``) and simulator outputs (``predictions.json``,
from ``wagma-bench simulate --out``); a claim names the ones it reads by their folder name.

Measured (:func:`measure`): per optimizer, its tuned score (``time_to_target``: the median over studies of
each study's fastest time to the target; ``final_metric``: the same with the best metric, higher is better) or
its median throughput over the trials, each with the exact two-stage bootstrap distribution of
:mod:`wagma_bench.analysis.intervals`. The claim's **speed-up** is the subject's value against the best
comparator's, oriented so that > 1 favours the subject; its interval comes from the law of the subject against
the best of independent draws of every comparator (the best is chosen inside the bootstrap, not fixed
beforehand).

Verdict (:func:`decide`), with the claim's threshold t (1.0 unless the claim says otherwise):

- **does not hold** when the whole interval is below t. Comparators without data do not matter here: one
  more comparator can only lower the speed-up against the best of them.
- **holds** when the whole interval is above t and every comparator was measured.
- **inconclusive** otherwise: the interval contains t, a comparator has no data, or the subject has none.

A claim on a final metric may compare by difference instead (``compare: difference``: subject minus best, for
metrics near 0 where a ratio means little). Beside the raw speed-up: the same with each trial scaled by its
speed reference to the power of the tuning's fitted elasticity (``drift_adjusted``,
:mod:`wagma_bench.analysis.drift`; its interval carries the elasticity's sampling error), and how often the
trials' order changed optimizer; neither decides. A prediction is shown beside the measurement and never
enters the verdict.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wagma_bench.analysis import drift, fairness, intervals, robustness
from wagma_bench.analysis.claims_pages import SUMMARY, TABLE, check_page, fill_page, verdict_summary
from wagma_bench.analysis.predictions import (
    INTERVAL_FILE,
    barrier_sentence,
    flip_points,
    flip_sentence,
    nearest_flip,
    speedup_interval,
    structural_range,
    undetermined,
)
from wagma_bench.analysis.ruler import hosts_text, source_record
from wagma_bench.analysis.run_records import reference_readings
from wagma_bench.analysis.tables import markdown_table
from wagma_bench.analysis.tuning import (
    LOWER_IS_BETTER,
    TRIALS,
    Trial,
    load_trials,
    optimizer_changes,
    trial_finished,
    trial_time,
)
from wagma_bench.analysis.tuning import PLAN as TUNE_PLAN
from wagma_bench.config import readback
from wagma_bench.config.paths import CHECKOUT
from wagma_bench.config.renamed import RENAMED_CLAIM_FIELDS, renamed_fields
from wagma_bench.errors import ConfigError
from wagma_bench.metric import Metric
from wagma_bench.record.events import RunEvents
from wagma_bench.record.files import atomic_write, staged_outputs, write_json_atomic
from wagma_bench.record.summary import RunSummary

CLAIMS_FILE = CHECKOUT / "reproduce" / "claims.yaml"
PREDICTIONS = "predictions.json"
METRICS = LOWER_IS_BETTER  # metric -> lower is better (the one registry, wagma_bench/metric.py)
VERDICTS = ("holds", "does not hold", "inconclusive")
# how the subject is set against the best comparator: a ratio (> 1 favours the subject), or for a final metric
# whose values may lie near 0 (a success rate after a short budget) the difference subject - best
COMPARES = ("ratio", "difference")
MIN_BUDGET = (3, 3)  # S studies x O trials: below it the budget is named in the table


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str
    says: str
    condition: str
    metric: str
    subject: str
    comparators: tuple[str, ...]
    measured: dict[str, str]  # tuning (folder name), here (what runs in its place)
    figure: str | None = None
    threshold: float = 1.0
    predicted: dict[str, Any] | None = None  # simulate (folder name), world_size, assumptions
    compare: str = "ratio"  # ratio (subject over best, > 1 favours the subject) | difference

    @property
    def lower_is_better(self) -> bool:
        return METRICS[self.metric]


REQUIRED = ("id", "paper", "says", "condition", "metric", "subject", "comparators", "measured")


def load_claims(path: Path = CLAIMS_FILE) -> list[Claim]:
    """Read and check the claims file; a bad record is refused naming the claim,
    the key and what is allowed."""
    from wagma_bench.optim.specs import OPTIMIZER_SPECS  # the registry's names, without importing torch

    data = readback.load(path, readback.CLAIMS)
    claims, seen = [], set()
    for i, raw in enumerate(data["claims"]):
        where = f"{path}: claim {raw.get('id', i + 1)}"
        unknown = set(raw) - {f.name for f in Claim.__dataclass_fields__.values()}
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                f"allowed: {', '.join(Claim.__dataclass_fields__)}"
            )
        missing = [k for k in REQUIRED if raw.get(k) in (None, "", [])]
        if missing:
            raise ConfigError(f"{where}: {', '.join(missing)} missing")
        if raw["metric"] not in METRICS:
            raise ConfigError(
                f"{where}: metric={raw['metric']!r} is not allowed; one of {', '.join(METRICS)}"
            )
        for opt in [raw["subject"], *raw["comparators"]]:
            if opt not in OPTIMIZER_SPECS:
                raise ConfigError(
                    f"{where}: optimizer {opt!r} is not registered; one of {', '.join(OPTIMIZER_SPECS)}"
                )
        compare = raw.get("compare", "ratio")
        if compare not in COMPARES:
            raise ConfigError(f"{where}: compare={compare!r} is not allowed; one of {', '.join(COMPARES)}")
        if compare == "difference" and raw["metric"] != "final_metric":
            raise ConfigError(
                f"{where}: compare=difference is for metric=final_metric (a time or a throughput is "
                "compared as a ratio)"
            )
        if "tuning" not in raw["measured"]:
            raise ConfigError(f"{where}: measured.tuning missing (the tuning directory's folder name)")
        pred = raw.get("predicted")
        if pred is not None and not {"simulate", "world_size", "assumptions"} <= set(pred):
            raise ConfigError(f"{where}: predicted needs simulate, world_size and assumptions")
        if raw["id"] in seen:
            raise ConfigError(f"{where}: the id {raw['id']!r} is used twice")
        seen.add(raw["id"])
        claims.append(
            Claim(
                **{
                    **raw,
                    "comparators": tuple(raw["comparators"]),
                    "threshold": float(raw.get("threshold", 1.0)),
                }
            )
        )
    return claims


# --- sources ------------------------------------------------------------------------------------------


@dataclass
class Sources:
    tunings: dict[str, Path] = field(default_factory=dict)  # folder name -> tuning directory
    simulations: dict[str, Path] = field(default_factory=dict)  # folder name -> simulate --out directory


def find_sources(dirs: list[Path]) -> Sources:
    """Tuning directories and simulator outputs under ``dirs``, by folder name; a name found twice is refused
    (which one a claim reads must not depend on the order of the arguments)."""
    found = Sources()
    for d in dirs:
        if not d.is_dir():
            raise FileNotFoundError(f"{d}: no such directory")
        for kind, marker, table in (
            ("tuning", TUNE_PLAN, found.tunings),
            ("simulation", PREDICTIONS, found.simulations),
        ):
            for f in sorted([d / marker] if (d / marker).is_file() else d.rglob(marker)):
                name = f.parent.name
                if name in table and table[name] != f.parent:
                    raise ConfigError(
                        f"two {kind} directories named {name!r}: {table[name]} and {f.parent}; "
                        "give only one of them"
                    )
                table[name] = f.parent
    return found


# --- measurements -------------------------------------------------------------------------------------


@dataclass
class Measurement:
    optimizer: str
    value: float  # the point estimate (score or median)
    dist: intervals.Dist  # its bootstrap distribution
    budget: tuple[int, int]  # studies with a finished trial x trials per study (planned)
    finished: int  # trials with a final summary
    planned: int
    reached: int | None  # trials that reached the target (time_to_target)
    compute_imbalance: float | None
    rounds: float | None = (
        None  # the median of the trials' rounds trained (a budget rounded to a sync period)
    )
    # each finished trial's wall over CPU compute, and the ranks per CPU it was given (None: not recorded)
    contention: tuple[tuple[float | None, float | None], ...] = ()
    references: tuple[float, ...] = ()  # every speed-reference reading of its finished trials

    @property
    def interval(self) -> tuple[float, float]:
        return intervals.interval(self.dist)


def measure(
    tune_dir: Path,
    metric: str,
    drift_median: float | None = None,
    elasticity: float = 1.0,
    loaded: tuple | None = None,
) -> dict[str, Measurement]:
    """Every optimizer of a tuning directory, measured by ``metric``. Trials without a final summary (not run
    yet, or killed) are left out, not counted as misses; a study none of whose trials finished is left out.
    With ``drift_median`` (every finished trial has a speed reference), each trial's figures are first scaled
    to that median reference by (reference / median)^elasticity (:func:`wagma_bench.analysis.drift.adjusted`).
    ``loaded``: what :func:`load_trials` read of ``tune_dir`` (read once for several measurements)."""
    plan, combos, summaries = loaded or load_trials(tune_dir)
    cap = plan.get("max_runtime_s")
    out: dict[str, Measurement] = {}
    for trials in combos.values():
        done = [t for t in trials if trial_finished(summaries[t.name])]
        if not done:
            continue
        optimizer = summaries[done[0].name].optimizer
        if optimizer in out:
            raise ConfigError(
                f"{tune_dir}: optimizer {optimizer} is tuned in two combinations; a claim reads one "
                "per optimizer (tune each condition into its own directory)"
            )
        ran = [summaries[t.name] for t in done]
        scored = [drift.adjusted(s, drift_median, cap, elasticity) for s in ran] if drift_median else ran
        by_study: dict[int, list[RunSummary]] = {}
        for t, s in zip(done, scored, strict=True):
            by_study.setdefault(t.study, []).append(s)
        value, dist = _score(list(by_study.values()), metric, None if drift_median else cap)
        imb = [s.compute_imbalance for s in ran if s.compute_imbalance is not None]
        out[optimizer] = Measurement(
            optimizer,
            value,
            dist,
            (len(by_study), plan["trials_per_study"]),
            len(done),
            len(trials),
            sum(math.isfinite(trial_time(s, cap)) for s in ran) if metric == "time_to_target" else None,
            float(statistics.median(imb)) if imb else None,
            float(statistics.median(s.rounds for s in ran)) if all(s.rounds for s in ran) else None,
            tuple((s.compute_contention, s.ranks_per_cpu) for s in ran),
            tuple(v for s in ran for v in reference_readings(s)),
        )
    return out


def drift_reference(tune_dir: Path, loaded: tuple | None = None) -> tuple[float | None, int, int]:
    """(the median speed reference, trials with one, finished trials) of a tuning directory; the median is
    None unless every finished trial has a reference (:func:`wagma_bench.analysis.drift.tuning_median`)."""
    _, _, summaries = loaded or load_trials(tune_dir)
    finished = [s for s in summaries.values() if trial_finished(s)]
    return drift.tuning_median(finished), sum(map(drift.has_reference, finished)), len(finished)


def drift_elasticity(tune_dir: Path, loaded: tuple | None = None) -> drift.Elasticity | None:
    """The elasticity of seconds per round to the speed reference, fitted over a tuning directory's finished
    trials with one intercept per combination (:func:`wagma_bench.analysis.drift.fit_elasticity`)."""
    _, combos, summaries = loaded or load_trials(tune_dir)
    return drift.fit_elasticity(
        [summaries[t.name] for t in trials if trial_finished(summaries[t.name])] for trials in combos.values()
    )


def _score(
    studies: list[list[RunSummary]], metric: str, max_runtime_s: float | None
) -> tuple[float, intervals.Dist]:
    """The value and law of one optimizer (:func:`wagma_bench.analysis.robustness.score_law`, which also
    scores the alternatives): a throughput's median over every trial, or AlgoPerf's tuned score over studies
    of each trial's cost by tune's own rule (:func:`wagma_bench.analysis.tuning.trial_cost`)."""
    return robustness.score_law(studies, metric, max_runtime_s)


# --- the speed-up and the verdict ----------------------------------------------------------------------


@dataclass
class Speedup:
    value: float  # subject against the best comparator (> 1: the subject is better)
    interval: tuple[float, float]
    best: str  # the comparator with the best point value
    missing: list[str]  # comparators without data


def speedup(
    subject: Measurement,
    comparators: dict[str, Measurement | None],
    lower_is_better: bool,
    compare: str = "ratio",
) -> Speedup | None:
    law = speedup_law(subject, comparators, lower_is_better, compare)
    if law is None:
        return None
    sp, dist = law
    sp.interval = intervals.interval(dist)
    return sp


def speedup_law(
    subject: Measurement,
    comparators: dict[str, Measurement | None],
    lower_is_better: bool,
    compare: str = "ratio",
) -> tuple[Speedup, intervals.Dist] | None:
    """The speed-up (its interval not yet set) and its bootstrap law; None without a subject or comparator."""
    have = {k: m for k, m in comparators.items() if m is not None and m.dist}
    if not have or not subject.dist:
        return None
    key = Metric("compared", lower_is_better).key  # the better value first
    best = min(have.values(), key=lambda m: key(m.value))
    best_dist = intervals.best_of([m.dist for m in have.values()], lower_is_better)
    if compare == "difference":  # subject against best in the better direction: > 0 favours the subject
        dist, value = (
            intervals.combine(subject.dist, best_dist, lambda x, y: key(y) - key(x)),
            key(best.value) - key(subject.value),
        )
    elif lower_is_better:
        dist, value = intervals.ratio(best_dist, subject.dist), intervals.divide(best.value, subject.value)
    else:
        dist, value = intervals.ratio(subject.dist, best_dist), intervals.divide(subject.value, best.value)
    missing = [k for k, m in comparators.items() if m is None or not m.dist]
    return Speedup(value, (math.nan, math.nan), best.optimizer, missing), dist


def decide(interval: tuple[float, float] | None, threshold: float, missing: list[str]) -> tuple[str, str]:
    """The verdict and its reason (the rule in this module's docstring and docs/claims.md)."""
    if interval is None:
        return "inconclusive", "no measurement" + (f" of {', '.join(missing)}" if missing else "")
    lo, hi = interval
    if hi < threshold:
        return "does not hold", f"the whole interval is below {threshold:g}"
    if lo > threshold:
        if missing:
            return "inconclusive", (
                f"above {threshold:g} against the comparators measured, but {', '.join(missing)} not measured"
            )
        return "holds", f"the whole interval is above {threshold:g}"
    return "inconclusive", f"the interval contains {threshold:g}"


# --- predictions ----------------------------------------------------------------------------------------


def predict(claim: Claim, sim_dir: Path | None) -> dict | None:
    """The subject against the best comparator in a simulator output at the claim's world size."""
    if claim.predicted is None:
        return None
    p = int(claim.predicted["world_size"])
    base = {
        "simulate": claim.predicted["simulate"],
        "world_size": p,
        "assumptions": " ".join(str(claim.predicted["assumptions"]).split()),
        "speedup": None,
    }
    if sim_dir is None:
        return {**base, "note": f"no simulator output named {claim.predicted['simulate']!r} was given"}
    key = "time_to_target_s" if claim.metric == "time_to_target" else "throughput"
    rows = {
        r["optimizer"]: r.get(key)
        for r in readback.load(sim_dir / PREDICTIONS, readback.PREDICTIONS)
        if r.get("world_size") == p
    }
    subject = rows.get(claim.subject)
    others = {o: rows.get(o) for o in claim.comparators}
    have = {o: v for o, v in others.items() if v}
    base.update(source=str(sim_dir), missing=[o for o in claim.comparators if not others.get(o)])
    if not subject or not have:
        return {**base, "note": f"no {key} predicted for {claim.subject} and a comparator at P={p}"}
    if claim.lower_is_better:
        best = min(have, key=have.get)
        out = {**base, "best": best, "speedup": have[best] / subject}
    else:
        best = max(have, key=have.get)
        out = {**base, "best": best, "speedup": subject / have[best]}
    return out | prediction_uncertainty(claim, sim_dir, p, key)


def prediction_uncertainty(claim: Claim, sim_dir: Path, world: int, metric: str) -> dict:
    """The prediction's 95% interval over its resampled inputs and what flips it, where the simulator output
    has them (``simulate --interval``, :mod:`wagma_bench.analysis.predictions`); else says it has none."""
    path = sim_dir / INTERVAL_FILE
    if not path.is_file():
        return {
            "interval": None,
            "flip": None,
            "flips": [],
            "uncertainty_note": f"no {INTERVAL_FILE} (simulate --interval N) in {sim_dir}",
        }
    data = readback.load(path, readback.INTERVALS)
    ask = {
        "subject": claim.subject,
        "comparators": claim.comparators,
        "metric": metric,
        "lower_is_better": claim.lower_is_better,
    }
    flips = flip_points(data, world, claim.threshold, **ask)
    barrier = next((f for f in flips if f["knob"] == "control_every"), None)
    return {
        "interval": speedup_interval(data, world, **ask),
        "replicates": data["replicates"],
        "resampled": data["resampled"],
        "flips": flips,
        "flip": flip_sentence(nearest_flip(flips), barrier),
        "with_barrier": barrier_sentence(barrier),
        "structural_range": structural_range(data, world, **ask),
    }


# --- one claim ------------------------------------------------------------------------------------------


def evaluate(claim: Claim, sources: Sources) -> dict:
    tune_dir = sources.tunings.get(claim.measured["tuning"])
    measured = measure(tune_dir, claim.metric) if tune_dir else {}
    subject = measured.get(claim.subject)
    comparators = {o: measured.get(o) for o in claim.comparators}
    sp = speedup(subject, comparators, claim.lower_is_better, claim.compare) if subject else None
    missing = [o for o, m in comparators.items() if m is None]
    if tune_dir is None:
        verdict, reason = (
            "inconclusive",
            (f"not measured: no tuning directory named {claim.measured['tuning']!r} among the sources"),
        )
    elif subject is None:
        verdict, reason = "inconclusive", f"no data for {claim.subject} in {tune_dir}"
    else:
        verdict, reason = decide(sp.interval if sp else None, claim.threshold, sp.missing if sp else missing)
    return {
        "id": claim.id,
        "paper": claim.paper,
        "says": " ".join(claim.says.split()),
        "figure": claim.figure,
        "drift_adjusted": _drift_adjusted(claim, tune_dir) if tune_dir and subject else None,
        "condition": claim.condition,
        "metric": claim.metric,
        "subject": claim.subject,
        "comparators": list(claim.comparators),
        "threshold": claim.threshold,
        "compare": claim.compare,
        "measured": {
            "tuning": claim.measured["tuning"],
            "source": str(tune_dir) if tune_dir else None,
            "here": " ".join(str(claim.measured.get("here", "")).split()),
            "speedup": sp.value if sp else None,
            "interval": list(sp.interval) if sp else None,
            "best_comparator": sp.best if sp else None,
            "missing": sp.missing if sp else missing,
            "optimizer_changes": _optimizer_changes(tune_dir) if tune_dir else None,
            "optimizers": {
                o: _measurement_json(m)
                for o, m in measured.items()
                if o == claim.subject or o in claim.comparators
            },
        },
        "predicted": predict(claim, sources.simulations.get((claim.predicted or {}).get("simulate"))),
        "fairness": claim_flags(subject, comparators) if subject else [],
        "verdict": verdict,
        "reason": reason,
        **_second_look(claim, tune_dir, verdict),
    }


def _second_look(claim: Claim, tune_dir: Path | None, verdict: str) -> dict:
    """The claim's ``robustness`` (:func:`wagma_bench.analysis.robustness.assess`), its source's ``ruler``
    and the ``hosts`` its trials ran on (:func:`wagma_bench.analysis.ruler.source_record`)."""
    if tune_dir is None:
        return {"robustness": None, "ruler": None, "hosts": None}
    loaded = load_trials(tune_dir)
    reads = {claim.subject, *claim.comparators}
    trials = {o: s for o, s in robustness.tuned_trials(tune_dir, loaded).items() if o in reads}
    assessed = robustness.assess(trials, claim.metric, _judge(claim), loaded[0].get("max_runtime_s"))
    if assessed.pop("verdict") != verdict:  # one rule: the removals start from the verdict the table shows
        raise AssertionError(f"{claim.id}: robustness rescored the verdict differently from evaluate()")
    record = source_record(tune_dir, loaded)
    return {
        "robustness": assessed,
        "ruler": record["ruler"],
        "ruler_counts": {
            k: record[k] for k in ("evaluations", "late_evaluations", "over_budget", "unrecorded")
        },
        "hosts": record["hosts"],
    }


def _judge(claim: Claim) -> robustness.Judge:
    """The verdict of a set of per-optimizer laws, by this module's rule (:func:`speedup`, :func:`decide`)."""

    def judge(laws: dict[str, robustness.Law]) -> robustness.Judged:
        subject = laws.get(claim.subject)
        comparators = {o: laws.get(o) for o in claim.comparators}
        sp = speedup(subject, comparators, claim.lower_is_better, claim.compare) if subject else None
        missing = sp.missing if sp else [o for o, m in comparators.items() if m is None]
        verdict, _ = decide(sp.interval if sp else None, claim.threshold, missing)
        return robustness.Judged(verdict, sp.value if sp else None, tuple(sp.interval) if sp else None)

    return judge


def _drift_adjusted(claim: Claim, tune_dir: Path) -> dict:
    """The speed-up again with every trial's figures scaled by its speed reference to the power of the
    tuning's fitted elasticity (:mod:`wagma_bench.analysis.drift`): beside the raw verdict, never deciding it.
    The point figure is at the fitted elasticity; the interval is that of the mixture of the exact bootstrap
    laws at :data:`~wagma_bench.analysis.drift.DRAWS` equally likely values of it (its sampling error carried
    into the interval), and each optimizer's value at the fitted elasticity. ``speedup`` is None where a
    finished trial has no reference or the elasticity cannot be fitted."""
    loaded = load_trials(tune_dir)  # once: every value of the elasticity measures the same trials
    median, with_ref, finished = drift_reference(tune_dir, loaded)
    fit = drift_elasticity(tune_dir, loaded) if median is not None else None
    out = {
        "median_reference_s": median,
        "trials_with_reference": with_ref,
        "trials_finished": finished,
        "elasticity": fit.value if fit else None,
        "elasticity_se": fit.se if fit else None,
        "elasticity_trials": fit.trials if fit else None,
        "speedup": None,
        "interval": None,
        "best_comparator": None,
    }
    if median is None:
        return {**out, "note": f"{finished - with_ref} of {finished} finished trials have no speed reference"}
    if fit is None:
        return {
            **out,
            "note": "the elasticity cannot be fitted (too few trials, or no reference varying within "
            "an optimizer)",
        }
    # a final metric at a fixed budget is not scaled: one law serves every value of the elasticity
    draws = [fit.value] if claim.metric == "final_metric" else drift.elasticity_draws(fit)
    measured = {
        e: measure(tune_dir, claim.metric, median, e, loaded) for e in dict.fromkeys([fit.value, *draws])
    }
    at_fit = measured[fit.value]
    laws = [_drift_law(claim, measured[e]) for e in [fit.value, *draws]]
    if laws[0] is None:
        return {**out, "note": "no comparator measured"}
    sp = laws[0][0]
    return {
        **out,
        "speedup": sp.value,
        "interval": list(intervals.interval(intervals.mixture([d for _, d in laws[1:]]))),
        "best_comparator": sp.best,
        "values": {o: at_fit[o].value for o in (claim.subject, *claim.comparators) if o in at_fit},
    }


def _drift_law(claim: Claim, measured: dict[str, Measurement]) -> tuple[Speedup, intervals.Dist] | None:
    subject = measured.get(claim.subject)
    return (
        speedup_law(
            subject, {o: measured.get(o) for o in claim.comparators}, claim.lower_is_better, claim.compare
        )
        if subject
        else None
    )


def _optimizer_changes(tune_dir: Path) -> float | None:
    _, combos, _ = load_trials(tune_dir)
    return optimizer_changes(tune_dir, combos)


def claim_flags(subject: Measurement, comparators: dict[str, Measurement | None]) -> list[str]:
    """What makes the claim's speed-up an unfair comparison (:mod:`~wagma_bench.analysis.fairness`): an
    optimizer whose trials waited for a core, a comparator whose speed references differ from the subject's
    beyond their noise; each flag names the optimizer it concerns."""
    flags = []
    for m in [subject, *(c for c in comparators.values() if c is not None)]:
        said = fairness.contended(m.contention)
        if said:
            flags.append(f"{m.optimizer} {said}")
        if m is not subject:
            said = fairness.different_conditions(m.references, subject.references, subject.optimizer)
            if said:
                flags.append(f"{m.optimizer} {said}")
    return flags


def _measurement_json(m: Measurement) -> dict:
    lo, hi = m.interval
    return {
        "value": m.value,
        "interval": [lo, hi],
        "studies": m.budget[0],
        "trials_per_study": m.budget[1],
        "finished": m.finished,
        "planned": m.planned,
        "reached": m.reached,
        "compute_imbalance": m.compute_imbalance,
        "rounds": m.rounds,
    }


# --- claims.md ----------------------------------------------------------------------------------------------

UNITS = {"time_to_target": "s", "throughput": "samples/s", "final_metric": ""}


def num(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def times(v: float | None) -> str:
    return "—" if v is None else ("∞" if math.isinf(v) else f"{v:.2f}x")


def signed(v: float | None) -> str:
    return "—" if v is None else f"{v:+.2f}"


def shown(r: dict, v: float | None) -> str:
    """A speed-up as the claim compares: 1.23x (a ratio) or +0.05 (a difference)."""
    return signed(v) if r.get("compare") == "difference" else times(v)


def bound(v: float, threshold: float, difference: bool = False) -> str:
    """An interval's end, with a third decimal where two would round it onto the threshold it misses."""
    text = signed(v) if difference else times(v)
    if math.isfinite(v) and v != threshold and f"{v:.2f}" == f"{threshold:.2f}":
        text = f"{v:+.3f}" if difference else f"{v:.3f}x"
    return text


def ends(r: dict, interval: list[float]) -> str:
    diff = r.get("compare") == "difference"
    return f"[{bound(interval[0], r['threshold'], diff)}, {bound(interval[1], r['threshold'], diff)}]"


def measured_cell(r: dict) -> str:
    m = r["measured"]
    if m["speedup"] is None:
        return "subject only: no comparator measured" if r["subject"] in m["optimizers"] else "no data"
    return f"{shown(r, m['speedup'])} vs {m['best_comparator']} {ends(r, m['interval'])}"


def drift_cell(r: dict, with_elasticity: bool = True) -> str:
    """The speed-up with every trial scaled by its speed reference to the power of the fitted elasticity e
    (shown where it scales the figure); "no reference" where trials lack one."""
    d = r.get("drift_adjusted")
    if d is None:
        return "—"
    if d["speedup"] is None:
        if d.get("trials_with_reference", 0) < d.get("trials_finished", 0):
            return f"— ({d['trials_finished'] - d['trials_with_reference']} trials without a reference)"
        return f"— ({d.get('note', 'not measured')})"
    scaled = r["metric"] != "final_metric" and d.get("elasticity") is not None
    return f"{shown(r, d['speedup'])} {ends(r, d['interval'])}" + (
        f", {elasticity_text(d)}" if scaled and with_elasticity else ""
    )


def elasticity_text(d: dict) -> str:
    return f"e {d['elasticity']:.2f} ± {d['elasticity_se']:.2f}"


def predicted_cell(r: dict) -> str:
    p = r["predicted"]
    if p is None:
        return "not predicted"
    if p["speedup"] is None:
        return f"— (P={p['world_size']})"
    interval = p.get("interval")
    said = f"{times(p['speedup'])}" + (f" [{times(interval[0])}, {times(interval[1])}]" if interval else "")
    return (
        f"{said} vs {p['best']} at P={p['world_size']}"
        + structure_said(p.get("structural_range"), r["threshold"])
        + (f"; {p['flip']}" if p.get("flip") else "")
    )


def structure_said(structural: dict | None, threshold: float) -> str:
    """The speed-up's range over the structures the model cannot decide, and "undetermined at the paper's
    scale" where that range spans the threshold."""
    if structural is None:
        return ""
    lo, hi = structural["range"]
    span = f"structures [{times(lo)}, {times(hi)}]"
    return (
        f"; undetermined at the paper's scale ({span})"
        if undetermined(structural, threshold)
        else f"; {span}"
    )


def budget_cell(r: dict) -> str:
    """Studies x trials of the subject's tuning ("a-b" where the optimizers' budgets differ), and the trials
    that finished where fewer than planned did."""
    optimizers = r["measured"]["optimizers"]
    budgets = sorted({(x["studies"], x["trials_per_study"]) for x in optimizers.values()})
    # a plan measured short (claims --allow-missing) says so here, not only in the detail table
    short = [
        f"{o}: {x['finished']} of {x['planned']}"
        for o, x in optimizers.items()
        if x["finished"] < x["planned"]
    ]
    cell = " / ".join(f"{s} x {o}" for s, o in budgets) or "—"
    return cell + (f" ({', '.join(short)} trials)" if short else "")


def imbalance_cell(r: dict) -> str:
    """The compute imbalance of the subject's runs and of the best comparator's."""
    m = r["measured"]
    shown = [o for o in (r["subject"], m["best_comparator"]) if o in m["optimizers"]]
    return " / ".join(num(m["optimizers"][o]["compute_imbalance"]) for o in shown) or "—"


def summary_table(results: list[dict]) -> str:
    rows = [
        {
            "claim": f"`{r['id']}`",
            "paper": r["figure"] or "direction only",
            "measured": measured_cell(r),
            "drift": drift_cell(r),
            "budget": budget_cell(r),
            "imbalance": imbalance_cell(r),
            "predicted": predicted_cell(r),
            "verdict": f"**{r['verdict']}**: {r['reason']}",
            "second": second_look_cell(r),
        }
        for r in results
    ]
    return markdown_table(
        rows,
        [
            ("claim", "claim", ""),
            ("paper", "the paper", ""),
            ("measured", "measured here: speed-up [95% interval]", ""),
            ("drift", "drift-adjusted [95%], elasticity e", ""),
            ("budget", "studies x trials", ""),
            ("imbalance", "compute imbalance (subject / best)", ""),
            ("predicted", "predicted at the paper's scale", ""),
            ("verdict", "verdict", ""),
            ("second", "single removals keeping it; ruler", ""),
        ],
    )


def second_look_cell(r: dict) -> str:
    """How many single-trial and single-study removals keep the verdict (**fragile** where one does not), and
    "old ruler" where the claim's source was measured before evaluations fell on the grid."""
    rb = r.get("robustness")
    if not rb:
        return "—"
    mark = "**fragile**: " if rb["fragile"] else ""
    return mark + removal_counts(rb) + ("; old ruler" if r["ruler"] == "old" else "")


def removal_counts(rb: dict) -> str:
    t, s = rb["removals"]["trials"], rb["removals"]["studies"]
    return f"{t['kept']}/{t['of']} trials, {s['kept']}/{s['of']} studies"


def verdicts_table(results: list[dict]) -> str:
    """Per claim: its verdict, whether one removal changes it, the alternatives' verdicts, its source's ruler
    and hosts (docs/claims.md's generated block; a test compares the two)."""

    def alt(rb: dict, key: str) -> str:
        a = rb["alternatives"][key]
        return a["verdict"] if a["applies"] else "n/a"

    rows = [
        {
            "claim": f"`{r['id']}`",
            "verdict": r["verdict"],
            "fragile": "—"
            if not r.get("robustness")
            else "**fragile**"
            if r["robustness"]["fragile"]
            else "no",
            "kept": removal_counts(r["robustness"]) if r.get("robustness") else "—",
            "final": alt(r["robustness"], "final_evaluation") if r.get("robustness") else "—",
            "median": alt(r["robustness"], "median_per_study") if r.get("robustness") else "—",
            "ruler": r.get("ruler") or "—",
            "hosts": hosts_text(r) if r.get("hosts") is not None else "—",
        }
        for r in results
    ]
    return markdown_table(
        rows,
        [
            ("claim", "claim", ""),
            ("verdict", "verdict", ""),
            ("fragile", "fragile", ""),
            ("kept", "single removals keeping it", ""),
            ("final", "by final evaluation", ""),
            ("median", "by median per study", ""),
            ("ruler", "ruler", ""),
            ("hosts", "ran on", ""),
        ],
    )


def second_look_lines(r: dict, named: int = 3) -> list[str]:
    """The claim's bullets on its robustness, its source's ruler and hosts (:func:`_second_look`)."""
    rb = r.get("robustness")
    if not rb:
        return []

    def judged(j: dict) -> str:
        return f"{j['verdict']}, {shown(r, j['speedup'])}" + (
            f" {ends(r, j['interval'])}" if j["interval"] else ""
        )

    changed = [c for kind in ("trials", "studies") for c in rb["removals"][kind]["changed"]]
    said = "; ".join(f"without {c['removed']}: {judged(c)}" for c in changed[:named])
    if len(changed) > named:
        said += f"; and {len(changed) - named} more"
    t, s = rb["removals"]["trials"], rb["removals"]["studies"]
    kept = (
        f"{t['kept']} of {t['of']} single-trial and {s['kept']} of {s['of']} single-study removals keep "
        f"the verdict ({r['verdict']})"
    )
    alt = rb["alternatives"]
    scored = "; ".join(
        f"{label}: {judged(alt[key]) if alt[key]['applies'] else 'not applicable (' + alt[key]['note'] + ')'}"
        for key, label in (
            ("final_evaluation", "Scored by each trial's final evaluation"),
            ("median_per_study", "by each study's median trial"),
        )
    )
    c = r["ruler_counts"]
    ruler = (
        f"its source is on the **{r['ruler']}** ruler ({c['late_evaluations']} of {c['evaluations']} "
        f"evaluations off the grid, {c['over_budget']} trials past their budget"
        + (f", {c['unrecorded']} without a recorded grid" if c["unrecorded"] else "")
        + ")"
    )
    return [
        f"- **Second look**: {'**fragile**: ' + said + '; ' if changed else 'robust: '}{kept}. {scored}.",
        f"- **Ruler and hosts**: {ruler}; ran on {hosts_text(r)}.",
    ]


RULE = (
    "Speed-up: the subject's tuned value against the best comparator's, > 1 favouring the subject (times and "
    "throughputs alike); a claim with compare=difference gives subject minus best instead (+0.05: five "
    "points above). Interval: the 95% percentile interval of the exact two-stage bootstrap (studies, then "
    "trials inside each study; the best comparator chosen inside each resample). Verdict, with the claim's "
    "threshold t (1 unless stated): **holds** when the whole interval is above t and every comparator was "
    "measured; **does not hold** when the whole interval is below t; **inconclusive** otherwise. A "
    "prediction never decides a verdict, nor does the drift-adjusted speed-up (each trial's time or "
    "throughput scaled by (its speed reference over the tuning's median)^e, e the elasticity of seconds per "
    "round to the reference fitted within optimizers over the tuning, ± its standard error, which the "
    "interval carries): it shows how much the machine's drift could move the raw one."
)


SECOND_LOOK = (
    "Single removals: the verdict recomputed, by the same rule and exactly, without each finished trial in "
    "turn (of the subject or a comparator) and without each study in turn (from every optimizer); a verdict "
    "that one of them changes is **fragile**. Beside it, never deciding: the verdict with each trial scored "
    "by its final evaluation instead of its best (a final metric), and with each study's median trial instead"
    " of its best (a tuned score). Ruler: a source is on the **current** ruler when every evaluation of its "
    "trials fell on the grid of eval_every rounds and no trial ran past its budget (read from the trials' "
    "events); on the **old** one, periodic optimizers were evaluated up to a sync period late, which a time "
    "to target charges them."
)


def detail(r: dict) -> list[str]:
    m, unit = r["measured"], UNITS[r["metric"]]
    lines = [
        f"### `{r['id']}`: {r['verdict']}",
        "",
        f"- **The paper** ({r['paper']}): {r['says']}" + (f" Figure: {r['figure']}." if r["figure"] else ""),
        f"- **Its condition**: {r['condition']}.",
        f"- **Here**: {m['here']} (tuning `{m['tuning']}`"
        + (f", `{m['source']}`" if m["source"] else "")
        + ").",
        f"- **Verdict**: {r['verdict']}: {r['reason']} (threshold {r['threshold']:g}).",
        *second_look_lines(r),
        *(
            [f"- **Flagged**: {'; '.join(r['fairness'])}: the speed-up rests on these trials."]
            if r.get("fairness")
            else []
        ),
        f"- **Drift-adjusted** ({drift_said(r)}): {drift_cell(r, False)}"
        + (
            f"; the trials' order changed optimizer {m['optimizer_changes']:.0%} of the time"
            if m.get("optimizer_changes") is not None
            else ""
        )
        + ".",
        "",
    ]
    lines += optimizer_lines(r)
    lines += prediction_lines(r["predicted"])
    return lines + [
        (
            f"({unit or 'the metric'}; compute imbalance: the slowest rank's compute per step over the "
            "ranks' mean, median over the trials, 1.00 = even)"
        ),
        "",
    ]


def optimizer_lines(r: dict) -> list[str]:
    """The claim's table of what each optimizer measured, and what was not measured, for its detail."""
    m = r["measured"]
    lines: list[str] = []
    if m["optimizers"]:
        label = {"time_to_target": "score (s)", "throughput": "median samples/s", "final_metric": "score"}[
            r["metric"]
        ]
        rows = []
        for opt, x in sorted(m["optimizers"].items(), key=lambda kv: kv[0] != r["subject"]):
            x = renamed_fields(
                x, RENAMED_CLAIM_FIELDS
            )  # a claims.json written before "rounds" reads the same
            rows.append(
                {
                    "optimizer": opt + (" (subject)" if opt == r["subject"] else ""),
                    "value": num(x["value"]),
                    "interval": f"[{num(x['interval'][0])}, {num(x['interval'][1])}]",
                    "budget": f"{x['studies']} x {x['trials_per_study']}"
                    + (" (below 3 x 3)" if (x["studies"], x["trials_per_study"]) < MIN_BUDGET else ""),
                    "reached": "—" if x["reached"] is None else f"{x['reached']}/{x['finished']}",
                    "finished": f"{x['finished']}/{x['planned']}",
                    "imbalance": num(x["compute_imbalance"]),
                    "rounds": num(x.get("rounds")),
                }
            )
        lines += [
            markdown_table(
                rows,
                [
                    ("optimizer", "optimizer", ""),
                    ("value", label, ""),
                    ("interval", "95% interval", ""),
                    ("budget", "studies x trials", ""),
                    ("reached", "reached target", ""),
                    ("finished", "trials finished", ""),
                    ("imbalance", "compute imbalance", ""),
                    ("rounds", "rounds trained (median)", ""),
                ],
            ),
            "",
        ]
        if m["missing"]:
            lines += [f"Not measured: {', '.join(m['missing'])}.", ""]
    return lines


def prediction_lines(p: dict | None) -> list[str]:
    """What the simulator predicted for the claim and how far its assumptions may move, for its detail."""
    lines: list[str] = []
    if p is not None:
        said = (
            f"{times(p['speedup'])} against {p['best']} at P={p['world_size']}"
            if p["speedup"] is not None
            else p.get("note", "no prediction")
        )
        lines += [f"Predicted (`{p['simulate']}`): {said}. Assumptions: {p['assumptions']}", ""]
        if p.get("interval"):
            lo, hi = p["interval"]
            lines += [
                f"Prediction interval (95%, {p['replicates']} replicates; resampled: "
                f"{'; '.join(p['resampled'])}): [{times(lo)}, {times(hi)}]. Nearest flip: {p['flip']}."
                + (f" The trainer's barrier: {p['with_barrier']}." if p.get("with_barrier") else ""),
                "",
            ]
            if p.get("structural_range"):
                sr = p["structural_range"]
                lines += [
                    f"Over the structures the model cannot decide ({sr['combinations']} combinations of "
                    f"{'; '.join(sr['structures'])}): [{times(sr['range'][0])}, {times(sr['range'][1])}]"
                    + (", undetermined at the paper's scale." if undetermined(sr, 1.0) else "."),
                    "",
                ]
            rows = [
                {
                    "assumption": f["knob"],
                    "crossing": "—" if f["crossing"] is None else f"{f['crossing']:.3g}",
                    "curve": ", ".join(f"{x:g}: {y:.2f}x" for x, y in f["curve"]),
                }
                for f in p["flips"]
            ]
            lines += [
                markdown_table(
                    rows,
                    [
                        ("assumption", "assumption moved", ""),
                        ("crossing", "ties at", ""),
                        ("curve", "value: predicted speed-up", ""),
                    ],
                ),
                "",
            ]
        elif p.get("uncertainty_note"):
            lines += [f"No prediction interval: {p['uncertainty_note']}.", ""]
    return lines


def drift_said(r: dict) -> str:
    """How the claim's drift-adjusted figure was scaled, for its detail."""
    d = r.get("drift_adjusted") or {}
    if d.get("elasticity") is None:
        return "each trial scaled by its speed reference to the power of the fitted elasticity"
    fitted = (
        f"{elasticity_text(d)}, the elasticity of seconds per round to the reference fitted within "
        f"optimizers over {d['elasticity_trials']} trials"
    )
    if r["metric"] == "final_metric":
        return f"a final metric at a fixed budget is not scaled; {fitted}"
    return (
        f"each trial scaled by (its speed reference over the median)^e, {fitted}; the interval mixes "
        f"{drift.DRAWS} equally likely values of e"
    )


def fairness_line(results: list[dict]) -> str:
    """One line over every claim's flags (:func:`claim_flags`): which claims' speed-ups they touch."""
    flagged = {r["id"]: r["fairness"] for r in results if r.get("fairness")}
    return fairness.summary_line(flagged, len(results), [f"{k}'s speed-up" for k in flagged], "claims")


def render(results: list[dict], sources: list[str]) -> str:
    counts = {v: sum(r["verdict"] == v for r in results) for v in VERDICTS}
    lines = [
        "# The papers' claims, tested",
        "",
        f"{counts['holds']} hold, {counts['does not hold']} do not hold, {counts['inconclusive']} "
        f"inconclusive (of {len(results)}). Generated by `wagma-bench claims` from: "
        + ", ".join(f"`{s}`" for s in sources)
        + ".",
        "",
        fairness_line(results),
        "",
        summary_table(results),
        "",
        RULE,
        "",
        SECOND_LOOK,
        "",
        "## Each claim",
        "",
    ]
    for r in results:
        lines += detail(r)
    return "\n".join(lines).rstrip() + "\n"


# --- command line -------------------------------------------------------------------------------------------


def make_claims(
    dirs: list[Path],
    out: Path,
    claims_file: Path = CLAIMS_FILE,
    pages: Sequence[Path] = (),
    allow_missing: bool = False,
) -> list[dict]:
    """Every claim of ``claims_file`` evaluated over the sources under ``dirs``; ``out/claims.json`` and
    ``out/claims.md`` written, and each of ``pages`` filled (:mod:`~wagma_bench.analysis.claims_pages`: the
    README's verdicts, docs/claims.md's table). Everything is checked before anything is written (the pages,
    the sources' unfinished trials), and the outputs are built beside ``out`` and moved
    in last (:func:`staged_outputs`): a refusal or a full disk leaves ``out`` as it was."""
    for page in pages:
        check_page(page)
    claims = load_claims(claims_file)
    sources = find_sources(dirs)
    for tune_dir, unfinished, planned in incomplete_sources(claims, sources):
        said = unfinished_sentence(tune_dir, unfinished, planned)
        if not allow_missing:
            raise ConfigError(
                f"{said}; a claim measured without them would rest on fewer trials than planned: finish them "
                "(the same wagma-bench tune command resumes), or give --allow-missing to measure without "
                "them (the tables then say how many trials each has)"
            )
        print(
            f"wagma-bench claims: warning: {said}; measured without them (--allow-missing)", file=sys.stderr
        )
    results = [evaluate(c, sources) for c in claims]
    text = render(results, [str(d) for d in dirs])
    data = {
        "version": 1,
        "rule": RULE,
        "level": intervals.LEVEL,
        "sources": [str(d) for d in dirs],
        "claims": results,
    }
    with staged_outputs(out) as stage:
        write_json_atomic(stage / "claims.json", data)
        atomic_write(stage / "claims.md", lambda f: f.write(text))
        blocks = {SUMMARY: verdict_summary(results), TABLE: summary_table(results)}
        for page in pages:  # before the outputs move in: a page that cannot be written leaves ``out``
            fill_page(page, blocks)
    return results


def incomplete_sources(claims: list[Claim], sources: Sources) -> list[tuple[Path, list[Trial], int]]:
    """(tuning directory, its unfinished trials, its planned trials) for each source a claim reads that has a
    trial without a final summary (not run, killed, its folder deleted): measured without them, a claim's
    speed-up would move while its headline still showed the planned studies x trials."""
    out = []
    for name in dict.fromkeys(c.measured["tuning"] for c in claims):
        tune_dir = sources.tunings.get(name)
        if tune_dir is None:
            continue
        _, combos, summaries = load_trials(tune_dir)
        planned = [t for trials in combos.values() for t in trials]
        unfinished = [t for t in planned if not trial_finished(summaries[t.name])]
        if unfinished:
            out.append((tune_dir, unfinished, len(planned)))
    return out


def unfinished_sentence(tune_dir: Path, unfinished: list[Trial], planned: int, shown: int = 3) -> str:
    """``DIR: 1 of its 175 planned trials did not finish: NAME (study 2, trial 3: FOLDER is missing)``."""

    def state(t: Trial) -> str:
        folder = tune_dir / TRIALS / t.name
        if not folder.is_dir():
            return f"{folder} is missing"
        summary = RunEvents.read(folder).saved_summary
        return f"{folder} has no summary" if summary is None else f"{folder} ended {summary.status}"

    named = ", ".join(f"{t.name} (study {t.study}, trial {t.trial}: {state(t)})" for t in unfinished[:shown])
    more = f" and {len(unfinished) - shown} more" if len(unfinished) > shown else ""
    return f"{tune_dir}: {len(unfinished)} of its {planned} planned trials did not finish: {named}{more}"
