"""Calibration of the simulator from real runs and ``wagma-bench comm-bench`` results.

From a run directory (``events.jsonl``, ``steps/rank<R>.jsonl``, ``summary.json``; a committed result's
``events.jsonl.xz`` and ``steps.json.xz`` read the same):

- the compute-time distribution: every rank's ``compute_s`` (forward + backward as the trainer timed it),
  the first ``SKIP_STEPS`` steps of each rank dropped (warm-up); kept as an empirical sample and
  summarised as a lognormal (median, and sigma from the 16th-84th percentile spread of its logarithm);
- the compute trace: each rank's ``compute_s`` step by step, for a trace-driven replay of the same run;
- the per-step overhead: the median of ``dt - compute_s - delay_s - comm_s`` between consecutive steps of a
  rank (optimizer update, data loading, logging: the time the trainer spends outside what it times);
- what the run was: optimizer and its settings, world size, imbalance settings and the model's parameter
  count (from ``run_start``; a run logged before run_start carried the count rebuilds the model from its
  config), the rounds it ran, samples per step, and its measured throughput (``summary.json``).

From comm-bench JSON (``{"backend", "world_size", "hostname", "results": [{"op", "impl", "group_size",
"bytes", "median_s", ...}]}``): alpha and beta of each link level by least squares on its allreduce rows, for
each collective algorithm of :mod:`.costs`; the algorithm whose model fits both levels best (smallest relative
RMS error over their rows) is kept. Rows are weighted by ``1 / median_s`` so small (latency-bound) and large
(bandwidth-bound) messages count alike. A comm-bench across hosts (``srun``, ``torchrun``) holds each level's
rows apart (``levels``: ``intra``, ranks of one host; ``inter``, one rank per host); a comm-bench on one host
(every file written before, and ``--nproc`` runs) measured the intra-node link only, in its ``results``. A
level that was not measured takes the other's fit, and the report says so (``levels.LEVEL.note``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wagma_bench.config.recorded import setting
from wagma_bench.config.renamed import renamed_option
from wagma_bench.imbalance import Imbalance
from wagma_bench.record.events import EVENTS, SUMMARY, RunEvents, RunStart, find_run_dirs
from wagma_bench.record.steps import STEP_TABLE, read_step_records
from wagma_bench.simulate.costs import ALGORITHMS, Link, Network, allreduce_terms
from wagma_bench.simulate.des import Workload, local_state_tensors

SKIP_STEPS = 3  # first steps of each rank left out of the fits (start-up, allocator warm-up)
MAX_SAMPLES = 20000  # compute times kept for the empirical distribution
ALLREDUCE_OPS = ("allreduce", "group_allreduce")


# --- compute time ---------------------------------------------------------------------------------------


def lognormal_fit(values: Sequence[float]) -> tuple[float, float]:
    """(median, sigma) of a lognormal matched to the sample's median and central 68% spread."""
    x = np.asarray([v for v in values if v > 0], dtype=float)
    if not len(x):
        raise ValueError("no positive compute times to fit")
    logs = np.log(x)
    lo, hi = np.percentile(logs, [15.87, 84.13])
    return float(np.exp(np.median(logs))), float(max(0.0, (hi - lo) / 2))


