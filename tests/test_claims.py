"""`wagma-bench claims`: the exact bootstrap against hand-computed cases and brute-force enumeration, the
verdict rule on hand-made cases, the claims file, the command end to end on a tiny fixture, the README's
verdicts and docs/claims.md's table against what the command makes of the committed results, and every
speed-up the README's and docs/claims.md's prose quotes against the committed claims.json."""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest

from tests.cli_util import load_script
from wagma_bench.analysis import intervals
from wagma_bench.analysis.claims import (
    CLAIMS_FILE,
    decide,
    find_sources,
    load_claims,
    make_claims,
    measure,
    summary_table,
)
from wagma_bench.analysis.claims_pages import BLOCKS, README_BLOCK, TABLE, verdict_summary
from wagma_bench.analysis.tuning import load_trials, optimizer_changes, score_combo, trial_finished
from wagma_bench.cli.claims import main
from wagma_bench.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
INF = math.inf


# --- the exact two-stage bootstrap -----------------------------------------------------------------------


def test_one_study_best_of_two_by_hand():
    # two trials (10, 20): a resample misses the 10 only when it draws the 20 twice: 1/4
    assert intervals.tuned_score([[10, 20]]) == pytest.approx({10.0: 0.75, 20.0: 0.25})


def test_three_single_trial_studies_by_hand():
    # the median of 3 draws from {10, 20, 30}: 10 when at least two draws are 10, 3 (1/3)^2 (2/3) + (1/3)^3 =
    # 7/27
    dist = intervals.tuned_score([[10], [20], [30]])
    assert dist == pytest.approx({10.0: 7 / 27, 20.0: 13 / 27, 30.0: 7 / 27})
    assert intervals.interval(dist) == (10.0, 30.0)
    assert intervals.interval(dist, level=0.4) == (
        20.0,
        20.0,
    )  # the 30% and 70% quantiles: CDF 7/27, then 20/27


def test_even_number_of_studies_by_hand():
    # two single-trial studies (10, 30): the median of two draws is 10, 20 (one of each) or 30
    assert intervals.tuned_score([[10], [30]]) == pytest.approx({10.0: 0.25, 20.0: 0.5, 30.0: 0.25})
    # a missed study: (10 + inf) / 2 is inf, as tune's own score counts it
    assert intervals.tuned_score([[10], [INF]]) == pytest.approx({10.0: 0.25, INF: 0.75})


@pytest.mark.parametrize("studies,trials", [(1, 3), (2, 2), (3, 3), (4, 2), (5, 1)])
def test_exact_distribution_equals_brute_force_enumeration(studies, trials):
    """The independent oracle: every resample of studies, then of each drawn study's trials, enumerated."""
    rng = random.Random(studies * 10 + trials)
    times = [[rng.choice([12.0, 15.0, 20.0, 31.0, INF]) for _ in range(trials)] for _ in range(studies)]
    counts: dict[float, int] = {}
    for drawn in itertools.product(range(studies), repeat=studies):
        per_study = [list(itertools.product(times[s], repeat=trials)) for s in drawn]
        for picks in itertools.product(*per_study):
            m = statistics.median(min(p) for p in picks)
            counts[m] = counts.get(m, 0) + 1
    total = sum(counts.values())
    exact = intervals.tuned_score(times)
    assert set(exact) == set(counts)
    for v, c in counts.items():
        assert exact[v] == pytest.approx(c / total, abs=1e-12)


def _pooled_median_by_enumeration(values: list[list[float]]) -> dict[float, float]:
    """The independent oracle of a throughput's law: every two-stage resample (studies, then each drawn
    study's trials) enumerated, and the median of all the trials it drew."""
    law: dict[float, float] = {}
    for drawn in itertools.product(range(len(values)), repeat=len(values)):
        per_study = [list(itertools.product(values[s], repeat=len(values[s]))) for s in drawn]
        # each drawn study is one of S equally likely; its resamples are equally likely among themselves
        weight = len(values) ** -len(values) / math.prod(len(p) for p in per_study)
        for picks in itertools.product(*per_study):
            m = statistics.median(v for p in picks for v in p)
            law[m] = law.get(m, 0.0) + weight
    return law


@pytest.mark.parametrize("shape", [(3,), (2, 2), (3, 3), (2, 3), (3, 2), (1, 2, 2), (2, 1, 3), (4, 1)])
def test_pooled_median_equals_brute_force_enumeration(shape):
    """Odd and even pools, and studies of unequal size (a trial not finished): the pool's size then varies."""
    rng = random.Random(sum(shape) * 7 + len(shape))
    values = [[rng.choice([280.0, 300.0, 310.0, 330.0, 350.0]) for _ in range(o)] for o in shape]
    oracle = _pooled_median_by_enumeration(values)
    exact = intervals.pooled_median(values)
    assert set(exact) == set(oracle)
    for v, p in oracle.items():
        assert exact[v] == pytest.approx(p, abs=1e-12)


