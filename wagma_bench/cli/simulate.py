"""``wagma-bench simulate``: predicted throughput and time-to-target of every optimizer against world size.

    wagma-bench simulate cluster=daint gpus=8,16,32,64,128,256,512,1024 \\
        'optimizer=glob(*)' experiment=paper_resnet50_stragglers [optimizer.tau=10 seed=1 ...] [cluster.network.inter.alpha_s=2e-6 ...] \\
        [train.max_steps=500 control_every=10] [step_s=0.32 train.batch_size=128 params=25.6e6 sigma=0.02] \\
        [samples_to_target=N] [--convergence RUN_DIR|TUNE_DIR...] [--out DIR]
        [--compute-from RUN_DIR|TUNE_DIR...] [compute=persistent] [--measured FILE] [--interval N]
    wagma-bench simulate --calibrate RUN_DIR... [COMM_BENCH.json...] [--out DIR]     (validation)

One configuration for every subcommand: the overrides are `wagma-bench run`'s (``workload=``, ``data=``,
``optimizer=``, ``optimizer.KEY=``, ``imbalance=``, ``seed=``, anything else `run` takes), composed from
``conf/`` with Hydra and checked by the same :func:`wagma_bench.config.schema.validate`, so a value `run` refuses is
refused here with the same message; each optimizer model gets its optimizer's typed ``Settings``. The
cluster is read as `sweep` reads it (``cluster=NAME``, ``cluster.KEY=VALUE``, e.g.
``cluster.network.inter.alpha_s=2e-6``). Arguments use Hydra's override grammar; ``gpus`` and
``optimizer`` take several values (``a,b``, ``'gpus=range(8,1025,8)'``, ``'optimizer=glob(*)'``); an
``optimizer.KEY`` applies to the selected optimizers that have that setting. `run`'s keys the simulation
reads: ``train.max_steps`` (the rounds simulated; default 500) and ``train.batch_size`` (the cost model's
batch per rank, given with its ``step_s``); ``train.epochs`` is refused (the model counts rounds); the others
are checked and do not change a prediction. Simulate's own keys: ``gpus``, ``control_every``,
``samples_to_target`` and the workload's cost model (``step_s``, ``params``, ``compute``, ``sigma``,
``overhead_s``, ``backward_fraction``, ``bytes_per_param``: the preset's numbers, :mod:`.presets`).
Defaults where they differ from `run`'s: every optimizer that runs on the workload (DropCompute where batches split), ``cluster=daint`` (``local`` with
``--calibrate``), and ``workload=resnet data=imagenet`` (the paper's ResNet-50 set-up) when neither a
workload nor an ``experiment`` is given; a data path `run` would need (``data.root``) is not needed.

``--calibrate``: fits each run's compute-time distribution and overhead, and alpha/beta from comm-bench
JSON (or takes the cluster profile's network), then simulates every calibrated run's own configuration and
prints predicted against measured throughput, twice: with compute times resampled i.i.d. from the run's
pooled measurements (``compute=empirical``, the default; ``compute=lognormal`` fits a lognormal instead), as
predictions at other scales use them, and trace-driven (each rank's recorded compute times replayed step by
step, which tests the communication and waiting model alone). Given ``gpus=`` too, it also predicts that
sweep with the workload pooled from the calibrated runs.

``control_every``: the trainer's control allreduce (a global barrier) every that many rounds, rounded up
to the optimizer's sync period, as ``wagma-bench run`` does (default 10,
:data:`wagma_bench.config.schedules.CONTROL_EVERY`: the rule and the constant the trainer imports);
``control_every=0`` leaves only the optimizers' own synchronisation -- the paper's implementations, which
have no such barrier.

Convergence model (time-to-target): samples to the target per optimizer, from real runs that reached it
(``--convergence RUN_DIR...``: the ``samples`` of the first evaluation at or above the target, median over
runs, taken at the smallest world size measured; a ``wagma-bench tune`` directory counts as its winning
trials, one per tuned combination) or one value for all (``samples_to_target=N``). It is
held constant in P -- the linear-scaling regime of large-batch SGD (Goyal et al. 2017), where epochs to a
target do not change with the global batch; beyond the critical batch size this is optimistic, for every
optimizer alike. time_to_target(P) = samples_to_target / predicted throughput(P).

``--compute-from RUN_DIR...``: each rank's compute time per step is drawn from the given runs' measured
compute times, each run's divided by its own median and scaled to the workload's ``step_s`` (the preset's or
the one given): the spread of real runs (their natural imbalance) at the modelled machine's speed, in place of
the preset's assumed distribution (:func:`measured_spread`). With ``compute=persistent`` it fits instead a rank
offset plus AR(1) per-step noise from the runs' ranks (:mod:`wagma_bench.simulate.spread`): a slow rank stays slow.

``--measured FILE``: measured model inputs (:mod:`wagma_bench.simulate.measured`; ``reproduce/scaling/
measure_inputs.py`` and ``make gpu-check`` write them): AD-PSGD's exchange cost ``gossip_cost`` (the seconds of
compute each second of its thread's exchange takes, 0-1), the intra-node link, the persistent spread; the command
line wins over the file. ``--interval N``: also N predictions with their inputs resampled and the prediction with one
assumption moved at a time (:mod:`wagma_bench.simulate.uncertainty`), written to ``interval.json``, from which
``wagma-bench claims`` takes each prediction's 95% interval and the assumption that flips it.

The table's columns (docs/simulator.md, "Outputs"): samples/s, the predicted throughput; vs allreduce, over
Allreduce-SGD's at the same P; efficiency, samples/s over P x batch / ``step_s`` (ranks that never communicate,
wait or sleep); wait share, a rank's mean share of time spent waiting; staleness, in rounds, the mean largest age
of a rank's contributions to the rounds that answer it (WAGMA-SGD, eager-SGD; at most ``tau`` for WAGMA-SGD) or
the mean step lag of AD-PSGD's exchanging pairs; time to target (s), samples to the target over samples/s.

Outputs in ``--out`` (default ``sim/``): ``predictions.csv|json``, ``throughput.png`` (``plots.plot_throughput``,
the report's figure, predictions dashed), ``time_to_target.png``, and with ``--calibrate``
``validation.csv|json``, ``validation.png`` and ``calibration.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wagma_bench import exits
from wagma_bench.analysis import plots
from wagma_bench.analysis.predictions import INTERVAL_FILE
from wagma_bench.analysis.tables import markdown_table, write_csv
from wagma_bench.cli.text import plain
from wagma_bench.config.cluster import load_profile
from wagma_bench.config.paths import CONF_DIR, conf_context
from wagma_bench.config.schedules import CONTROL_EVERY
from wagma_bench.config.schema import RunConfig, check_world, runs_on, validate
from wagma_bench.imbalance import IMBALANCES, Imbalance, make_imbalance
from wagma_bench.optim.specs import OPTIMIZER_SPECS
from wagma_bench.record.events import RunEvents
from wagma_bench.record.files import write_text_atomic
from wagma_bench.runtime.sweep import parse_overrides
from wagma_bench.simulate.costs import Network
from wagma_bench.simulate.des import (
    WORKLOAD_RANGES,
    Progress,
    SimConfig,
    SimResult,
    Workload,
    local_state_tensors,
    simulate,
    simulated_optimizers,
)
from wagma_bench.simulate.measured import read_measured, with_measured
from wagma_bench.simulate.presets import preset_for
from wagma_bench.simulate.uncertainty import Inputs, Sources, uncertainty

DEFAULT_GPUS = (8, 16, 32, 64, 128, 256, 512, 1024)
# once the predictions have taken this long, a progress line at least this often: a line per simulation, and lines
# from inside a long one (each says where it is as it goes: des.Progress). A module constant so that a test can shorten it.
PROGRESS_EVERY_S = 5.0
# the largest world simulated (the biggest GPU systems): all eight optimizers at 500 rounds took 54 s on this quiet
# 2-core machine (2026-12-06), AD-PSGD 34 s of it, and several times that under other work
MAX_GPUS = 65_536
WORKLOAD_KEYS = {f.name for f in dataclasses.fields(Workload)} - {"name", "samples", "trace", "source"}
# `run`'s keys that the simulation reads, -> the name simulate uses inside: the rounds simulated (default
# DEFAULT_ROUNDS) and the workload's batch per rank (a number of the cost model, next to step_s)
RUN_KEYS_READ = {"train.max_steps": "steps", "train.batch_size": "batch"}
DEFAULT_ROUNDS = 500
# `run`'s keys a throughput model cannot honour: refused, not ignored
RUN_KEYS_REFUSED = {"train.epochs": "simulate counts rounds, not epochs: give train.max_steps=N "
                                    f"(default {DEFAULT_ROUNDS})"}
# simulate's own keys, beside `run`'s: the world sizes, the control barrier, the convergence model and the
# workload's cost model (the preset's numbers; its batch is `run`'s train.batch_size)
OWN_KEYS = {"gpus", "control_every", "samples_to_target"} | (WORKLOAD_KEYS - {"batch"})
SWEPT_KEYS = ("gpus", "optimizer")  # the keys that take several values (a,b / range() / glob())
# a missing data path (data.root=???) does not change a prediction: filled with this before `validate`
NOT_READ = "(not read by simulate)"


class UsageError(ValueError):
    pass


@dataclass
class Request:
    """The command line, sorted: `run`'s overrides (composed with Hydra), the cluster (read as `sweep` reads
    it) and simulate's own keys."""

    run_overrides: list[str] = field(default_factory=list)  # one value each, optimizer=... excluded
    optimizers: list[str] = field(default_factory=simulated_optimizers)
    optimizers_chosen: bool = False  # optimizer= given; else every optimizer that runs on the workload
    optimizer_overrides: list[tuple[str, str]] = field(default_factory=list)  # (KEY, VALUE) of optimizer.KEY
    gpus: list[int] | None = None
    cluster: str | None = None
    cluster_overrides: list[str] = field(default_factory=list)  # KEY=VALUE of cluster.KEY
    own: dict[str, str] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        """Rounds to simulate: `run`'s ``train.max_steps`` (``null``, `run`'s default: 500)."""
        steps = self.own.get("steps", "null")
        return DEFAULT_ROUNDS if steps in ("null", "None") else int(steps)

    @property
    def control_every(self) -> int:
        return int(self.own.get("control_every", CONTROL_EVERY))


