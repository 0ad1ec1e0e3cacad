"""The drift adjustment scaled by its measured effect (`wagma_bench.analysis.drift`): the elasticity against
an independent least-squares fit with one dummy column per optimizer, the adjustment at elasticity 1 against
the proportional one it replaced, and `claims`' drift-adjusted speed-up on made-up tunings where the answer is
known."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import numpy as np
import pytest

from wagma_bench.analysis import drift, intervals, tuning
from wagma_bench.analysis.claims import Claim, Sources, evaluate

ROUNDS, BATCH = 100, 64  # each made-up trial: 100 rounds of 64 samples
SPEED = {
    "allreduce": 2.0,
    "wagma": 1.6,
    "sgp": 1.8,
}  # each made-up optimizer's seconds per round at reference 1


def _summary(optimizer: str, reference: float, per_round: float, reached: bool = True) -> dict:
    train = ROUNDS * per_round
    return {
        "status": "completed",
        "optimizer": optimizer,
        "reference_s": reference,
        "rounds": ROUNDS,
        "train_s": train,
        "throughput_samples_per_s": ROUNDS * BATCH / train,
        "reached": reached,
        "time_to_target_s": train if reached else None,
    }


def _made_up(seed: int, elasticity: float, noise: float) -> dict[str, list[dict]]:
    """Three optimizers, each with its own speed, and references spread over a drifting machine; each trial's
    seconds per round = speed * reference^elasticity * exp(noise)."""
    rng = random.Random(seed)
    return {
        o: [
            _summary(o, ref, c * ref**elasticity * math.exp(rng.gauss(0, noise)))
            for ref in (rng.uniform(0.07, 0.12) for _ in range(7))
        ]
        for o, c in SPEED.items()
    }


def test_the_elasticity_is_numpys_least_squares_with_a_dummy_per_optimizer():
    groups = _made_up(seed=3, elasticity=0.4, noise=0.05)
    fit = drift.fit_elasticity(groups.values())
    rows = [(o, s) for o, trials in groups.items() for s in trials]
    # log(seconds per round) = sum_o a_o [optimizer = o] + e log(reference): the full design, solved by numpy
    x = np.array([[float(o == g) for g in groups] + [math.log(s["reference_s"])] for o, s in rows])
    y = np.array([math.log(s["train_s"] / s["rounds"]) for _, s in rows])
    beta, rss, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    n, p = x.shape
    se = math.sqrt(rss[0] / (n - p) * np.linalg.inv(x.T @ x)[-1, -1])
    assert rank == p and (fit.trials, fit.groups) == (21, 3)
    assert fit.value == pytest.approx(beta[-1], rel=1e-10) and fit.se == pytest.approx(se, rel=1e-10)
    assert abs(fit.value - 0.4) < 3 * fit.se  # the made-up elasticity, within its error
    exact = drift.fit_elasticity(_made_up(seed=3, elasticity=0.4, noise=0.0).values())
    assert exact.value == pytest.approx(0.4, abs=1e-12) and exact.se == pytest.approx(0.0, abs=1e-12)


def test_an_elasticity_of_one_is_the_proportional_adjustment_it_replaced():
    s = _summary("wagma", reference=0.09, per_round=1.5)
    median = 0.08
    old = {
        **s,
        "throughput_samples_per_s": s["throughput_samples_per_s"] * 0.09 / 0.08,
        "time_to_target_s": s["time_to_target_s"] * 0.08 / 0.09,
    }  # the rule before 2026-12-06
    assert drift.adjusted(s, median, None, 1.0).to_json() == pytest.approx(old)
    assert drift.adjusted(s, median, None).to_json() == old
    assert drift.adjusted(s, median, None, 0.0).to_json() == s  # no measured effect: nothing scaled
    half = drift.adjusted(s, median, None, 0.5)
    assert half.time_to_target_s == pytest.approx(s["time_to_target_s"] * math.sqrt(0.08 / 0.09))
    late = drift.adjusted(s, median, max_runtime_s=100.0, elasticity=0.5)  # 150 s raw: past the cap, a miss
    assert late.reached is False and late.time_to_target_s == s["time_to_target_s"]


def test_no_elasticity_without_enough_trials_or_a_reference_varying_within_an_optimizer():
    one_each = [[_summary("wagma", 0.08, 1.0)], [_summary("sgp", 0.09, 1.1)]]
    assert drift.fit_elasticity(one_each) is None  # each optimizer's intercept takes its only trial
    flat = [
        [_summary("wagma", 0.08, 1.0), _summary("wagma", 0.08, 1.2)],
        [_summary("sgp", 0.09, 1.1), _summary("sgp", 0.09, 1.3)],
    ]
    assert drift.fit_elasticity(flat) is None
    three = [_summary("wagma", 0.08, 1.0), _summary("wagma", 0.09, 1.2), _summary("wagma", 0.1, 1.3)]
    assert drift.fit_elasticity([three[:2]]) is None  # a residual needs a third trial
    fit = drift.fit_elasticity([[*three, None, {**three[0], "rounds": 0}]])
    assert fit is not None and fit.trials == 3  # no summary, or no rounds: left out


def test_the_draws_are_equally_likely_slices_of_the_normal_law():
    draws = drift.elasticity_draws(drift.Elasticity(0.4, 0.1, 20, 2), k=4)
    normal = statistics.NormalDist(0.4, 0.1)
    assert [normal.cdf(e) for e in draws] == pytest.approx([0.125, 0.375, 0.625, 0.875])
    assert drift.elasticity_draws(drift.Elasticity(0.4, 0.0, 20, 2)) == [0.4] * drift.DRAWS


def _tuning(root: Path, groups: dict[str, list[dict]]) -> Path:
    """One study of seven trials per optimizer, as `wagma-bench tune` lays it out."""
    d = root / "drifting"
    trials = []
    for o, summaries in groups.items():
        for i, s in enumerate(summaries, 1):
            name = f"{o}_study1_trial{i}"
            trials.append(
                {
                    "name": name,
                    "combo": o,
                    "study": 1,
                    "trial": i,
                    "seed": i,
                    "params": {},
                    "overrides": [f"optimizer={o}"],
                    "gpus": 0,
                }
            )
            (d / "trials" / name).mkdir(parents=True)
            (d / "trials" / name / "summary.json").write_text(json.dumps(s))
    (d / "tune.json").write_text(
        json.dumps({"version": 1, "studies": 1, "trials_per_study": 7, "seed": 1, "trials": trials})
    )
    return d


def _claim(metric: str) -> Claim:
    return Claim(
        id="c",
        paper="p",
        says="s",
        condition="c",
        metric=metric,
        subject="wagma",
        comparators=("allreduce", "sgp"),
        measured={"tuning": "drifting"},
    )


@pytest.mark.parametrize("metric", ["throughput", "time_to_target"])
def test_where_drift_is_all_there_is_the_fitted_elasticity_removes_it(tmp_path, metric):
    """Seconds per round exactly speed * reference^0.4: scaled at the fitted elasticity every trial of an
    optimizer gets the same figure, and the speed-up is the ratio of the speeds with no spread left; the
    proportional rule (elasticity 1) would have left the drift's spread in."""
    groups = _made_up(seed=5, elasticity=0.4, noise=0.0)
    got = evaluate(_claim(metric), Sources(tunings={"drifting": _tuning(tmp_path, groups)}))["drift_adjusted"]
    assert got["elasticity"] == pytest.approx(0.4) and got["elasticity_se"] == pytest.approx(0, abs=1e-9)
    assert got["best_comparator"] == "sgp" and got["speedup"] == pytest.approx(1.8 / 1.6)
    assert got["interval"] == pytest.approx([1.8 / 1.6] * 2)
    median = statistics.median(s["reference_s"] for trials in groups.values() for s in trials)
    per_round = {o: c * median**0.4 for o, c in SPEED.items()}  # each optimizer at the median reference
    assert got["values"] == pytest.approx(
        {o: BATCH / v if metric == "throughput" else ROUNDS * v for o, v in per_round.items()}
    )


