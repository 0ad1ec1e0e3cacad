"""Names renamed for rounds and local steps (``train.max_steps`` -> ``train.max_rounds``, ``eval.every_steps``
-> ``eval.every_rounds``, ``optimizer.warmup_steps`` -> ``optimizer.warmup_rounds``, local SGD's ``period``
and AD-PSGD's and eager-SGD's ``sync_every`` -> ``optimizer.sync_period``, a checkpoint's ``optimizer`` state
-> ``local_optimizer``, a step log's ``step`` -> ``local_step``): the old names still work for one release, on
a command line, in a YAML file and in a recorded configuration, each with one deprecation line naming the new
name; a tuning committed under the old names is still the same tuning, and a run directory written before the
renames reads under today's names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.cli_util import QUICK, compose, run
from wagma_bench.config import renamed
from wagma_bench.config.renamed import RENAMED_KEYS, deprecation_line, renamed_overrides
from wagma_bench.config.schema import as_recorded, validate
from wagma_bench.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
BUDGET_TUNING = ROOT / "reproduce" / "tuning" / "results-2core-20261206" / "transformer_budget"


def test_an_old_key_on_the_command_line_is_read_as_its_new_name_with_one_line_naming_it(capsys, monkeypatch):
    """Each old key of an override, with Hydra's prefixes and a sweep, becomes its new key; one line per old
    key and process names the new one."""
    monkeypatch.setattr(renamed, "_SAID", set())  # as in a fresh process
    out = renamed_overrides(
        [
            "train.max_steps=5",
            "+eval.every_steps=1,2",
            "optimizer.warmup_steps=3",
            "optimizer.period=8",
            "optimizer.sync_every=8",
            "train.lr=0.1",
            "-m",
        ]
    )
    assert out == [
        "train.max_rounds=5",
        "+eval.every_rounds=1,2",
        "optimizer.warmup_rounds=3",
        "optimizer.sync_period=8",
        "optimizer.sync_period=8",
        "train.lr=0.1",
        "-m",
    ]
    said = capsys.readouterr().err.splitlines()
    assert said == [deprecation_line(old) for old in RENAMED_KEYS], said
    assert all(RENAMED_KEYS[old][0] in line for old, line in zip(RENAMED_KEYS, said))
    renamed_overrides(["train.max_steps=6"])
    assert capsys.readouterr().err == ""  # said once


def test_an_old_key_in_a_yaml_file_is_read_as_its_new_name_and_a_disagreeing_pair_is_refused():
    """A configuration composed with the old keys (as an old experiment YAML file gives them) validates to the
    new ones; an old and a new key at two values are one ConfigError naming both."""
    cfg = validate(
        compose(
            "optimizer=local_sgd",
            "+train.max_steps=7",
            "+eval.every_steps=3",
            "+optimizer.warmup_steps=2",
            "+optimizer.period=8",
        )
    )
    assert (cfg.train.max_rounds, cfg.eval.every_rounds, cfg.optimizer.warmup_rounds) == (7, 3, 2)
    assert cfg.optimizer.sync_period == 8
    for name in ("eager", "adpsgd"):
        assert validate(compose(f"optimizer={name}", "+optimizer.sync_every=3")).optimizer.sync_period == 3
    same = validate(compose("+train.max_steps=7", "train.max_rounds=7"))
    assert same.train.max_rounds == 7
    with pytest.raises(ConfigError, match=r"train\.max_steps=7 and train\.max_rounds=8 are both given"):
        validate(compose("+train.max_steps=7", "train.max_rounds=8"))


def test_sweep_and_simulate_read_an_old_key_as_its_new_name():
    """`sweep`, `tune` and `simulate` parse their overrides through one parser, which renames."""
    from wagma_bench.campaign.sweep import parse_overrides
    from wagma_bench.simulate.request import sort_overrides

    parsed = parse_overrides(["train.max_steps=40", "eval.every_steps=10,20"])
    assert parsed == [("train.max_rounds", ["40"]), ("eval.every_rounds", ["10", "20"])]
    assert sort_overrides(parse_overrides(["train.max_steps=40"])).steps == 40


def test_a_run_recorded_under_the_old_keys_is_the_same_run():
    """A finished run whose recorded configuration has the old keys is found by today's configuration (tune
    skips it, run reports it) and a checkpoint written under them resumes; a changed budget is still another
    run."""
    from wagma_bench.config.identity import budget, resume_hash

    old = {
        "seed": 1,
        "train": {"lr": 0.1, "max_steps": 100},
        "eval": {"every_steps": 10},
        "optimizer": {"name": "local_sgd", "warmup_steps": 2, "period": 4},
    }
    new = {
        "seed": 1,
        "train": {"lr": 0.1, "max_rounds": 100},
        "eval": {"every_rounds": 10},
        "optimizer": {"name": "local_sgd", "warmup_rounds": 2, "sync_period": 4},
    }
    assert resume_hash(old) == resume_hash(new) and budget(old) == budget(new)
    assert budget({**new, "train": {"lr": 0.1, "max_rounds": 200}}) != budget(old)
    assert resume_hash({**new, "eval": {"every_rounds": 20}}) != resume_hash(old)


def test_a_tuning_committed_under_the_old_keys_is_resumed_as_done(tmp_path):
    """The committed fixed-budget Transformer tuning (its plan says train.max_steps=300 eval.every_steps=50,
    and its trials tune optimizer.period and optimizer.sync_every): its command plans the same tuning
    (tune.json accepted) and finds every trial finished, so a resume skips them all; with the new keys it
    plans the same."""
    from wagma_bench.campaign.tune import combinations, make_plan, parse_args, write_plan
    from wagma_bench.record.rundir import finished_summary

    plan = json.loads((BUDGET_TUNING / "tune.json").read_text())
    argv = plan["command"][2:]
    argv[argv.index("--out") + 1] = str(tmp_path)
    shutil.copy(BUDGET_TUNING / "tune.json", tmp_path / "tune.json")
    args = parse_args(argv)
    assert combinations(parse_args(renamed_overrides(argv, quiet=True))) == combinations(args)
    spec, trials, configs = make_plan(args)
    assert "train.max_rounds=300" in spec.common and len(trials) == len(plan["trials"]) == 63
    write_plan(args, spec, trials, ["wagma-bench", "tune", *argv])  # refuses another tuning
    unfinished = [
        t.name
        for t in trials
        if finished_summary(BUDGET_TUNING / "trials" / t.name, as_recorded(configs[t.name])) is None
    ]
    assert unfinished == []


def test_run_with_an_old_key_trains_and_says_one_deprecation_line(tmp_path):
    """`wagma-bench run train.max_steps=N` trains N rounds, with one deprecation line naming
    train.max_rounds."""
    args = [a for a in QUICK if not a.startswith("train.max_rounds=")]
    out = run([*args, "train.max_steps=4", f"hydra.run.dir={tmp_path}"])
    assert out.returncode == 0, out.stderr[-2000:]
    said = [line for line in (out.stdout + out.stderr).splitlines() if "deprecated" in line]
    assert said == [deprecation_line("train.max_steps")], said
    assert json.loads((tmp_path / "summary.json").read_text())["rounds"] == 4


def test_a_checkpoint_of_the_local_optimizer_under_its_old_name_resumes():
    """An algorithm's checkpointed state names the rank's torch optimizer ``local_optimizer``; a state written
    before, under ``optimizer``, loads the same through the checkpoint's reader (a run resumes from a
    checkpoint of the older code), by the one rename table: the algorithm itself knows only today's name."""
    import torch
    from torch import nn

    from tests.optim_util import make_algorithm
    from wagma_bench.record.checkpoint import algorithm_state

    def sgd(params):
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    model = nn.Linear(3, 2)
    algo = make_algorithm("local_sgd", None, model, sgd)
    model(torch.ones(1, 3)).sum().backward()
    algo.local_optimizer.step()
    saved = algo.state_dict()
    assert set(saved) == {"round", "local_optimizer"}
    old = {"round": 7, "optimizer": saved["local_optimizer"]}
    again = make_algorithm("local_sgd", None, nn.Linear(3, 2), sgd)
    with pytest.raises(KeyError):  # one policy, in one place: not the algorithm's own second table
        again.load_state_dict(old)
    again.load_state_dict(algorithm_state({"algo": old}))
    assert again.round == 7
    buffers = [s["momentum_buffer"] for s in again.local_optimizer.state_dict()["state"].values()]
    before = [s["momentum_buffer"] for s in saved["local_optimizer"]["state"].values()]
    assert buffers and all(torch.equal(a, b) for a, b in zip(buffers, before))


