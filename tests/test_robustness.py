"""A claim's second look (wagma_bench/analysis/robustness.py, ruler.py): the verdict under every single-trial
and single-study removal and under the two alternative scorings, against a brute-force oracle that enumerates
every two-stage resample literally; the committed DD-PPO claim against an independent audit's figures
(01ff221d); the ruler read from the committed sources; the CPU and the preempted rollouts a run records."""

from __future__ import annotations

import functools
import itertools
import json
import math
import random
import statistics
from pathlib import Path

import pytest
import torch

from wagma_bench.analysis import intervals, robustness
from wagma_bench.analysis.claims import Claim, _judge, decide, load_claims
from wagma_bench.analysis.ruler import source_record
from wagma_bench.record.provenance import cpu_identity
from wagma_bench.record.rundir import preempted_rollouts, step_logs

ROOT = Path(__file__).resolve().parents[1]
TUNED = ROOT / "reproduce" / "tuning"
INF = math.inf


def _claim(metric: str, compare: str = "ratio", threshold: float = 1.0) -> Claim:
    return Claim(
        id="t",
        paper="p",
        says="s",
        condition="c",
        metric=metric,
        subject="wagma",
        comparators=("allreduce", "sgp"),
        measured={"tuning": "t"},
        threshold=threshold,
        compare=compare,
    )


# --- the oracle: every resample enumerated ------------------------------------------------------------------


@functools.cache
def _law_by_enumeration(studies: tuple[tuple[float, ...], ...], statistic: str) -> dict[float, float]:
    """Every resample of the studies, then of each drawn study's trials, weighted equally within its level;
    per resampled study its best (min cost) or median, then the median over studies; ``pooled``: the median of
    every value drawn (a throughput)."""
    law: dict[float, float] = {}
    s = len(studies)
    for drawn in itertools.product(range(s), repeat=s):
        per_study = [list(itertools.product(studies[i], repeat=len(studies[i]))) for i in drawn]
        weight = s**-s / math.prod(len(p) for p in per_study)
        for picks in itertools.product(*per_study):
            if statistic == "pooled":
                m = statistics.median(v for p in picks for v in p)
            else:
                m = statistics.median((min if statistic == "best" else statistics.median)(p) for p in picks)
            law[m] = law.get(m, 0.0) + weight
    return law


def _verdict_by_enumeration(data: dict, claim: Claim, scoring: str) -> tuple[str, tuple[float, float]]:
    """The verdict from the oracle's laws: costs (a time; a metric negated), the best comparator drawn with
    them, the subject against it, the percentile interval, the claim's rule."""
    statistic = "pooled" if claim.metric == "throughput" else scoring
    laws = {}
    for opt, studies in data.items():
        if not studies:
            continue
        key = "final" if scoring == "final" else "best"
        costs = tuple(
            tuple(t[key] if claim.metric != "final_metric" else -t[key] for t in study) for study in studies
        )
        law = _law_by_enumeration(costs, "best" if statistic == "final" else statistic)
        laws[opt] = (
            law
            if claim.metric == "time_to_target"
            else {-v if claim.metric == "final_metric" else v: p for v, p in law.items()}
        )
    pick = min if claim.lower_is_better else max
    best: dict[float, float] | None = None
    for opt in claim.comparators:
        if opt in laws:
            best = laws[opt] if best is None else _product(best, laws[opt], pick)
    if claim.compare == "difference":
        law = _product(laws["wagma"], best, lambda x, y: x - y)
    elif claim.lower_is_better:
        law = _product(best, laws["wagma"], intervals.divide)
    else:
        law = _product(laws["wagma"], best, intervals.divide)
    lo, hi = _percentile(law, 0.025), _percentile(law, 0.975)
    return decide((lo, hi), claim.threshold, [])[0], (lo, hi)


def _product(a: dict, b: dict, op) -> dict:
    out: dict[float, float] = {}
    for x, p in a.items():
        for y, q in b.items():
            out[op(x, y)] = out.get(op(x, y), 0.0) + p * q
    return out


def _percentile(law: dict[float, float], q: float) -> float:
    acc = 0.0
    for v in sorted(law):
        acc += law[v]
        if acc >= q - 1e-12:
            return v
    return max(law)


def _summary(metric: str, best: float, final: float) -> dict:
    if metric == "time_to_target":
        reached = math.isfinite(best)
        return {"status": "completed", "reached": reached, "time_to_target_s": best if reached else None}
    if metric == "throughput":
        return {"status": "completed", "throughput_samples_per_s": best}
    return {"status": "completed", "best_metric": best, "final_metric": final}


