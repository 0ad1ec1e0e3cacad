"""``wagma-bench tune``: search spaces, quasirandom points, AlgoPerf scoring, resume, the command end to
end."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli_util import BIN
from wagma_bench.analysis import tuning
from wagma_bench.campaign import tune
from wagma_bench.cli import tune as tune_cli
from wagma_bench.config import search_space
from wagma_bench.config.schema import as_recorded
from wagma_bench.errors import ConfigError

# --- search spaces ------------------------------------------------------------------------------------


def test_every_registered_optimizer_has_a_valid_search_space():
    """Walks the registry: a new optimizer without a space fails here with the file to add (the conformance
    test's piece, tests/test_conformance.py)."""
    from tests.test_conformance import missing
    from tests.test_conformance import search_space as space_piece

    problems = missing(space_piece)
    assert not problems, "\n".join(problems)


def _space_file(tmp_path, monkeypatch, text: str, name: str = "wagma") -> None:
    (tmp_path / f"{name}.yaml").write_text(text)
    monkeypatch.setattr(search_space, "SPACE_DIR", tmp_path)


BASE = "lr_multiplier: {low: 0.5, high: 2.0, scale: log}\nwarmup_fraction: {low: 0.0, high: 0.1}\n"


@pytest.mark.parametrize(
    "extra,message",
    [
        (
            "optimizer.tau: {low: 5, high: 5}\n",
            "optimizer.tau low=5 high=5 is an empty range; it must have low < high",
        ),
        ("optimizer.tua: {low: 2, high: 5}\n", "optimizer.tua: unknown key; valid keys: "),
        (
            "optimizer.tau: {low: 0, high: 5}\n",
            (
                "optimizer.tau=0 would be refused by the run config: optimizer.tau=0 is "
                "not allowed; it must be >= 1"
            ),
        ),
        (
            "optimizer.group_size: {choices: [2, 3]}\n",
            (
                "optimizer.group_size=3 would be refused by the run config: "
                "optimizer.group_size=3 is not allowed; it must be a power of two"
            ),
        ),
        (
            "optimizer.catch_up: {choices: [replay, later]}\n",
            "optimizer.catch_up='later' is not allowed; choose one",
        ),
        ("optimizer.tau: {low: 2, high: 5, step: 1}\n", "optimizer.tau.step: unknown field"),
        (
            "optimizer.tau: {choices: []}\n",
            "optimizer.tau.choices=[] is not allowed; it must be a non-empty list",
        ),
        ("train.lr: {low: 0.1, high: 0.2}\n", "train.lr: unknown key"),
        ("train.momentum: {low: 0.0, high: 1.0}\n", "train.momentum=1.0 would be refused by the run config"),
    ],
)
def test_a_bad_search_space_is_refused_up_front(tmp_path, monkeypatch, extra, message):
    _space_file(tmp_path, monkeypatch, BASE + extra)
    with pytest.raises(ConfigError) as err:
        search_space.load_space("wagma")
    assert message in str(err.value)
    assert str(err.value).startswith(f"search space {tmp_path}/wagma.yaml: ")


@pytest.mark.parametrize(
    "text,message",
    [
        ("warmup_fraction: {low: 0.0, high: 0.1}\n", "lr_multiplier not given"),
        (
            "lr_multiplier: {low: 0.5, high: 2.0}\nwarmup_fraction: {low: 0.0, high: 0.1}\n",
            "it must be log-uniform",
        ),
        (
            "lr_multiplier: {low: 0.0, high: 2.0, scale: log}\nwarmup_fraction: {low: 0.0, high: 0.1}\n",
            "lr_multiplier.low=0.0 is not allowed with scale: log",
        ),
        (
            "lr_multiplier: {low: 0.5, high: 2.0, scale: log}\nwarmup_fraction: {low: 0.0, high: 1.0}\n",
            "it must be in [0, 1)",
        ),
    ],
)
def test_the_required_dimensions_are_checked(tmp_path, monkeypatch, text, message):
    _space_file(tmp_path, monkeypatch, text)
    with pytest.raises(ConfigError) as err:
        search_space.load_space("wagma")
    assert message in str(err.value)


def test_an_optimizer_without_a_space_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(search_space, "SPACE_DIR", tmp_path)
    with pytest.raises(
        ConfigError, match=f"optimizer=sgp has no search space; add one to {tmp_path}/sgp.yaml"
    ):
        search_space.load_space("sgp")


# --- quasirandom points -------------------------------------------------------------------------------


def test_the_same_seed_draws_the_same_points_and_another_seed_others():
    space = search_space.load_space("wagma", check=False)
    a, b, c = (search_space.draw(space, 6, seed) for seed in (7, 7, 8))
    assert a == b and a != c
    for p in a:  # inside the declared space, with the declared types
        assert 0.25 <= p["lr_multiplier"] <= 4.0 and 0.0 <= p["warmup_fraction"] <= 0.1
        assert isinstance(p["optimizer.tau"], int) and 2 <= p["optimizer.tau"] <= 20
        assert p["optimizer.group_size"] in (None, 2)
    assert search_space.draw(space, 3, 7) == a[:3]  # a prefix of the same sequence


def test_integer_log_dimension_reaches_both_bounds():
    dim = search_space.Dimension("optimizer.tau", 2.0, 20.0, log=True, integer=True)
    assert dim.value(0.0) == 2 and dim.value(0.999999) == 20
    assert sorted({dim.value(i / 1000) for i in range(1000)}) == list(range(2, 21))


# --- scoring (AlgoPerf), against hand-computed cases ---------------------------------------------------


def _trials(values: list[list[float | None]], budget: bool = False) -> tuple[list[tuning.Trial], dict]:
    """Trials of S studies (rows) x O trials. By time: a value None missed the target. ``budget``
    (eval.target=null): each value is the trial's best metric, None a trial that failed (its metric, 0.9, must
    never count)."""
    trials, summaries = [], {}
    for s, row in enumerate(values, 1):
        for o, v in enumerate(row, 1):
            name = f"c_study{s}_trial{o}"
            trials.append(
                tuning.Trial(name, "c", s, o, len(trials) + 1, {"lr_multiplier": float(len(trials))}, [])
            )
            summaries[name] = (
                {
                    "status": "completed" if v is not None else "failed",
                    "target": None,
                    "target_metric": "success",
                    "reached": False,
                    "time_to_target_s": None,
                    "best_metric": 0.9 if v is None else v,
                }
                if budget
                else {"status": "completed", "reached": v is not None, "time_to_target_s": v}
            )
    return trials, summaries


def test_score_is_the_median_of_the_per_study_bests():
    trials, summaries = _trials([[30.0, 20.0], [50.0, None], [10.0, 40.0]])
    e = tuning.score_combo(trials, summaries, None)
    assert [s["best_time_s"] for s in e["studies"]] == [20.0, 50.0, 10.0]
    assert [s["trial"] for s in e["studies"]] == ["c_study1_trial2", "c_study2_trial1", "c_study3_trial1"]
    assert e["score_s"] == 20.0  # median(20, 50, 10)
    assert (e["reached"], e["trials"], e["unfinished"]) == (5, 6, 0)
    assert e["winner"]["trial"] == "c_study3_trial1" and e["winner"]["params"] == {"lr_multiplier": 4.0}


def test_a_study_that_missed_counts_as_infinite():
    trials, summaries = _trials([[None, None], [12.0, None], [8.0, 30.0]])
    e = tuning.score_combo(trials, summaries, None)
    assert [s["best_time_s"] for s in e["studies"]] == [None, 12.0, 8.0]
    assert e["score_s"] == 12.0  # median(inf, 12, 8) = 12


def test_most_studies_missing_make_the_score_infinite():
    trials, summaries = _trials([[None], [None], [5.0]])
    e = tuning.score_combo(trials, summaries, None)
    assert e["score_s"] is None and e["winner"]["trial"] == "c_study3_trial1"
    trials, summaries = _trials([[None], [5.0]])  # even S: half missing -> (5 + inf) / 2 = inf
    assert tuning.score_combo(trials, summaries, None)["score_s"] is None
    trials, summaries = _trials([[None], [None]])
    e = tuning.score_combo(trials, summaries, None)
    assert e["score_s"] is None and e["winner"] is None and e["reached"] == 0
    assert math.isinf(tuning.median_score([]))


def test_a_trial_past_max_runtime_counts_as_missing_and_an_unfinished_one_is_left_out():
    """A trial past the cap is a miss; one without a final summary is not scored (the policy claims share:
    tests/test_claims.py::test_tune_report_claims_and_paired_score_one_tuning_alike)."""
    trials, summaries = _trials([[30.0, 20.0], [50.0, 10.0]])
    e = tuning.score_combo(trials, summaries, 25.0)
    assert [s["best_time_s"] for s in e["studies"]] == [20.0, 10.0] and e["score_s"] == 15.0
    e = tuning.score_combo(trials, summaries, 15.0)
    assert [s["best_time_s"] for s in e["studies"]] == [None, 10.0] and e["score_s"] is None
    summaries["c_study2_trial2"] = None  # never ran (or killed before its summary)
    e = tuning.score_combo(trials, summaries, None)
    assert e["unfinished"] == 1 and [s["best_time_s"] for s in e["studies"]] == [20.0, 50.0]
    summaries["c_study2_trial1"] = None  # the whole study unfinished: left out, the score is study 1's
    e = tuning.score_combo(trials, summaries, None)
    assert [s["best_time_s"] for s in e["studies"]] == [20.0, None] and e["score_s"] == 20.0


def test_performance_profile_by_hand():
    from wagma_bench.analysis.scoring import performance_profile

    rows = [
        {"workload": w, "data": "d", "world_size": 4, "imbalance": "none", "optimizer": o, "score_s": s}
        for w, o, s in [
            ("a", "allreduce", 10.0),
            ("a", "wagma", 20.0),
            ("b", "allreduce", None),
            ("b", "wagma", 30.0),
        ]
    ]
    profiles, n = performance_profile(rows, taus=[1.0, 1.9, 2.0, 100.0])
    assert n == 2
    assert profiles["allreduce"] == ([1.0, 1.9, 2.0, 100.0], [0.5, 0.5, 0.5, 0.5])  # missed b: never counts
    assert profiles["wagma"][1] == [0.5, 0.5, 1.0, 1.0]  # best on b, 2x on a


def test_with_no_target_the_score_is_the_median_of_the_per_study_best_metrics():
    """A fixed-budget tuning (eval.target=null) is scored by the best metric, higher being better: before,
    every trial counted as missing the target, and the score was infinite."""
    trials, summaries = _trials([[0.50, 0.70], [0.40, None], [0.80, 0.60]], budget=True)
    e = tuning.score_combo(trials, summaries, None)
    assert e["scored_by"] == "best_metric" and "score_s" not in e
    assert [s["best_metric"] for s in e["studies"]] == [0.70, 0.40, 0.80]
    assert [s["trial"] for s in e["studies"]] == ["c_study1_trial2", "c_study2_trial1", "c_study3_trial1"]
    assert e["score_metric"] == 0.70  # median(0.70, 0.40, 0.80)
    assert (
        e["reached"] is None and e["winner"]["trial"] == "c_study3_trial1" and e["winner"]["metric"] == 0.80
    )
    # score() adds the workload's metric to the entry (from the trials' summaries)
    assert tuning.format_score({**e, "target_metric": "success"}) == ("0.7 success", "0.7, 0.4, 0.8")
    trials, summaries = _trials([[None], [None], [0.3]], budget=True)  # two studies without a metric: none
    e = tuning.score_combo(trials, summaries, None)
    assert e["score_metric"] is None and tuning.format_score(e)[0] == "none"
    assert tuning.outcome(summaries["c_study3_trial1"], None) == (
        "completed, best success 0.3 (no target: scored by the best metric)"
    )
    assert tuning.scored_by([{"target": 0.97}, None]) == tuning.scored_by([None]) == "time_to_target"


def test_a_budget_tuning_is_compared_with_tuned_allreduce_metric_over_metric():
    from wagma_bench.analysis.scoring import performance_profile, tuned_rows

    def entry(optimizer, metric):
        return {
            "combo": optimizer,
            "optimizer": optimizer,
            "workload": "ddppo",
            "data": "d",
            "world_size": 4,
            "imbalance": "none",
            "target_metric": "success",
            "scored_by": "best_metric",
            "score_metric": metric,
            "studies": [{"best_metric": metric}],
            "reached": None,
            "trials": 1,
            "winner": None,
        }

    rows = tuned_rows([entry("allreduce", 0.80), entry("wagma", 0.60), entry("sgp", None)])
    ratios = {r["optimizer"]: r["vs_tuned_allreduce"] for r in rows}
    # the row's metric over allreduce's; none for a row without a score
    assert ratios == {"allreduce": 1.0, "wagma": pytest.approx(0.75), "sgp": None}
    assert [r["score"] for r in rows] == ["0.8 success", "0.6 success", "none"] and rows[1][
        "reached"
    ] == "no target"
    profiles, _ = performance_profile(rows, taus=[1.0, 1.3, 1.4])
    assert profiles["wagma"][1] == [0.0, 0.0, 1.0]  # within a factor 4/3 of the best metric


def test_the_plan_partitions_points_into_studies_and_is_reproducible():
    args = tune.parse_args(
        [
            "optimizer=allreduce,wagma",
            "launcher.nproc=2",
            "tune.trials=3",
            "tune.studies=2",
            "tune.seed=5",
            "--out",
            "/nonexistent",
        ]
    )
    _, trials, _ = tune.make_plan(args)
    _, again, _ = tune.make_plan(args)
    assert [t.overrides for t in trials] == [t.overrides for t in again]
    wagma = [t for t in trials if t.combo == "wagma"]
    assert [(t.study, t.trial) for t in wagma] == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]
    points = search_space.draw(search_space.load_space("wagma", check=False), 6, 5)
    assert [t.params for t in wagma] == points  # study s holds points (s-1)*O .. s*O-1 of one sequence
    assert len({t.seed for t in wagma}) == 6
    assert "train.lr=" + str(float(f"{0.2 * points[0]['lr_multiplier']:.6g}")) in wagma[0].overrides


