"""Sinks that rank 0's :class:`~wagma_bench.record.events.EventLog` forwards every event to.

The event log (``events.jsonl``) stays the source of truth; a sink only mirrors it elsewhere
(:func:`event_log_for_run` builds a rank's event log with the sinks its config asks for):

- :class:`WandbSink` logs evaluations, progress and the final summary to Weights & Biases
  (``logger=wandb``), offline when no API key is configured.

A sink that fails (no network, a W&B server error) prints one warning and is switched off: losing a
mirror must never end a training run whose events are safe on disk. Nor may it slow one down: the W&B sink
hands events to a thread of its own, so W&B's initialisation and uploads never run on the training clock;
an online initialisation that does not finish within ``logger.wandb.timeout_s`` falls back to an offline
run, with a message, and ``summary.json`` says which mode was used and why (its ``wandb`` entry).
"""

from __future__ import annotations

import hashlib
import json
import netrc
import os
import queue
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from wagma_bench.config import readback
from wagma_bench.config.schema import WandbConfig, as_recorded
from wagma_bench.errors import ConfigError
from wagma_bench.record.events import EVENTS, EVENTS_XZ, SUMMARY, EventLog, RunEvents
from wagma_bench.record.files import write_json_atomic
from wagma_bench.record.rundir import TUNE_PLAN, TUNE_TRIALS
from wagma_bench.record.steps import StepRecord, read_step_records
from wagma_bench.record.summary import add_to_summary


class Sink(Protocol):
    def emit(self, event: dict) -> None: ...

    def close(self) -> None: ...


def event_log_for_run(cfg, run_dir: Path, rank: int, resume_step: int | None = None) -> EventLog:
    """The event log of one rank of a run, with the sinks its ``logger`` config asks for; on a resume
    (``resume_step``: the checkpoint's round) cut back to the events up to the checkpoint."""
    return EventLog(run_dir, enabled=rank == 0, sinks=make_sinks(cfg, run_dir, rank), resume_step=resume_step)


def make_sinks(cfg, run_dir: Path, rank: int) -> list[Sink]:
    """The sinks a run's configuration asks for (rank 0 only; other ranks log nothing)."""
    if rank != 0:
        return []
    sinks: list[Sink] = []
    if cfg.logger.wandb is not None:
        from wagma_bench.workloads import get_workload

        # from the config, not from the first event: after a requeue the first event is run_resume
        metric = get_workload(cfg.workload.name).metric_of(cfg)
        labels = RunLabels(cfg.workload.name, cfg.optimizer.name, cfg.imbalance.name, cfg.seed)
        sinks.append(WandbSink(cfg.logger.wandb, run_dir, as_recorded(cfg), metric, labels))
    return sinks


# --- Weights & Biases ------------------------------------------------------------------------------


def wandb_env(base: Path) -> dict[str, str]:
    """W&B's directories under ``base``, so nothing lands in the home or the current directory.

    ``WANDB_CONFIG_DIR`` moves too unless the user set it (it holds W&B's settings; the API key itself
    comes from ``WANDB_API_KEY`` or ``~/.netrc``, which stay where they are).
    """
    root = base / "wandb"
    env = {
        "WANDB_DIR": str(base),
        "WANDB_CACHE_DIR": str(root / "cache"),
        "WANDB_DATA_DIR": str(root / "data"),
        "WANDB_ARTIFACT_DIR": str(root / "artifacts"),
        "WANDB_CONFIG_DIR": os.environ.get("WANDB_CONFIG_DIR", str(root / "config")),
    }
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    return env


def has_api_key(env=os.environ) -> bool:
    """A W&B API key in ``WANDB_API_KEY`` or in the netrc entry of the W&B host (as
    ``wandb login`` stores it)."""
    if env.get("WANDB_API_KEY"):
        return True
    host = urlparse(env.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        auth = netrc.netrc(env.get("NETRC") or None).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])


def resolve_mode(mode: str, env=os.environ) -> str:
    """``auto``: online with an API key, else offline. ``WANDB_MODE`` in the environment wins over the config.

    ``online`` without a key is a :class:`ConfigError`: the launcher asks (``extras.check_extras``) before any
    rank starts, rather than W&B at its first request."""
    allowed = WandbConfig.CHOICES["mode"]
    if mode not in allowed:
        raise ConfigError(f"logger.wandb.mode={mode!r} is not allowed; choose one of: {', '.join(allowed)}")
    if env.get("WANDB_MODE") in ("offline", "online", "disabled"):
        mode = env["WANDB_MODE"]
    if mode == "auto":
        return "online" if has_api_key(env) else "offline"
    if mode == "online" and not has_api_key(env):
        origin = "WANDB_MODE=online" if env.get("WANDB_MODE") == "online" else "logger.wandb.mode=online"
        raise ConfigError(
            f"{origin} is not allowed without a W&B API key: set WANDB_API_KEY or run `wandb login` "
            "(or use logger.wandb.mode=auto|offline)"
        )
    return mode