def _made_up(rng: random.Random, metric: str, shape: tuple[int, ...]) -> dict:
    """Per optimizer, per study, its trials' best and final values; the subject drawn from better values, so
    that some verdicts are decided (and some of those fragile)."""
    choices = {
        "time_to_target": [10.0, 12.0, 15.0, 20.0, INF],
        "throughput": [280.0, 300.0, 310.0, 330.0, 350.0],
        "final_metric": [0.1, 0.2, 0.3, 0.4, 0.5],
    }[metric]
    better = {
        "time_to_target": [8.0, 9.0, 10.0, 12.0],
        "throughput": [340.0, 350.0, 360.0, 300.0],
        "final_metric": [0.5, 0.6, 0.7, 0.3],
    }[metric]
    data = {}
    for opt in ("wagma", "allreduce", "sgp"):
        values = better if opt == "wagma" else choices
        studies = []
        for o in shape:
            trials = []
            for _ in range(o):
                b = rng.choice(values)
                f = b if metric != "final_metric" else rng.choice([c for c in values if c <= b])
                trials.append({"best": b, "final": f})
            studies.append(trials)
        data[opt] = studies
    return data


def _assess_by_enumeration(data: dict, claim: Claim) -> dict:
    base, _ = _verdict_by_enumeration(data, claim, "best")
    rows = {"trials": [], "studies": []}
    for opt, studies in data.items():
        for i, study in enumerate(studies):
            for j in range(len(study)):
                reduced = [[t for k, t in enumerate(s) if (n, k) != (i, j)] for n, s in enumerate(studies)]
                reduced = [s for s in reduced if s]
                rows["trials"].append((f"{opt}_study{i + 1}_trial{j + 1}", {**data, opt: reduced}))
    for i in range(max(len(s) for s in data.values())):
        rows["studies"].append(
            (f"study {i + 1}", {o: [s for n, s in enumerate(ss) if n != i] for o, ss in data.items()})
        )
    out = {}
    for kind, cases in rows.items():
        verdicts = [(name, _verdict_by_enumeration(d, claim, "best")[0]) for name, d in cases]
        out[kind] = {
            "kept": sum(v == base for _, v in verdicts),
            "of": len(verdicts),
            "changed": [n for n, v in verdicts if v != base],
        }
    alternatives = {}
    for key, scoring in (("final_evaluation", "final"), ("median_per_study", "median")):
        if robustness.applies(claim.metric, scoring) is None:
            alternatives[key] = _verdict_by_enumeration(data, claim, scoring)
    return {"verdict": base, "removals": out, "alternatives": alternatives}


def _as_tuned(data: dict, metric: str) -> robustness.Tuned:
    return {
        opt: {
            i + 1: [
                (f"{opt}_study{i + 1}_trial{j + 1}", _summary(metric, t["best"], t["final"]))
                for j, t in enumerate(s)
            ]
            for i, s in enumerate(studies)
        }
        for opt, studies in data.items()
    }


CASES = [
    ("time_to_target", "ratio", 1.0, (2, 2, 2)),
    ("final_metric", "difference", -0.05, (2, 2, 2)),
    ("final_metric", "ratio", 1.0, (3, 2)),
    ("throughput", "ratio", 1.0, (2, 2, 1)),
]


@pytest.mark.parametrize("metric,compare,threshold,shape", CASES)
def test_every_removal_and_scoring_matches_the_enumeration_of_every_resample(
    metric, compare, threshold, shape
):
    """Over several made-up tunings per case (3 optimizers, studies of 1-3 trials): the verdict, the removals
    that keep it and those that change it, and the alternatives' verdicts and intervals, all as the literal
    enumeration of every two-stage resample gives them. Some seeds give fragile verdicts, so the removals that
    change a verdict are compared too, not only counts that all keep it."""
    claim = _claim(metric, compare, threshold)
    fragile = []
    for seed in range(6):
        data = _made_up(random.Random(seed * 31 + len(shape)), metric, shape)
        got = robustness.assess(_as_tuned(data, metric), metric, _judge(claim))
        want = _assess_by_enumeration(data, claim)
        assert got["verdict"] == want["verdict"], seed
        for kind in ("trials", "studies"):
            mine = got["removals"][kind]
            assert (mine["kept"], mine["of"]) == (
                want["removals"][kind]["kept"],
                want["removals"][kind]["of"],
            )
            assert [c["removed"] for c in mine["changed"]] == want["removals"][kind]["changed"], (seed, kind)
        for key, (verdict, (lo, hi)) in want["alternatives"].items():
            alt = got["alternatives"][key]
            assert alt["verdict"] == verdict and alt["interval"] == pytest.approx([lo, hi]), (seed, key)
        fragile.append(got["fragile"])
    assert any(fragile), fragile


