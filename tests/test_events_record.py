"""The one reader of a run directory (``events.RunEvents``) and the import graph around the event log.

Hand-written run directories with known events: a torn last line, a preempted and resumed run, and a
run_start logged before it carried the model size and the derived values (each reader must still read it).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from wagma_bench.analysis import run_records
from wagma_bench.campaign import sweep_jobs
from wagma_bench.config.schedules import peak_lr
from wagma_bench.record import mlperf
from wagma_bench.record.events import RunEvents, RunStart, summarize
from wagma_bench.record.files import write_json_atomic
from wagma_bench.simulate.convergence import samples_to_target

PACKAGE = Path(__file__).resolve().parent.parent / "wagma_bench"
T0 = 1.7e12
CONFIG = {"train": {"lr": 0.1, "batch_size": 32, "lr_reference_batch": 256, "weight_decay": 0.0001}}
OLD_START = {
    "workload": "resnet",
    "data": "mnist5k",
    "optimizer": "wagma",
    "imbalance": "none",
    "world_size": 4,
    "seed": 1,
    "metric": "top1",
    "target": 0.9,
    "global_batch_size": 128,
    "train_samples": 4500,
    "eval_samples": 500,
    "steps_total": 40,
    "sync_period": 10,
    "hosts": ["a", "b"],
    "config": CONFIG,
}


def event(key: str, t_s: float, value=None, **metadata) -> dict:
    return {"key": key, "value": value, "time_ms": T0 + 1000 * t_s, "metadata": metadata}


def evaluation(step: int, value: float) -> dict:
    return event(
        "eval_accuracy",
        step,
        value,
        step=step,
        epoch=step / 10,
        samples=step * 128,
        train_s=float(step),
        wall_s=step + 1.0,
        eval_took_s=0.5,
    )


def write_events(d: Path, events: list[dict], tail: str = "") -> Path:
    d.mkdir(parents=True)
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + tail)
    return d


def resumed_events() -> list[dict]:
    """Preempted at step 20 after a checkpoint at 10; resumed from 10; reaches the target at step 30."""
    end = {"step": 40, "samples": 40 * 128, "train_s": 40.0, "wall_s": 41.0, "eval_s": 2.0}
    return [
        event("run_start", 0, **OLD_START),
        evaluation(10, 0.5),
        event("checkpoint", 10, step=10),
        evaluation(20, 0.95),
        event("run_suspend", 20, status="preempted", step=20, train_s=20.0),
        event("run_resume", 21, step=10, epoch=1.0, train_s=10.0),
        evaluation(20, 0.7),
        evaluation(30, 0.92),
        evaluation(40, 0.93),
        event("run_stop", 41, status="completed", **end),
    ]


def test_torn_last_line_is_skipped_and_the_run_is_marked(tmp_path):
    events = [event("run_start", 0, **OLD_START), evaluation(10, 0.5)]
    d = write_events(tmp_path / "run", events, tail='{"key": "progress", "value": null, "met')
    record = RunEvents.read(d)
    assert record.torn and [e["key"] for e in record.events] == ["run_start", "eval_accuracy"]
    assert not record.stopped and record.saved_summary is None and record.last_round == 10
    assert [(e.round, e.value, e.took_s) for e in record.evaluations] == [(10, 0.5, 0.5)]
    run = run_records.load_run(d)
    assert "torn last line in events.jsonl" in run.problems and run.summary.status == "incomplete"
    assert sweep_jobs.run_progress(d) == {
        "status": "running",
        "step": 10,
        "metric": 0.5,
        "metric_name": "top1",
        "eval_step": 10,
        "restarts": 0,
        "reached": None,
    }


def test_resumed_run_reads_as_one_run(tmp_path):
    events = resumed_events()
    d = write_events(tmp_path / "run", events)
    write_json_atomic(d / "summary.json", summarize(events))
    record = RunEvents.read(d)
    assert record.lifecycle == ["run_start", "run_suspend", "run_resume", "run_stop"]
    assert record.stopped and record.resumes == 1 and not record.torn
    # the first evaluation at or above the target, as logged (the rolled-back one at step 20 included)
    assert (record.first_at_target.round, record.first_at_target.samples) == (20, 20 * 128)
    assert record.summary() == record.saved_summary.to_json() == summarize(events)
    assert record.summary()["restarts"] == 1 and record.summary()["status"] == "completed"
    assert samples_to_target([str(tmp_path)]) == {"wagma": 20 * 128.0}
    assert sweep_jobs.run_progress(d)["restarts"] == 1
    assert run_records.load_run(d).problems == []
    # MLPerf's log keeps the run that produced the final model: the rolled-back evaluation at step 20 goes
    steps = [r.metadata["step_num"] for r in mlperf.mllog_records(record.events) if r.key == "eval_accuracy"]
    assert steps == [10, 20, 30, 40]
    assert [r.value for r in mlperf.mllog_records(record.events) if r.key == "eval_accuracy"][1] == 0.7


def test_a_target_reached_past_the_time_limit_is_not_reached():
    """train.time_limit_s stops a run at the first synchronisation point past it, and an evaluation there may
    reach the target: that run missed it (tune counts it so); its summary must say so too."""
    config = {**CONFIG, "train": {**CONFIG["train"], "time_limit_s": 25}}
    start = event("run_start", 0, **{**OLD_START, "config": config})
    end = {"step": 30, "samples": 30 * 128, "train_s": 30.0, "wall_s": 31.0, "eval_s": 1.0}
    late = summarize(
        [start, evaluation(10, 0.5), evaluation(30, 0.95), event("run_stop", 31, status="time_limit", **end)]
    )
    assert (late["reached"], late["time_to_target_s"], late["rounds_to_target"]) == (False, None, None)
    assert late["best_metric"] == 0.95  # the evaluation itself stays
    on_time = summarize([start, evaluation(20, 0.95), event("run_stop", 21, status="completed", **end)])
    assert (on_time["reached"], on_time["time_to_target_s"]) == (True, 20.0)


def test_old_run_start_without_the_derived_fields_falls_back(tmp_path):
    start = RunStart(OLD_START)
    assert start.model_params is None and start.group_size is None and start.sync_period == 10
    assert (
        start.base_lr == pytest.approx(peak_lr(0.1, 32, 4, 256))
        and start.nodes == 2
        and start.ranks_per_node == 2
    )
    assert start.settings == {k: v for k, v in OLD_START.items() if k != "config"}
    new = RunStart(
        {**OLD_START, "model_params": 1234, "group_size": 2, "base_lr": 0.5, "nodes": 1, "ranks_per_node": 4}
    )
    assert (new.model_params, new.group_size, new.base_lr, new.nodes, new.ranks_per_node) == (
        1234,
        2,
        0.5,
        1,
        4,
    )
    hyper = {r.key: r.value for r in mlperf.mllog_records([event("run_start", 0, **OLD_START)])}
    assert hyper["opt_base_learning_rate"] == pytest.approx(0.05) and hyper["number_of_nodes"] == 2


def test_a_directory_without_run_start_is_listed_not_fatal(tmp_path):
    d = write_events(tmp_path / "run", [event("progress", 1, step=5)])
    record = RunEvents.read(d)
    assert record.start is None and record.first_at_target is None and record.evaluations == []
    assert "no run_start event" in run_records.load_run(d).problems
    assert mlperf.mllog_records(record.events) == []


def _imports(path: Path) -> set[str]:
    """Every wagma_bench module ``path`` imports, deferred (in-function) imports included."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("wagma_bench"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("wagma_bench"))
    return out


