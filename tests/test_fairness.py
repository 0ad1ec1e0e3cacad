"""The report a researcher hands on: every column from what the runs recorded, the comparison asked for
(``--reference``, the workload's throughput unit, wait shares, the seeds' interval), and fair comparisons
flagged when they are not: a series whose ranks waited for a core is marked contended, beside its row and in
the line at the top, and the speed-ups it touches are named."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_report import reach_at, write_run
from wagma_bench.analysis import fairness, report, run_records
from wagma_bench.analysis.step_figures import step_figures
from wagma_bench.cli import report as report_cli
from wagma_bench.record.steps import StepRecord


def _steps(d: Path, per_rank: dict[int, dict]) -> None:
    """Replace a run's step logs: per rank, the fields every one of its 20 steps logs."""
    for old in (d / "steps").glob("rank*.jsonl"):
        old.unlink()
    for rank, fields in per_rank.items():
        recs = [{"local_step": s, "round": s, "t": 0.2 * s, **fields} for s in range(1, 21)]
        (d / "steps" / f"rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_wait_is_communication_beyond_the_least_rank_of_the_step():
    """Rank 1 spends 0.1 s a step longer in communication than rank 0: that is its wait; rank 0 waited for
    nobody. The share is the wait over the rank's training clock."""
    recs = {
        0: [StepRecord(local_step=s, t=0.2 * s, compute_s=0.15, comm_s=0.05) for s in range(1, 11)],
        1: [StepRecord(local_step=s, t=0.2 * s, compute_s=0.05, comm_s=0.15) for s in range(1, 11)],
    }
    fig = step_figures(recs)
    assert fig.wait_shares == pytest.approx({0: 0.0, 1: 1.0 / 2.0})  # 10 x 0.1 s of 2.0 s
    assert fig.wait_share_mean == pytest.approx(0.25) and fig.wait_share_max == pytest.approx(0.5)
    assert fig.components[1] == pytest.approx(
        {"compute": 0.05, "delay": 0.0, "comm": 0.05, "wait": 0.1, "p10": 0.2, "p90": 0.2}
    )
    assert fig.contention is None  # no CPU time recorded: no claim either way


def test_flags_say_their_factor_and_their_noise():
    assert fairness.contended([(1.1, None), (None, None)]) is None
    assert (
        fairness.contended([(1.1, None), (2.4, None)])
        == "contended: wall/CPU compute 2.40x > 1.5x (1 of 2 run(s))"
    )
    # four ranks on two cores wait about 2x by design: judged against that, not against a core each
    assert fairness.contended([(2.1, 2.0), (2.9, 2.0)]) is None
    assert fairness.contended([(2.1, 2.0), (3.2, 2.0)]) == (
        "contended: wall/CPU compute 3.20x at 2 ranks per CPU, 1.60x what that placement explains > 1.5x "
        "(1 of 2 run(s))"
    )
    # more CPUs than ranks explains nothing: judged as a core each; a run without its CPUs recorded likewise
    assert fairness.contended([(1.6, 0.5)]) == "contended: wall/CPU compute 1.60x > 1.5x (1 of 1 run(s))"
    assert fairness.contended([(2.1, None)]) == "contended: wall/CPU compute 2.10x > 1.5x (1 of 1 run(s))"
    # 30% apart, each series' own readings within 2%: measured under different conditions
    said = fairness.different_conditions([0.13, 0.131], [0.1, 0.102], "allreduce")
    assert (
        said == "different conditions: speed reference 0.1305 s against allreduce's 0.101 s (1.29x, noise 5%)"
    )
    # as far apart, but one series' own readings spread by 40%: within the noise
    assert fairness.different_conditions([0.11, 0.154], [0.1, 0.102], "allreduce") is None
    assert fairness.different_conditions([0.13], [], "allreduce") is None


@pytest.fixture
def contended_pair(tmp_path) -> Path:
    """Two series of the Transformer, 2 seeds each: local SGD's ranks got half a core (wall compute twice
    their CPU compute), Allreduce-SGD's had theirs; the summaries predate compute_imbalance."""
    root = tmp_path / "runs"
    for opt, cpu in (("allreduce", 0.1), ("local_sgd", 0.05)):
        for seed in (1, 2):
            d = write_run(root / f"{opt}_{seed}", opt, seed, reach_at(10.0 * seed), workload="transformer")
            fields = {"compute_s": 0.1, "compute_cpu_s": cpu, "delay_s": 0.0, "samples": 32}
            _steps(d, {0: {**fields, "comm_s": 0.02}, 1: {**fields, "comm_s": 0.06, "delay_s": 0.1}})
    return root


def test_a_contended_series_is_flagged_beside_its_row_and_at_the_top(contended_pair, tmp_path, capsys):
    """Exactly the series whose ranks waited for a core is flagged, with its factor; the line at the top says
    so and the comparison names the speed-up it touches; figures only summary.json would hold are filled
    from the step records (compute imbalance: (0.2 / 0.15) each step; wall / CPU compute 2.00)."""
    out = tmp_path / "R"
    assert report_cli.main([str(contended_pair), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    rows = {r["optimizer"]: r for r in csv.DictReader((out / "comparison.csv").open())}
    assert rows["local_sgd"]["flags"] == "contended: wall/CPU compute 2.00x > 1.5x (2 of 2 run(s))"
    assert rows["allreduce"]["flags"] == ""
    assert float(rows["allreduce"]["compute_imbalance"]) == pytest.approx(0.2 / 0.15, abs=1e-4)
    # rank 1 waits 0.04 s a step for rank 0 (20 x 0.04 s of its 4 s), rank 0 for nobody: 0.2 and 0, mean 0.1
    assert float(rows["local_sgd"]["wait_share"]) == pytest.approx(0.1)
    assert float(rows["local_sgd"]["wait_share_worst"]) == pytest.approx(0.2)
    assert "Fairness: **1 of 2 series flagged**: local_sgd (P=4, imbalance=none): contended" in md
    assert "The ratios they touch: local_sgd vs allreduce (P=4, imbalance=none)." in md
    assert "Speed-ups against `allreduce` (the default, Allreduce-SGD); throughput in target tokens/s." in md
    assert "| throughput (target tokens/s) |" in md and "| speed-up vs allreduce |" in md
    for run in json.loads("[" + ",".join(p.read_text() for p in contended_pair.rglob("summary.json")) + "]"):
        assert "compute_imbalance" not in run  # an old run's summary: the report recomputed it


def test_reference_is_chosen_and_said(contended_pair, tmp_path, capsys):
    """``--reference local_sgd``: speed-ups against local SGD, said above the table and in its headers; an
    optimizer with no run here: exit 2 in one line."""
    out = tmp_path / "R"
    assert report_cli.main([str(contended_pair), "--out", str(out), "--reference", "local_sgd"]) == 0
    md = (out / "report.md").read_text()
    assert "Speed-ups against `local_sgd` (asked for with --reference)" in md
    assert "| speed-up vs local_sgd |" in md
    rows = {r["optimizer"]: r for r in csv.DictReader((out / "comparison.csv").open())}
    assert float(rows["local_sgd"]["speedup_throughput"]) == 1.0
    capsys.readouterr()
    assert report_cli.main([str(contended_pair), "--out", str(out), "--reference", "sgp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        (
            "wagma-bench report: error: --reference='sgp' is not allowed: no run of it here; the optimizers "
            "run: allreduce, local_sgd"
        )
    ]


def test_without_allreduce_the_first_series_is_the_reference_and_said(tmp_path):
    for opt in ("wagma", "local_sgd"):
        write_run(tmp_path / "runs" / opt, opt, 1, reach_at(8.0))
    assert report_cli.main([str(tmp_path / "runs"), "--out", str(tmp_path / "R")]) == 0
    md = (tmp_path / "R" / "report.md").read_text()
    assert "Speed-ups against `local_sgd` (the first series: Allreduce-SGD has no run in this group" in md
    assert "throughput in images/s" in md


def test_the_seeds_interval_needs_three_seeds():
    assert report.ttt_interval([5.0, 6.0]) is None
    assert report.ttt_interval([5.0, 6.0, 9.0]) == (5.0, 9.0)
    lo, hi = report.ttt_interval([5.0] * 9 + [float("inf")])
    assert lo == hi == 5.0  # one missed seed in ten barely moves the median


# --- fresh runs: one series slowed by a CPU-bound process beside it ---------------------------------------

RUN = [sys.executable, "-m", "wagma_bench", "run"]
TINY = [
    "launcher.nproc=2",
    "train.max_rounds=30",
    "eval.every_rounds=15",
    "eval.target=0.05",
    "logger.progress=off",
]
BUSY = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end: pass\n"


def _run(tmp: Path, name: str, optimizer: str) -> Path:
    out = subprocess.run(
        [*RUN, *TINY, f"optimizer={optimizer}", f"hydra.run.dir={tmp / 'runs' / name}"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return tmp / "runs" / name


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """Allreduce-SGD run beside three CPU-bound processes on this machine's cores, then local SGD alone."""
    tmp = tmp_path_factory.mktemp("fresh")
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(3)]
    try:
        _run(tmp, "loaded", "allreduce")
    finally:
        for p in busy:
            p.kill()
            p.wait(timeout=30)
    _run(tmp, "alone", "local_sgd")
    return tmp / "runs"


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.alone
def test_the_series_beside_a_cpu_bound_process_is_flagged_and_only_it(fresh, tmp_path):
    """The Done-when test: the loaded series is marked contended, the other not; the alone run reported by
    itself raises no flag at all."""
    assert report_cli.main([str(fresh), "--out", str(tmp_path / "R")]) == 0
    rows = {r["optimizer"]: r for r in csv.DictReader((tmp_path / "R" / "comparison.csv").open())}
    assert rows["allreduce"]["flags"].startswith("contended: wall/CPU compute"), rows["allreduce"]
    assert rows["local_sgd"]["flags"] == "", rows["local_sgd"]
    assert report_cli.main([str(fresh / "alone"), "--out", str(tmp_path / "A")]) == 0
    assert "Fairness: no series flagged (1 checked" in (tmp_path / "A" / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.alone
def test_every_column_of_fresh_runs_is_filled_and_equal_to_their_summaries(fresh, tmp_path):
    """Each run's row in runs.csv holds its summary.json's figures (compute imbalance and wall/CPU compute
    included) and every column that a run's records can fill is filled."""
    assert report_cli.main([str(fresh), "--out", str(tmp_path / "R")]) == 0
    table = {r["run"]: r for r in csv.DictReader((tmp_path / "R" / "runs.csv").open())}
    same = {
        "status": "status",
        "reached": "reached",
        "time_to_target_s": "time_to_target_s",
        "rounds": "rounds",
        "final_metric": "final_metric",
        "best_metric": "best_metric",
        "throughput": "throughput_samples_per_s",
        "train_s": "train_s",
        "restarts": "restarts",
        "compute_imbalance": "compute_imbalance",
        "contention": "compute_contention",
    }
    for name in ("loaded", "alone"):
        row = next(r for k, r in table.items() if k.endswith(name))
        summary = json.loads((fresh / name / "summary.json").read_text())
        for column, key in same.items():
            assert summary[key] is not None, key
            assert row[column] == str(summary[key]), (column, row[column], summary[key])
        for column in ("wait_share", "wait_share_worst", "world_size", "seed", "optimizer"):
            assert row[column] not in ("", "None"), column
    loaded = run_records.load_run(fresh / "loaded")
    assert loaded.steps is not None and set(loaded.steps.components) == {0, 1}
    # its placement: two ranks on the CPUs this process may use (the launcher binds no rank)
    summary = json.loads((fresh / "alone" / "summary.json").read_text())
    assert summary["ranks_per_cpu"] == round(2 / len(os.sched_getaffinity(0)), 4)


def _tuning(root: Path, trials: dict[str, list[dict]]) -> Path:
    """A tuning directory whose trials (per combination, their summaries) have finished."""
    plan = []
    for combo, summaries in trials.items():
        for i, summary in enumerate(summaries, start=1):
            name = f"{combo}_study1_trial{i}"
            plan.append(
                {
                    "name": name,
                    "combo": combo,
                    "study": 1,
                    "trial": i,
                    "seed": i,
                    "params": {},
                    "overrides": [],
                }
            )
            (root / "trials" / name).mkdir(parents=True)
            (root / "trials" / name / "summary.json").write_text(
                json.dumps({"status": "completed", **summary})
            )
    plan_file = {"version": 1, "trials": plan, "studies": 1, "trials_per_study": 2}  # as tune writes it
    (root / "tune.json").write_text(json.dumps(plan_file))
    return root


def test_tune_summary_flags_the_combination_that_waited_or_drifted(tmp_path):
    """``tune``'s fairness line: wagma's trials waited for a core; local SGD's ran on a 30% slower machine
    than Allreduce-SGD's (readings 2% apart within each); the ratios against allreduce that they touch."""
    from wagma_bench.analysis.tuning import fairness_line

    ok = {"compute_contention": 1.1}
    tune = _tuning(
        tmp_path / "T",
        {
            "allreduce": [{**ok, "optimizer": "allreduce", "reference_before_after_s": [0.1, 0.102]}] * 2,
            "wagma": [{"optimizer": "wagma", "compute_contention": 2.2, "reference_s": 0.101}] * 2,
            "local_sgd": [{**ok, "optimizer": "local_sgd", "reference_before_after_s": [0.13, 0.131]}] * 2,
        },
    )
    assert fairness_line(tune) == (
        "Fairness: **2 of 3 combinations flagged**: wagma: contended: wall/CPU compute 2.20x > 1.5x (2 of 2 "
        "run(s)); local_sgd: different conditions: speed reference 0.1305 s against allreduce's 0.101 s "
        "(1.29x, noise 5%). The ratios they touch: wagma vs allreduce, local_sgd vs allreduce."
    )


def test_a_tuning_of_more_ranks_than_cores_is_judged_against_its_placement(tmp_path):
    """Four ranks on two cores read about 2x by themselves: a tuning whose trials recorded that placement is
    not flagged for it; one whose trials waited 1.7x more than it explains is, and says both figures."""
    from wagma_bench.analysis.tuning import fairness_line

    placed = {"ranks_per_cpu": 2.0, "reference_s": 0.1}
    tune = _tuning(
        tmp_path,
        {
            "allreduce": [{**placed, "optimizer": "allreduce", "compute_contention": 2.1}] * 2,
            "wagma": [{**placed, "optimizer": "wagma", "compute_contention": 3.4}] * 2,
        },
    )
    assert fairness_line(tune) == (
        "Fairness: **1 of 2 combinations flagged**: wagma: contended: wall/CPU compute 3.40x at 2 ranks per "
        "CPU, 1.70x what that placement explains > 1.5x (2 of 2 run(s)). The ratios they touch: wagma vs "
        "allreduce."
    )


def test_ranks_per_cpu_is_the_most_ranks_a_usable_cpu_of_any_host_was_given():
    from wagma_bench.record.events import ranks_per_cpu
    from wagma_bench.record.provenance import _host_cpus

    # two hosts: a's four ranks may use CPUs 0-1 between them (bound two and two), b's two ranks CPU 3 only
    placement = [
        ("a", 0, 0b01),
        ("a", 1, 0b01),
        ("a", 2, 0b10),
        ("a", 3, 0b10),
        ("b", 0, 0b1000),
        ("b", 1, 0b1000),
    ]
    cpus = _host_cpus(placement)
    assert cpus == {"a": 2, "b": 1}
    assert ranks_per_cpu({"rank_hosts": [h for h, _, _ in placement], "host_cpus": cpus}) == 2.0
    assert ranks_per_cpu({"rank_hosts": ["a", "a"], "host_cpus": {"a": 16}}) == 0.125
    assert ranks_per_cpu({"rank_hosts": ["a"]}) is None  # logged before the CPUs were recorded


def test_a_claims_speedup_on_contended_trials_is_flagged():
    from wagma_bench.analysis.claims import Measurement, claim_flags, fairness_line

    def measured(name, contention, refs):
        return Measurement(name, 1.0, {1.0: 1.0}, (1, 1), 1, 1, None, None, None, contention, refs)

    subject = measured("wagma", ((1.1, None), (1.2, None)), (0.1, 0.1))
    flags = claim_flags(subject, {"allreduce": measured("allreduce", ((1.9, None),), (0.1,)), "sgp": None})
    assert flags == ["allreduce contended: wall/CPU compute 1.90x > 1.5x (1 of 1 run(s))"]
    assert claim_flags(subject, {"allreduce": measured("allreduce", ((1.0, None),), (0.1,))}) == []
    # trials of four ranks on two cores that waited no more than that placement explains: no flag
    assert claim_flags(subject, {"allreduce": measured("allreduce", ((2.1, 2.0),), (0.1,))}) == []
    line = fairness_line([{"id": "c1", "fairness": flags}, {"id": "c2", "fairness": []}])
    assert line.startswith("Fairness: **1 of 2 claims flagged**: c1: allreduce contended")
    assert line.endswith("The ratios they touch: c1's speed-up.")


def test_simulate_names_each_inputs_origin_and_the_contended_runs_it_rests_on(contended_pair):
    """``simulate --compute-from``'s line names the runs whose spread includes waiting for a core."""
    from wagma_bench.simulate.outputs import contended_runs, missing_target_line, origins_line
    from wagma_bench.simulate.request import Request

    flagged = contended_runs([str(contended_pair)])
    assert flagged == {"local_sgd_1": 2.0, "local_sgd_2": 2.0}
    req = Request(compute_from=[str(contended_pair)], cluster="generic8", convergence=[str(contended_pair)])
    assert origins_line(req, False, flagged) == (
        "Inputs: cost model: the workload's preset (defaults); network: cluster profile generic8; compute "
        f"spread: --compute-from {contended_pair}; contended (wall/CPU compute above 1.5x), so their spread "
        "includes waiting for a core: local_sgd_1 (2.00x), local_sgd_2 (2.00x); samples to target: "
        f"--convergence {contended_pair}."
    )
    rows = [
        {"optimizer": "wagma", "time_to_target_s": None},
        {"optimizer": "allreduce", "time_to_target_s": 3},
    ]
    assert missing_target_line(rows, req) == (
        "Time to target: — for wagma: no run of theirs under --convergence reached its target (give runs "
        "that did, or samples_to_target=N)."
    )