RECORDED = ROOT / "tests" / "fixtures" / "run-recorded-2026-12-06"  # written by the code before the renames
RECORDED_COMMAND = [
    "launcher.nproc=2",
    "optimizer=local_sgd",
    "optimizer.period=3",
    "train.max_steps=6",
    "eval.every_steps=3",
    "logger.progress=off",
    "checkpoint.every_s=1e9",
]


def test_a_run_directory_written_before_the_renames_reads_under_todays_names(tmp_path):
    """A run directory of the code before the renames (its config says optimizer.period, train.max_steps; its
    step logs say step): its step records read with local_step, its compute imbalance is the one its own code
    wrote, the simulator calibrates from it, `report` reads it, and its command as read today finds it
    finished."""
    from wagma_bench.cli.report import main as report_main
    from wagma_bench.record.events import RunEvents, current_summary
    from wagma_bench.record.rundir import compute_imbalance, finished_summary
    from wagma_bench.record.steps import StepRecord, read_step_records
    from wagma_bench.simulate.calibrate import fit_run

    raw = {
        int(p.stem[4:]): [json.loads(line) for line in p.read_text().splitlines()]
        for p in sorted((RECORDED / "steps").glob("rank*.jsonl"))
    }
    assert all("step" in r for recs in raw.values() for r in recs)  # the fixture is of the old format
    records = read_step_records(RECORDED)
    today = {
        rank: [{("local_step" if k == "step" else k): v for k, v in r.items()} for r in recs]
        for rank, recs in raw.items()
    }
    assert records == {
        rank: [StepRecord(**{k: v for k, v in r.items() if k in StepRecord._fields}) for r in recs]
        for rank, recs in today.items()
    }
    summary = json.loads((RECORDED / "summary.json").read_text())
    events = [json.loads(line) for line in (RECORDED / "events.jsonl").read_text().splitlines()]
    assert "steps" in summary  # the fixture is of the old format: its events say step, its summary steps
    assert [e["metadata"]["step"] for e in events if "step" in e["metadata"]] == [3, 6, 6]
    record = RunEvents.read(RECORDED)
    assert [e.round for e in record.evaluations] == [3, 6] and record.last_round == 6
    assert record.saved_summary.rounds == 6 and "steps" not in record.saved_summary.to_json()
    assert compute_imbalance(RECORDED) == summary["compute_imbalance"]
    assert [len(t) for t in fit_run(RECORDED, params=1000).trace] == [6, 6]
    today = as_recorded(
        validate(compose(*renamed_overrides(RECORDED_COMMAND, quiet=True)))
    )  # as run reads it
    assert finished_summary(RECORDED, today).to_json() == current_summary(summary)  # read under today's names
    assert report_main([str(RECORDED), "--out", str(tmp_path / "report")]) == 0
    assert "local_sgd" in (tmp_path / "report" / "report.md").read_text()