def test_the_event_log_imports_none_of_its_readers():
    """events is the leaf every reader and sink imports; it imports no other module of the package but the
    safe file writer (which imports only the error types, a leaf), the recorded configuration's reader
    (which imports only the table of renamed keys), that table itself and the one metric rule (leaves), the
    one reader of files read back (the error types only), and the summary's type (which imports only those),
    so no cycle (events <-> loggers, events <-> mlperf, events <-> summary) can run through it."""
    assert _imports(PACKAGE / "metric.py") == set()
    assert _imports(PACKAGE / "record" / "events.py") <= {
        "wagma_bench.metric",
        "wagma_bench.config.readback",
        "wagma_bench.config.schedules",
        "wagma_bench.record.files",
        "wagma_bench.config.recorded",
        "wagma_bench.config.renamed",
        "wagma_bench.record.summary",
    }
    assert _imports(PACKAGE / "record" / "summary.py") == {
        "wagma_bench.config",  # its readback module
        "wagma_bench.config.renamed",
        "wagma_bench.record.files",
    }
    assert _imports(PACKAGE / "record" / "files.py") == {"wagma_bench.errors"}
    assert _imports(PACKAGE / "errors.py") == set()
    assert _imports(PACKAGE / "config" / "readback.py") == {"wagma_bench.errors"}
    assert _imports(PACKAGE / "config" / "recorded.py") == {"wagma_bench.config.renamed"}
    assert _imports(PACKAGE / "config" / "renamed.py") == {"wagma_bench.errors"}
    assert "wagma_bench" not in {m.split(".")[0] for m in _imports(PACKAGE / "config" / "schedules.py")}