def test_throughput_interval_is_the_declared_two_stage_bootstrap(tmp_path):
    """A throughput is resampled as a time is: studies, then trials (the one-stage bootstrap of the pooled
    trials, which this suite used before, gives another law whenever the studies differ)."""
    studies = [[300.0, 340.0, 310.0], [280.0, 285.0, 290.0], [350.0, 355.0, 330.0]]
    d = tmp_path / "resnet_paper"
    trials = []
    for s, study in enumerate(studies, 1):
        for o, tp in enumerate(study, 1):
            name = f"wagma_study{s}_trial{o}"
            trials.append(
                {
                    "name": name,
                    "combo": "wagma",
                    "study": s,
                    "trial": o,
                    "seed": len(trials) + 1,
                    "params": {},
                    "overrides": [],
                    "gpus": 0,
                }
            )
            (d / "trials" / name).mkdir(parents=True)
            (d / "trials" / name / "summary.json").write_text(
                json.dumps({"status": "completed", "optimizer": "wagma", "throughput_samples_per_s": tp})
            )
    (d / "tune.json").write_text(
        json.dumps({"version": 1, "studies": 3, "trials_per_study": 3, "seed": 1, "trials": trials})
    )
    got = measure(d, "throughput")["wagma"]
    oracle = _pooled_median_by_enumeration(studies)
    assert got.value == statistics.median(v for s in studies for v in s)
    assert set(got.dist) == set(oracle)
    for v, p in oracle.items():
        assert got.dist[v] == pytest.approx(p, abs=1e-12)
    assert got.interval == intervals.interval(oracle)


def test_a_failed_trial_scores_as_tune_scores_it(tmp_path):
    """A final metric is scored by tune's own per-trial rule (tuning.trial_cost): a trial that failed counts
    as no result, whatever best metric it logged before failing, in the claim as in `tune`'s score."""
    d = tmp_path / "transformer_budget"
    runs = {"wagma_study1_trial1": ("completed", 0.5), "wagma_study1_trial2": ("failed", 0.9)}
    trials = [
        {
            "name": name,
            "combo": "wagma",
            "study": 1,
            "trial": o,
            "seed": o,
            "params": {},
            "overrides": [],
            "gpus": 0,
        }
        for o, name in enumerate(runs, 1)
    ]
    for name, (status, best) in runs.items():
        (d / "trials" / name).mkdir(parents=True)
        (d / "trials" / name / "summary.json").write_text(
            json.dumps({"status": status, "optimizer": "wagma", "target": None, "best_metric": best})
        )
    (d / "tune.json").write_text(
        json.dumps({"version": 1, "studies": 1, "trials_per_study": 2, "seed": 1, "trials": trials})
    )
    got = measure(d, "final_metric")["wagma"]
    # a resample that draws the failed trial twice has no result: its best metric is -inf
    assert got.value == 0.5 and got.dist == pytest.approx({0.5: 0.75, -INF: 0.25})
    _, combos, summaries = load_trials(d)
    assert score_combo(combos["wagma"], summaries, None)["score_metric"] == got.value  # tune's own score
    paired = load_script(ROOT / "reproduce" / "claims" / "paired.py")
    assert paired.costs(d, "final_metric") == {
        "wagma": {(1, 1): -0.5, (1, 2): INF}
    }  # reproduce/claims/paired.py


def test_ratio_best_of_and_both_missed():
    assert intervals.ratio({10.0: 0.5, 20.0: 0.5}, {10.0: 1.0}) == pytest.approx({1.0: 0.5, 2.0: 0.5})
    assert intervals.ratio({INF: 1.0}, {INF: 1.0}) == {1.0: 1.0}  # both missed: a tie
    assert intervals.ratio({INF: 1.0}, {10.0: 1.0}) == {INF: 1.0}
    best = intervals.best_of([{10.0: 0.5, 30.0: 0.5}, {20.0: 1.0}], lower_is_better=True)
    assert best == pytest.approx({10.0: 0.5, 20.0: 0.5})


# --- the verdict rule --------------------------------------------------------------------------------------


def test_verdict_rule_on_hand_made_cases():
    assert decide((1.1, 1.4), 1.0, [])[0] == "holds"
    assert decide((0.6, 0.9), 1.0, [])[0] == "does not hold"
    assert decide((0.9, 1.2), 1.0, [])[0] == "inconclusive"
    assert decide((1.0, 1.2), 1.0, [])[0] == "inconclusive"  # touching the threshold is not above it
    assert decide((0.96, 0.99), 0.95, [])[0] == "holds"  # a claim's own threshold
    # a missing comparator: above is not enough, below is (one more comparator can only lower the speed-up)
    verdict, reason = decide((1.1, 1.4), 1.0, ["sgp"])
    assert verdict == "inconclusive" and "sgp" in reason
    assert decide((0.6, 0.9), 1.0, ["sgp"])[0] == "does not hold"
    assert decide(None, 1.0, ["dpsgd"]) == ("inconclusive", "no measurement of dpsgd")


