"""Which claims can this machine decide at all? For each claim, the chance that its 95% interval excludes the
threshold (a verdict other than inconclusive) at the design it was measured with and at larger designs, if the
optimizers behave as their committed trials did.

    .venv/bin/python reproduce/claims/power.py run     # recompute and write reproduce/claims/power.json
    .venv/bin/python reproduce/claims/power.py table   # the table of docs/claims.md ("power" block)

Method (a parametric-free simulation; the same every time: fixed seed). Each optimizer's committed trials in
the claim's tuning directory, scored as `wagma-bench claims` scores them (`tuning.trial_cost`: the time to
target, inf for a miss; the best metric; or the throughput), are its distribution. One simulated campaign at S
studies x O trials draws every optimizer's S x O trials with replacement from its own committed trials (the
studies of one tuning are replicates of one search, so a trial of any study stands for a draw from the
search), computes the claim's interval on them by the declared two-stage bootstrap (studies, then trials
within each, resampled with replacement; the best comparator chosen inside each resample; the 2.5% and 97.5%
quantiles) by Monte Carlo with BOOTSTRAP resamples, and asks whether the interval excludes the claim's
threshold. The power is the share of CAMPAIGNS campaigns that do. It measures the designs against the spread
these trials showed: where the optimizers' true difference is near the threshold, no design decides, and the
simulated campaigns take the observed point speed-up for the truth.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

from wagma_bench.analysis.claims import find_sources, load_claims
from wagma_bench.analysis.tuning import BY_METRIC, BY_TIME, load_trials, trial_cost, trial_finished
from wagma_bench.record.files import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "reproduce" / "claims" / "power.json"
DESIGNS = ((5, 5), (10, 10))  # beside each claim's own design
CAMPAIGNS, BOOTSTRAP, SEED, LEVEL = 200, 400, 1, 0.95
DECIDES = 0.8  # the power a claim needs at 10 x 10 for the README to count it as decidable here


def trials(tune_dir: Path, metric: str) -> dict[str, list[list[float]]]:
    """Each optimizer's finished trials by study, as values where lower is better for a time (inf: missed) and
    higher is better otherwise (a best metric, -inf: failed; a throughput)."""
    plan, combos, summaries = load_trials(tune_dir)
    out: dict[str, dict[int, list[float]]] = {}
    for combo in combos.values():
        for t in combo:
            s = summaries[t.name]
            if not trial_finished(s):
                continue
            if metric == "throughput":
                if not s.throughput_samples_per_s:
                    continue
                value = float(s.throughput_samples_per_s)
            elif metric == "time_to_target":
                value = trial_cost(s, plan.get("max_runtime_s"), BY_TIME)
            else:
                value = -trial_cost(s, plan.get("max_runtime_s"), BY_METRIC)
            out.setdefault(s.optimizer, {}).setdefault(t.study, []).append(value)
    return {o: [by_study[k] for k in sorted(by_study)] for o, by_study in out.items()}


def point(studies: list[list[float]], metric: str) -> float:
    """The claim's statistic on observed trials: the tuned score (median over studies of each one's best), or
    a throughput's median over every trial."""
    if metric == "throughput":
        return float(statistics.median(v for s in studies for v in s))
    best = max if metric == "final_metric" else min
    return float(statistics.median(best(s) for s in studies))


def quartile(values: list[float], q: float) -> float:
    """numpy's default (linear) quantile, but a quantile that falls on a trial is that trial even where the
    next is a miss: numpy interpolates there too and gets 0 x inf, nan."""
    v = sorted(values)
    h = (len(v) - 1) * q
    lo = math.floor(h)
    return v[lo] if h == lo else v[lo] + (h - lo) * (v[lo + 1] - v[lo])


def spread(values: list[float], difference: bool) -> float:
    """The trials' interquartile range, over their median for a ratio claim (inf where a quartile is a
    miss)."""
    q1, med, q3 = (quartile(values, q) for q in (0.25, 0.5, 0.75))
    width = abs(q3 - q1) if math.isfinite(q1) and math.isfinite(q3) else math.inf
    return width if difference else width / abs(med) if med else math.inf


def statistic(drawn: np.ndarray, metric: str) -> np.ndarray:
    """The claim's statistic over the last two axes (studies, trials) of ``drawn``."""
    if metric == "throughput":
        return np.median(drawn.reshape(*drawn.shape[:-2], -1), axis=-1)
    best = drawn.max(axis=-1) if metric == "final_metric" else drawn.min(axis=-1)
    return np.median(best, axis=-1)


