"""MLPerf training logs (``RUN_DIR/mllog.txt``), derived from a run's ``events.jsonl``.

The event log stays the source of truth; this module only translates it, after the fact, into the
``:::MLLOG`` lines that MLPerf's tools read, written through ``mlperf_logging.mllog`` with its key
constants. The trainer calls :func:`write_mllog` at the end of every run (and the launcher after a
failure); ``wagma-bench report --mllog`` rewrites the file of existing run directories.

Which MLPerf rules a workload's log follows (the closest benchmark; the ruleset is the last one that
has it). ``tests/test_mllog.py`` runs the official compliance checker on real runs of the first two::

    # resnet
    python -m mlperf_logging.compliance_checker --usage training --ruleset 4.0.0 RUN_DIR/mllog.txt
    # transformer
    python -m mlperf_logging.compliance_checker --usage training --ruleset 0.7.0 RUN_DIR/mllog.txt

- ``resnet``: training 4.0.0, open division, ``resnet`` (the validation top-1 as a fraction).
- ``transformer``: training 0.7.0, open division, ``transformer``. MLPerf logs BLEU as a fraction, so
  ``eval_accuracy`` is sacrebleu's BLEU / 100 (the 0-100 value stays in the metadata as ``bleu``); the
  rules require at least one evaluation at or above 0.25 (MLPerf's target, 25 BLEU).
- ``ddppo``: MLPerf training has no RL benchmark; the log follows the common rules of training 4.0.0
  (``training_4.0.0/common.yaml``) with ``submission_benchmark`` ``ddppo``. The checker's command line
  cannot check it: the open division's rules accept only MLPerf's benchmark names and then look for a rules
  file of the benchmark, which ``ddppo`` has not; the test applies ``common.yaml`` through the checker's API.

How our run maps onto MLPerf's keys:

- ``cache_clear`` is ``false``: wagma-bench does not drop the file-system cache before a run.
- ``init_start`` is when rank 0 began setting up (model, data, communicator); ``init_stop`` and
  ``run_start`` are our ``run_start``, when the training clock starts.
- A *block* is the training between two evaluations (``block_start``: ``first_epoch_num``,
  ``epoch_count``, fractional epochs as our evaluation period is); ``eval_start``/``eval_stop`` bracket
  each evaluation (its duration is ``eval_took_s`` of our event).
- ``run_stop`` appears exactly once, at the real end of the run: ``status`` is ``success`` when an
  evaluation reached the target, ``aborted`` otherwise (our own status is ``run_status``). A run that was
  preempted and resumed (SLURM requeue, a rerun in the same directory) logs our own keys ``run_suspend``
  (where a process stopped: today's logs write a ``run_stop`` with status ``preempted`` there, newer ones
  ``run_suspend``) and ``run_resume`` (where the next one started), both POINT_IN_TIME, which the checker
  ignores. Evaluations that a resume from an older checkpoint rolled back are left out. Times are wall
  clock, so MLPerf's ``run_stop - run_start`` includes time in the queue; every record carries our
  training clock ``train_s``, the one time-to-target is read from.
- ``submission_*`` come from the run's ``logger.submission`` settings.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from wagma_bench.config.paths import CHECKOUT
from wagma_bench.config.recorded import setting
from wagma_bench.record.events import EVENTS, RunEvents, RunStart, current_event, run_metric
from wagma_bench.record.files import atomic_write

MLLOG = "mllog.txt"

# workload -> (MLPerf benchmark name, training ruleset whose rules the log follows)
BENCHMARKS = {
    "resnet": ("resnet", "4.0.0"),
    "transformer": ("transformer", "0.7.0"),
    "ddppo": ("ddppo", "4.0.0"),
}
# MLPerf reports each workload's quality as a fraction; our metric divided by this gives it.
METRIC_SCALE = {"bleu": 100.0}
# Our events that a resume from a checkpoint rolls back when they came after that checkpoint.
ROLLED_BACK = ("eval_accuracy", "progress", "checkpoint")
# submission_* keys every ruleset requires (the point of contact is optional)
_REQUIRED_SUBMISSION = (
    "submission_benchmark",
    "submission_org",
    "submission_platform",
    "submission_division",
    "submission_status",
)
SUBMISSION_DEFAULTS = {
    "org": "wagma-bench",
    "platform": "unknown",
    "division": "open",
    "status": "research",
    "poc_name": "",
    "poc_email": "",
}


@dataclass
class Record:
    """One MLPerf log line: ``kind`` is the MLLogger method (``start``, ``end`` or ``event``)."""

    kind: str
    key: str
    value: Any
    time_ms: float
    metadata: dict


def submission_settings(config: dict) -> dict:
    """The ``logger.submission`` section of a run's resolved config, over the
    defaults (older runs have none)."""
    given = setting(config, "logger.submission") or {}
    return {**SUBMISSION_DEFAULTS, **{k: v for k, v in given.items() if v is not None}}


def effective_events(events: list[dict]) -> list[dict]:
    """The events of the run that produced the final model: a resume at round ``s`` drops the evaluations,
    progress and checkpoints logged after ``s`` by the process that stopped (work the resume repeats)."""
    kept: list[dict] = []
    for event in events:
        if event["key"] == "run_resume":
            at = event["metadata"].get("round", 0)
            kept = [e for e in kept if e["key"] not in ROLLED_BACK or e["metadata"].get("round", 0) <= at]
        kept.append(event)
    return kept


def final_stop_index(events: list[dict]) -> int | None:
    """Index of the run_stop that ends the run: the last one, when no resume follows it."""
    for i in range(len(events) - 1, -1, -1):
        if events[i]["key"] == "run_resume":
            return None
        if events[i]["key"] == "run_stop":
            return i
    return None


def mllog_records(events: list[dict]) -> list[Record]:
    """The MLPerf log of a run, from its events (empty when the run never started; events of an older run read
    under today's names: :func:`~wagma_bench.record.events.current_event`)."""
    events = effective_events([current_event(e) for e in events])
    start_i = next((i for i, e in enumerate(events) if e["key"] == "run_start"), None)
    if start_i is None:
        return []
    return _Translation(events, start_i).records


class _Translation:
    """Walks the events once, keeping the state MLPerf's interval keys need (the open block)."""

    def __init__(self, events: list[dict], start_i: int):
        self.events, self.records = events, []
        start = events[start_i]
        self.start = RunStart(start["metadata"])
        self.scale = METRIC_SCALE.get(self.start.metric, 1.0)
        self.target = self.start.target
        self.goal, self.time_limit_s = (
            run_metric(self.start.metadata),
            setting(self.start.config, "train.time_limit_s"),
        )
        self.reached = False
        self.block_first: float | None = None  # first epoch of the open block; None: no block open
        self.epoch = 0.0
        self._preamble(start)
        stop_i = final_stop_index(events)
        for i in range(start_i + 1, len(events)):
            self._translate(i, events[i], final=i == stop_i)
        if stop_i is None:  # the run is still going, or its processes were killed before run_stop
            last = events[-1]
            self._stop(last["time_ms"], {"status": "incomplete", **_clock(last["metadata"])})

    def add(self, kind: str, key: str, value: Any, time_ms: float, **metadata: Any) -> None:
        self.records.append(Record(kind, key, value, time_ms, metadata))

    def _preamble(self, start: dict) -> None:
        from mlperf_logging.mllog import constants as c

        t, config = start["time_ms"], self.start.config
        t_init = self.start.get("init_time_ms", t)
        self.add("event", c.CACHE_CLEAR, False, t_init)
        self.add("start", c.INIT_START, None, t_init)
        benchmark = BENCHMARKS.get(self.start.workload, (self.start.workload, None))[0]
        sub = submission_settings(config)
        for key, value in (
            (c.SUBMISSION_BENCHMARK, benchmark),
            (c.SUBMISSION_ORG, sub["org"]),
            (c.SUBMISSION_PLATFORM, sub["platform"]),
            (c.SUBMISSION_DIVISION, sub["division"]),
            (c.SUBMISSION_STATUS, sub["status"]),
            (c.SUBMISSION_POC_NAME, sub["poc_name"]),
            (c.SUBMISSION_POC_EMAIL, sub["poc_email"]),
        ):
            if value != "" or key in _REQUIRED_SUBMISSION:
                self.add("event", key, value, t_init)
        for key, value in self._hyperparameters(config).items():
            self.add("event", key, value, t)
        self.add("end", c.INIT_STOP, None, t)
        self.add("start", c.RUN_START, None, t)
        self._open_block(t, 0.0, start_index=0)

    def _hyperparameters(self, config: dict) -> dict:
        from mlperf_logging.mllog import constants as c

        start, train = self.start, config.get("train") or {}
        out = {
            c.SEED: start.get("seed"),
            c.GLOBAL_BATCH_SIZE: start.get("global_batch_size"),
            c.GRADIENT_ACCUMULATION_STEPS: 1,
            c.TRAIN_SAMPLES: start.get("train_samples"),
            c.EVAL_SAMPLES: start.get("eval_samples") or 0,
            # ours: the distributed algorithm and where it ran (MLPerf keeps these in its system description)
            "distributed_optimizer": start.optimizer,
            "world_size": start.world_size or 1,
            "number_of_nodes": start.nodes,
            "accelerators_per_node": start.ranks_per_node,
        }
        if train:
            adam = train.get("local_optimizer") == "adam"
            out[c.OPT_NAME] = (c.ADAMW if train.get("weight_decay") else c.ADAM) if adam else c.SGD
            out[c.OPT_BASE_LR] = start.base_lr
            out[c.OPT_WEIGHT_DECAY] = train.get("weight_decay")
        return out

    def _translate(self, i: int, event: dict, final: bool) -> None:
        key, meta, t = event["key"], event["metadata"], event["time_ms"]
        if key == "eval_accuracy":
            self._eval(i, event)
        elif key == "run_suspend" or (key == "run_stop" and not final):
            self._close_block(t)
            self.add("event", "run_suspend", None, t, run_status=meta.get("status"), **_clock(meta))
        elif key == "run_resume":
            self.epoch = meta.get("epoch", self.epoch)
            self.add("event", "run_resume", None, t, epoch_num=self.epoch, **_clock(meta))
            self._open_block(t, self.epoch, start_index=i)
        elif key == "run_stop":
            self._close_block(t)
            self._stop(t, {"status": meta.get("status"), **_clock(meta)})

    def _eval(self, i: int, event: dict) -> None:
        from mlperf_logging.mllog import constants as c

        meta, t_end = event["metadata"], event["time_ms"]
        t_begin = t_end - 1000 * (meta.get("eval_took_s") or 0.0)
        self.epoch = meta.get("epoch", self.epoch)
        self._close_block(t_begin)
        where = {c.EPOCH_NUM: self.epoch, c.SAMPLES_COUNT: meta.get("samples"), c.STEP_NUM: meta.get("round")}
        value = event["value"]
        ours = {self.start.metric or "metric": value, "train_s": meta.get("train_s")}
        if "sacrebleu_signature" in meta:
            ours["sacrebleu_signature"] = meta["sacrebleu_signature"]
        self.add("start", c.EVAL_START, None, t_begin, **where)
        self.add("event", c.EVAL_ACCURACY, value / self.scale, t_end, **where, **ours)
        self.add("end", c.EVAL_STOP, None, t_end, **where)
        if self.goal.reached(value, meta.get("train_s"), self.time_limit_s):
            self.reached = True
        self._open_block(t_end, self.epoch, start_index=i)

    def _open_block(self, t: float, epoch: float, start_index: int) -> None:
        """A block runs to the next evaluation of the same process; none is opened when there is none."""
        from mlperf_logging.mllog import constants as c

        for later in self.events[start_index + 1 :]:
            if later["key"] in ("run_stop", "run_suspend"):
                return
            if later["key"] == "eval_accuracy":
                count = later["metadata"].get("epoch", epoch) - epoch
                if count > 0:
                    self.block_first = epoch
                    self.add(
                        "start", c.BLOCK_START, None, t, **{c.FIRST_EPOCH_NUM: epoch, c.EPOCH_COUNT: count}
                    )
                return

    def _close_block(self, t: float) -> None:
        from mlperf_logging.mllog import constants as c

        if self.block_first is not None:
            self.add("end", c.BLOCK_STOP, None, t, **{c.FIRST_EPOCH_NUM: self.block_first})
            self.block_first = None

    def _stop(self, t: float, ours: dict) -> None:
        from mlperf_logging.mllog import constants as c

        self._close_block(t)
        success = self.reached if self.target is not None else ours.get("status") == "completed"
        run_status = ours.pop("status")
        self.add(
            "end",
            c.RUN_STOP,
            None,
            t,
            **{c.STATUS: c.SUCCESS if success else c.ABORTED},
            run_status=run_status,
            **ours,
        )


def _clock(meta: dict) -> dict:
    """Our round and training clock, carried along in a record's metadata."""
    return {k: meta[k] for k in ("round", "train_s", "samples") if k in meta}


def write_mllog(run_dir: Path, echo: bool = False) -> Path | None:
    """(Re)write ``RUN_DIR/mllog.txt`` from the run's events, through ``mlperf_logging``'s MLLogger; with
    ``echo`` the lines also go to stdout. Returns the file, or None when the run has no ``run_start``."""
    run_dir = Path(run_dir)
    records = mllog_records(RunEvents.read(run_dir).events)
    if not records:
        (run_dir / MLLOG).unlink(missing_ok=True)  # an earlier attempt's log must not stand for this end
        return None
    atomic_write(run_dir / MLLOG, lambda f: _log_records(records, f, echo))
    return run_dir / MLLOG


def _log_records(records: list[Record], stream: IO, echo: bool) -> None:
    """The records through ``mlperf_logging``'s MLLogger, into ``stream`` (and stdout with ``echo``)."""
    from mlperf_logging.mllog import mllog

    handlers: list[logging.Handler] = [logging.StreamHandler(stream)]
    if echo:
        handlers.append(logging.StreamHandler(sys.stdout))
    logger = logging.getLogger("wagma_bench.mllog")
    logger.propagate = False  # only our handlers: not Hydra's job log, not the root logger
    logger.setLevel(logging.INFO)
    for handler in handlers:
        logger.addHandler(handler)
    mllogger = mllog.MLLogger(logger=logger, root_dir=str(CHECKOUT))
    try:
        for r in records:
            getattr(mllogger, r.kind)(key=r.key, value=r.value, metadata=r.metadata, time_ms=int(r.time_ms))
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
            handler.flush()


def try_write_mllog(run_dir: Path, echo: bool = False) -> Path | None:
    """:func:`write_mllog` for the end of a run: a failure only warns. The MLPerf log is derived, and it
    must neither fail a finished run nor hide the error of a failed one; ``report --mllog`` rewrites it."""
    try:
        return write_mllog(run_dir, echo)
    except Exception as err:  # noqa: BLE001
        (Path(run_dir) / MLLOG).unlink(missing_ok=True)  # a stale log (an earlier end's) would mislead
        print(
            f"wagma-bench: {MLLOG} not written ({type(err).__name__}: {err}); the events are in "
            f"{Path(run_dir) / EVENTS}",
            file=sys.stderr,
            flush=True,
        )
        return None