def sweep_group(run_dir: Path) -> str | None:
    """The W&B group of a run: one per sweep, named by the sweep's directory plus a hash of its path (two
    sweeps named alike, e.g. by date and time on two machines, stay apart); none outside a sweep.

    A sweep is a ``wagma-bench tune`` (``TUNE/tune.json``, trials in ``TUNE/trials/NAME``: the tuning's trials
    share its group), a ``wagma-bench sweep`` (``SWEEP/manifest.json``, runs in ``SWEEP/runs/NAME``), a Hydra
    multirun (``multirun.yaml`` in the sweep directory, named by date and time), or the multiruns of a
    ``--submitit`` sweep (one per GPU count in ``SWEEP/runs/0008gpu``: the group is ``SWEEP``'s, so
    GPU counts do not split a sweep)."""
    run_dir = Path(run_dir).resolve()
    parent = run_dir.parent
    marker = {TUNE_TRIALS: TUNE_PLAN, "runs": "manifest.json"}.get(
        parent.name
    )  # a tuning's trials, a sweep's runs
    if marker and (parent.parent / marker).exists():
        root, name = parent.parent, parent.parent.name
    elif (parent / "multirun.yaml").exists() and parent.parent.name == "runs":
        root, name = parent.parent.parent, parent.parent.parent.name
    elif (parent / "multirun.yaml").exists():
        root, name = parent, f"{parent.parent.name}_{parent.name}" if parent.parent.name else parent.name
    else:
        return None
    return f"{name}-{hashlib.sha256(str(root).encode()).hexdigest()[:6]}"


ARTIFACT_FILES = (EVENTS, EVENTS_XZ, "summary.json", "mllog.txt")  # the event log live or compacted


# The flat W&B config keys reviewers group and filter runs by (W&B's run table, a Report's run sets); the
# whole configuration goes beside them under ``config``. ``tuning_trial`` says whether the run is a trial of a
# tuning (a Report's untuned run sets leave trials out); a trial also has ``study``, ``trial`` and one
# ``tuned_<key>`` per tuned setting (dots made underscores: W&B reads a dot in a config key as nesting).
GROUP_KEYS = ("optimizer", "workload", "data", "imbalance", "world_size", "seed")


def tuned_key(key: str) -> str:
    """The W&B config key of a tuned setting: ``optimizer.tau`` -> ``tuned_optimizer_tau``."""
    return "tuned_" + key.replace(".", "_")


def grouping_config(run_dir: Path, start: dict) -> dict[str, Any]:
    """The flat keys of a run's W&B config: :data:`GROUP_KEYS` from its ``run_start`` metadata; for a trial of
    a tuning (``TUNE/trials/NAME`` beside ``TUNE/tune.json``) its study, trial and tuned settings from the
    plan."""
    flat = {**{k: start.get(k) for k in GROUP_KEYS}, "tuning_trial": False}
    run_dir = Path(run_dir)
    plan = run_dir.parent.parent / TUNE_PLAN
    if run_dir.parent.name == TUNE_TRIALS and plan.exists():
        try:
            trials = readback.load(plan, readback.TUNE_PLAN)["trials"]
        except (OSError, ValueError):  # a plan being rewritten: the trial is still grouped by the tuning
            trials = []
        for t in (t for t in trials if isinstance(t, dict) and t.get("name") == run_dir.name):
            flat.update(
                tuning_trial=True,
                study=t.get("study"),
                trial=t.get("trial"),
                **{tuned_key(k): v for k, v in (t.get("params") or {}).items()},
            )
    return flat


def init_wandb(base: Path, mode: str, timeout_s: float | None = None, **init_kwargs: Any):
    """``wandb.init`` with W&B's directories under ``base``; prints where an offline run lives and how
    to upload it. ``timeout_s``: W&B's own ``init_timeout`` (how long an online start may take)."""
    os.environ.update(wandb_env(base))
    resolved = mode if mode in ("offline", "disabled") else resolve_mode(mode)
    os.environ["WANDB_MODE"] = resolved
    import wandb

    limit = {} if timeout_s is None else {"init_timeout": timeout_s}
    run = wandb.init(
        dir=str(base),
        mode=resolved,
        settings=wandb.Settings(console="off", silent=True, **limit),
        **init_kwargs,
    )
    if resolved == "offline":
        why = "" if has_api_key() or mode == "offline" else " (no API key configured)"
        print(
            f"wagma-bench: W&B run {run.id} is offline{why}; its files: {offline_dir(run)}\n"
            f"wagma-bench: upload it later with: wandb sync {offline_dir(run)}",
            flush=True,
        )
    return run