def test_the_median_per_study_law_by_hand():
    """Two studies: (10, 20) and (30,): a resampled first study's median is 10, 15 or 20 (1/4, 1/2, 1/4);
    the median of two such draws from the mixture is checked against the enumeration."""
    studies = [
        [{"status": "completed", "reached": True, "time_to_target_s": t} for t in s] for s in ([10, 20], [30])
    ]
    value, law = robustness.score_law(studies, "time_to_target", scoring="median")
    assert value == statistics.median([15, 30])
    assert law == pytest.approx(_law_by_enumeration(((10.0, 20.0), (30.0,)), "median"))


# --- the committed DD-PPO claim against the audit ---------------------------------------------------------


def _combine_by_loop(a: dict, b: dict, op) -> dict:
    """intervals.combine as it was written before its array path: a dict filled pair by pair."""
    out: dict[float, float] = {}
    for x, p in a.items():
        for y, q in b.items():
            out[op(x, y)] = out.get(op(x, y), 0.0) + p * q
    return {v: p for v, p in out.items() if p > 1e-15}


def _quantile_by_loop(dist: dict, q: float) -> float:
    acc = 0.0
    values = sorted(dist)
    for i, v in enumerate(values):
        acc += dist[v]
        if (1.0 if i == len(values) - 1 else min(acc, 1.0)) >= q - 1e-12:
            return v
    return values[-1]


def _pooled_counts_by_loop(low_high: tuple, sizes: tuple) -> dict:
    """intervals._pooled_counts as it was written before: (c, n) tuples as keys, every partial sum kept."""
    one: dict[tuple[int, int], float] = {}
    for (low, high), o in zip(low_high, sizes, strict=True):
        for c in range(o + 1):
            p = math.comb(o, c) * low**c * high ** (o - c) / len(sizes)
            if p:
                one[c, o] = one.get((c, o), 0.0) + p
    total = {(0, 0): 1.0}
    for _ in sizes:
        nxt: dict[tuple[int, int], float] = {}
        for (c1, n1), p in total.items():
            for (c2, n2), q in one.items():
                nxt[c1 + c2, n1 + n2] = nxt.get((c1 + c2, n1 + n2), 0.0) + p * q
        total = nxt
    return total


def _bits(dist: dict) -> list[tuple[str, str]]:
    """A law as its values and masses, each exactly (hex keeps -0.0 and the last bit), in its order."""
    return [(float(v).hex(), float(p).hex()) for v, p in dist.items()]


@pytest.mark.parametrize("seed", range(4))
def test_the_array_paths_are_bitwise_the_loops(seed):
    """The claims' exactness rests on these laws being the same floats in the same order whatever path
    computes them (a later combine sums in a law's order): combine's numpy path against the loop it replaced
    (ties, inf, inf / inf, division by 0.0 and signed zeros included), the quantiles against a loop over
    the sorted law, the pooled-count table against the loop it replaced, and one read for some entries only
    against the whole table."""
    rng = random.Random(seed)
    pool = [0.0, -0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 0.1 + 0.2, 1 / 3, INF]

    def law() -> dict:
        raw = {rng.choice(pool) * rng.choice((1, 1, 7.25)): rng.random() for _ in range(rng.randint(1, 9))}
        return {v: p / sum(raw.values()) for v, p in raw.items()}

    for _ in range(40):
        a, b = law(), law()
        for op in (min, max, intervals.divide):
            assert _bits(intervals.combine(a, b, op)) == _bits(_combine_by_loop(a, b, op)), (a, b, op)
        for q in (0.0, 0.025, 0.5, 0.975, 1.0):
            assert intervals.quantile(a, q).hex() == _quantile_by_loop(a, q).hex()
    for _ in range(20):
        sizes = tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 4)))
        low_high = tuple((low, rng.uniform(0, 1 - low)) for low in (rng.random() for _ in sizes))
        whole = intervals._pooled_counts.__wrapped__(low_high, sizes)
        assert [(e, p.hex()) for e, p in whole.items()] == [
            (e, p.hex()) for e, p in _pooled_counts_by_loop(low_high, sizes).items()
        ]
        wanted = tuple(rng.sample(sorted(whole), min(3, len(whole))))
        some = intervals._pooled_counts.__wrapped__(low_high, sizes, wanted)
        assert [(e, p.hex()) for e, p in some.items()] == [
            (e, p.hex()) for e, p in whole.items() if e in wanted
        ]