def test_a_run_recorded_before_a_key_was_added_with_a_null_default_keeps_its_identity(tmp_path):
    """A key added later (workload.shuffle_seed, config/identity.ADDED_KEYS): a finished run recorded without
    it is still the same run (tune skips it, run reports it), and so is a checkpoint written without it; a
    real change is still one."""
    from wagma_bench.config.identity import identity, resume_hash
    from wagma_bench.record.checkpoint import check_against_run
    from wagma_bench.record.rundir import finished_summary

    old = {
        "seed": 4,
        "train": {"lr": 0.004, "max_steps": 100},
        "workload": {"name": "transformer", "beam": 4},
        "launcher": {"nproc": 4},
    }
    new = {**old, "workload": {**old["workload"], "shuffle_seed": None}}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    start = {"key": "run_start", "value": None, "time_ms": 0, "metadata": {"config": old, "world_size": 4}}
    (run_dir / "events.jsonl").write_text(json.dumps(start) + "\n")
    write_json_atomic(run_dir / "summary.json", {"status": "completed", "steps": 100})
    # read under today's name
    assert finished_summary(run_dir, new).to_json() == {"status": "completed", "rounds": 100}
    changed = {**new, "workload": {**new["workload"], "shuffle_seed": 7}}
    assert finished_summary(run_dir, changed) is None
    folder = run_dir / "checkpoint" / "round-50"
    folder.mkdir(parents=True)
    (folder / "rank0.pt").write_bytes(b"x")
    write_json_atomic(
        folder / "manifest.json",
        {
            "round": 50,
            "world_size": 1,
            "files": {"rank0.pt": "0"},
            "config_hash": resume_hash(old),
            "config": identity(old),
        },
    )
    (run_dir / "checkpoint" / "latest").write_text("round-50")
    check_against_run(run_dir, new, 1, "launcher.nproc=1")
    with pytest.raises(Exception, match="shuffle_seed"):
        check_against_run(run_dir, changed, 1, "launcher.nproc=1")


def test_a_checkpoint_manifest_names_its_hash_for_what_it_is_and_the_old_name_still_reads():
    """The manifest's hash is the run's identity (``resume_hash``), not the whole config's (``run_start``'s
    ``config_hash``); a manifest written before the rename, with only its hash, still reads."""
    from wagma_bench.config.identity import config_hash, resume_hash
    from wagma_bench.record.checkpoint import _written_identity

    raw = {"seed": 1, "train": {"lr": 0.1, "max_steps": 10}, "logger": {"progress": "off"}}
    extended = {**raw, "train": {"lr": 0.1, "max_steps": 20}, "logger": {"progress": "lines"}}
    assert resume_hash(raw) == resume_hash(extended) and config_hash(raw) != config_hash(extended)
    assert _written_identity({"resume_hash": "a1"}) == "a1" == _written_identity({"config_hash": "a1"})
    assert _written_identity({"resume_hash": "x", "config": raw}) == resume_hash(raw)


def _read_as_reports_do(d: Path) -> tuple:
    """What the readers make of a run directory, its own path and its log's name left out."""
    record = RunEvents.read(d)
    run = run_records.load_run(d)
    said = json.dumps([run.problems, run.warnings]).replace(str(d), "RUN").replace(".jsonl.xz", ".jsonl")
    return (
        (record.events, record.torn, record.skipped, record.saved_summary),
        (run.summary, run.evals, said),
        sweep_jobs.run_progress(d),
    )


