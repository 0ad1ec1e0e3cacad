"""Checked before the queue: what ``sweep`` and ``tune``'s cluster mode check and estimate while they render,
so that a job does not wait in SLURM's queue only to fail at its start or to spend more than the user meant.

- Each run's data (:func:`check_data`): the path its data option reads (``data.root``, ``data.path``,
  ``env.data_root``) exists on the submitting host, is readable and has the layout that option reads, by the
  same checks ``wagma-bench run`` makes at its start. A path that only the compute nodes see (a scratch file
  system not mounted where the sweep is rendered) is said with ``--data-on-nodes``: it is then not checked
  here, and the output says so.
- The sweep's GPU-hours (:func:`gpu_hours`): the sum over runs of GPUs x rounds x seconds per round. Seconds
  per round are measured ones where ``--step-times RUN_DIR...`` holds a finished run of the same workload,
  data, optimizer and world size, else the simulator's (:func:`wagma_bench.simulate.des.simulate`, the model
  of ``wagma-bench simulate``, with its workload preset and the cluster profile's network); rounds are the
  trainer's plan (:class:`wagma_bench.config.plan.RunPlan`). Beside it, the bound the queue enforces: every
  run's GPUs x ``cluster.time``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from wagma_bench.config.cluster import ClusterProfile, slurm_hours_minutes
from wagma_bench.config.plan import RunPlan
from wagma_bench.config.recorded import setting
from wagma_bench.config.schema import RunConfig
from wagma_bench.errors import ConfigError
from wagma_bench.optim.specs import OPTIMIZER_SPECS
from wagma_bench.workloads.specs import (
    IMAGENET_LAYOUT,
    WORKLOAD_SPECS,
    check_binarized_dir,
    check_imagenet_root,
    rounds_per_epoch,
    updates_per_rollout,
)

DATA_ON_NODES = "--data-on-nodes"
STEP_TIMES = "--step-times"
# how each data option's files are prepared (where the data error points)
PREPARE = {"imagenet": "reproduce/imagenet/README.md", "wmt17_en_de": "reproduce/transformer/README.md"}
LAYOUTS = {
    "imagenet": IMAGENET_LAYOUT,
    "wmt17_en_de": "a fairseq-binarized directory (fairseq-preprocess output)",
    "habitat": "the folder holding habitat's data/ (scene_datasets, datasets)",
}


# --- data ---------------------------------------------------------------------------------------------------


def data_paths(cfg: RunConfig) -> list[tuple[str, str]]:
    """(key, path) of the files a run's data option reads from outside the suite;
    none for the embedded data."""
    section = WORKLOAD_SPECS[cfg.workload.name].DATA_SECTION
    data = cfg.data
    key = {"imagenet": "root", "wmt17_en_de": "path", "habitat": "data_root"}.get(data.name)
    path = getattr(data, key, None) if key else None
    return [(f"{section}.{key}", str(path))] if path else []


def check_data(configs: Iterable[RunConfig], on_nodes: bool = False) -> list[str]:
    """Check each distinct data path of the runs (:func:`check_data_path`); one line per path saying what was
    checked, or, ``on_nodes``, that it was not. A ConfigError naming the key and the path otherwise."""
    paths: dict[tuple[str, str], RunConfig] = {}
    for cfg in configs:
        for key, path in data_paths(cfg):
            paths.setdefault((key, path), cfg)
    lines = []
    for (key, path), cfg in paths.items():
        if on_nodes:
            lines.append(
                f"{key}={path}: not checked ({DATA_ON_NODES}: only the compute nodes see it); each run "
                "checks it at its start"
            )
        else:
            check_data_path(key, path, cfg)
            lines.append(f"{key}={path}: exists, readable, {cfg.data.name} layout")
    return lines


def check_data_path(key: str, path: str, cfg: RunConfig) -> None:
    """The path exists here, is a readable directory and has the layout its data option reads."""
    name = cfg.data.name
    prepare = f"; prepare it as {PREPARE[name]} says" if name in PREPARE else ""
    unseen = f"{prepare}; a path that only the compute nodes see: give {DATA_ON_NODES}"
    root = Path(path).expanduser()
    if not root.exists():
        raise ConfigError(f"{key}={path}: no such directory on this host; expected {LAYOUTS[name]}{unseen}")
    if not root.is_dir():
        raise ConfigError(f"{key}={path}: not a directory; expected {LAYOUTS[name]}{prepare}")
    if not readable(root):
        raise ConfigError(
            f"{key}={path}: not readable by this user (uid {os.getuid()}); expected {LAYOUTS[name]}{prepare}"
        )
    try:
        if name == "imagenet":
            check_imagenet_root(path)
        elif name == "wmt17_en_de":
            check_binarized_dir(path, cfg.data.source_lang, cfg.data.target_lang, cfg.data.eval_split)
        elif name == "habitat" and not (root / "data").is_dir():
            raise ConfigError(f"{key}={path}: no data/ folder in it; expected {LAYOUTS[name]}")
    except ConfigError as err:
        said = str(err)
        raise ConfigError(said + (prepare if name in PREPARE and PREPARE[name] not in said else "")) from None


def readable(folder: Path) -> bool:
    """The folder can be listed (tried, not asked of the mode bits: an ACL or root squash decides too)."""
    try:
        with os.scandir(folder) as entries:
            next(entries, None)
    except OSError:
        return False
    return True


# --- GPU-hours ----------------------------------------------------------------------------------------------

SIM_ROUNDS = 100  # rounds simulated per (optimizer, settings, world): the mean round time settles well before
# the training-set sizes of the data options whose size the configuration does not give; a subset folder of
# ImageNet is smaller (the estimate is then high). Others are read from --step-times runs (their run_start).
TRAIN_SAMPLES = {
    ("resnet", "imagenet"): 1_281_167,  # ILSVRC-2012's training images
    ("resnet", "mnist5k"): 4_500,
}  # conf/data/mnist5k.yaml: 500 per class less 50 for validation


@dataclass
class Measured:
    """Seconds per round and training-set sizes of finished runs (``--step-times``)."""

    round_s: dict[tuple, float]  # (workload, data, optimizer, world) -> seconds per round
    train_samples: dict[tuple, int]  # (workload, data) -> samples per epoch


def read_step_times(paths: Iterable[str]) -> Measured:
    """Every run at or below ``paths`` that trained: its training clock per round, by what it ran."""
    from wagma_bench.analysis.run_records import find_runs
    from wagma_bench.record.events import RunEvents

    paths = list(paths)
    out = Measured({}, {})
    try:
        dirs = find_runs(paths)
    except FileNotFoundError as err:
        raise ConfigError(f"{STEP_TIMES}: {err}") from None
    for d in dirs:
        record = RunEvents.read(d)
        start, summary = record.start, record.summary_or_saved()
        if start is None or not summary.rounds or not summary.train_s:
            continue
        data = setting(start.config, "data.name") or summary.data
        key = (start.workload, data, start.optimizer, start.world_size)
        out.round_s.setdefault(key, summary.train_s / summary.rounds)
        if start.get("train_samples"):
            out.train_samples.setdefault((start.workload, data), int(start.get("train_samples")))
    if paths and not out.round_s:
        raise ConfigError(
            f"{STEP_TIMES} {' '.join(paths)}: no run that trained (events.jsonl with steps) there"
        )
    return out


def steps_per_epoch(cfg: RunConfig, gpus: int, measured: Measured) -> int | None:
    """Rounds of one epoch as the workload will count them; None where only the data itself says."""
    if cfg.workload.name == "ddppo":  # an epoch is one rollout's updates
        return updates_per_rollout(cfg.workload)
    key = (cfg.workload.name, cfg.data.name)
    size = measured.train_samples.get(key, TRAIN_SAMPLES.get(key))
    if cfg.data.name == "synthetic":
        size = cfg.data.num_samples * gpus
    return None if size is None else rounds_per_epoch(size, cfg.train.batch_size, gpus)


def rounds_of(cfg: RunConfig, gpus: int, measured: Measured) -> int | None:
    """The run's length in rounds by the trainer's plan; None when it depends on
    an unknown training-set size."""
    per_epoch = steps_per_epoch(cfg, gpus, measured)
    if per_epoch is None and cfg.train.max_rounds is None:
        return None
    sync = OPTIMIZER_SPECS[cfg.optimizer.name].sync_period_of(cfg.optimizer)
    return RunPlan.of(cfg, sync, per_epoch or 1, gpus).total


class Predictor:
    """Seconds per round of a run as the simulator predicts it (one simulation per distinct optimizer
    settings, imbalance and world size); None where no workload preset models the run."""

    def __init__(self, profile: ClusterProfile):
        self.profile, self.cache, self.presets = profile, {}, set()
        self.other_batch: dict[str, int] = {}  # preset -> its batch, where a run's batch differs
        self._network = None

    def network(self):
        from wagma_bench.simulate.costs import Network

        if self._network is None:
            net = self.profile.network.as_dict() if self.profile.network else {}
            self._network = Network.from_profile(
                net, self.profile.gpus_per_node, f"conf/cluster/{self.profile.name}.yaml network"
            )
        return self._network

    def round_s(self, cfg: RunConfig, gpus: int) -> float | None:
        from wagma_bench.imbalance import make_imbalance
        from wagma_bench.simulate.des import SimConfig, local_state_tensors, simulate
        from wagma_bench.simulate.presets import preset_for

        key = (
            repr(cfg.optimizer),
            repr(cfg.imbalance),
            cfg.workload.name,
            cfg.data.name,
            cfg.train.local_optimizer,
            cfg.train.momentum,
            gpus,
        )
        if key not in self.cache:
            try:
                workload = preset_for(cfg.workload.name, cfg.data.name)
            except ValueError:
                self.cache[key] = None
                return None
            self.presets.add(workload.name)
            if (
                cfg.train.batch_size != workload.batch
            ):  # the preset's step time is for its own batch: said, not scaled
                self.other_batch[workload.name] = workload.batch
            sim = SimConfig(
                cfg.optimizer.name,
                gpus,
                workload,
                self.network(),
                make_imbalance(cfg.imbalance, cfg.seed),
                cfg.optimizer,
                SIM_ROUNDS,
                cfg.seed,
                local_state=local_state_tensors(cfg.train.local_optimizer, cfg.train.momentum),
            )
            result = simulate(sim)
            self.cache[key] = result.time_s / result.rounds
        return self.cache[key]


def gpu_hours(
    profile: ClusterProfile,
    runs: list[tuple[int, RunConfig]],
    step_times: Iterable[str] = (),
    one_job: bool = False,
) -> dict:
    """The estimate for ``runs`` ((GPUs, config) each): expected GPU-hours, the
    bound, and where each came from. ``one_job``: the runs share one allocation (the smoke sweep's job), the
    bound is its GPUs x ``cluster.time`` once."""
    measured = read_step_times(step_times)
    predictor = Predictor(profile)
    limit_s = time_limit_s(profile.time)
    known_s, counts, longer = 0.0, {"measured": 0, "simulated": 0, "unknown": 0}, 0
    for gpus, cfg in runs:
        seconds, source = run_seconds(cfg, gpus, measured, predictor)
        if seconds is None:  # no expectation: only the bound counts it
            source = "unknown"
        else:
            known_s += gpus * seconds
            longer += limit_s is not None and seconds > limit_s
        counts[source] += 1
    total_gpus = sum(g for g, _ in runs)
    known = counts["measured"] + counts["simulated"]
    est = {
        # GPU-hours of the runs whose length and round time are known (None: none is)
        "expected": known_s / 3600 if known else None,
        "expected_runs": known,
        "bound": (max(g for g, _ in runs) if one_job else total_gpus) * limit_s / 3600 if limit_s else None,
        "one_job": one_job,
        "runs": len(runs),
        "gpus": total_gpus,
        "sources": counts,
        "presets": sorted(predictor.presets),
        "preset_batch": predictor.other_batch,
        "cluster_time": profile.time,
        # runs expected to outlast cluster.time (requeued); None where some run's length is unknown
        "longer_than_time": None if counts["unknown"] else longer,
    }
    est["line"] = gpu_hour_line(est, profile.name)
    return est


def run_seconds(
    cfg: RunConfig, gpus: int, measured: Measured, predictor: Predictor
) -> tuple[float | None, str]:
    """(expected training seconds of one run, where its seconds per round come from: measured | simulated)."""
    rounds = rounds_of(cfg, gpus, measured)
    round_s = measured.round_s.get((cfg.workload.name, cfg.data.name, cfg.optimizer.name, gpus))
    source = "measured"
    if round_s is None:
        round_s, source = predictor.round_s(cfg, gpus), "simulated"
    if rounds is None or round_s is None:
        return None, source
    seconds = rounds * round_s
    if cfg.train.time_limit_s is not None:  # the trainer stops the run there
        seconds = min(seconds, cfg.train.time_limit_s)
    return seconds, source


def time_limit_s(limit: str) -> float | None:
    """``cluster.time`` in seconds (None: INFINITE / UNLIMITED)."""
    if limit in ("INFINITE", "UNLIMITED"):
        return None
    hours, minutes = slurm_hours_minutes(limit)
    return (hours * 60 + minutes) * 60.0


def gpu_hour_line(est: dict, cluster: str) -> str:
    """One line: the expected GPU-hours where the runs' lengths and round times are known (else "unknown")
    and where they come from, then the bound of the cluster's time limit, said to be a bound."""
    counts = est["sources"]
    parts = []
    if counts["measured"]:
        parts.append(f"{n_runs(counts['measured'])} measured ({STEP_TIMES})")
    if counts["simulated"]:
        parts.append(
            f"{n_runs(counts['simulated'])} simulated (wagma-bench simulate's model: preset "
            f"{', '.join(est['presets'])}, cluster {cluster}'s network)"
        )
    if est["preset_batch"]:
        batches = ", ".join(f"{name}'s at batch {b}" for name, b in est["preset_batch"].items())
        parts.append(
            f"runs of another train.batch_size take the preset's step time ({batches}): give "
            f"{STEP_TIMES} for theirs"
        )
    unknown = counts["unknown"]
    why_unknown = (
        f"{n_runs(unknown)} of unknown length or round time ({STEP_TIMES} RUN_DIR of a finished run of the "
        "same data tells them)"
    )
    if est["expected"] is None:
        line = f"GPU-hours: expected unknown: {why_unknown}"
    else:
        line = (
            f"GPU-hours: {est['expected']:,.1f} expected for {n_runs(est['expected_runs'])} = GPUs x rounds "
            f"x seconds per round ({'; '.join(parts)}; training only: evaluations, start-up and queueing not "
            "counted)"
        )
        if unknown:
            line += f"; unknown for the other {why_unknown}"
    if est["longer_than_time"]:
        line += (
            f"; {n_runs(est['longer_than_time'])} longer than cluster.time={est['cluster_time']} (requeued "
            "from their checkpoints)"
        )
    if est["bound"] is None:
        return line + f"; no upper bound: cluster.time={est['cluster_time']}"
    allocations = (
        f"one job: {est['bound']:,.1f} = its GPUs x"
        if est.get("one_job")
        else f"one allocation per run: {est['bound']:,.1f} = {n_runs(est['runs'])} x their GPUs x"
    )
    return line + f"; upper bound, {allocations} cluster.time={est['cluster_time']} (requeues come on top)"


def n_runs(n: int) -> str:
    return f"{n:,} run" + ("" if n == 1 else "s")


def summary(manifest: dict) -> str:
    """What a rendered sweep's manifest says was checked before the queue: a line
    per data path, the GPU-hours."""
    checks = manifest.get("checks") or {}
    lines = [
        *checks.get("data", []),
        checks.get("node"),
        checks["gpu_hours"]["line"],
        checks.get("slurm"),
        checks.get("paths"),
    ]
    return "\n".join(line for line in lines if line)