def parse(argv: list[str]) -> tuple[Request, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="wagma-bench simulate", description=plain(__doc__),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="`run`'s overrides (workload=, optimizer=, imbalance=, seed=, "
                    "...), cluster=NAME, cluster.KEY=VALUE, gpus=..., and simulate's own KEY=VALUE")
    ap.add_argument("--calibrate", nargs="+", default=[], metavar="PATH", help="run directories and comm-bench JSON")
    ap.add_argument("--convergence", nargs="+", default=[], metavar="RUN_DIR",
                    help="runs that reached a target, or tuning directories (their winning trials)")
    ap.add_argument("--compute-from", nargs="+", default=[], metavar="RUN_DIR",
                    help="runs or tuning directories whose measured compute spread (over its median) replaces the "
                    "preset's distribution, scaled to its step_s")
    ap.add_argument("--interval", type=int, default=0, metavar="N",
                    help="also N predictions with their inputs resampled, and the assumptions moved one at a time: "
                    "interval.json, which `claims` reads for a prediction's interval and what flips it")
    ap.add_argument("--measured", metavar="FILE", help="measured model inputs (reproduce/scaling/measure_inputs.py, "
                    "make gpu-check): AD-PSGD's exchange cost with its bootstrap replicates, the link, the spread")
    ap.add_argument("--out", default="sim", help="output directory (default: sim)")
    ap.add_argument("--cfg", choices=("job",), help="print what each simulation would use, simulate nothing")
    ns = ap.parse_args(argv)
    if ns.interval < 0:
        raise UsageError(f"--interval {ns.interval} is not allowed; it must be 0 (none) or a number of replicates")
    # `--calibrate RUN params=N`: nargs="+" also took the KEY=VALUE items that follow the paths
    for opt in ("calibrate", "convergence", "compute_from"):
        items = getattr(ns, opt)
        moved = [i for i in items if "=" in i and not Path(i).exists()]
        setattr(ns, opt, [i for i in items if i not in moved])
        ns.overrides += moved
        if items and not getattr(ns, opt):
            raise UsageError(f"--{opt.replace('_', '-')} needs at least one path")
    return sort_overrides(parse_overrides(ns.overrides)), ns