def test_a_scripts_old_flag_is_read_under_its_new_spelling_with_one_line(capsys, monkeypatch):
    """compare.py (reproduce/optimizers/) takes --max-rounds; --max-steps is read as it (the one policy)."""
    monkeypatch.setattr(renamed, "_SAID", set())
    assert renamed.renamed_flags(["--max-steps", "8", "--max-steps=9", "--seeds", "1"]) == [
        "--max-rounds",
        "8",
        "--max-rounds=9",
        "--seeds",
        "1",
    ]
    assert capsys.readouterr().err.splitlines() == [deprecation_line("--max-steps")]
    assert "--max-rounds now" in deprecation_line("--max-steps")


def test_a_claims_json_written_before_rounds_reads_unchanged():
    """An optimizer's ``steps`` in a claims.json written before the rename is its ``rounds``: the committed
    table's lines are the same from either spelling."""
    from wagma_bench.analysis.claims import optimizer_lines

    claims = json.loads((ROOT / "reproduce" / "claims" / "claims.json").read_text())["claims"]
    measured = [c for c in claims if c["measured"]["optimizers"]]
    assert measured
    for claim in measured:
        old = json.loads(json.dumps(claim).replace('"rounds":', '"steps":'))
        assert '"rounds":' not in json.dumps(old)
        assert optimizer_lines(old) == optimizer_lines(claim)
        assert "rounds trained (median)" in "\n".join(optimizer_lines(claim))