def offline_dir(run) -> Path:
    """The directory ``wandb sync`` takes for a run (``.../wandb/offline-run-<time>-<id>``)."""
    return Path(run.dir).parent


def _start_metadata(run_dir: Path) -> dict:
    start = RunEvents.read(run_dir).start
    return start.metadata if start is not None else {}


@dataclass(frozen=True)
class RunLabels:
    """What a run's W&B run is named and tagged by, from its typed configuration."""

    workload: str
    optimizer: str
    imbalance: str
    seed: int


class WandbSink:
    """Mirrors a run's events to W&B: eval metric and progress against ``step`` (and ``train_s``), the
    summary at ``run_stop`` with each rank's step-time summaries (:func:`step_time_summaries`). With
    ``per_rank_step_times`` it also logs each rank's mean compute, injected delay and communication time since
    the previous event, read from ``steps/rank<R>.jsonl`` (the files every rank flushes at synchronisation
    points; ranks on another node need a shared run directory). ``imported``: replayed after the run by
    :func:`import_run`, which leaves the run's ``summary.json`` as it is."""

    def __init__(
        self, settings, run_dir: Path, config: dict, metric: str, labels: RunLabels, imported: bool = False
    ):
        # config: the whole configuration, as W&B's run config; labels: what the run is named and tagged by
        self.settings, self.run_dir, self.config, self._metric = settings, Path(run_dir), config, metric
        self.labels, self.imported = labels, imported
        self.mode = resolve_mode(settings.mode)  # checked before the ranks started (extras.check_extras)
        self.run = None
        self.run_id: str | None = None
        self._failed = False
        self._status: str | None = None
        self._offsets: dict[Path, int] = {}
        self.used: dict[str, str] = {}  # the mode W&B ran in and why (summary.json's ``wandb`` entry)
        # W&B works in a thread of its own: the training loop only queues events (off the timed path)
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="wandb-sink", daemon=True)
        self._thread.start()

    def emit(self, event: dict) -> None:
        self._queue.put(event)

    def _work(self) -> None:
        while (event := self._queue.get()) is not None:
            if self._failed:
                continue
            try:
                self._emit(event)
            except Exception as err:  # noqa: BLE001 -- a mirror must not end the run; events.jsonl has it all
                self._failed = True
                print(
                    f"wagma-bench: W&B logging switched off after an error ({type(err).__name__}: {err}); "
                    f"the run continues, its events are in {self.run_dir / EVENTS}",
                    file=sys.stderr,
                    flush=True,
                )
        self._finish()

    def _emit(self, event: dict) -> None:
        key, meta = event["key"], event.get("metadata") or {}
        if self.run is None:
            self._start(event)
        row: dict[str, Any] = {
            k: meta[k] for k in ("round", "epoch", "samples", "train_s", "wall_s") if k in meta
        }
        if key == "eval_accuracy":
            row[f"eval/{self._metric}"] = event["value"]
            if meta.get("train_s"):
                row["throughput_samples_per_s"] = meta["samples"] / meta["train_s"]
        elif key in ("progress", "checkpoint", "run_resume"):
            row[f"events/{key}"] = 1
        if self.settings.per_rank_step_times and key in ("eval_accuracy", "progress", "run_stop"):
            row.update(self._rank_step_times())
        if "round" in row and len(row) > 1:
            self.run.log(row)
        if key in ("run_stop", "run_suspend"):  # run_suspend: a preempted process that will be resumed
            self._summarize(meta.get("status"))

    def _start(self, event: dict) -> None:
        meta = event.get("metadata") or {}
        c, run = self.config, self.labels
        world = f"_x{meta['world_size']}" if meta.get("world_size") else ""
        name = f"{run.workload}_{run.optimizer}{world}_s{run.seed}"
        # A stable id per run directory and config: a resumed run continues the same W&B run.
        key = json.dumps([str(self.run_dir.resolve()), c], sort_keys=True, default=str)
        run_id = self.run_id = hashlib.sha256(key.encode()).hexdigest()[:16]
        # after a requeue the first event is run_resume: the grouping keys come from the run's run_start
        start = meta if event["key"] == "run_start" else _start_metadata(self.run_dir)
        config = {**grouping_config(self.run_dir, start), "config": c}
        kwargs = {
            "project": self.settings.project,
            "entity": self.settings.entity,
            "name": name,
            "id": run_id,
            "group": self.settings.group or sweep_group(self.run_dir),
            "resume": "allow",
            "config": config,
            "job_type": run.optimizer,
            "tags": [run.workload, run.optimizer, run.imbalance],
        }
        self.run = self._init(kwargs)
        self.used["id"] = run_id  # summary.json's wandb entry: a report's run set can select the run by it
        self.run.define_metric("round")
        self.run.define_metric("*", step_metric="round")
        # time to accuracy: eval/* against the training clock by default; samples is logged in the same rows,
        # so a panel can take it as its x-axis too (W&B allows one step metric per metric)
        self.run.define_metric("train_s")
        self.run.define_metric("samples", step_metric="train_s")
        self.run.define_metric("eval/*", step_metric="train_s")
        if event["key"] == "run_start":
            self.run.summary.update(
                {
                    k: meta.get(k)
                    for k in (
                        "world_size",
                        "global_batch_size",
                        "target",
                        "model_params",
                        "group_size",
                        "sync_period",
                        "git_sha",
                        "hosts",
                        "versions",
                    )
                }
            )

    def _init(self, kwargs: dict):
        """The W&B run: online within ``timeout_s``, else (no network, W&B down) offline, with a message."""
        if self.mode != "online":
            if os.environ.get("WANDB_MODE") == self.mode:
                why = "WANDB_MODE"
            elif self.settings.mode == self.mode:
                why = f"logger.wandb.mode={self.mode}"
            else:  # auto without a key
                why = "no API key configured"
            self.used = {"mode": self.mode, "reason": why}
            return init_wandb(self.run_dir, self.mode, **kwargs)
        try:
            run = init_wandb(self.run_dir, "online", timeout_s=self.settings.timeout_s, **kwargs)
            self.used = {"mode": "online", "reason": "an API key is configured"}
            return run
        except Exception as err:  # noqa: BLE001 -- any failure to start online: fall back to offline
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            why = (
                f"online start failed within logger.wandb.timeout_s={self.settings.timeout_s:g} "
                f"({type(err).__name__}: {first})"
            )
        print(f"wagma-bench: W&B {why}; logging offline instead", file=sys.stderr, flush=True)
        import wandb

        try:  # W&B's service keeps retrying the online run and would never answer the offline one
            wandb.teardown()
        except Exception:  # noqa: BLE001, S110 -- a fresh service starts either way
            pass
        self.used = {"mode": "offline", "reason": "fallback: " + why}
        return init_wandb(self.run_dir, "offline", **kwargs)

    def _rank_step_times(self) -> dict[str, float]:
        row = {}
        for path in sorted((self.run_dir / "steps").glob("rank*.jsonl")):
            records = self._new_records(path)
            if records:
                rank = path.stem[len("rank") :]
                for field in STEP_COMPONENTS:
                    row[f"rank{rank}/{field}"] = sum(getattr(r, field) or 0.0 for r in records) / len(records)
        return row

    def _new_records(self, path: Path) -> list[StepRecord]:
        """Complete lines appended since the last read (a line still being written is left for later)."""
        with open(path, "rb") as f:
            f.seek(self._offsets.get(path, 0))
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._offsets[path] = self._offsets.get(path, 0) + end
        return [StepRecord.from_json(json.loads(line)) for line in data[:end].splitlines() if line.strip()]

    def _summarize(self, status: str | None) -> None:
        """At run_stop: the run's summary as W&B's run summary (the run is finished by :meth:`close`, once
        the trainer has written summary.json and mllog.txt, which go into the artifact)."""
        summary = RunEvents.read(self.run_dir).summary()
        self.run.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool))})
        self.run.summary.update(step_time_summaries(self.run_dir))
        self._status = status

    def _log_artifact(self) -> None:
        """events.jsonl, summary.json and mllog.txt as one artifact of type ``run-files`` (a new version
        per process of a requeued run; the last one holds the whole run)."""
        import wandb

        artifact = wandb.Artifact(
            f"run-files-{self.run.id}",
            type="run-files",
            metadata={"status": self._status, "run_dir": str(self.run_dir)},
        )
        for name in ARTIFACT_FILES:
            if (self.run_dir / name).exists():
                artifact.add_file(str(self.run_dir / name), name=name)
        self.run.log_artifact(artifact)

    def close(self) -> None:
        """Finish the W&B run (after the trainer wrote summary.json and mllog.txt: they go into the
        artifact), then record in summary.json which mode W&B ran in and why."""
        self._queue.put(None)
        self._thread.join(timeout=self.settings.timeout_s + 60)
        if self._thread.is_alive():
            print(
                f"wagma-bench: W&B did not finish within {self.settings.timeout_s + 60:g} s; the run's files "
                f"are in {self.run_dir}",
                file=sys.stderr,
                flush=True,
            )
        if self.used and not self.imported and (self.run_dir / SUMMARY).exists():
            try:
                add_to_summary(self.run_dir, {"wandb": dict(self.used)})
            except (OSError, ValueError) as err:
                print(f"wagma-bench: W&B mode not recorded in {SUMMARY} ({err})", file=sys.stderr, flush=True)

    def _finish(self) -> None:
        if self.run is None:
            return
        try:
            self._log_artifact()
        except Exception as err:  # noqa: BLE001 -- a mirror must not end the run; the files are on disk
            print(
                f"wagma-bench: W&B artifact not logged ({type(err).__name__}: {err})",
                file=sys.stderr,
                flush=True,
            )
        run, self.run, self._failed = self.run, None, True  # nothing more to log
        try:
            offline, where = run.settings.mode == "offline", offline_dir(run)
            run.finish(exit_code=0 if self._status not in ("failed", None) else 1)
        except Exception as err:  # noqa: BLE001 -- also called while a failed run unwinds: never mask its error
            print(
                f"wagma-bench: W&B run not finished cleanly ({type(err).__name__}: {err})",
                file=sys.stderr,
                flush=True,
            )
            return
        if offline:
            print(f"wagma-bench: offline W&B run saved; upload it with: wandb sync {where}", flush=True)