def sort_overrides(parsed: list[tuple[str, list[str]]]) -> Request:
    """Hydra-parsed ``(key, values)`` -> a :class:`Request`. Simulate's defaults where they differ from
    `run`'s: every optimizer, and the paper's ResNet-50 / ImageNet set-up when no workload is given."""
    req = Request()
    keys = {k for k, _ in parsed}
    if not keys & {"workload", "experiment"}:  # an experiment preset picks its own workload
        req.run_overrides += ["workload=resnet"] + ([] if "data" in keys else ["data=imagenet"])
    for key, values in parsed:
        if len(values) > 1 and key not in SWEPT_KEYS:
            raise UsageError(f"{key}={','.join(values)}: only {' and '.join(SWEPT_KEYS)} take several values")
        if key == "gpus":
            try:
                req.gpus = [int(v) for v in values]
            except ValueError:
                raise UsageError(f"gpus must be integers, e.g. gpus=8,16,32; got {','.join(values)!r}") from None
            for g in req.gpus:
                if not 1 <= g <= MAX_GPUS:
                    raise UsageError(f"gpus={g} is not allowed; it must be between 1 and {MAX_GPUS:,} (a simulation's "
                                     "cost grows with ranks x rounds: 1,024 ranks x 500 rounds take seconds)")
        elif key == "optimizer":
            req.optimizers, req.optimizers_chosen = values, True
        elif key.startswith("optimizer."):
            req.optimizer_overrides.append((key[len("optimizer."):], values[0]))
        elif key == "cluster":
            req.cluster = values[0]
        elif key.startswith("cluster."):
            req.cluster_overrides.append(f"{key[len('cluster.'):]}={values[0]}")
        elif key in OWN_KEYS:
            req.own[key] = values[0]
        elif key in RUN_KEYS_REFUSED:
            raise UsageError(f"{key}={values[0]}: {RUN_KEYS_REFUSED[key]}")
        elif key in ("steps", "batch"):  # simulate's names before it took run's
            run_key = next(k for k, v in RUN_KEYS_READ.items() if v == key)
            raise UsageError(f"{key}={values[0]}: simulate takes run's option names; give {run_key}={values[0]}")
        else:
            req.run_overrides.append(f"{key}={values[0]}")
            if key in RUN_KEYS_READ:  # checked by `run`'s validate with the rest, then read here
                req.own[RUN_KEYS_READ[key]] = values[0]
    return req


# --- building the pieces: `run`'s configuration, `sweep`'s cluster profiles -----------------------------

def load_network(cluster: str, overrides: list[str]) -> Network:
    """The cluster profile's ``network:`` section, read by `sweep`'s loader (``cluster.network.KEY=VALUE``
    changes one number; a link's number given so is checked here, named as the user typed it)."""
    from wagma_bench.simulate.costs import LINK_RANGES, link_value

    for o in overrides:
        key, _, value = o.partition("=")
        if key.startswith("network.") and key.rsplit(".", 1)[-1] in LINK_RANGES:
            try:
                link_value(key.rsplit(".", 1)[-1], value, f"cluster.{key}")
            except ValueError as err:
                raise UsageError(str(err)) from None
    profile = load_profile(cluster, overrides)
    network = profile.network.as_dict() if profile.network else {}
    return Network.from_profile(network, profile.gpus_per_node, f"conf/cluster/{cluster}.yaml network")