def compare(subject: np.ndarray, best: np.ndarray, claim) -> np.ndarray:
    """The speed-up, oriented as `wagma-bench claims` orients it (> 1 or > 0 favours the subject)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        if claim.compare == "difference":
            out = subject - best
        elif claim.metric == "time_to_target":
            out = np.where(np.isinf(subject) & np.isinf(best), 1.0, best / subject)
        else:
            out = subject / best
    return np.nan_to_num(out, nan=0.0 if claim.compare == "difference" else 1.0)  # both failed: a tie


def power(
    claim, data: dict[str, list[list[float]]], design: tuple[int, int], rng: np.random.Generator
) -> list[float]:
    """The shares of simulated campaigns at ``design`` whose bootstrap interval lies above the claim's
    threshold (the claim holds) and below it (it does not hold)."""
    s, o = design
    names = [claim.subject] + [c for c in claim.comparators if c in data]
    stats = {}
    for name in names:
        pool = np.array([v for study in data[name] for v in study])
        campaign = pool[rng.integers(len(pool), size=(CAMPAIGNS, s, o))]
        studies = rng.integers(s, size=(CAMPAIGNS, BOOTSTRAP, s))
        drawn = campaign[np.arange(CAMPAIGNS)[:, None, None], studies]  # (campaigns, resamples, S, O)
        drawn = np.take_along_axis(drawn, rng.integers(o, size=drawn.shape), axis=-1)
        stats[name] = statistic(drawn, claim.metric)  # (campaigns, resamples)
    others = np.stack([stats[n] for n in names[1:]])
    best = others.min(axis=0) if claim.metric == "time_to_target" else others.max(axis=0)
    speedups = compare(stats[claim.subject], best, claim)
    tail = (1 - LEVEL) / 2
    lo, hi = np.quantile(speedups, [tail, 1 - tail], axis=1, method="inverted_cdf")
    return [float(np.mean(lo > claim.threshold)), float(np.mean(hi < claim.threshold))]


def row(claim, tune_dir: Path, rng: np.random.Generator) -> dict:
    data = trials(tune_dir, claim.metric)
    comparators = [c for c in claim.comparators if c in data]
    pick = min if claim.metric == "time_to_target" else max
    best = pick(comparators, key=lambda c: point(data[c], claim.metric))
    own = (len(data[claim.subject]), max(len(s) for s in data[claim.subject]))
    difference = claim.compare == "difference"
    return {
        "claim": claim.id,
        "source": str(tune_dir.relative_to(ROOT)),
        "metric": claim.metric,
        "best_comparator": best,
        "design": list(own),
        "trials": {n: sum(map(len, data[n])) for n in [claim.subject, *comparators]},
        "spread": {
            "subject": spread([v for s in data[claim.subject] for v in s], difference),
            "best": spread([v for s in data[best] for v in s], difference),
        },
        "power": {f"{s}x{o}": power(claim, data, (s, o), rng) for s, o in dict.fromkeys((own, *DESIGNS))},
    }


def compute() -> dict:
    dirs = [
        ROOT / line.strip() for line in (ROOT / "reproduce/claims/sources").read_text().splitlines() if line
    ]
    sources = find_sources(dirs)
    rng = np.random.default_rng(SEED)
    rows = [row(c, sources.tunings[c.measured["tuning"]], rng) for c in load_claims()]
    return {"campaigns": CAMPAIGNS, "bootstrap": BOOTSTRAP, "seed": SEED, "level": LEVEL, "claims": rows}


def inputs(result: dict) -> dict[str, dict]:
    """What each row was computed from (source and trial counts): a test compares it with the committed
    sources."""
    return {r["claim"]: {"source": r["source"], "trials": r["trials"]} for r in result["claims"]}


def _shares(p: list[float]) -> str:
    return f"{p[0]:.2f} / {p[1]:.2f}"


def _spread(v: float | None) -> str:
    # None: an infinite spread (a quartile on a miss) as power.json holds it; strict JSON has no infinity
    return "∞" if v is None or math.isinf(v) else f"{v:.2f}"


def table(result: dict) -> str:
    head = (
        "| claim | design | spread of the trials: subject / best comparator | P(holds) / P(does not hold) at "
        "its design | at 5 x 5 | at 10 x 10 |"
    )
    rows = [head, "|---|---|---|---|---|---|"]
    for r in result["claims"]:
        s, o = r["design"]
        p = r["power"]
        rows.append(
            f"| `{r['claim']}` | {s} x {o} | {_spread(r['spread']['subject'])} / "
            f"{_spread(r['spread']['best'])} ({r['best_comparator']}) | {_shares(p[f'{s}x{o}'])} | "
            f"{_shares(p['5x5'])} | {_shares(p['10x10'])} |"
        )
    return "\n".join(rows)


def decidable(result: dict) -> list[str]:
    """The claims whose power at 10 x 10 reaches DECIDES."""
    return [r["claim"] for r in result["claims"] if sum(r["power"]["10x10"]) >= DECIDES]


if __name__ == "__main__":
    if sys.argv[1:] == ["run"]:
        write_json_atomic(RESULT, compute())
    elif sys.argv[1:] == ["table"]:
        print(table(json.loads(RESULT.read_text())))
    else:
        sys.exit("usage: power.py run | table")