def test_the_drift_interval_mixes_the_laws_at_the_elasticitys_draws(tmp_path):
    """With noise, the interval is that of the equal mixture of the exact throughput laws at nine equally
    likely elasticities, recomputed here from the trials with the bootstrap's own pieces."""
    groups = _made_up(seed=7, elasticity=0.4, noise=0.08)
    d = _tuning(tmp_path, groups)
    got = evaluate(_claim("throughput"), Sources(tunings={"drifting": d}))["drift_adjusted"]
    refs = [s["reference_s"] for trials in groups.values() for s in trials]
    median = statistics.median(refs)
    normal = statistics.NormalDist(got["elasticity"], got["elasticity_se"])

    def law(o: str, e: float) -> intervals.Dist:
        return intervals.pooled_median(
            [[s["throughput_samples_per_s"] * (s["reference_s"] / median) ** e for s in groups[o]]]
        )

    laws = []
    for k in range(drift.DRAWS):
        e = normal.inv_cdf((k + 0.5) / drift.DRAWS)
        best = intervals.best_of([law("allreduce", e), law("sgp", e)], lower_is_better=False)
        laws.append(intervals.ratio(law("wagma", e), best))
    assert got["interval"] == pytest.approx(list(intervals.interval(intervals.mixture(laws))))
    e = got["elasticity"]
    scaled = {
        o: statistics.median(
            s["throughput_samples_per_s"] * (s["reference_s"] / median) ** e for s in groups[o]
        )
        for o in groups
    }
    assert got["speedup"] == pytest.approx(scaled["wagma"] / max(scaled["allreduce"], scaled["sgp"]))


def test_tunes_drift_adjusted_score_is_on_the_same_ruler(tmp_path):
    """`tune`'s tuning.json (and so its table and `report`'s) scales by the same fitted elasticity as
    `claims`: where drift is all there is, every optimizer's drift-adjusted score is its speed at the median
    reference."""
    groups = _made_up(seed=5, elasticity=0.4, noise=0.0)
    result = tuning.score(_tuning(tmp_path, groups))
    median = statistics.median(s["reference_s"] for trials in groups.values() for s in trials)
    assert (
        result["drift_elasticity"]["value"] == pytest.approx(0.4)
        and result["drift_elasticity"]["trials"] == 21
    )
    for e in result["results"]:
        assert e["drift_adjusted"]["score_s"] == pytest.approx(ROUNDS * SPEED[e["optimizer"]] * median**0.4)