def compose_runs(req: Request) -> dict[str, RunConfig]:
    """Per optimizer, the configuration `wagma-bench run` would compose and check with these overrides.
    An ``optimizer.KEY`` goes to the selected optimizers that have that setting (to all when none has it,
    so that the error is `run`'s)."""
    from hydra import compose
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from wagma_bench.config.overrides import refuse_path_options, unknown_key_message, unknown_option_message

    runs = {}
    with conf_context():
        for name in req.optimizers:
            mine = optimizer_overrides(req, name)
            overrides = req.run_overrides + [f"optimizer={name}"] + mine
            refuse_path_options(overrides, CONF_DIR)  # `optimizer=../x`: in the user's words, as `run` says it
            try:
                cfg = compose(config_name="wagma", overrides=overrides)
            except (HydraException, OmegaConfBaseException) as err:  # unknown option or key: run's message
                raise UsageError(unknown_key_message(err, overrides, CONF_DIR) or unknown_option_message(err)
                                 or hydra_message(err)) from None
            if not req.optimizers_chosen and not runs_on(name, str(cfg.workload.name)):
                continue  # every optimizer by default: those that run on this workload (not DropCompute on RL)
            for key in OmegaConf.missing_keys(cfg):
                if key.split(".")[0] in ("data", "env"):
                    OmegaConf.update(cfg, key, NOT_READ)
            runs[name] = validate(cfg)
    return runs


def hydra_message(err: BaseException) -> str:
    """A composition error as `run` shows it (Hydra prints the error and the errors that caused it)."""
    lines = []
    while err is not None:
        lines.append(str(err).strip())
        err = err.__cause__
    return "\n".join(lines)


def optimizer_overrides(req: Request, name: str) -> list[str]:
    """The ``optimizer.KEY`` overrides for optimizer ``name``: those of its settings, and any KEY that no
    selected optimizer has (so that `run`'s own error names it)."""
    def settings(opt: str) -> set[str]:
        spec = OPTIMIZER_SPECS.get(opt)
        return {f.name for f in dataclasses.fields(spec.Settings)} if spec else set()

    anyone = set().union(*(settings(o) for o in req.optimizers))
    return [f"optimizer.{k}={v}" for k, v in req.optimizer_overrides if k in settings(name) or k not in anyone]


def check_worlds(runs: dict[str, RunConfig], gpus: list[int]) -> None:
    """Each optimizer's settings against each world size, as `run` checks them against its world."""
    for run in runs.values():
        for p in gpus:
            check_world(run.optimizer, run.imbalance, p)


def make_workload(run: RunConfig, own: dict[str, str]) -> Workload:
    """The preset of `run`'s workload and data options, with simulate's own workload keys applied. A batch
    other than the preset's (``train.batch_size``) needs its step time (``step_s``): the preset's is measured
    at its own batch, and the model does not guess how compute scales with the batch."""
    wl = dataclasses.replace(preset_for(run.workload.name, run.data.name))
    if "batch" in own and "step_s" not in own and int(own["batch"]) != wl.batch:
        raise UsageError(f"train.batch_size={own['batch']}: the {wl.name} preset's step_s={wl.step_s} s is one "
                         f"step at batch {wl.batch}; give step_s= for batch {own['batch']} too")
    for key in WORKLOAD_KEYS & set(own):
        cur = getattr(wl, key)
        if isinstance(cur, (int, float)) and not isinstance(cur, bool):
            try:
                number = float(own[key])
            except ValueError:
                raise UsageError(f"{key}={own[key]!r} is not a number") from None
            low, high, allowed = WORKLOAD_RANGES.get(key, (-math.inf, math.inf, ""))
            if not low <= number <= high:
                raise UsageError(f"{key}={own[key]} is not allowed; it must be {allowed}")
            setattr(wl, key, int(number) if isinstance(cur, int) else number)
        else:
            setattr(wl, key, own[key])
        wl.source = "preset + overrides"
    return wl


def sim_config(run: RunConfig, world_size: int, workload: Workload, network: Network, imbalance: Imbalance,
               steps: int, control_every: int = CONTROL_EVERY, seed: int | None = None,
               progress: Progress | None = None) -> SimConfig:
    """One simulation of a composed run configuration (``seed``: another than the run's; ``progress``: told where
    it is)."""
    return SimConfig(run.optimizer.name, world_size, workload, network, imbalance, run.optimizer, steps,
                     run.seed if seed is None else seed, control_every,
                     local_state_tensors(run.train.local_optimizer, run.train.momentum), progress)