STEP_COMPONENTS = ("compute_s", "delay_s", "comm_s")  # the step-time components a run's W&B summary holds


def step_time_summaries(run_dir: Path) -> dict[str, float]:
    """Per rank and component (:data:`STEP_COMPONENTS`): the mean, p50 and p95 of its per-step seconds
    (``rank<R>/<component>_{mean,p50,p95}``); over the ranks, each component's mean of the ranks' means and
    the worst rank's mean (``ranks/<component>_{mean,worst}``): what a W&B panel shows at any world size. Read
    from the step records, raw or compact; none where there are none (or a damaged table)."""
    try:
        records = read_step_records(run_dir)
    except ValueError:
        return {}
    out: dict[str, float] = {}
    for field in STEP_COMPONENTS:
        means = []
        for rank, recs in sorted(records.items()):
            values = sorted(float(v) for r in recs if isinstance(v := getattr(r, field), (int, float)))
            if not values:
                continue
            mean = sum(values) / len(values)
            means.append(mean)
            out[f"rank{rank}/{field}_mean"] = mean
            out[f"rank{rank}/{field}_p50"] = _percentile(values, 50)
            out[f"rank{rank}/{field}_p95"] = _percentile(values, 95)
        if means:
            out[f"ranks/{field}_mean"], out[f"ranks/{field}_worst"] = sum(means) / len(means), max(means)
    return out