def test_rl_final_quality_reads_as_the_independent_audit_found():
    """The audit (issue 81, its own code and a 10^6-resample Monte Carlo): without allreduce_study2_trial1
    -0.109 [-0.328, 0.000], inconclusive; without study 3 -0.148 [-0.367, -0.047], inconclusive (threshold
    -0.05); 49 of 50 single-trial removals keep "does not hold"; by each trial's final evaluation -0.141
    [-0.328, -0.078]; by each study's median, inconclusive."""
    claim = next(c for c in load_claims() if c.id == "rl-final-quality")
    tune_dir = TUNED / "results-2core-20261206" / "ddppo_budget"
    got = robustness.assess(robustness.tuned_trials(tune_dir), claim.metric, _judge(claim))
    assert got["verdict"] == "does not hold" and got["fragile"]
    trials, studies = got["removals"]["trials"], got["removals"]["studies"]
    assert (trials["kept"], trials["of"], studies["kept"], studies["of"]) == (49, 50, 4, 5)
    (one,) = trials["changed"]
    assert one["removed"] == "allreduce_study2_trial1" and one["verdict"] == "inconclusive"
    assert [round(x, 3) for x in (one["speedup"], *one["interval"])] == [-0.109, -0.328, 0.0]
    (three,) = studies["changed"]
    assert three["removed"] == "study 3" and three["verdict"] == "inconclusive"
    assert [round(x, 3) for x in (three["speedup"], *three["interval"])] == [-0.148, -0.367, -0.047]
    final, median = got["alternatives"]["final_evaluation"], got["alternatives"]["median_per_study"]
    assert final["verdict"] == "does not hold"
    assert [round(x, 3) for x in (final["speedup"], *final["interval"])] == [-0.141, -0.328, -0.078]
    assert median["verdict"] == "inconclusive"


# --- the ruler, the CPU, the preempted rollouts -------------------------------------------------------------


@pytest.mark.parametrize(
    "source,ruler,cpu",
    [
        ("results-2core-20261207/resnet_none", "current", ("AMD EPYC", "AVX512")),
        ("results-2core-20261205/ddppo_throughput", "old", (None, None)),
    ],
)
def test_the_ruler_is_read_from_the_trials_evaluations(source, ruler, cpu):
    """resnet_none was re-tuned on the exact grid (every evaluation at a multiple of its eval_every rounds,
    the run ending at its target's evaluation), recording its CPU; ddppo_throughput before the fix and
    before the CPU was recorded: WAGMA-SGD evaluated at its next synchronous round, after the grid's."""
    record = source_record(TUNED / source)
    assert record["ruler"] == ruler
    assert (record["late_evaluations"] == 0) == (ruler == "current") and record["evaluations"] > 0
    trials = sum(1 for _ in (TUNED / source / "trials").iterdir())
    assert record["hosts"] == [
        {"hosts": ["vm"], "cpu_model": cpu[0], "cpu_capability": cpu[1], "trials": trials}
    ]


def test_a_run_records_its_cpu_and_the_instruction_set_torch_used():
    cpu = cpu_identity()
    assert cpu["capability"] == torch.backends.cpu.get_cpu_capability()
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), None)
    assert cpu["model"] == model


def test_preempted_rollouts_are_counted_over_the_ranks(tmp_path):
    steps = tmp_path / "steps"
    steps.mkdir()
    rank0 = [{"local_step": 1, "preempted": False}, {"local_step": 2}, {"local_step": 5, "preempted": True}]
    rank1 = [{"local_step": 1, "preempted": True}, {"local_step": 5, "preempted": True}]
    for name, records in (("rank0.jsonl", rank0), ("rank1.jsonl", rank1)):
        (steps / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    assert preempted_rollouts(step_logs(tmp_path)) == {"cut": 3, "rollouts": 4}
    (steps / "rank0.jsonl").write_text(json.dumps({"local_step": 1}) + "\n")
    (steps / "rank1.jsonl").unlink()
    assert preempted_rollouts(step_logs(tmp_path)) is None  # a workload with no rollouts