class Ticker:
    """The progress lines of long predictions, on stderr: quiet for the first ``PROGRESS_EVERY_S``, then a line at
    least that often -- one per finished simulation, and, inside a long one, where it is (its phase, how far, and
    how long the phase has left at its pace so far). Lines used to come only between simulations: at 65,536 GPUs
    AD-PSGD's alone takes most of a minute, and a loaded machine saw one line after 6 s, then none for 294 s."""

    def __init__(self, total: int, label: str = "simulate", start: float | None = None):
        self.total, self.label, self.every_s = total, label, PROGRESS_EVERY_S
        # from the command's start (composing eight optimizers' configs took 7 s on a loaded machine)
        self.start = self.last = time.perf_counter() if start is None else start
        self.current, self.what, self.phase, self.phase_at = 0, "", "", (0.0, 0.0)

    def simulation(self, what: str) -> Progress:
        """The next simulation (``what``: its optimizer and world): the hook to give it."""
        self.current, self.what, self.phase = self.current + 1, what, ""
        return self.tick

    def tick(self, phase: str, fraction: float) -> None:
        now = time.perf_counter()
        if phase != self.phase:  # a phase's pace is measured from its start
            self.phase, self.phase_at = phase, (now, fraction)
        if now - self.last < self.every_s:
            return
        t0, f0 = self.phase_at
        # the phase's pace so far, once it has gone far enough to have one
        left = f", about {(now - t0) / (fraction - f0) * (1 - fraction):.0f} s more" if fraction > f0 + 0.02 else ""
        self._say(f"{self.what}: {phase} {100 * fraction:.0f}%{left}", now)

    def note(self, text: str) -> None:
        """A line saying ``text``, unless one was said within ``PROGRESS_EVERY_S``."""
        now = time.perf_counter()
        if now - self.last >= self.every_s:
            self._say(text, now)

    def done(self, took: str) -> None:
        """The simulation ended (``took``: how long it took, said)."""
        now = time.perf_counter()
        if now - self.start > self.every_s:
            self._say(f"{self.what}: {took}", now)

    def _say(self, text: str, now: float) -> None:
        self.last = now
        count = f" {self.current}/{self.total}" if self.total else ""
        print(f"[{self.label}{count} {now - self.start:.0f} s] {text}", file=sys.stderr, flush=True)


# --- convergence model ----------------------------------------------------------------------------------

def samples_to_target(run_dirs: list[str]) -> dict[str, float]:
    """Per optimizer: median global samples at the first evaluation reaching the target, over the runs at
    the smallest world size that reached it. A tuning directory (``wagma-bench tune``) stands for its
    winning trials (:func:`wagma_bench.analysis.tuning.winning_runs`), so predictions rest on tuned convergence."""
    return {opt: statistics.median(hits) for opt, hits in target_hits(run_dirs).items()}


def target_hits(run_dirs: list[str]) -> dict[str, list[float]]:
    """Per optimizer: the samples of each run's first evaluation at the target, at the smallest world size that
    reached it (what :func:`samples_to_target` takes the median of, and the interval resamples)."""
    from wagma_bench.analysis.run_records import find_runs
    from wagma_bench.analysis.tuning import winning_runs

    dirs: list[Path] = []
    for p in map(Path, run_dirs):
        dirs += winning_runs(p) if is_tuning_dir(p) else [p]
    found: dict[str, dict[int, list[float]]] = {}
    for d in find_runs(dirs):
        record = RunEvents.read(d)
        hit = record.first_at_target
        if hit is not None:
            found.setdefault(record.start.optimizer, {}).setdefault(int(record.start.world_size), []).append(
                float(hit.samples))
    return {opt: by_p[min(by_p)] for opt, by_p in found.items()}


def measured_spread(paths: list[str]) -> tuple[float, ...]:
    """Every run's compute times (forward and backward; injected delays are the imbalance model's) over that
    run's own median, pooled: the natural imbalance of real runs as a shape, without their machine's speed. A
    tuning directory counts as all its trials. The unit is the simulator's step: one step of a supervised
    run, a rollout with its PPO updates for DD-PPO (:func:`~wagma_bench.simulate.calibrate.cycle_compute`).
    Drawn i.i.d. per rank and step (``compute=empirical``): a rank that is slow in every step is not kept as
    such."""
    return tuple(x for run in spread_by_run(paths) for x in run)


def spread_by_run(paths: list[str]) -> list[list[float]]:
    """:func:`measured_spread`, run by run (what the interval resamples)."""
    from wagma_bench.analysis.run_records import find_runs
    from wagma_bench.simulate.calibrate import cycle_compute

    shapes: list[list[float]] = []
    for d in find_runs(map(Path, paths)):
        try:
            times = cycle_compute(d)
        except ValueError as err:  # no step records (a summary-only copy), too few steps
            raise UsageError(f"--compute-from: {err}") from None
        median = statistics.median(times)
        shapes.append([t / median for t in times])
    if not shapes:
        raise UsageError(f"--compute-from: no run directory under {', '.join(paths)}")
    return shapes


def with_measured_spread(workload: Workload, paths: list[str]) -> Workload:
    """The workload with the runs' measured spread scaled to its median step time (``--compute-from``); with
    ``compute=persistent`` the persistent model's offsets, noise and autocorrelation fitted from the runs' ranks
    (:mod:`wagma_bench.simulate.spread`), else the pooled times drawn i.i.d."""
    if workload.compute == "persistent":
        fit = measured_persistence(paths)
        return dataclasses.replace(workload, sigma_rank=fit.sigma_rank, sigma=fit.sigma, rho=fit.rho,
                                   source=f"{workload.source}; persistent spread fitted in {', '.join(paths)} "
                                          f"(sigma_rank {fit.sigma_rank:.3g}, sigma {fit.sigma:.3g}, rho {fit.rho:.3g})")
    shape = measured_spread(paths)
    return dataclasses.replace(workload, compute="empirical", samples=tuple(workload.step_s * x for x in shape),
                               source=f"{workload.source}; compute spread measured in {', '.join(paths)}")