@dataclass
class RunFit:
    """What calibration learned from one real run."""

    path: str
    optimizer: str
    world_size: int
    imbalance: dict  # the run's imbalance settings (name + fields)
    settings: dict  # the run's optimizer settings
    rounds: int  # rounds the run completed
    seed: int
    samples_per_step: float  # mean samples a rank processes per step
    compute: list[float]  # compute times (s) after warm-up, all ranks pooled
    trace: list[list[float]]  # per rank (0..P-1), every step's compute time in step order
    delay_trace: list[list[float]]  # per rank, every step's injected delay (slept) in step order
    overhead_s: float  # median per-step time outside compute, delay and communication
    measured_throughput: float | None
    params: float | None  # model parameters (None: unknown, pass params=N)
    workload: str | None = None
    comm_s_mean: float = 0.0
    local_state: int = 1  # model-sized tensors of the run's local optimizer state (des.local_state_tensors)
    extra: dict = field(default_factory=dict)

    def to_workload(self, params: float | None = None, compute: str = "empirical") -> Workload:
        n = params if params is not None else self.params
        if n is None:
            raise ValueError(f"{self.path}: model size unknown; pass params=N (number of model parameters)")
        median, sigma = lognormal_fit(self.compute)
        return Workload(
            name=self.workload or "calibrated",
            step_s=median,
            batch=max(1, round(self.samples_per_step)),
            params=float(n),
            compute=compute,
            sigma=sigma,
            samples=tuple(self.compute),
            trace=tuple(tuple(seq) for seq in self.trace),
            overhead_s=self.overhead_s,
            # the suite's own AD-PSGD as measured: its compute times already carry what its thread took from
            # them, and it has no per-step averaging of the authors' code (give gossip_cost= and
            # adpsgd_averaging= to model the authors' AD-PSGD on these numbers)
            gossip_cost=0.0,
            adpsgd_averaging="none",
            source=f"calibrated from {self.path}",
        )