def _percentile(ordered: list[float], q: float) -> float:
    """The q-th percentile of sorted values, linear between order statistics (numpy's default)."""
    pos = q / 100 * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


IMPORTED = "wandb-import.json"  # under RUN_DIR/wandb/: where wandb-import logged the run, read by report


def import_run(run_dir: Path, project: str, entity: str | None, group: str | None, mode: str) -> Path:
    """Log a finished run (a trial, a committed compact result) as the W&B run ``logger=wandb`` would have
    made of it: its events replayed through :class:`WandbSink` (the same config keys, history and summary),
    its W&B files under ``RUN_DIR/wandb/`` with a note of where they went (:data:`IMPORTED`). Returns that
    folder."""
    run_dir = Path(run_dir)
    record = RunEvents.read(run_dir)
    if record.start is None or not record.stopped:
        raise ConfigError(
            f"{run_dir}: not a finished run (no run_start or no run_stop in {EVENTS}); wandb-import logs "
            "finished runs only"
        )
    start = record.start
    config = start.config
    settings = WandbConfig(project=project, entity=entity, group=group, mode=mode)
    labels = RunLabels(
        str(start.workload), str(start.optimizer), str(start.get("imbalance")), start.get("seed") or 0
    )
    sink = WandbSink(settings, run_dir, config, str(start.metric), labels, imported=True)
    for event in record.events:
        sink.emit(event)
    sink.close()
    note = {
        "project": project,
        "entity": entity,
        "group": group or sweep_group(run_dir),
        "mode": sink.used.get("mode"),
        "id": sink.run_id,
    }
    write_json_atomic(run_dir / "wandb" / IMPORTED, note)
    return run_dir / "wandb"