def test_a_final_metric_compared_as_a_difference():
    """subject - best comparator, the best drawn inside the resample: near-zero metrics stay meaningful."""
    from wagma_bench.analysis.claims import Measurement, speedup

    def m(name, value, dist):
        return Measurement(name, value, dist, (1, 1), 1, 1, None, None)

    subject = m("wagma", 0.6, {0.5: 0.5, 0.7: 0.5})
    others = {"allreduce": m("allreduce", 0.6, {0.6: 1.0}), "sgp": m("sgp", 0.7, {0.0: 0.5, 0.8: 0.5})}
    sp = speedup(subject, others, lower_is_better=False, compare="difference")
    # best of (0.6) and (0 or 0.8): 0.6 or 0.8, each 1/2; the difference: -0.1, 0.1, -0.3, -0.1
    assert sp.interval == pytest.approx((-0.3, 0.1))
    assert sp.best == "sgp" and sp.value == pytest.approx(0.6 - 0.7)  # the point values
    assert speedup(subject, {"allreduce": others["allreduce"]}, False, "ratio").interval == pytest.approx(
        (0.5 / 0.6, 0.7 / 0.6)
    )


# --- the claims file ----------------------------------------------------------------------------------------


def test_committed_claims_cover_the_papers():
    claims = {c.id: c for c in load_claims()}
    metrics = {(c.measured["tuning"].split("_")[0], c.metric) for c in claims.values()}
    assert {
        ("resnet", "throughput"),
        ("resnet", "time_to_target"),
        ("transformer", "time_to_target"),
        ("transformer", "final_metric"),
        ("ddppo", "throughput"),
        ("ddppo", "final_metric"),
    } <= metrics
    assert claims["rl-throughput-1024"].predicted["world_size"] == 1024
    assert any(
        c.subject == "local_sgd" and c.comparators == ("allreduce",) for c in claims.values()
    )  # PR-SGD


def test_committed_sources_follow_the_protocol():
    """The claims' protocol, read from the committed trials themselves: every claim's source was tuned
    interleaved (consecutive trials by start time change optimizer at least half the time), every trial has
    its speed reference, at least three sources are at AlgoPerf's 5 studies x 5 trials with every trial
    finished, and claims.json carries a drift-adjusted speed-up with its interval and its tuning's fitted
    elasticity for every claim."""
    tunings = find_sources(committed_source_dirs()).tunings
    at_5x5 = set()
    for tune_dir in {tunings[claim.measured["tuning"]] for claim in load_claims()}:  # each source once
        plan, combos, summaries = load_trials(tune_dir)
        assert len(combos) >= 2 and optimizer_changes(tune_dir, combos) >= 0.5, f"{tune_dir}: not interleaved"
        assert all(trial_finished(s) for s in summaries.values()), f"{tune_dir}: a trial did not finish"
        assert all((s.reference_s or 0) > 0 for s in summaries.values()), (
            f"{tune_dir}: a trial lacks a reference"
        )
        if plan["studies"] >= 5 and plan["trials_per_study"] >= 5:
            at_5x5.add(tune_dir)
    assert len(at_5x5) >= 3
    committed = json.loads((ROOT / "reproduce/claims/claims.json").read_text())["claims"]
    assert {r["id"] for r in committed} == {c.id for c in load_claims()}
    for r in committed:
        drift = r["drift_adjusted"]  # a percentile interval need not hold its point: both present, ordered
        assert math.isfinite(drift["speedup"]) and drift["interval"][0] <= drift["interval"][1], r["id"]
        # scaled by the drift's measured effect: the tuning's fitted elasticity, with its standard error
        assert math.isfinite(drift["elasticity"]) and drift["elasticity_se"] > 0, r["id"]


