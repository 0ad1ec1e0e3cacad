"""Run directories read as the report compares them: one :class:`RunRecord` per run, a crashed or half-written
one included with what is missing listed (never an exception), and the runs grouped by what they were measured
against. :mod:`wagma_bench.analysis.report` builds its tables from these records; ``simulate`` finds runs with
:func:`find_runs`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from wagma_bench.analysis.step_figures import StepFigures, step_figures
from wagma_bench.config import readback
from wagma_bench.config.recorded import setting
from wagma_bench.record.events import EVENTS, RunEvents, find_run_dirs, is_run_dir
from wagma_bench.record.rundir import FINISHED, cancel_note, live_holder
from wagma_bench.record.steps import read_step_records
from wagma_bench.record.summary import RunSummary, run_summary


@dataclass
class RunRecord:
    """One run directory, read as is (a crashed run included)."""

    path: Path
    meta: dict  # run_start metadata (empty when the run never started)
    evals: list[dict]  # {step, train_s, wall_s, value} per evaluation
    summary: RunSummary  # events.summarize() of its events; status from summary.json when present
    problems: list[str] = field(default_factory=list)  # why the run is marked half-written
    signature: str | None = None  # how the metric was computed (sacrebleu's signature for BLEU)
    running: bool = False  # its lock names a live process: shown, but left out of comparisons
    warnings: list[str] = field(default_factory=list)  # lines the reader skipped, named by file and line
    optimizer_settings: dict = field(default_factory=dict)  # the run's optimizer section, as resolved
    variant: str = ""  # what sets it apart from other runs of its optimizer (name_variants)
    wandb: dict | None = None  # its logger.wandb section (None: it did not log to W&B)
    steps: StepFigures | None = None  # what its step records say (None: it has none, or they are damaged)
    wandb_id: str | None = None  # its W&B run's id, where it was recorded (summary.json, wandb-import's note)

    def __post_init__(self) -> None:
        self.summary = run_summary(self.summary)  # a mapping given (as written, or computed) read as the type

    @property
    def partial(self) -> bool:
        return bool(self.problems)

    @property
    def optimizer(self) -> str | None:
        """The optimizer as the tables name it: its name, and its settings where runs of it differ."""
        name = self.meta.get("optimizer")
        return f"{name} ({self.variant})" if self.variant else name

    @property
    def group_key(self) -> tuple:
        m = self.meta
        return (m.get("workload"), m.get("data"), m.get("metric"), m.get("target"))

    @property
    def series_key(self) -> tuple:
        m = self.meta
        return (self.optimizer, m.get("world_size"), m.get("imbalance"))


def find_runs(paths: Iterable[Path]) -> list[Path]:
    """Every run directory (one holding ``events.jsonl``, or a committed result's ``events.jsonl.xz``) at or
    below the given paths, sorted."""
    found: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"no such run or sweep directory: {p}")
        if is_run_dir(p):
            found.add(p.resolve())
        found.update(d.resolve() for d in find_run_dirs(p))
    return sorted(found)


def load_run(path: Path) -> RunRecord:
    """Read one run directory; never fails on a half-written one, it lists what is missing instead."""
    record = RunEvents.read(path)
    summary = record.summary()
    problems = []
    if record.start is None:
        problems.append("no run_start event")
    if not record.stopped:
        problems.append(
            "no run_stop event (crashed, killed or still running)"
            + (" since its last resume" if "run_stop" in record.lifecycle else "")
        )
        summary["status"] = "incomplete"
    log = record.log or Path(path) / EVENTS  # the file read, live or compacted
    if record.torn:
        problems.append(f"torn last line in {log.name}")
    saved = record.saved_summary
    if saved is None:
        problems.append("no summary.json")
    elif not record.stopped and saved.status and record.summary_after_events:
        # written by the launcher's finalize() after the ranks died: it knows the failure the events miss
        summary["status"], summary["error"] = saved.status, saved.error or RunSummary.from_json(summary).error
    if RunSummary.from_json(summary).status not in (*FINISHED, "running") and cancel_note(path) is not None:
        summary["status"] = "cancelled"  # by `wagma-bench sweep cancel`: not a failure, and resumable
    holder = live_holder(path) if not record.stopped else None
    if holder is not None:
        summary["status"] = "running"
        problems = [f"running (PID {holder.get('pid')} holds its lock): not compared"]
    warnings = [
        f"{log} line {n}: not JSON, skipped (its event is missing from the report)" for n in record.skipped
    ]
    if record.skipped:
        problems.append(f"unreadable line(s) {', '.join(map(str, record.skipped))} of {log.name} skipped")
    figures = _step_figures(path, warnings)
    summary.update(recorded_only(record.saved_summary, figures))
    meta = record.start.settings if record.start else {}
    evals = [
        {"round": e.round, "train_s": e.train_s, "wall_s": e.wall_s, "value": e.value}
        for e in record.evaluations
    ]
    settings = dict(record.start.config.get("optimizer") or {}) if record.start else {}
    wandb = (setting(record.start.config, "logger.wandb") if record.start else None) or wandb_import_note(
        path
    )
    return RunRecord(
        Path(path),
        meta,
        evals,
        RunSummary.from_json(summary),
        problems,
        record.signature,
        holder is not None,
        warnings,
        {k: v for k, v in settings.items() if k != "name"},
        wandb=wandb,
        steps=figures,
        wandb_id=wandb_run_id(saved, path),
    )


# What only summary.json holds (written there after the events: by finalize, by tune), not the events that the
# summary above is rebuilt from.
RECORDED_ONLY = ("compute_imbalance", "compute_contention", "reference_s", "reference_before_after_s")


def recorded_only(saved: RunSummary | None, figures: StepFigures | None) -> dict:
    """The figures ``summary.json`` holds beyond its events: from the step records where they say (so a run
    recorded before a figure was measured has it too), else as saved; None where neither has it."""
    out = {key: getattr(saved, key) if saved else None for key in RECORDED_ONLY}
    if figures is not None:
        for key, value in (
            ("compute_imbalance", figures.compute_imbalance),
            ("compute_contention", figures.contention),
        ):
            out[key] = value if value is not None else out[key]
    return out


def wandb_import_note(run_dir: Path) -> dict | None:
    """Where ``wagma-bench wandb-import`` logged a run that did not log to W&B itself (its project, entity and
    group, as a ``logger.wandb`` section reads); None where it has not, or the note is not what it writes."""
    from wagma_bench.record.loggers import IMPORTED

    try:
        note = readback.load(Path(run_dir) / "wandb" / IMPORTED, readback.WANDB_IMPORT_NOTE)
    except (OSError, ValueError):
        return None
    keys = ("project", "entity", "group", "id")
    return {k: note.get(k) for k in keys if isinstance(note.get(k), (str, type(None)))}


def wandb_run_id(saved: RunSummary | dict | None, run_dir: Path) -> str | None:
    """The id of a run's W&B run: from ``summary.json``'s ``wandb`` entry (``logger=wandb``), else from
    ``wandb-import``'s note; None for a run logged before the id was recorded, or never logged."""
    s = run_summary(saved or None)
    entry = s.wandb if s is not None else None
    if isinstance(entry, dict) and isinstance(entry.get("id"), str):
        return entry["id"]
    note = wandb_import_note(run_dir)
    return note.get("id") if note else None


def reference_readings(summary: RunSummary | dict) -> list[float]:
    """A run's speed-reference readings (:mod:`wagma_bench.campaign.reference`): the ones at its start and end
    where recorded, else their mean; none for a run that was not timed so."""
    s = run_summary(summary)
    pair = s.reference_before_after_s
    if isinstance(pair, list) and all(isinstance(v, (int, float)) for v in pair) and pair:
        return [float(v) for v in pair]
    ref = s.reference_s
    return [float(ref)] if isinstance(ref, (int, float)) else []


def _step_figures(path: Path, warnings: list[str]) -> StepFigures | None:
    try:
        return step_figures(read_step_records(path))
    except ValueError as err:  # a damaged compact table: the run is reported without its step figures
        warnings.append(f"{err}; its step figures are left out")
        return None


def name_variants(runs: Sequence[RunRecord]) -> None:
    """Set each run's ``variant`` (:func:`variant_labels`), so that different configurations of one optimizer
    are different series, never folded together as seeds."""
    for run, label in zip(
        runs, variant_labels([(r.meta.get("optimizer"), r.optimizer_settings) for r in runs]), strict=True
    ):
        run.variant = label


def variant_labels(items: Sequence[tuple[str | None, dict]]) -> list[str]:
    """Per (optimizer, its settings): the settings in which it differs from the other items of the same
    optimizer (``outer=nesterov, period=2``); empty where they all agree. Only settings every item has count:
    a run logged before a setting existed ran at what is now its default, which its record does not say."""
    by_optimizer: dict[str | None, list[dict]] = {}
    for name, settings in items:
        by_optimizer.setdefault(name, []).append(settings)
    differ = {
        name: [
            k
            for k in sorted(set.intersection(*(set(s) for s in group)))
            if len({repr(s[k]) for s in group}) > 1
        ]
        for name, group in by_optimizer.items()
    }
    return [", ".join(f"{k}={settings.get(k)}" for k in differ[name]) for name, settings in items]


def group_runs(runs: Iterable[RunRecord]) -> dict[tuple, list[RunRecord]]:
    """Runs by (workload, data, metric, target); runs without a run_start are left out (listed apart)."""
    groups: dict[tuple, list[RunRecord]] = {}
    for run in runs:
        if run.meta:
            groups.setdefault(run.group_key, []).append(run)
    return dict(sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])))