def _plan(combos: dict[str, int], studies: int, trials: int) -> list[tuning.Trial]:
    return [
        tuning.Trial(f"{c}_study{s}_trial{o}", c, s, o, 0, {}, [])
        for c, n in combos.items()
        if n
        for s in range(1, studies + 1)
        for o in range(1, trials + 1)
    ]


@pytest.mark.parametrize(
    "combos", [{"a": 1, "b": 1}, {"a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1, "g": 1}]
)
def test_trials_run_interleaved_round_by_round(combos):
    """Each trial once; round r is every combination's r-th trial (plan order) in a seeded order; never the
    same combination twice in a row; the same seed, the same order (a resumed tuning goes on where it
    stopped)."""
    plan = _plan(combos, studies=5, trials=5)
    order = tune.run_order(plan, seed=1)
    assert sorted(t.name for t in order) == sorted(t.name for t in plan)
    k = len(combos)
    for r in range(25):
        this_round = order[r * k : (r + 1) * k]
        assert sorted(t.combo for t in this_round) == sorted(combos)
        assert all((t.study - 1) * 5 + t.trial == r + 1 for t in this_round)
    assert all(a.combo != b.combo for a, b in itertools.pairwise(order))
    assert tune.run_order(plan, seed=1) == order
    others = [tune.run_order(plan, seed=s) for s in (2, 3, 4)]
    assert any(o != order for o in others)
    firsts = {tuple(t.combo for t in tune.run_order(plan, seed=s)[:k]) for s in range(1, 9)}
    assert len(firsts) > 1  # the order inside a round is drawn, not fixed


def test_uneven_combinations_still_interleave():
    plan = _plan({"a": 1}, 2, 3) + _plan({"b": 1}, 1, 2)
    order = [t.combo for t in tune.run_order(plan, seed=3)]
    assert sorted(order) == ["a"] * 6 + ["b"] * 2 and order[4:] == ["a", "a", "a", "a"]


def test_optimizer_changes_reads_the_trials_start_times(tmp_path):
    plan = _plan({"a": 1, "b": 1}, 1, 2)
    for t, start in zip(plan, [0, 2, 1, 3], strict=True):  # a1, a2, b1, b2 started at 0, 2, 1, 3: a b a b
        run = tmp_path / tuning.TRIALS / t.name
        run.mkdir(parents=True)
        (run / "events.jsonl").write_text(
            json.dumps({"key": "run_start", "time_ms": 1000.0 * start, "value": None, "metadata": {}}) + "\n"
        )
    combos = {"a": plan[:2], "b": plan[2:]}
    assert tuning.optimizer_changes(tmp_path, combos) == 1.0
    (tmp_path / tuning.TRIALS / plan[1].name / "events.jsonl").write_text(
        json.dumps({"key": "run_start", "time_ms": 500.0, "value": None, "metadata": {}}) + "\n"
    )
    assert tuning.optimizer_changes(tmp_path, combos) == pytest.approx(1 / 3)  # a a b b: one change in three


@pytest.mark.parametrize(
    "argv,message",
    [
        (["tune.trials=0", "--out", "x"], "tune.trials=0 is not allowed; it must be >= 1"),
        (
            ["tune.max_runtime_s=nan", "--out", "x"],
            "tune.max_runtime_s=nan is not allowed; it must be a finite number of seconds > 0",
        ),
        (
            ["tune.max_runtime_s=inf", "--out", "x"],
            "tune.max_runtime_s=inf is not allowed; it must be a finite number of seconds > 0",
        ),
        (["tune.budget=3", "--out", "x"], "tune.budget: unknown key; valid keys of tune: trials, studies"),
        (["tune.trials=2"], "--out DIR is required"),
        (["seed=3", "--out", "x"], "seed is set by tune"),
        (
            ["optimizer=wagma", "optimizer.tau=5", "--out", "x"],
            (
                "optimizer.tau=5: optimizer.tau is tuned by the search "
                "space wagma.yaml of optimizer=wagma; leave it out"
            ),
        ),
    ],
)
def test_bad_tune_arguments_are_refused(argv, message, capsys):
    assert tune_cli.main(argv) == 2
    assert message in capsys.readouterr().err


# --- imbalance ----------------------------------------------------------------------------------------


def test_compute_imbalance_by_hand(tmp_path):
    from wagma_bench.record.rundir import compute_imbalance

    (tmp_path / "steps").mkdir()
    rows = {0: [(1, 1.0, 0.0), (2, 1.0, 0.0), (3, 9.0, 0.0)], 1: [(1, 1.0, 2.0), (2, 1.0, 0.0)]}
    for rank, recs in rows.items():
        (tmp_path / "steps" / f"rank{rank}.jsonl").write_text(
            "".join(json.dumps({"local_step": s, "compute_s": c, "delay_s": d}) + "\n" for s, c, d in recs)
        )
    # step 1: ranks 1 and 3 -> 3 / 2 = 1.5; step 2: 1.0; step 3 only one rank logged: left out
    assert compute_imbalance(tmp_path) == 1.25
    assert compute_imbalance(tmp_path / "none") is None


# --- the command end to end (real runs) ----------------------------------------------------------------

# A reachable target (the embedded MNIST at 2 steps) so that trials score; 2 ranks, 2 steps each.
TINY = [
    "workload=resnet",
    "launcher.nproc=2",
    "train.max_rounds=2",
    "eval.every_rounds=2",
    "eval.target=0.05",
    "logger.progress=off",
]


def _tune(args, timeout=900, **kw):
    return subprocess.run(
        [str(BIN), "tune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        **kw,
    )


@pytest.mark.slow
def test_tiny_tune_then_report_then_rerun_trains_nothing(tmp_path, capsys):
    """allreduce and wagma, one study of one trial each (2 runs): tuning.json, the tuned report, a rerun
    that skips both, and simulate's convergence read from the tuning directory."""
    out = tmp_path / "tune"
    res = _tune([*TINY, "optimizer=allreduce,wagma", "tune.trials=1", "tune.studies=1", "--out", str(out)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[tune 1/2" in res.stdout and "[tune 2/2" in res.stdout
    result = json.loads((out / "tuning.json").read_text())
    by_opt = {e["optimizer"]: e for e in result["results"]}
    assert set(by_opt) == {"allreduce", "wagma"}
    for e in by_opt.values():
        assert e["workload"] == "resnet" and e["world_size"] == 2 and e["reached"] == 1
        assert (
            e["score_s"] == e["studies"][0]["best_time_s"] > 0 and e["winner"]["params"]["lr_multiplier"] > 0
        )
        assert e["compute_imbalance"] >= 1.0
    trial = out / "trials" / by_opt["wagma"]["winner"]["trial"]
    summary = json.loads((trial / "summary.json").read_text())
    assert summary["compute_imbalance"] >= 1.0  # every new summary.json has it
    for run in (out / "trials").iterdir():  # the speed reference, timed before and after each trial
        s = json.loads((run / "summary.json").read_text())
        assert (
            s["reference_s"] == pytest.approx(sum(s["reference_before_after_s"]) / 2) and s["reference_s"] > 0
        )
    assert result["median_reference_s"] > 0 and result["optimizer_changes"] == 1.0
    # one trial per combination leaves no residual to fit the drift's effect by: nothing is scaled
    assert result["drift_elasticity"] is None and all(e["drift_adjusted"] is None for e in result["results"])
    events = {p: p.read_bytes() for p in (out / "trials").glob("*/events.jsonl")}
    capsys.readouterr()
    # the same command again (in this process: a finished trial is skipped before any run starts)
    assert (
        tune_cli.main(
            [*TINY, "optimizer=allreduce,wagma", "tune.trials=1", "tune.studies=1", "--out", str(out)]
        )
        == 0
    )
    assert capsys.readouterr().out.count("finished earlier") == 2
    assert {p: p.read_bytes() for p in events} == events  # nothing trained twice
    from wagma_bench.cli.report import main as report_main

    assert report_main([str(out), "--out", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "## Tuned comparisons" in text and "against tuned allreduce" in text
    assert (tmp_path / "rep" / "tuned_performance_profile.png").stat().st_size > 0
    from wagma_bench.simulate.convergence import samples_to_target

    conv = samples_to_target([str(out)])
    assert set(conv) == {"allreduce", "wagma"} and all(v > 0 for v in conv.values())


def test_a_trials_configuration_is_its_whole_composition(tmp_path, monkeypatch):
    """make_plan composes each combination once and applies a trial's seed and point to a copy, as Hydra
    applies a command line's values after composing: every trial's checked configuration is the one Hydra
    composes from all its overrides (a group in a point, or an unknown key, is composed whole)."""
    argv = [
        "optimizer=allreduce,wagma",
        "launcher.nproc=2",
        "train.batch_size=8",
        "tune.trials=2",
        "tune.studies=1",
        "tune.max_runtime_s=30",
        "space.lr_multiplier.high=3",
        "--out",
        str(tmp_path),
    ]
    spec, trials, configs = tune.make_plan(tune.parse_args(argv))
    whole = tune._composed
    monkeypatch.setattr(
        tune, "_composed", lambda compose, overrides, name, *_: whole(compose, overrides, name)
    )
    assert tune.make_plan(tune.parse_args(argv)) == (spec, trials, configs) and len(configs) == 4
    assert {c.seed for c in configs.values()} == {1, 2} and {
        c.train.time_limit_s for c in configs.values()
    } == {30}


def test_another_tuning_into_the_same_directory_is_refused(tmp_path):
    out = str(tmp_path / "tune")
    args = tune.parse_args(
        ["optimizer=allreduce", "launcher.nproc=2", "tune.trials=1", "tune.studies=1", "--out", out]
    )
    spec, trials, _ = tune.make_plan(args)
    tune.write_plan(args, spec, trials, ["first"])
    tune.write_plan(args, spec, trials, ["same trials"])  # the same plan: a resume
    other = tune.parse_args(
        [
            "optimizer=allreduce",
            "launcher.nproc=2",
            "tune.trials=1",
            "tune.studies=1",
            "tune.seed=2",
            "--out",
            out,
        ]
    )
    spec, trials, _ = tune.make_plan(other)
    # the refusal names the first setting that differs, as recorded and as asked now (tune.seed: the points)
    with pytest.raises(
        ConfigError, match=r"another tuning \(tune.json: trial .*: (overrides|params)=.* there, .* now\)"
    ):
        tune.write_plan(other, spec, trials, ["other"])


def test_cluster_mode_renders_the_trials_as_a_sweep(tmp_path):
    out = tmp_path / "tune"
    assert (
        tune_cli.main(
            [
                "cluster=generic4",
                "gpus=4",
                "optimizer=allreduce,local_sgd",
                "tune.trials=2",
                "tune.studies=1",
                "--dry-run",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["runs"]) == 4 and all(r["run_dir"].startswith("trials/") for r in manifest["runs"])
    script = (out / manifest["jobs"][0]["script"]).read_text()
    assert "train.lr=" in script and "optimizer.sync_period=" in script
    result = tuning.score(out)  # nothing ran yet: every trial unfinished, every score infinite
    assert all(e["score_s"] is None and e["unfinished"] == 2 for e in result["results"])


@pytest.mark.long
def test_killed_tune_resumes_skips_finished_trials_and_trains_none_twice(tmp_path):
    """Two trials; the tune is SIGKILLed (launcher and ranks) while the second trains, after a checkpoint;
    the same command again skips the first and resumes the second from its checkpoint."""
    out = tmp_path / "tune"
    args = [
        "workload=resnet",
        "launcher.nproc=2",
        "train.max_rounds=40",
        "eval.every_rounds=20",
        "checkpoint.every_s=0",
        "logger.progress=off",
        "optimizer=allreduce",
        "tune.trials=2",
        "tune.studies=1",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        [str(BIN), "tune", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    second = out / "trials" / "allreduce_study1_trial2"
    deadline = time.monotonic() + 600
    while not (second / "checkpoint" / "latest").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the second trial never checkpointed"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    # the trial's launcher has a process group of its own: tune's death interrupts it (parent-death signal)
    _wait_until_no_process_names(second, timeout=120)
    first = out / "trials" / "allreduce_study1_trial1"
    first_events = (first / "events.jsonl").read_bytes()
    res = _tune(args)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "allreduce_study1_trial1: finished earlier" in res.stdout
    assert (first / "events.jsonl").read_bytes() == first_events
    keys = [json.loads(line)["key"] for line in (second / "events.jsonl").read_text().splitlines()]
    assert (keys.count("run_start"), keys.count("run_resume"), keys.count("run_stop")) == (1, 1, 1)
    steps = [
        json.loads(line)["local_step"] for line in (second / "steps" / "rank0.jsonl").read_text().splitlines()
    ]
    assert steps == list(range(1, 41))  # every step once
    assert json.loads((out / "tuning.json").read_text())["results"][0]["trials"] == 2


@pytest.mark.long
def test_the_done_when_command(tmp_path):
    """The documented example (docs/tuning.md): 2 optimizers x 2 studies x 2 trials = 8 trials of 60 steps,
    then the report."""
    out = tmp_path / "tune"
    res = _tune(
        [
            "workload=resnet",
            "optimizer=allreduce,wagma",
            "tune.trials=2",
            "tune.studies=2",
            "train.max_rounds=60",
            "logger.progress=off",
            "--out",
            str(out),
        ],
        timeout=3000,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(list((out / "trials").glob("*/summary.json"))) == 8
    result = json.loads((out / "tuning.json").read_text())
    assert {e["optimizer"] for e in result["results"]} == {"allreduce", "wagma"}
    assert all(len(e["studies"]) == 2 for e in result["results"])
    rep = subprocess.run(
        [str(BIN), "report", str(out), "--out", str(tmp_path / "rep")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert rep.returncode == 0 and "## Tuned comparisons" in (tmp_path / "rep" / "report.md").read_text()


# --- search-space overrides on the command line --------------------------------------------------------


def test_space_overrides_change_the_tuned_range_and_are_checked_like_the_file(tmp_path):
    args = tune.parse_args(
        [
            "workload=resnet",
            "optimizer=allreduce,wagma",
            "tune.trials=4",
            "tune.studies=1",
            "space.lr_multiplier.high=2",
            "space.optimizer.tau={low: 2, high: 5}",
            "--out",
            str(tmp_path),
        ]
    )
    _, trials, _ = tune.make_plan(args)
    lrs = [t.params["lr_multiplier"] for t in trials]
    assert max(lrs) <= 2 and min(lrs) >= 0.25
    assert {t.params["optimizer.tau"] for t in trials if t.combo == "wagma"} <= {2, 3, 4, 5}
    assert all("optimizer.tau" not in t.params for t in trials if t.combo == "allreduce")  # only where it is


# streaming DiLoCo's tuning (docs/outer-optimizers.md): H, the outer rate and momentum; F = 2, tau = 1 fixed
STREAMING = [
    "optimizer=local_sgd",
    "optimizer.outer=nesterov",
    "optimizer.fragments=2",
    "optimizer.fragment_delay=1",
    "space.optimizer.sync_period={choices: [4, 8, 16]}",
    "space.optimizer.outer_lr={low: 0.1, high: 1.0, scale: log}",
    "space.optimizer.outer_momentum={low: 0.0, high: 0.95}",
]


def test_streaming_diloco_is_tuned_over_h_and_its_outer_step_with_every_trial_valid(tmp_path):
    """Every drawn H keeps torchft's rules with F = 2 and tau = 1 (F divides H, tau < H / F): each trial's
    config is composed and checked, and carries the outer step and fragments it was given."""
    args = tune.parse_args(
        ["workload=transformer", *STREAMING, "tune.trials=3", "tune.studies=3", "--out", str(tmp_path)]
    )
    _, trials, configs = tune.make_plan(args)
    assert len(trials) == 9 and {t.params["optimizer.sync_period"] for t in trials} <= {4, 8, 16}
    assert all(
        0.1 <= t.params["optimizer.outer_lr"] <= 1.0 and 0 <= t.params["optimizer.outer_momentum"] <= 0.95
        for t in trials
    )
    for config in configs.values():
        opt = config.optimizer
        assert (opt.outer, opt.fragments, opt.fragment_delay) == ("nesterov", 2, 1)


@pytest.mark.parametrize(
    "override,message",
    [
        ("space.lr_multiplier.low=8", "lr_multiplier low=8 high=4.0 is an empty range"),
        ("space.optimizer.tau.high=0", "optimizer.tau low=2 high=0 is an empty range"),
        ("space.optimizer.tau={low: 0, high: 3}", "optimizer.tau=0 would be refused by the run config"),
        (
            "space.lr_multiplier.colour=2",
            "space.lr_multiplier.colour: unknown field colour; valid fields: choices, high",
        ),
        (
            "space.optimizer.sync_period.high=9",
            "space.optimizer.sync_period.high=9: no tuned search space has the dimension",
        ),
        ("space.lr_multiplier.high", "a search-space override is space.KEY.FIELD=VALUE"),
    ],
)
def test_bad_space_overrides_are_refused_before_any_trial(override, message, tmp_path, capsys):
    assert (
        tune_cli.main(
            [
                "workload=resnet",
                "optimizer=wagma",
                "tune.trials=1",
                "tune.studies=1",
                override,
                "--out",
                str(tmp_path / "t"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "t" / "trials").exists()


def _processes_naming(path: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(path) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _wait_until_no_process_names(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _processes_naming(path):
        assert time.monotonic() < deadline, f"processes of {path} still run: {_processes_naming(path)}"
        time.sleep(0.2)


def test_ctrl_c_on_tune_stops_its_trial_at_a_checkpoint_and_exits_130_in_one_line(tmp_path):
    """SIGINT to tune alone while a trial trains: tune forwards it to the trial, whose ranks checkpoint and
    stop; tune waits for them, says what to do in one line and exits 130; nothing of the trial runs on."""
    out = tmp_path / "tune"
    args = [
        "workload=resnet",
        "launcher.nproc=2",
        "train.batch_size=8",  # the rounds until the signal's checkpoint cost a quarter of 32's
        "train.max_rounds=100000",
        "eval.every_rounds=100000",
        "logger.progress=off",
        "optimizer=allreduce",
        "tune.trials=2",
        "tune.studies=1",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        [str(BIN), "tune", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    first = out / "trials" / "allreduce_study1_trial1"
    try:
        deadline = time.monotonic() + 300
        while not (
            (first / "steps" / "rank0.jsonl").exists() and (first / "steps" / "rank0.jsonl").stat().st_size
        ):
            assert time.monotonic() < deadline and proc.poll() is None, "the first trial never trained"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "interrupted in trial allreduce_study1_trial1" in err, err[-3000:]
    assert not _processes_naming(first)
    summary = json.loads((first / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert (first / "checkpoint" / "latest").exists()
    assert not (out / "trials" / "allreduce_study1_trial2").exists()  # the next trial never started


def test_a_committed_tuning_is_still_the_same_runs_under_todays_plan():
    """Keys added since (streaming DiLoCo's fragments, the Transformer's shuffle_seed:
    config/identity.ADDED_KEYS) do not make the committed trials other runs: the same tune command would skip
    every one of them. Local SGD, whose section gained three keys, and Allreduce-SGD of the 2026-12-02
    Transformer tuning."""
    from wagma_bench.campaign.tune import make_plan, parse_args
    from wagma_bench.record.rundir import finished_summary

    folder = (
        Path(__file__).resolve().parents[1]
        / "reproduce"
        / "tuning"
        / "results-2core-20261202"
        / "transformer"
    )
    args = parse_args(
        [
            "workload=transformer",
            "tune.max_runtime_s=150",
            "optimizer=allreduce,local_sgd",
            "tune.trials=3",
            "tune.studies=3",
            "logger.progress=off",
            "--out",
            str(folder),
        ]
    )
    _, trials, configs = make_plan(args)
    assert len(trials) == 18
    assert [
        t.name
        for t in trials
        if finished_summary(folder / "trials" / t.name, as_recorded(configs[t.name])) is None
    ] == []
