"""``report --wandb-report`` as W&B users review it: a W&B Report and saved workspace built with
wandb-workspaces over real offline runs (two optimizers, 2 ranks each, and a tiny tuning), checked against
what those runs wrote in their own W&B records (``run-<id>.wandb``, read with W&B's protobuf definitions):
every metric, summary and config key a panel or run set names was logged, each run set's filters select runs,
and the spec round-trips through wandb-workspaces' models. No key, no network (a listener counts any
attempt)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_report import Listener, offline_env, reach_at, write_run
from tests.test_wandb_offline import of_type, wandb_records

RUN = [sys.executable, "-m", "wagma_bench"]
TINY = [
    "launcher.nproc=2",
    "train.max_rounds=8",
    "train.batch_size=8",  # the workload's 32 a rank is compute no assertion needs
    "eval.every_rounds=8",  # one evaluation a run (250 images a rank): what the keys and the target need
    "logger=wandb",
    "logger.progress=off",
    "eval.target=0.05",
]  # a target the tiny runs reach, so time_to_target_s is in their summaries


def _call(args: list[str], env: dict, cwd: Path, command: str = "") -> subprocess.CompletedProcess:
    out = subprocess.run(
        [*RUN, *([command] if command else []), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory):
    """Two optimizers' runs and a tuning (1 study x 2 trials), logged offline, then the report over them."""
    tmp = tmp_path_factory.mktemp("wandb_report")
    listener = Listener()
    env = offline_env(tmp, listener)
    # two single runs, not one multirun: runs outside a sweep are what the report selects by their W&B ids
    for opt in ("allreduce", "wagma"):
        _call(
            [
                "run",
                *TINY,
                f"optimizer={opt}",
                "logger.wandb.per_rank_step_times=true",
                f"hydra.run.dir={tmp / 'runs' / opt}",
            ],
            env,
            tmp,
        )
    _call(
        ["tune", "optimizer=wagma", "tune.trials=2", "tune.studies=1", *TINY, "--out", str(tmp / "tune")],
        env,
        tmp,
    )
    t0 = time.monotonic()
    out = subprocess.run(
        [*RUN, "report", str(tmp / "runs"), str(tmp / "tune"), "--wandb-report", "--out", str(tmp / "R")],
        env={**env, "WANDB_MODE": "offline"},
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    took = time.monotonic() - t0
    listener.close()
    return {
        "tmp": tmp,
        "out": out,
        "took": took,
        "net": listener.connections,
        "records": [wandb_records(p) for p in sorted(tmp.rglob("offline-run-*/run-*.wandb"))],
    }


def logged_keys(records: list[list]) -> dict[str, set]:
    """What the runs logged, section by section as a report names them: history, summary, config, run."""
    logged: dict[str, set] = {"history": set(), "summary": set(), "config": set(), "run": set()}
    for recs in records:
        for run in of_type(recs, "run"):
            logged["config"] |= {item.key for item in run.config.update}
            logged["run"] |= ({"group"} if run.run_group else set()) | {"name"}  # name: W&B's run id
        logged["history"] |= {
            i.key or "/".join(i.nested_key) for h in of_type(recs, "history") for i in h.item
        }
        logged["summary"] |= {
            i.key or "/".join(i.nested_key) for s in of_type(recs, "summary") for i in s.update
        }
    return logged


def run_values(records: list) -> dict:
    """One run's config values and group, as its run set filters compare them."""
    (run,) = of_type(records, "run")[:1]
    return {
        **{("config", i.key): json.loads(i.value_json) for i in run.config.update},
        ("run", "group"): run.run_group,
        ("run", "name"): run.run_id,
    }


def selected(runset: dict, runs: list[dict]) -> list[dict]:
    from wagma_bench.analysis.wandb_panels import _leaves

    leaves = _leaves(runset.get("filters") or {})
    assert all(f["op"] in ("=", "IN") for f in leaves), leaves

    def holds(run: dict, f: dict) -> bool:
        value = run.get((f["key"]["section"], f["key"]["name"]))
        return value in f["value"] if f["op"] == "IN" else value == f["value"]

    return [r for r in runs if all(holds(r, f) for f in leaves)]


def planted(runs: list[dict]) -> list[dict]:
    """Each run again as a colleague's in the same project: the same config keys, another W&B group and id."""
    return [
        {**r, ("run", "group"): "someone-else-0a1b2c", ("run", "name"): "x" + r[("run", "name")]}
        for r in runs
    ]


@pytest.mark.slow
@pytest.mark.background
def test_report_names_only_what_the_runs_logged(reviewed):
    """The Done-when test: without a key (WANDB_MODE=offline, no network) the report finishes in seconds,
    writes the spec and prints the publish command; every key its panels and run sets name was logged by the
    runs (their own offline records), each run set selects runs (the two optimizers' runs; the tuning's trials
    by its group), eval/* is logged against train_s, and the spec round-trips through wandb-workspaces."""
    from wagma_bench.analysis.wandb_panels import from_spec, named_keys, spec_of, unlogged

    out, tmp = reviewed["out"], reviewed["tmp"]
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert reviewed["net"] == 0, "W&B tried to reach the network"
    assert reviewed["took"] < 60, reviewed["took"]  # about 4 s here on a quiet machine
    spec_path = tmp / "R" / "wandb-report.json"
    assert (
        f"publish it later (after `wandb sync` of the runs' offline directories) with: wagma-bench report "
        f"--wandb-publish {spec_path}" in out.stdout
    )
    spec = json.loads(spec_path.read_text())
    records = reviewed["records"]
    assert len(records) == 4  # two runs, two trials
    missing = unlogged(spec, logged_keys(records))
    assert not missing, "\n".join(missing)
    named = {(s, k) for s, k, _ in named_keys(spec)}
    assert {
        ("history", "eval/top1"),
        ("history", "train_s"),
        ("history", "samples"),
        ("history", "rank1/comm_s"),
        ("summary", "time_to_target_s"),
        ("summary", "throughput_samples_per_s"),
        ("summary", "ranks/comm_s_worst"),
        ("config", "optimizer"),
        ("config", "tuned_lr_multiplier"),
        ("config", "study"),
        ("run", "group"),
    } <= named
    runs = [run_values(r) for r in records]
    runs += planted(runs)  # never selected: every run set filters on its W&B group (or its runs' ids)
    runsets = [
        rs for b in spec["report"]["spec"]["blocks"] for rs in (b.get("metadata") or {}).get("runSets", [])
    ]
    chosen = {
        rs["name"][:6]: sorted(
            r[("config", "optimizer")] + str(r[("config", "tuning_trial")]) for r in selected(rs, runs)
        )
        for rs in runsets
    }
    assert chosen == {"Tuning": ["wagmaTrue", "wagmaTrue"], "resnet": ["allreduceFalse", "wagmaFalse"]}, (
        chosen
    )
    steps = {(m.glob_name or m.name): m.step_metric for recs in records for m in of_type(recs, "metric")}
    assert steps["eval/*"] == "train_s" and steps["samples"] == "train_s"
    assert spec_of(*from_spec(spec)) == spec


@pytest.mark.slow
@pytest.mark.background
def test_a_panel_asking_for_an_unlogged_key_is_named(reviewed):
    """A panel naming a metric no run logged (eval/bleu beside these ResNet runs) and a parallel-coordinates
    column on an unlogged config key are each named, with the panel that asks."""
    import wandb_workspaces.reports.v2 as wr

    from wagma_bench.analysis.wandb_panels import from_spec, spec_of, unlogged

    report, workspace = from_spec(json.loads((reviewed["tmp"] / "R" / "wandb-report.json").read_text()))
    grid = next(b for b in report.blocks if isinstance(b, wr.PanelGrid))
    grid.panels = [
        *grid.panels,
        wr.LinePlot(title="bleu", x="train_s", y=["eval/bleu"]),
        wr.ParallelCoordinatesPlot(
            title="pc", columns=[wr.ParallelCoordinatesPlotColumn(wr.Config("tuned_momentum"))]
        ),
    ]
    said = unlogged(spec_of(report, workspace), logged_keys(reviewed["records"]))
    assert said == [
        "panel 'bleu' names history key 'eval/bleu', which no run logged",
        "panel 'pc' names config key 'tuned_momentum', which no run logged",
    ]


@pytest.mark.slow
@pytest.mark.background
def test_claims_report_has_the_claims_table_and_each_interval(reviewed):
    """``claims --wandb-report`` over the tuning: the claims table and one interval line a claim as Markdown,
    the tuning's parallel coordinates, every key named logged; no key: the spec and the publish command."""
    from wagma_bench.analysis.wandb_panels import unlogged

    tmp = reviewed["tmp"]
    out = subprocess.run(
        [*RUN, "claims", str(tmp / "tune"), "--out", str(tmp / "C"), "--allow-missing", "--wandb-report"],
        env=offline_env(tmp, Listener()),
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert f"wagma-bench report --wandb-publish {tmp / 'C' / 'wandb-report.json'}" in out.stdout
    spec = json.loads((tmp / "C" / "wandb-report.json").read_text())
    claims = json.loads((tmp / "C" / "claims.json").read_text())["claims"]
    text = [b["content"] for b in spec["report"]["spec"]["blocks"] if b.get("type") == "markdown-block"]
    assert all(c["id"] in text[0] for c in claims)  # the table
    assert [line.split("**")[1] for line in text[1].splitlines()] == [c["id"] for c in claims]
    assert all(", interval " in line for line in text[1].splitlines())
    panels = [
        p
        for b in spec["report"]["spec"]["blocks"]
        for p in ((b.get("metadata") or {}).get("panelBankSectionConfig") or {}).get("panels", [])
    ]
    assert "Parallel Coordinates Plot" in [p["viewType"] for p in panels]
    assert unlogged(spec, logged_keys(reviewed["records"])) == []


def test_publishing_a_spec_needs_a_key(tmp_path, monkeypatch, capsys):
    """``--wandb-publish`` without an API key: exit 2 and one line saying what it needs, nothing sent."""
    from wagma_bench.cli import report as report_cli

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    (tmp_path / "netrc").write_text("")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    rc = report_cli.main(["--wandb-publish", str(tmp_path / "wandb-report.json")])
    said = (
        f"wagma-bench report: error: --wandb-publish {tmp_path / 'wandb-report.json'} needs a W&B API key: "
        "set WANDB_API_KEY or run `wandb login`"
    )
    assert rc == 2 and capsys.readouterr().err.strip().splitlines() == [said]


def test_wandb_report_without_the_extra_is_one_line(tmp_path, monkeypatch, capsys):
    """wandb-workspaces absent: exit 2 and one line naming the install, before any report file is written."""
    from wagma_bench.cli import report as report_cli

    run_dir = write_run(tmp_path / "runs" / "a", "wagma", 1, reach_at(30.0))
    monkeypatch.setitem(sys.modules, "wandb_workspaces", None)
    rc = report_cli.main([str(run_dir), "--out", str(tmp_path / "R"), "--wandb-report"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [
        (
            "wagma-bench report: error: --wandb-report needs the Python package "
            "'wandb_workspaces', which is not installed: pip install 'wagma-bench[wandb]'"
        )
    ]
    assert not (tmp_path / "R").exists()


def test_tuning_trials_share_the_tunings_group_and_log_its_settings(tmp_path):
    """A trial's W&B config carries the flat grouping keys, its study, trial and tuned settings (dots made
    underscores); its W&B group is the tuning's, the same for every trial; other runs are no tuning trials."""
    from wagma_bench.record.loggers import grouping_config, sweep_group

    tune = tmp_path / "T"
    trial = {
        "name": "wagma_study2_trial1",
        "study": 2,
        "trial": 1,
        "params": {"optimizer.tau": 4, "lr_multiplier": 2.0},
        "combo": "wagma",
        "seed": 4,
        "overrides": [],
    }
    (tune / "trials").mkdir(parents=True)
    plan = {"version": 1, "studies": 2, "trials_per_study": 1, "trials": [trial]}  # as tune writes it
    (tune / "tune.json").write_text(json.dumps(plan))
    start = {
        "optimizer": "wagma",
        "workload": "resnet",
        "data": "mnist5k",
        "imbalance": "none",
        "world_size": 2,
        "seed": 4,
    }
    assert grouping_config(tune / "trials" / trial["name"], start) == {
        **start,
        "tuning_trial": True,
        "study": 2,
        "trial": 1,
        "tuned_optimizer_tau": 4,
        "tuned_lr_multiplier": 2.0,
    }
    assert grouping_config(tmp_path / "run", start) == {**start, "tuning_trial": False}
    group = sweep_group(tune / "trials" / trial["name"])
    assert group.startswith("T-") and group == sweep_group(tune / "trials" / "wagma_study1_trial1")


COMMITTED = (
    Path(__file__).resolve().parents[1] / "reproduce/tuning/results-2core-20261202b/transformer_streaming"
)


@pytest.mark.slow
@pytest.mark.background
def test_wandb_import_of_a_committed_tuning_gives_the_report_every_key_it_names(tmp_path):
    """Two trials of a committed compact tuning (their files as committed), logged by ``wandb-import``
    offline: the report over them has a section whose every named key their W&B records hold, whose run set
    selects both trials and not a planted run of another group; their summary.json is left as committed."""
    import shutil

    from wagma_bench.analysis.wandb_panels import unlogged

    tune = tmp_path / "T"
    (tune / "trials").mkdir(parents=True)
    shutil.copy(COMMITTED / "tune.json", tune / "tune.json")
    names = sorted(p.name for p in (COMMITTED / "trials").iterdir())[:2]
    for name in names:
        shutil.copytree(COMMITTED / "trials" / name, tune / "trials" / name)
    listener = Listener()
    env = {**offline_env(tmp_path, listener), "WANDB_MODE": "offline"}
    said = _call(["wandb-import", str(tune)], env, tmp_path).stdout
    assert said.splitlines()[-1] == "wagma-bench wandb-import: 2 run(s) logged (offline)"
    _call([str(tune), "--wandb-report", "--out", str(tmp_path / "R")], env, tmp_path, "report")
    listener.close()
    assert listener.connections == 0
    records = [wandb_records(p) for p in sorted(tune.rglob("offline-run-*/run-*.wandb"))]
    assert len(records) == 2
    spec = json.loads((tmp_path / "R" / "wandb-report.json").read_text())
    assert unlogged(spec, logged_keys(records)) == []
    runs = [run_values(r) for r in records]
    (runset,) = [
        rs for b in spec["report"]["spec"]["blocks"] for rs in (b.get("metadata") or {}).get("runSets", [])
    ]
    assert selected(runset, runs + planted(runs)) == runs
    for name in names:
        committed = (COMMITTED / "trials" / name / "summary.json").read_bytes()
        assert (tune / "trials" / name / "summary.json").read_bytes() == committed


def test_a_wandb_report_with_nothing_logged_is_refused_in_one_line(tmp_path, capsys):
    """Runs that never logged to W&B: exit 2, one line naming ``wandb-import``, before anything is written."""
    from wagma_bench.cli import report as report_cli

    run_dir = write_run(tmp_path / "runs" / "a", "wagma", 1, reach_at(30.0))
    rc = report_cli.main([str(run_dir), "--out", str(tmp_path / "R"), "--wandb-report"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "no run here logged to W&B" in err[0] and f"wagma-bench wandb-import {run_dir}" in err[0]
    assert not (tmp_path / "R").exists()  # refused before the report is written


def test_wandb_import_refuses_a_run_that_did_not_finish(tmp_path, capsys):
    """A crashed run (no run_stop): exit 2 and one line, before W&B starts; nothing written beside it."""
    from wagma_bench.cli import wandb_import

    run_dir = write_run(tmp_path / "runs" / "a", "sgp", 1, reach_at(None)[:2], crashed=True)
    assert wandb_import.main([str(run_dir), "--mode", "offline"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    said = (
        f"wagma-bench wandb-import: error: {run_dir}: not a finished run (no run_start or no run_stop in "
        "events.jsonl); wandb-import logs finished runs only"
    )
    assert err == [said]
    assert not (run_dir / "wandb").exists()