def fit_run(run_dir: Path, params: float | None = None) -> RunFit:
    """Read one run directory and fit its compute-time distribution and per-step overhead."""
    run_dir = Path(run_dir)
    record = RunEvents.read(run_dir)
    start = record.start
    if start is None:
        raise ValueError(f"{run_dir}: no run_start event in {EVENTS}; is this a wagma-bench run directory?")
    meta, config = start.metadata, start.config
    records = read_step_records(run_dir)
    if not records:
        raise ValueError(f"{run_dir}: no step records (steps/rank*.jsonl or {STEP_TABLE})")
    compute, overhead, samples, comm = [], [], [], []
    by_rank = [sorted(records[k], key=lambda r: r.local_step) for k in sorted(records)]
    trace = [[float(r.compute_s) for r in recs] for recs in by_rank]
    delay_trace = [[float(r.delay_s or 0.0) for r in recs] for recs in by_rank]
    for recs in by_rank:
        for prev, cur in zip(recs[SKIP_STEPS:], recs[SKIP_STEPS + 1 :]):
            delay_s, comm_s = _or(cur.delay_s, 0.0), _or(cur.comm_s, 0.0)
            compute.append(float(cur.compute_s))
            comm.append(float(comm_s))
            samples.append(float(_or(cur.samples, 0)))
            dt = float(cur.t) - float(prev.t)
            overhead.append(max(0.0, dt - cur.compute_s - delay_s - comm_s))
    if not compute:
        raise ValueError(f"{run_dir}: too few steps to calibrate (need more than {SKIP_STEPS + 1} per rank)")
    summary = record.summary_or_saved()
    opt = dict(config.get("optimizer") or {"name": meta.get("optimizer")})
    imbalance = dict(config.get("imbalance") or {"name": meta.get("imbalance") or "none"})
    imbalance["name"] = renamed_option("imbalance", imbalance["name"], quiet=True)  # recorded before a rename
    train = config.get("train") or {}
    stride = max(1, len(compute) // MAX_SAMPLES)
    return RunFit(
        path=str(run_dir),
        optimizer=opt.get("name") or meta.get("optimizer"),
        world_size=int(meta["world_size"]),
        imbalance=imbalance,
        settings=opt,
        rounds=int(summary.rounds or max(r.round for recs in records.values() for r in recs)),
        seed=int(meta.get("seed") or 1),
        samples_per_step=float(np.mean(samples)),
        compute=compute[::stride],
        trace=trace,
        delay_trace=delay_trace,
        overhead_s=float(np.median(overhead)),
        measured_throughput=summary.throughput_samples_per_s,
        params=params if params is not None else model_params_of(start),
        workload=setting(config, "workload.arch") or meta.get("workload"),
        comm_s_mean=float(np.mean(comm)),
        # DropCompute's threshold as the run set it (its calibration steps' rule), replayed by a trace
        extra={"threshold_s": summary.dropcompute.get("threshold_s")} if summary.dropcompute else {},
        local_state=local_state_tensors(train.get("local_optimizer", "sgd"), train.get("momentum", 0.9)),
    )


def _or(value, default):
    """A step record's field, ``default`` where the rank did not log it."""
    return default if value is None else value


class RecordedDelays(Imbalance):
    """The delays a run slept, rank by rank and step by step (repeated from the start if the simulation runs
    longer): what a trace-driven replay injects, so that it replays the run's own stragglers, not a new draw
    of its imbalance model."""

    name = "recorded"

    def __init__(self, delay_trace: Sequence[Sequence[float]]):
        super().__init__(None, 0)
        self.trace = [np.asarray(seq, dtype=float) for seq in delay_trace]

    def delays(self, world_size: int, base_s: np.ndarray, first_step: int = 0) -> np.ndarray:
        if len(self.trace) != world_size:
            raise ValueError(f"recorded delays of {len(self.trace)} ranks for a world of {world_size}")
        steps = first_step + np.arange(np.shape(base_s)[1])
        return np.stack([seq[steps % len(seq)] if len(seq) else np.zeros(len(steps)) for seq in self.trace])


def cycle_compute(run_dir: Path) -> list[float]:
    """Every rank's compute time per cycle (:func:`cycle_compute_by_rank`), pooled."""
    return [t for times in cycle_compute_by_rank(run_dir).values() for t in times]


def cycle_compute_by_rank(run_dir: Path) -> dict[int, list[float]]:
    """Per rank, its compute time per cycle in order: a cycle is a step that took fresh samples and the steps
    after it that took none (DD-PPO: a rollout and the further PPO updates on it; a supervised workload: each
    step alone). The unit of the simulator's step, whose presets count a rollout and its update as one.
    Warm-up as in :func:`fit_run` (the first ``SKIP_STEPS + 1`` steps of each rank), a leading partial cycle
    and a trailing one shorter than the rank's longest left out."""
    records = read_step_records(Path(run_dir))
    if not records:
        raise ValueError(f"{run_dir}: no step records (steps/rank*.jsonl or {STEP_TABLE})")
    by_rank: dict[int, list[float]] = {}
    for rank, recs in sorted(records.items()):
        cycles: list[list[float]] = []
        for r in sorted(recs, key=lambda r: r.local_step)[SKIP_STEPS + 1 :]:
            if float(_or(r.samples, 1)) > 0:
                cycles.append([])
            if cycles:  # steps before the first sample-taking one finish a cycle begun in the warm-up
                cycles[-1].append(float(r.compute_s))
        if cycles and len(cycles[-1]) < max(map(len, cycles)):
            cycles.pop()  # the run ended inside this cycle
        if cycles:
            by_rank[rank] = [sum(c) for c in cycles]
    if not by_rank:
        raise ValueError(f"{run_dir}: too few steps to calibrate (need more than {SKIP_STEPS + 1} per rank)")
    return by_rank


def model_params_of(start: RunStart) -> float | None:
    """The model's parameter count, as run_start logged it; for a run logged before run_start said, from
    the model built from the run's own config (cheap for the embedded workloads); None when that fails."""
    if start.model_params:
        return float(start.model_params)
    try:
        import torch

        from wagma_bench.config.schema import validate
        from wagma_bench.workloads import get_workload

        cfg = validate(start.config)
        workload = get_workload(cfg.workload.name)(cfg, 0, int(start.world_size), torch.device("cpu"))
        return float(sum(p.numel() for p in workload.build_model().parameters()))
    except Exception:  # noqa: BLE001 - any failure means "unknown"; the caller asks for params=N
        return None


# --- alpha / beta ---------------------------------------------------------------------------------------


def fit_alpha_beta(rows: Sequence[dict], algorithm: str) -> tuple[Link, float]:
    """Least-squares (alpha, beta) of ``algorithm``'s allreduce model; returns the link and the relative RMS
    error of the fit. ``rows``: comm-bench results (``group_size``, ``bytes``, ``median_s``)."""
    feats, target = [], []
    for r in rows:
        a, b = allreduce_terms(algorithm, int(r["group_size"]), float(r["bytes"]))
        w = 1.0 / float(r["median_s"])
        feats.append((a * w, b * w))
        target.append(1.0)  # median_s * w
    if len(feats) < 2:
        raise ValueError("need at least two allreduce measurements (sizes) to fit alpha and beta")
    x, y = np.asarray(feats), np.asarray(target)
    (alpha, beta), *_ = np.linalg.lstsq(x, y, rcond=None)
    if alpha < 0 or beta < 0:  # the unconstrained optimum left the physical region: fit each alone
        alpha, beta = max(0.0, alpha), max(0.0, beta)
        if alpha == 0.0:
            beta = float(np.linalg.lstsq(x[:, 1:], y, rcond=None)[0][0])
        else:
            alpha = float(np.linalg.lstsq(x[:, :1], y, rcond=None)[0][0])
    rel = x @ np.array([alpha, beta]) - y
    return Link(float(alpha), float(beta)), float(np.sqrt(np.mean(rel**2)))


def bench_rows(bench: dict, impl: str = "ours") -> list[dict]:
    """The allreduce rows of a comm-bench result (our implementation's, else the raw library's)."""
    rows = [
        r
        for r in bench.get("results", [])
        if r.get("op") in ALLREDUCE_OPS and r.get("median_s", 0) > 0 and int(r.get("group_size", 0)) > 1
    ]
    mine = [r for r in rows if r.get("impl") == impl]
    return mine or rows


LEVELS = ("intra", "inter")
ONE_HOST_RANKS = 1024  # ranks a node where the bench measured one host: every simulated group stays inside it


def level_rows(bench: dict) -> dict[str, list[dict]]:
    """The allreduce rows of a comm-bench result by link level: a bench across hosts holds them apart
    (``levels``); one on one host measured the intra-node link (its ``results``)."""
    if "levels" not in bench:
        return {"intra": bench_rows(bench), "inter": []}
    return {
        level: [
            r
            for r in bench["levels"].get(level) or []
            if r.get("median_s", 0) > 0 and int(r.get("group_size", 0)) > 1
        ]
        for level in LEVELS
    }


def bench_ranks_per_node(benches: Sequence[dict]) -> int | None:
    """Ranks a host of the first bench measured across hosts (the most any host ran); None if none was."""
    for b in benches:
        hosts = b.get("hosts") or []
        if len(set(hosts)) > 1:
            return max(hosts.count(h) for h in set(hosts))
    return None


def _level_report(link: Link, err: float, rows: list[dict]) -> dict:
    return {
        "measured": True,
        "alpha_s": link.alpha_s,
        "beta_s_per_byte": link.beta_s_per_byte,
        "bandwidth_GBps": (1e-9 / link.beta_s_per_byte) if link.beta_s_per_byte > 0 else math.inf,
        "rel_rms": err,
        "rows": len(rows),
        "group_sizes": sorted({int(r["group_size"]) for r in rows}),
    }


def fit_network(
    benches: Sequence[dict], gpus_per_node: int | None = None, algorithm: str | None = None
) -> tuple[Network, dict]:
    """The network of comm-bench results: each link level fitted on its own rows, with one collective
    algorithm for both (the best over their rows together); a level not measured takes the other's link.
    ``gpus_per_node`` (which ranks share a node in the simulation): the cluster profile's where one is named;
    None: the ranks a host of a bench across hosts, else every rank on one node (one host measured).
    The report keeps the former keys (``alpha_s``, ... of the inter-node link) and adds ``levels``."""
    rows = {level: [r for b in benches for r in level_rows(b)[level]] for level in LEVELS}
    measured = [level for level in LEVELS if rows[level]]
    if not measured:
        raise ValueError("the comm-bench JSON has no allreduce/group_allreduce results with group_size > 1")
    for level in measured:
        if len(rows[level]) < 2:
            raise ValueError(
                f"{level}-node link: need at least two allreduce measurements (sizes) to fit alpha and beta"
            )
    fits = {
        a: {level: fit_alpha_beta(rows[level], a) for level in measured}
        for a in ([algorithm] if algorithm else ALGORITHMS)
    }
    total = {
        a: math.sqrt(sum(len(rows[lv]) * e**2 for lv, (_, e) in f.items()) / sum(map(len, rows.values())))
        for a, f in fits.items()
    }
    best = min(total, key=total.__getitem__)
    levels = {level: _level_report(*fits[best][level], rows[level]) for level in measured}
    for missing in set(LEVELS) - set(measured):
        (other,) = measured
        why = "one rank a host" if missing == "intra" else "one host"
        levels[missing] = {
            **levels[other],
            "measured": False,
            "rows": 0,
            "group_sizes": [],
            "from": other,
            "note": f"not measured ({why}): the {other}-node fit is used for both levels",
        }
    levels = {level: levels[level] for level in LEVELS}  # intra first, measured or not
    links = {level: Link(levels[level]["alpha_s"], levels[level]["beta_s_per_byte"]) for level in LEVELS}
    per_node = gpus_per_node or bench_ranks_per_node(benches) or ONE_HOST_RANKS
    inter = levels["inter"]
    report = {
        "algorithm": best,
        **{k: inter[k] for k in ("alpha_s", "beta_s_per_byte", "bandwidth_GBps")},
        "rel_rms": total[best],
        "rows": sum(map(len, rows.values())),
        "all_fits": total,
        "backend": sorted({str(b.get("backend")) for b in benches}),
        "levels": levels,
        "gpus_per_node": per_node,
        "notes": [f"{lv}-node link {levels[lv]['note']}" for lv in LEVELS if not levels[lv]["measured"]],
    }
    return Network(links["intra"], links["inter"], per_node, best), report


# --- inputs ---------------------------------------------------------------------------------------------


def is_comm_bench(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("results"), list) and "world_size" in obj


def find_inputs(paths: Iterable[Path]) -> tuple[list[Path], list[dict]]:
    """Run directories (holding events.jsonl or events.jsonl.xz, searched recursively) and comm-bench JSON
    objects (files given directly, or ``*.json`` files beside the runs that have the comm-bench format)."""
    paths = list(paths)
    runs: set[Path] = set()
    benches: list[dict] = []
    seen: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"--calibrate: no such file or directory: {p}")
        candidates = [p] if p.is_file() else [*p.rglob("*.json")]
        if p.is_dir():
            runs.update(find_run_dirs(p))
        for f in candidates:
            if f.suffix != ".json" or f.resolve() in seen or f.name == SUMMARY:
                continue
            seen.add(f.resolve())
            try:
                obj = json.loads(f.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError, OSError):
                if p.is_file():  # given by name: it must be comm-bench's
                    raise ValueError(
                        f"--calibrate: {f} is not comm-bench JSON (it does not parse as JSON)"
                    ) from None
                continue
            if is_comm_bench(obj):
                benches.append(obj)
            elif p.is_file():
                raise ValueError(f"--calibrate: {f} is not comm-bench JSON (needs world_size and results)")
    if not runs and not benches:
        raise ValueError(
            f"--calibrate: no run directory ({EVENTS}) and no comm-bench JSON in {', '.join(map(str, paths))}"
        )
    return sorted(runs), benches