def test_a_compacted_event_log_reads_as_the_live_one_and_the_same_log_gives_the_same_bytes(tmp_path):
    """A committed result keeps ``events.jsonl.xz`` (reproduce/tuning/compact.py): every reader gets what the
    live log gave, a finished run and a torn one alike; both logs in one folder are refused, naming it."""
    from wagma_bench.record.events import EVENTS, EVENTS_XZ, compact_events, event_log

    finished = write_events(tmp_path / "live" / "done", resumed_events())
    write_json_atomic(finished / "summary.json", summarize(resumed_events()))
    torn = write_events(tmp_path / "live" / "torn", resumed_events()[:3], tail='{"key": "progr')
    (torn / EVENTS).write_text(f"not json\n{(torn / EVENTS).read_text()}")
    for live in (finished, torn):
        compact = tmp_path / "compact" / live.name
        compact.mkdir(parents=True)
        for f in live.glob("summary.json"):
            (compact / f.name).write_bytes(f.read_bytes())
        compact_events(live, compact / EVENTS_XZ)
        assert event_log(compact) == compact / EVENTS_XZ and not (compact / EVENTS).exists()
        assert _read_as_reports_do(compact) == _read_as_reports_do(live)
        compact_events(live, tmp_path / "again.xz")
        assert (tmp_path / "again.xz").read_bytes() == (compact / EVENTS_XZ).read_bytes()
    assert RunEvents.read(torn).torn and RunEvents.read(torn).skipped == (1, 5)
    assert run_records.find_runs([tmp_path / "compact"]) == sorted((tmp_path / "compact").iterdir())
    compact_events(finished, finished / EVENTS_XZ)  # beside the live log: which is the record?
    with pytest.raises(ValueError, match=f"{finished} holds both {EVENTS} .* and {EVENTS_XZ}"):
        RunEvents.read(finished)


def test_a_damaged_compacted_event_log_is_named_and_a_compacted_run_is_not_run_into(tmp_path):
    """Cut short, or not xz: one error naming the file, not a bare decoder error. A compacted folder is a
    read-only record: ``run`` into it is refused before any rank starts, saying so (exit 2)."""
    from tests.cli_util import QUICK, run
    from wagma_bench.record.events import EVENTS, EVENTS_XZ, compact_events

    live = write_events(tmp_path / "live", resumed_events())
    compact_events(live, tmp_path / EVENTS_XZ)
    data = (tmp_path / EVENTS_XZ).read_bytes()
    for damaged in (data[: len(data) // 2], b"not xz"):
        (tmp_path / EVENTS_XZ).write_bytes(damaged)
        with pytest.raises(ValueError, match=rf"{tmp_path / EVENTS_XZ}: damaged event log \(LZMAError"):
            RunEvents.read(tmp_path)
    (live / EVENTS).unlink()
    (live / EVENTS_XZ).write_bytes(data)
    refused = run([*QUICK, f"hydra.run.dir={live}"], timeout=120)
    said = (
        f"wagma-bench run: error: run directory {live} holds {EVENTS_XZ}: a committed result, a read-only "
        "record that no run resumes or appends to; choose another hydra.run.dir (or, for a tuning, another "
        "--out)"
    )
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [said]
    assert sorted(p.name for p in live.iterdir()) == [EVENTS_XZ]


def test_committed_folders_are_compacted_in_place_each_run_read_back_the_same(tmp_path):
    """reproduce/tuning/compact.py --events-only: the plain logs of a committed folder become
    ``events.jsonl.xz``, each run reading as before; run again, nothing is left to do."""
    from tests.cli_util import load_script
    from wagma_bench.record.events import EVENTS, EVENTS_XZ

    compact = load_script(PACKAGE.parent / "reproduce" / "tuning" / "compact.py")
    runs = [write_events(tmp_path / "trials" / name, resumed_events()) for name in ("a", "b")]
    before = [_read_as_reports_do(d) for d in runs]
    assert compact.compact_events_in_place(tmp_path) == 2
    assert [_read_as_reports_do(d) for d in runs] == before
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [EVENTS_XZ, EVENTS_XZ]
    assert not any(tmp_path.rglob(EVENTS)) and compact.compact_events_in_place(tmp_path) == 0