def test_reading_the_claims_imports_no_torch():
    """``wagma-bench claims`` checks the claims' optimizers against the torch-free specs (the launcher's own
    check): reading the claims file imported torch for a list of names (2.2 of its 2.8 CPU-seconds)."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom wagma_bench.analysis.claims import load_claims\n"
        "load_claims()\nprint('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr[-2000:]


@pytest.mark.parametrize(
    "change,message",
    [
        ({"metric": "bleu"}, "metric='bleu' is not allowed; one of time_to_target"),
        ({"subject": "nesterov"}, "optimizer 'nesterov' is not registered"),
        ({"colour": "red"}, "unknown key(s) colour"),
        ({"predicted": {"simulate": "rl"}}, "predicted needs simulate, world_size and assumptions"),
        ({"compare": "log"}, "compare='log' is not allowed; one of ratio, difference"),
        ({"compare": "difference"}, "compare=difference is for metric=final_metric"),
    ],
)
def test_a_bad_claim_is_refused_naming_it(tmp_path, change, message):
    good = {
        "id": "c1",
        "paper": "p",
        "says": "s",
        "condition": "c",
        "metric": "throughput",
        "subject": "wagma",
        "comparators": ["allreduce"],
        "measured": {"tuning": "t"},
    }
    path = tmp_path / "claims.yaml"
    path.write_text(json.dumps({"claims": [{**good, **change}]}))
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        load_claims(path)
    assert "claim c1" in str(err.value)


def test_a_claims_file_that_is_not_yaml_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "claims.yaml"
    path.write_text("claims:\n  - id: x: y\n")
    assert main([str(tmp_path), "--claims", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}: not valid YAML" in err[0]


# --- end to end on a tiny fixture --------------------------------------------------------------------------


def _tuning(
    root: Path, name: str, times: dict[str, list[list[float | None]]], throughput: dict[str, float]
) -> Path:
    """A tuning directory as `wagma-bench tune` writes it: tune.json and each trial's summary.json
    (None: a trial that has not finished)."""
    d = root / name
    trials = []
    for opt, studies in times.items():
        for s, study in enumerate(studies, 1):
            for o, t in enumerate(study, 1):
                trial = f"{opt}_study{s}_trial{o}"
                trials.append(
                    {
                        "name": trial,
                        "combo": opt,
                        "study": s,
                        "trial": o,
                        "seed": len(trials) + 1,
                        "params": {},
                        "overrides": [f"optimizer={opt}"],
                        "gpus": 0,
                    }
                )
                if t is None:
                    continue
                run = d / "trials" / trial
                run.mkdir(parents=True)
                (run / "summary.json").write_text(
                    json.dumps(
                        {
                            "status": "completed" if math.isfinite(t) else "time_limit",
                            "optimizer": opt,
                            "workload": "resnet",
                            "world_size": 4,
                            "imbalance": "paper",
                            "reached": math.isfinite(t),
                            "time_to_target_s": t if math.isfinite(t) else None,
                            "compute_imbalance": 1.5,
                            "throughput_samples_per_s": throughput[opt] + o,
                            "best_metric": 0.9,
                        }
                    )
                )
    (d / "tune.json").parent.mkdir(parents=True, exist_ok=True)
    (d / "tune.json").write_text(
        json.dumps(
            {
                "version": 1,
                "studies": len(next(iter(times.values()))),
                "trials_per_study": 3,
                "seed": 1,
                "max_runtime_s": 150.0,
                "trials": trials,
            }
        )
    )
    return d


def _claims_file(tmp_path: Path) -> Path:
    path = tmp_path / "claims.yaml"
    base = {"paper": "WAGMA-SGD", "says": "faster", "condition": "stragglers", "subject": "wagma"}
    path.write_text(
        json.dumps(
            {
                "claims": [
                    {
                        **base,
                        "id": "fast",
                        "metric": "time_to_target",
                        "comparators": ["allreduce", "sgp"],
                        "measured": {"tuning": "resnet_paper", "here": "ResNet-20"},
                        "predicted": {"simulate": "resnet50", "world_size": 64, "assumptions": "Daint"},
                    },
                    {
                        **base,
                        "id": "slower-than-sgp",
                        "metric": "throughput",
                        "comparators": ["sgp"],
                        "measured": {"tuning": "resnet_paper"},
                    },
                    {
                        **base,
                        "id": "missing-one",
                        "metric": "time_to_target",
                        "comparators": ["allreduce", "dpsgd"],
                        "measured": {"tuning": "resnet_paper"},
                    },
                    {
                        **base,
                        "id": "no-data",
                        "metric": "time_to_target",
                        "comparators": ["allreduce"],
                        "measured": {"tuning": "transformer"},
                    },
                ]
            }
        )
    )
    return path


def test_claims_end_to_end_on_a_tiny_fixture(tmp_path, capsys):
    results = tmp_path / "results"
    _tuning(
        results,
        "resnet_paper",
        {
            "wagma": [[30, 32, 35], [31, 33, INF], [29, 36, 40]],
            "allreduce": [[70, 72, 80], [66, 75, INF], [71, 73, 90]],
            "sgp": [[60, 65, 62], [61, 64, 68], [59, 70, None]],  # one trial not finished: left out
        },
        throughput={"wagma": 400.0, "allreduce": 300.0, "sgp": 500.0},
    )
    sim = results / "paper-scale" / "resnet50"
    sim.mkdir(parents=True)
    (sim / "predictions.json").write_text(
        json.dumps(
            [
                {"optimizer": o, "world_size": p, "throughput": tp, "time_to_target_s": 1e6 / tp}
                for o, tp in (("wagma", 2000.0), ("allreduce", 1000.0), ("sgp", 1600.0))
                for p in (16, 64)
            ]
        )
    )

    # simulate --interval's file: three replicates, and the spread knob along which WAGMA-SGD's time ties
    # SGP's
    def at64(wagma, sgp):
        return {
            "64": {
                "wagma": {"time_to_target_s": wagma},
                "allreduce": {"time_to_target_s": 1000.0},
                "sgp": {"time_to_target_s": sgp},
            }
        }

    (sim / "interval.json").write_text(
        json.dumps(
            {
                "replicates": 3,
                "resampled": ["a new seed"],
                "predictions": [at64(500, 600), at64(450, 650), at64(520, 500)],
                "sensitivity": [
                    {
                        "knob": "spread",
                        "says": "the spread were times",
                        "value": f,
                        "factor": True,
                        "base": 1.0,
                        "predicted": at64(500 * f, 625),
                    }
                    for f in (0.5, 1.0, 2.0)
                ],
            }
        )
    )
    out = tmp_path / "claims"
    readme, page = tmp_path / "README.md", tmp_path / "claims-page.md"
    readme.write_text("# A\n\n<!-- claims:begin -->\nold verdicts\n<!-- claims:end -->\n\nthe rest\n")
    page.write_text("# B\n\n<!-- claims_table:begin -->\n<!-- claims_table:end -->\n")  # not filled yet
    args = [str(results), "--out", str(out), "--claims", str(_claims_file(tmp_path))]
    args += ["--readme", str(readme), "--readme", str(page)]
    assert main(args) == 2  # sgp_study3_trial3 did not finish: refused unless allowed
    assert "1 of its 27 planned trials did not finish: sgp_study3_trial3" in capsys.readouterr().err
    assert main([*args, "--allow-missing"]) == 0
    said = capsys.readouterr()
    assert "4 claims (1 holds, 1 does not hold, 2 inconclusive)" in said.out
    assert "warning: " in said.err and "measured without them (--allow-missing)" in said.err
    got = {c["id"]: c for c in json.loads((out / "claims.json").read_text())["claims"]}

    fast = got["fast"]
    assert fast["verdict"] == "holds"
    assert fast["measured"]["best_comparator"] == "sgp"
    assert fast["measured"]["speedup"] == pytest.approx(
        statistics.median([60, 61, 59]) / statistics.median([30, 31, 29])
    )
    lo, hi = fast["measured"]["interval"]
    assert 1 < lo <= fast["measured"]["speedup"] <= hi
    sgp = fast["measured"]["optimizers"]["sgp"]
    assert (sgp["finished"], sgp["planned"]) == (8, 9)
    assert fast["predicted"]["speedup"] == pytest.approx(2000 / 1600)  # times: 1e6/1600 (sgp) over 1e6/2000
    assert fast["predicted"]["best"] == "sgp"
    # the interval: percentiles of each replicate's best-comparator time over WAGMA-SGD's; the speed-up 625 /
    # (500 f) is 1.25 at f = 1 and 0.625 at f = 2: linear between them, it ties at f = 1.4
    assert fast["predicted"]["interval"] == pytest.approx(
        list(np.percentile([600 / 500, 650 / 450, 500 / 520], [2.5, 97.5]))
    )
    assert fast["predicted"]["flip"] == "ties if the spread were times 1.4"

    assert got["slower-than-sgp"]["verdict"] == "does not hold"
    assert got["missing-one"]["verdict"] == "inconclusive"
    assert got["missing-one"]["measured"]["missing"] == ["dpsgd"]
    assert got["no-data"]["verdict"] == "inconclusive" and "not measured" in got["no-data"]["reason"]
    text = (out / "claims.md").read_text()
    assert "1 hold, 1 do not hold, 2 inconclusive (of 4)" in text
    assert "| `fast` |" in text and "**holds**" in text
    assert "| 3 x 3 (sgp: 8 of 9 trials) |" in text  # the headline says what was measured, not the plan
    table = text[text.index("| claim |") : text.index("\n\n", text.index("| claim |"))]
    assert page.read_text() == f"# B\n\n<!-- claims_table:begin -->\n{table}\n<!-- claims_table:end -->\n"
    # the fixture's trials are evaluated off an eval grid (old ruler), and one removal turns `fast` (fragile)
    verdicts = (
        "- **Holds** (1 of 4): old ruler: `fast` (fragile).\n"
        "- **Does not hold** (1 of 4): old ruler: `slower-than-sgp`.\n"
        "- **Inconclusive** (2 of 4): `no-data` (old ruler: `missing-one`)."
    )
    assert (
        readme.read_text() == f"# A\n\n<!-- claims:begin -->\n{verdicts}\n<!-- claims:end -->\n\nthe rest\n"
    )


@pytest.mark.parametrize(
    "marks, said",
    [
        (  # claims.json before robustness and rulers: no marks
            {},
            (
                "- **Holds** (1 of 4): `a`.\n- **Does not hold** (1 of 4): `b`.\n"
                "- **Inconclusive** (2 of 4): `c`, `d`."
            ),
        ),
        (
            {
                "b": {"robustness": {"fragile": True, "leave_one_out": [0.1]}, "ruler": "current"},
                "a": {"robustness": {"fragile": False}, "ruler": "current"},
                "d": {"ruler": "old"},
            },
            (
                "- **Holds** (1 of 4): `a`.\n- **Does not hold** (1 of 4): `b` (fragile).\n"
                "- **Inconclusive** (2 of 4): `c` (old ruler: `d`)."
            ),
        ),
        (
            {
                "a": {"ruler": "old", "robustness": {"fragile": True}},
                "c": {"ruler": "old"},
                "d": {"ruler": "old"},
            },
            (
                "- **Holds** (1 of 4): old ruler: `a` (fragile).\n- **Does not hold** (1 of 4): `b`.\n"
                "- **Inconclusive** (2 of 4): old ruler: `c`, `d`."
            ),
        ),
    ],
    ids=["no-marks", "fragile-and-old-ruler", "old-ruler-only"],
)
def test_the_readme_verdicts_mark_a_fragile_claim_and_list_the_old_rulers_apart(marks, said):
    verdicts = {"a": "holds", "b": "does not hold", "c": "inconclusive", "d": "inconclusive"}
    results = [{"id": cid, "verdict": v, **marks.get(cid, {})} for cid, v in verdicts.items()]
    assert verdict_summary(results) == said
    assert "none" in verdict_summary(results[1:]).splitlines()[0]  # no claim holds: said, not left out


def test_two_sources_of_one_name_are_refused(tmp_path):
    for where in ("a", "b"):
        _tuning(tmp_path / where, "resnet_paper", {"wagma": [[30.0, 31.0, 32.0]]}, {"wagma": 1.0})
    with pytest.raises(ConfigError, match="two tuning directories named 'resnet_paper'"):
        find_sources([tmp_path])


def test_claims_refuses_a_planted_link_and_leaves_its_target(tmp_path, capsys):
    results = tmp_path / "results"
    _tuning(results, "resnet_paper", {"wagma": [[30.0, 31.0, 32.0]]}, {"wagma": 1.0})
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.md"
    victim.write_text("keep me\n")
    (out / "claims.md").symlink_to(victim)
    assert main([str(results), "--out", str(out), "--claims", str(_claims_file(tmp_path))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{out / 'claims.md'} is a symbolic link (to {victim})" in err[0]
    assert victim.read_text() == "keep me\n" and (out / "claims.md").is_symlink()


@pytest.mark.parametrize(
    "damage", ["", '{"version": 1, "studies": 3, "tri', "[1, 2]", '{"trials": [{"name": 1}]}']
)
def test_a_damaged_tuning_plan_is_refused_in_one_line_naming_it(tmp_path, capsys, damage):
    results = tmp_path / "results"
    tuning = _tuning(results, "resnet_paper", {"wagma": [[30.0, 31.0, 32.0]]}, {"wagma": 1.0})
    (tuning / "tune.json").write_text(damage)
    out = tmp_path / "out"
    assert main([str(results), "--out", str(out), "--claims", str(_claims_file(tmp_path))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{tuning / 'tune.json'}" in err[0] and "damaged" in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("readme_text", [None, "# no markers here\n"])
def test_a_readme_without_its_block_is_refused_before_anything_is_written(tmp_path, capsys, readme_text):
    results = tmp_path / "results"
    _tuning(results, "resnet_paper", {"wagma": [[30.0, 31.0, 32.0]]}, {"wagma": 1.0})
    out = tmp_path / "out"
    out.mkdir()
    (out / "claims.md").write_text("earlier\n")
    readme = tmp_path / "README.md"
    if readme_text is not None:
        readme.write_text(readme_text)
    assert (
        main(
            [
                str(results),
                "--out",
                str(out),
                "--claims",
                str(_claims_file(tmp_path)),
                "--readme",
                str(readme),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(readme) in err[0], err
    assert (
        sorted(p.name for p in out.iterdir()) == ["claims.md"]
        and (out / "claims.md").read_text() == "earlier\n"
    )
    assert readme_text is None or readme.read_text() == readme_text


def test_a_readme_that_is_a_link_is_refused_before_anything_is_written(tmp_path, capsys):
    """claims used to follow the link to read the README, write claims.json and claims.md into --out, and only
    then refuse to write the README through the link: --out held the new outputs beside an old README."""
    results = tmp_path / "results"
    _tuning(results, "resnet_paper", {"wagma": [[30.0, 31.0, 32.0]]}, {"wagma": 1.0})
    out = tmp_path / "out"
    out.mkdir()
    before = {"claims.md": b"earlier\n", "claims.json": b'{"version": 0}\n'}
    for name, data in before.items():
        (out / name).write_bytes(data)
    target = tmp_path / "someone-elses-README.md"
    target.write_text(README_TEXT := "# A\n\n<!-- claims:begin -->\nold table\n<!-- claims:end -->\n")
    readme = tmp_path / "README.md"
    readme.symlink_to(target)
    args = [str(results), "--out", str(out), "--claims", str(_claims_file(tmp_path)), "--readme", str(readme)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{readme} is a symbolic link (to {target})" in err[0], err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert target.read_text() == README_TEXT and readme.is_symlink()


RESNET = ROOT / "reproduce" / "tuning" / "results-2core-20261205" / "resnet_independent"


def test_a_source_missing_a_trial_is_refused_unless_allowed_then_counted_in_the_headline(tmp_path, capsys):
    """With one trial folder deleted, claims exited 0 without a word: the speed-up moved, and the headline
    still said 5 x 5 (only the detail table said 24/25)."""
    source = tmp_path / "results" / "resnet_independent"
    shutil.copytree(RESNET, source)
    gone = source / "trials" / "wagma_study2_trial3"
    shutil.rmtree(gone)
    out = tmp_path / "out"
    assert main([str(tmp_path / "results"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"wagma_study2_trial3 (study 2, trial 3: {gone} is missing)" in err[0], err
    assert "1 of its 175 planned trials" in err[0] and "--allow-missing" in err[0], err
    assert not out.exists()
    assert main([str(tmp_path / "results"), "--out", str(out), "--allow-missing"]) == 0
    lines = (out / "claims.md").read_text().splitlines()
    headline = [line for line in lines if line.startswith("| `resnet-")]
    assert len(headline) == 2, headline
    assert all("| 5 x 5 (wagma: 24 of 25 trials) |" in line for line in headline), headline


# --- the README's headline is the generated table -----------------------------------------------------------

SOURCES = ROOT / "reproduce" / "claims" / "sources"


def committed_source_dirs() -> list[Path]:
    """The committed results the README's table is generated from (`wagma-bench claims
    @reproduce/claims/sources`)."""
    return [ROOT / line.strip() for line in SOURCES.read_text().splitlines() if line.strip()]


def test_readme_headline_is_what_claims_makes_of_the_committed_results(tmp_path):
    results = make_claims(committed_source_dirs(), tmp_path / "claims", CLAIMS_FILE)
    for page, pattern, made in (
        ("README.md", README_BLOCK, verdict_summary(results)),
        ("docs/claims.md", BLOCKS[TABLE], summary_table(results)),
    ):
        block = pattern.search((ROOT / page).read_text())
        assert block, f"{page} has no {pattern.pattern} block"
        assert block.group(0) == pattern.sub(
            lambda m, made=made: m.group(1) + made + "\n" + m.group(2), block.group(0)
        ), (
            f"{page}'s claims block differs from what `wagma-bench claims` makes of the committed results: "
            "run wagma-bench claims @reproduce/claims/sources --out reproduce/claims --readme README.md "
            "--readme docs/claims.md"
        )
    committed = (ROOT / "reproduce" / "claims" / "claims.md").read_text()
    assert summary_table(results).strip() in committed, "reproduce/claims/claims.md is stale: regenerate it"


def test_one_command_makes_every_claims_data():
    """reproduce/claims/mini.sh runs every tuning and simulation the claims read (by their folder names)."""
    claims = load_claims()
    setups = set(
        re.findall(r"^\s+\[(\w+)\]=", (ROOT / "reproduce" / "tuning" / "mini.sh").read_text(), re.MULTILINE)
    )
    script = (ROOT / "reproduce" / "claims" / "mini.sh").read_text()
    for c in claims:
        assert c.measured["tuning"] in setups, (
            f"{c.id}: reproduce/tuning/mini.sh has no setup {c.measured['tuning']}"
        )
        assert re.search(rf"\b{c.measured['tuning']}\b", script), f"{c.id}: reproduce/claims/mini.sh skips it"
        if c.predicted:
            assert f'paper-scale/{c.predicted["simulate"]}"' in script, f"{c.id}: no simulation writes it"


# --- every speed-up the prose quotes is a committed one, or says that it was one ----------------------------

# "0.96x [0.92x, 1.02x]", "0.91x vs SGP [0.71x, 1.05x]", "-0.09, interval [-0.34, +0.02]"
FIGURE = re.compile(
    r"([+-]?\d+\.\d+x?)(?:,?\s+(?:vs\s+[\w-]+|interval))?\s+\[([+-]?\d+\.\d+x?),\s+([+-]?\d+\.\d+x?)\]"
)
# a figure whose sentence says it is a former one, up to the figure
FORMER = re.compile(r"\b(?:[Bb]efore|was|were|had|gave|block-tuned)\b")
PROSE = [ROOT / "README.md", ROOT / "docs" / "claims.md"]
# any other generated block of a page (<!-- NAME:begin --> ... <!-- NAME:end -->), checked by its own test
GENERATED_BLOCK = re.compile(r"<!-- ([\w-]+):begin -->.*?<!-- \1:end -->", re.DOTALL)


def quoted_figures(text: str) -> tuple[list[str], list[str]]:
    """The speed-ups with an interval that ``text`` quotes as current, and those it quotes as former (the part
    of their sentence before them says so). The generated blocks are left out: their own test checks
    them."""
    for pattern in BLOCKS.values():
        text = pattern.sub("", text)
    text = GENERATED_BLOCK.sub("", text)  # repeatability, spread, paired, power: each its own test
    current, former = [], []
    for m in FIGURE.finditer(text):
        start = max(
            text.rfind(". ", 0, m.start()),
            text.rfind(".\n", 0, m.start()),
            text.rfind("\n- ", 0, m.start()),
            text.rfind("\n\n", 0, m.start()),
        )
        figure = f"{m.group(1)} [{m.group(2)}, {m.group(3)}]"
        (former if FORMER.search(text[start + 1 : m.start()]) else current).append(figure)
    return current, former


def committed_figures() -> set[str]:
    """Each committed claim's speed-up and drift-adjusted speed-up, as claims.md prints them, and its
    paper-scale prediction with the prediction's interval."""
    from wagma_bench.analysis.claims import ends, shown, times

    figures = set()
    for r in json.loads((ROOT / "reproduce" / "claims" / "claims.json").read_text())["claims"]:
        for part in (r["measured"], r.get("drift_adjusted") or {}):
            if part.get("speedup") is not None:
                figures.add(f"{shown(r, part['speedup'])} {ends(r, part['interval'])}")
        predicted = r.get("predicted") or {}
        if predicted.get("interval"):
            lo, hi = predicted["interval"]
            figures.add(f"{times(predicted['speedup'])} [{times(lo)}, {times(hi)}]")
    return figures


def test_quoted_figures_are_told_apart_from_former_ones():
    text = (
        '- **Inconclusive: X** (was "holds"). It is 0.96x vs SGP [0.92x, 1.02x], drift-adjusted 0.95x '
        "[0.90x, 1.01x]. Before, block by block: 0.94x [0.85x, 1.01x]; a difference -0.09, interval "
        "[-0.34, +0.02] (at 3 x 3 it was -0.31 [-0.64, +0.31])."
    )
    assert quoted_figures(text) == (
        ["0.96x [0.92x, 1.02x]", "0.95x [0.90x, 1.01x]"],
        ["0.94x [0.85x, 1.01x]", "-0.09 [-0.34, +0.02]", "-0.31 [-0.64, +0.31]"],
    )


@pytest.mark.parametrize("path", PROSE, ids=lambda p: p.name)
def test_every_current_figure_the_prose_quotes_is_a_committed_claims(path):
    """Generated, not copied: a speed-up with its interval in the README's or docs/claims.md's prose is one
    that `wagma-bench claims` wrote to reproduce/claims/claims.json (measured, drift-adjusted or predicted),
    unless its sentence says it was a former one ("Before", "was", "had", "gave", "block-tuned" ahead of
    it)."""
    current, _ = quoted_figures(path.read_text())
    # the README's figures moved to docs/claims.md: that page must still quote some, or the pattern is broken
    assert current or path.name == "README.md", (
        f"{path.name} quotes no figure: the pattern no longer finds them"
    )
    committed = committed_figures()
    stale = [f for f in current if f not in committed]
    assert not stale, (
        f"{path.name} quotes {stale}, not in reproduce/claims/claims.json (regenerate the claims and "
        "update the prose, or say that the figure was a former one)"
    )


def test_tune_report_claims_and_paired_score_one_tuning_alike(tmp_path):
    """One scoring policy: a tuning with a missed trial, a failed one, unfinished ones and a study none of
    whose trials finished is scored the same by `tune` (tuning.json), the report's tuned table (its ratio to
    tuned Allreduce-SGD), `claims` and reproduce/claims/paired.py. `tune` counted an unfinished trial as a
    miss where `claims` left it out, so a study with none finished made tune's score infinite (25 s here, not
    22.5)."""
    import importlib.util

    from wagma_bench.analysis import claims as claims_lib
    from wagma_bench.analysis import scoring, tuning

    d = _tuning(
        tmp_path,
        "t",
        {
            "allreduce": [[20.0, 30.0], [25.0, None], [None, None]],
            "wagma": [[15.0, math.inf], [40.0, 18.0], [12.0, 14.0]],
        },
        {"allreduce": 100.0, "wagma": 110.0},
    )
    failed = d / "trials" / "wagma_study3_trial2" / "summary.json"
    failed.write_text(
        json.dumps(
            {**json.loads(failed.read_text()), "status": "failed", "reached": False, "time_to_target_s": None}
        )
    )
    expected = {"allreduce": statistics.median([20.0, 25.0]), "wagma": statistics.median([15.0, 18.0, 12.0])}

    tuned = {e["optimizer"]: e for e in tuning.score(d)["results"]}
    assert {o: e["score_s"] for o, e in tuned.items()} == expected
    rows = {r["optimizer"]: r for r in scoring.tuned_rows(list(tuned.values()))}
    assert rows["wagma"]["vs_tuned_allreduce"] == pytest.approx(expected["allreduce"] / expected["wagma"])
    assert {o: m.value for o, m in claims_lib.measure(d, "time_to_target").items()} == expected
    spec = importlib.util.spec_from_file_location("paired", ROOT / "reproduce" / "claims" / "paired.py")
    paired = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(paired)
    for optimizer, cost in paired.costs(d, "time_to_target").items():
        studies = sorted({s for s, _ in cost})
        draw = [(s, [t for t_s, t in cost if t_s == s]) for s in studies]
        assert paired.score(cost, draw) == expected[optimizer], optimizer