def measured_persistence(paths: list[str]):
    """The persistent spread model fitted over the runs under ``paths`` (each rank's cycles in order)."""
    from wagma_bench.simulate.spread import fit_spread

    try:
        return fit_spread(ranks_by_run(paths))
    except ValueError as err:
        raise UsageError(f"--compute-from: {err} under {', '.join(paths)}") from None


def ranks_by_run(paths: list[str]) -> list[list[list[float]]]:
    """Per run under ``paths``, each rank's compute time per cycle in order."""
    from wagma_bench.analysis.run_records import find_runs
    from wagma_bench.simulate.calibrate import cycle_compute_by_rank

    runs = []
    for d in find_runs(map(Path, paths)):
        try:
            runs.append(list(cycle_compute_by_rank(d).values()))
        except ValueError as err:
            raise UsageError(f"--compute-from: {err}") from None
    return runs


def is_tuning_dir(path: Path) -> bool:
    from wagma_bench.analysis.tuning import PLAN

    return (Path(path) / PLAN).exists()


# --- tables, files, plots -------------------------------------------------------------------------------

def markdown(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    return markdown_table(rows, [(key, header, "sig") for key, header in cols])


def write_table(rows: list[dict], out: Path, stem: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / f"{stem}.json", json.dumps(rows, indent=2, default=float) + "\n")
    write_csv(rows, out / f"{stem}.csv")


def plot_time_to_target(rows: list[dict], path: Path, title: str) -> Path:
    plt = plots.pyplot()
    palette = plots.colors([r["label"] for r in rows])
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label in palette:
        rs = sorted((r for r in rows if r["label"] == label and r.get("time_to_target_s")), key=lambda r: r["world_size"])
        if rs:
            ax.plot([r["world_size"] for r in rs], [r["time_to_target_s"] / 3600 for r in rs], color=palette[label],
                    marker="x", linestyle="--", label=f"{label} (predicted)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    sizes = sorted({r["world_size"] for r in rows})
    ax.set_xticks(sizes, [str(p) for p in sizes])
    ax.set_xlabel("world size P (ranks)")
    ax.set_ylabel("time to target (h, training clock)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return plots.save(fig, path)


# --- the two modes --------------------------------------------------------------------------------------

def predict(req: Request, ns, runs: dict[str, RunConfig], network: Network, workload: Workload,
            out: Path, started: float | None = None) -> list[dict]:
    """The predictions, their table and plots (``started``: when the command started, ``time.perf_counter()``;
    its progress lines count from there)."""
    gpus = req.gpus or list(DEFAULT_GPUS)
    first = next(iter(runs.values()))
    imbalance = make_imbalance(first.imbalance, first.seed)
    conv = samples_to_target(ns.convergence) if ns.convergence else {}
    if "samples_to_target" in req.own:
        conv = {n: float(req.own["samples_to_target"]) for n in runs} | conv
    rows, ticker = [], Ticker(len(gpus) * len(runs), start=started)
    for p in gpus:
        for name, run in runs.items():
            t0 = time.perf_counter()
            res = simulate(sim_config(run, p, workload, network, imbalance, req.steps, req.control_every,
                                      progress=ticker.simulation(f"{name} at P={p}")))
            rows.append(_row(res, imbalance, workload, conv.get(name), time.perf_counter() - t0))
            ticker.done(f"{rows[-1]['sim_s']:.1f} s")
    ref = {r["world_size"]: r["throughput"] for r in rows if r["optimizer"] == "allreduce"}
    for r in rows:
        r["speedup_vs_allreduce"] = r["throughput"] / ref[r["world_size"]] if r["world_size"] in ref else None
    write_table(rows, out, "predictions")
    title = (f"predicted: {workload.name}, imbalance={imbalance.name}, cluster={req.cluster or 'daint'} "
             f"({req.steps} rounds simulated)")
    plots.plot_throughput([dict(r, kind="predicted") for r in rows], out / "throughput.png", title, ideal=False)
    if any(r.get("time_to_target_s") for r in rows):
        plot_time_to_target(rows, out / "time_to_target.png", title)
    cols = [("optimizer", "optimizer"), ("world_size", "P"), ("throughput", "samples/s"),
            ("speedup_vs_allreduce", "vs allreduce"), ("efficiency", "efficiency"), ("wait_frac", "wait share"),
            ("staleness", "staleness"), ("time_to_target_s", "time to target (s)")]
    print(f"## Predicted throughput ({title})\n\n{markdown(rows, cols)}\n")
    if ns.interval > 0:
        write_interval(req, ns, runs, gpus, Inputs(workload, network, imbalance, conv, req.control_every, first.seed),
                       out)
    return rows


def write_interval(req: Request, ns, runs: dict[str, RunConfig], gpus: list[int], base: Inputs, out: Path) -> None:
    """``--interval N``: :func:`wagma_bench.simulate.uncertainty.uncertainty` over these runs' predictions."""
    sources = Sources()
    if ns.compute_from:
        persistent = base.workload.compute == "persistent"
        sources.spread_kind = "persistent" if persistent else "empirical"
        sources.spread_runs = ranks_by_run(ns.compute_from) if persistent else spread_by_run(ns.compute_from)
    if ns.convergence:
        sources.hits = target_hits(ns.convergence)
    if ns.measured and "gossip_cost" not in req.own:
        sources.gossip_costs = read_measured(ns.measured).gossip_replicates

    ticker = Ticker(0, "simulate --interval")  # every prediction's simulations say where they are, too

    def predict_once(inputs: Inputs) -> dict[int, dict[str, dict[str, float | None]]]:
        out_: dict[int, dict[str, dict[str, float | None]]] = {}
        for p in gpus:
            for name, run in runs.items():
                res = simulate(sim_config(run, p, inputs.workload, inputs.network, inputs.imbalance, req.steps,
                                          inputs.control_every, inputs.seed, ticker.simulation(f"{name} at P={p}")))
                stt = inputs.samples_to_target.get(name)
                out_.setdefault(p, {})[name] = {"throughput": res.throughput,
                                                "time_to_target_s": stt / res.throughput if stt else None}
        return out_

    start = time.perf_counter()

    def progress(what: str) -> None:  # after each prediction: which one (the simulations inside tick on their own)
        ticker.note(what)

    data = uncertainty(predict_once, base, sources, ns.interval, progress)
    data["took_s"] = round(time.perf_counter() - start, 1)
    write_text_atomic(out / INTERVAL_FILE, compact_json(data))
    print(f"wrote {out / INTERVAL_FILE}: {ns.interval} replicates (resampled: {'; '.join(data['resampled'])}) and "
          f"{len(data['sensitivity'])} sensitivity points in {data['took_s']} s")


def compact_json(data: Any) -> str:
    """JSON with every number to 6 significant digits, no indentation: ``interval.json`` holds (N + 25) x worlds x
    optimizers predictions, committed for every claim (the repository stays under 20 MB)."""
    def rounded(x: Any) -> Any:
        if isinstance(x, float):
            return float(f"{x:.6g}")
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [rounded(v) for v in x]
        return x

    return json.dumps(rounded(data), separators=(",", ":"), default=float) + "\n"


def composed(req: Request, runs: dict[str, RunConfig], network: Network, workload: Workload) -> str:
    """``--cfg job``: the cluster's network, the workload, the imbalance and every optimizer's settings that
    the simulations of these overrides would use, as YAML."""
    from dataclasses import asdict

    from omegaconf import OmegaConf

    first = next(iter(runs.values()))
    job = {"gpus": req.gpus or list(DEFAULT_GPUS), "cluster": req.cluster or "daint",
           "network": {k: v for k, v in asdict(network).items() if not k.startswith("_")},
           "workload": asdict(workload), "imbalance": asdict(first.imbalance),
           "optimizers": {n: asdict(r.optimizer) for n, r in runs.items()},
           "local_state": local_state_tensors(first.train.local_optimizer, first.train.momentum),
           "steps": req.steps, "seed": first.seed, "control_every": req.control_every}
    return OmegaConf.to_yaml(OmegaConf.create(job))


def _row(res: SimResult, imbalance: Imbalance, wl: Workload, stt: float | None, took: float) -> dict:
    r = res.row()
    r.update(label=res.optimizer, imbalance=imbalance.name, workload=wl.name,
             efficiency=res.throughput * wl.step_s / (res.world_size * wl.batch),
             samples_to_target=stt, time_to_target_s=stt / res.throughput if stt else None, sim_s=round(took, 3))
    return r


def compare_with_runs(req: Request, ns, out: Path) -> tuple[list[dict], Workload | None, Network]:
    """``--calibrate``: fit each run and the network, simulate each run's own configuration, and write
    predicted against measured throughput; returns the rows, the workload pooled over the runs and the
    network."""
    from wagma_bench.simulate.calibrate import find_inputs, fit_network, fit_run

    runs, benches = find_inputs(ns.calibrate)
    params = float(req.own["params"]) if "params" in req.own else None
    cal: dict[str, Any] = {"runs": [], "network": None}
    if benches:
        # which ranks share a node: the named cluster's, else the bench's own hosts (report["gpus_per_node"])
        per_node = load_profile(req.cluster, req.cluster_overrides).gpus_per_node if req.cluster else None
        network, report = fit_network(benches, per_node)
        cal["network"] = report
        print(network_lines(report))
    else:
        network = load_network(req.cluster or "local", req.cluster_overrides)
    rows, fits = [], []
    compute = req.own.get("compute", "empirical")
    for d in runs:
        fit = fit_run(d, params)
        fits.append(fit)
        wl = fit.to_workload(compute=compute)
        measured = fit.measured_throughput
        predicted = _replay_run(fit, wl, network)
        # the trace-driven replay: each rank's own recorded compute times, step by step
        traced = predicted if compute == "trace" else _replay_run(fit, dataclasses.replace(wl, compute="trace"), network)
        ratio = predicted / measured if measured else None
        rows.append({"run": str(d), "optimizer": fit.optimizer, "world_size": fit.world_size,
                     "imbalance": fit.imbalance.get("name"), "rounds": fit.rounds, "compute_median_s": wl.step_s,
                     "compute_sigma": wl.sigma, "overhead_s": wl.overhead_s, "params": wl.params,
                     "measured": measured, "predicted": predicted, "ratio": ratio,
                     "within_15pct": ratio is not None and abs(ratio - 1) <= 0.15,
                     "predicted_trace": traced, "ratio_trace": traced / measured if measured else None})
        cal["runs"].append({k: v for k, v in dataclasses.asdict(fit).items() if k not in ("compute", "trace")}
                           | {"compute_median_s": wl.step_s, "compute_sigma": wl.sigma})
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "calibration.json", json.dumps(cal, indent=2, default=float) + "\n")
    if rows:
        write_table(rows, out, "validation")
        cols = [("optimizer", "optimizer"), ("world_size", "P"), ("imbalance", "imbalance"), ("measured", "measured"),
                ("predicted", f"predicted ({compute})"), ("ratio", "ratio"), ("predicted_trace", "predicted (trace)"),
                ("ratio_trace", "ratio"), ("run", "run")]
        print(f"## Validation: predicted vs measured throughput (samples/s)\n\n{markdown(rows, cols)}\n")
        table = [{"label": f"{r['optimizer']} {r['imbalance']}", "world_size": r["world_size"],
                  "throughput": r["measured"], "kind": "measured"} for r in rows if r["measured"]]
        table += [{"label": f"{r['optimizer']} {r['imbalance']}", "world_size": r["world_size"],
                   "throughput": r["predicted"], "kind": "predicted"} for r in rows]
        plots.plot_throughput(table, out / "validation.png", "measured (solid) vs simulated (dashed)", ideal=False)
    pooled = None
    if fits:
        samples = [c for f in fits for c in f.compute]
        # a sweep over other world sizes has no per-rank trace: resample the pooled compute times instead
        base = fits[-1].to_workload(compute="empirical" if compute == "trace" else compute)
        pooled = dataclasses.replace(base, samples=tuple(samples), source="pooled over the calibrated runs")
    return rows, pooled, network


def network_lines(report: dict) -> str:
    """The calibrated network as ``--calibrate`` prints it: each level's fit, or where it came from."""
    head = (f"## Network fitted from comm-bench ({report['rows']} rows): {report['algorithm']}, "
            f"{report['gpus_per_node']} ranks a node (relative RMS error {report['rel_rms']:.2f})")
    lines = [head]
    for level, fit in report["levels"].items():
        how = "measured" if fit["measured"] else fit["note"]
        lines.append(f"- {level}: alpha={fit['alpha_s']:.3g} s, bandwidth={fit['bandwidth_GBps']:.3g} GB/s ({how})")
    return "\n".join(lines) + "\n"


def _replay_run(fit, workload: Workload, network: Network, keep: list | None = None) -> float:
    """Simulated throughput of a calibrated run's own configuration (optimizer, world, imbalance, rounds, seed);
    ``keep`` receives the whole result."""
    settings = typed_settings("optimizer", OPTIMIZER_SPECS, fit.settings)
    imbalance = make_imbalance(typed_settings("imbalance", IMBALANCES, fit.imbalance), fit.seed)
    if workload.compute == "trace":  # the run's own stragglers with its own compute times
        from wagma_bench.simulate.calibrate import RecordedDelays

        imbalance = RecordedDelays(fit.delay_trace)
        if "threshold_s" in fit.extra and getattr(settings, "threshold_s", None) == "auto":
            # ... and DropCompute's threshold as the run set it: the rule, fed the model's micro-batch times and
            # communication cost, lands elsewhere (a measured miss of the trace before: docs/simulator.md)
            threshold = fit.extra["threshold_s"]
            settings = dataclasses.replace(settings, threshold_s="inf" if threshold is None else str(threshold))
    res = simulate(SimConfig(fit.optimizer, fit.world_size, workload, network, imbalance, settings,
                             fit.rounds, fit.seed, local_state=fit.local_state))
    if keep is not None:
        keep.append(res)
    return res.throughput


def typed_settings(section: str, registry: dict, values: dict) -> Any:
    """A run's recorded ``section`` settings (``run_start``'s config) as its option's typed ``Settings``."""
    name = values.get("name")
    if name not in registry:
        raise UsageError(f"{section}={name!r} is not available; choose one of: {', '.join(sorted(registry))}")
    try:
        return registry[name].Settings(**values)
    except TypeError:
        valid = ", ".join(f.name for f in dataclasses.fields(registry[name].Settings))
        raise UsageError(f"{section} {name}: unknown setting in {sorted(values)}; valid: {valid}") from None


def main(argv: list[str]) -> int:
    # a value the model cannot take (a ValueError: --measured's file, the calibrated runs), a file that is not
    # there: refused, exit 2
    return exits.run_body("simulate", lambda: _simulate(argv),
                          also=((ValueError, exits.REFUSED), (FileNotFoundError, exits.REFUSED)))


def _simulate(argv: list[str]) -> int:
    started = time.perf_counter()
    req, ns = parse(argv)
    out = Path(ns.out)
    runs = compose_runs(req)
    check_worlds(runs, req.gpus or ([] if ns.calibrate else list(DEFAULT_GPUS)))
    first = next(iter(runs.values()))
    if ns.calibrate:
        _, pooled, network = compare_with_runs(req, ns, out)
        if req.gpus is None:
            return 0
        workload = pooled if pooled is not None else make_workload(first, req.own)
    else:
        network = load_network(req.cluster or "daint", req.cluster_overrides)
        workload = make_workload(first, req.own)
    if ns.compute_from:
        workload = with_measured_spread(workload, ns.compute_from)
    if ns.measured:
        measured = read_measured(ns.measured)
        workload, network = with_measured(workload, network, measured, set(req.own))
        print(measured.line())
    if ns.cfg == "job":
        print(composed(req, runs, network, workload))
        return 0
    predict(req, ns, runs, network, workload, out, started)
    print(f"wrote {out}/predictions.csv, predictions.json, throughput.png")
    return 0
