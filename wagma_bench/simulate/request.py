"""What ``wagma-bench simulate`` was asked, sorted into a :class:`Request`: `run`'s overrides (composed with
Hydra by :mod:`.configure`), the cluster (read as `sweep` reads it), simulate's own keys, and the command's
options (the runs to calibrate on, to take convergence or compute spread from, the measured inputs, the
interval). Which of `run`'s keys the simulation reads, which it refuses, and which keys are its own."""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from wagma_bench.config.schedules import CONTROL_EVERY
from wagma_bench.errors import ConfigError
from wagma_bench.optim.specs import OPTIMIZER_SPECS
from wagma_bench.simulate.des import WORKLOAD_RANGES, Workload, simulated_optimizers

DEFAULT_GPUS = (8, 16, 32, 64, 128, 256, 512, 1024)
# the largest world simulated (the biggest GPU systems): all eight optimizers at 500 rounds took 54 s on this
# quiet 2-core machine (2026-12-06), AD-PSGD 34 s of it, and several times that under other work
MAX_GPUS = 65_536
WORKLOAD_KEYS = {f.name for f in dataclasses.fields(Workload)} - {"name", "samples", "trace", "source"}
# `run`'s keys that the simulation reads, -> the name simulate uses inside: the rounds simulated (default
# DEFAULT_ROUNDS) and the workload's batch per rank (a number of the cost model, next to step_s)
RUN_KEYS_READ = {"train.max_rounds": "steps", "train.batch_size": "batch"}
DEFAULT_ROUNDS = 500
# `run`'s keys a throughput model cannot honour: refused, not ignored
RUN_KEYS_REFUSED = {
    "train.epochs": f"simulate counts rounds, not epochs: give train.max_rounds=N (default {DEFAULT_ROUNDS})"
}
# simulate's own keys, beside `run`'s: the world sizes, the control barrier, the convergence model and the
# workload's cost model (the preset's numbers; its batch is `run`'s train.batch_size)
OWN_KEYS = {"gpus", "control_every", "samples_to_target"} | (WORKLOAD_KEYS - {"batch"})
SWEPT_KEYS = ("gpus", "optimizer")  # the keys that take several values (a,b / range() / glob())
# The work one simulation may imply, ranks x rounds: the largest world at the default rounds (65,536 x 500,
# all eight optimizers in 54 s here); a bigger product would run for hours or fail allocating its arrays.
MAX_RANK_ROUNDS = MAX_GPUS * DEFAULT_ROUNDS
# --interval's replicates x the work of one prediction (every world size): twenty of the largest simulations
# (the committed claims take 100 replicates of the default worlds, 1,024 GPUs at most: a fifth of it)
MAX_INTERVAL_WORK = 20 * MAX_RANK_ROUNDS
# the log-scale compute spreads beyond which exp() of a draw leaves float range (a throughput of 0, NaN in
# predictions.json): sigma 3 already makes one rank in six 20 times slower than the median
SPREAD_MAX = 3.0
BOUNDS = {
    **WORKLOAD_RANGES,
    "sigma": (0.0, SPREAD_MAX, f"a number from 0 to {SPREAD_MAX:g}"),
    "sigma_rank": (0.0, SPREAD_MAX, f"a number from 0 to {SPREAD_MAX:g}"),
}
PERSISTENT_ONLY = ("sigma_rank", "rho")  # the persistent model's own: ignored by every other compute model


class UsageError(ConfigError):
    """A value simulate cannot take (refused, exit 2, as every command refuses bad input)."""


@dataclass
class Request:
    """The command line, sorted: `run`'s overrides (composed with Hydra), the cluster (read as `sweep` reads
    it), simulate's own keys and its options."""

    run_overrides: list[str] = field(default_factory=list)  # one value each, optimizer=... excluded
    optimizers: list[str] = field(default_factory=simulated_optimizers)
    optimizers_chosen: bool = False  # optimizer= given; else every optimizer that runs on the workload
    optimizer_overrides: list[tuple[str, str]] = field(default_factory=list)  # (KEY, VALUE) of optimizer.KEY
    gpus: list[int] | None = None
    cluster: str | None = None
    cluster_overrides: list[str] = field(default_factory=list)  # KEY=VALUE of cluster.KEY
    own: dict[str, str] = field(default_factory=dict)
    # the command's options: --calibrate's run directories and comm-bench JSON, --convergence's and
    # --compute-from's runs, --measured's file, --interval's number of replicates
    calibrate: list[str] = field(default_factory=list)
    convergence: list[str] = field(default_factory=list)
    compute_from: list[str] = field(default_factory=list)
    measured: str | None = None
    interval: int = 0
    jobs: int = 1  # --jobs: the processes that run --interval's simulations
    out: Path | None = None  # --out (--interval keeps what it simulated beside it until it is written)

    @property
    def steps(self) -> int:
        """Rounds to simulate: `run`'s ``train.max_rounds`` (``null``, `run`'s default: 500)."""
        steps = self.own.get("steps", "null")
        return DEFAULT_ROUNDS if steps in ("null", "None") else int(steps)

    @property
    def control_every(self) -> int:
        return int(self.own.get("control_every", CONTROL_EVERY))


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
                raise UsageError(
                    f"gpus must be integers, e.g. gpus=8,16,32; got {','.join(values)!r}"
                ) from None
            for g in req.gpus:
                if not 1 <= g <= MAX_GPUS:
                    raise UsageError(
                        f"gpus={g} is not allowed; it must be between 1 and {MAX_GPUS:,} (a simulation's "
                        "cost grows with ranks x rounds: 1,024 ranks x 500 rounds take seconds)"
                    )
        elif key == "optimizer":
            req.optimizers, req.optimizers_chosen = values, True
        elif key.startswith("optimizer."):
            req.optimizer_overrides.append((key[len("optimizer.") :], values[0]))
        elif key == "cluster":
            req.cluster = values[0]
        elif key.startswith("cluster."):
            req.cluster_overrides.append(f"{key[len('cluster.') :]}={values[0]}")
        elif key in OWN_KEYS:
            req.own[key] = values[0]
        elif key in RUN_KEYS_REFUSED:
            raise UsageError(f"{key}={values[0]}: {RUN_KEYS_REFUSED[key]}")
        elif key in ("steps", "batch"):  # simulate's names before it took run's
            run_key = next(k for k, v in RUN_KEYS_READ.items() if v == key)
            raise UsageError(
                f"{key}={values[0]}: simulate takes run's option names; give {run_key}={values[0]}"
            )
        else:
            req.run_overrides.append(f"{key}={values[0]}")
            if key in RUN_KEYS_READ:  # checked by `run`'s validate with the rest, then read here
                req.own[RUN_KEYS_READ[key]] = values[0]
    return req


def check_work(req: Request) -> None:
    """Refuse, before anything is composed or simulated, a request whose work (ranks x rounds, and
    ``--interval``'s replicates x that over every world size) would run for hours or exhaust memory."""
    try:
        rounds = req.steps
    except ValueError:  # not a number: run's own check names it
        return
    gpus = req.gpus or list(DEFAULT_GPUS)
    biggest = max(gpus)
    if biggest * rounds > MAX_RANK_ROUNDS:
        raise UsageError(
            f"train.max_rounds={rounds} is not allowed at gpus={biggest}: a simulation of ranks x rounds "
            f"= {biggest * rounds:,} exceeds {MAX_RANK_ROUNDS:,} (65,536 ranks x {DEFAULT_ROUNDS} rounds); "
            f"give at most {MAX_RANK_ROUNDS // biggest:,} rounds"
        )
    work = sum(gpus) * rounds
    if req.interval * work > MAX_INTERVAL_WORK:
        raise UsageError(
            f"--interval {req.interval} is not allowed here: replicates x ranks x rounds (summed over the "
            f"world sizes) = {req.interval * work:,} exceeds {MAX_INTERVAL_WORK:,}; give at most "
            f"{max(1, MAX_INTERVAL_WORK // work):,} replicates"
        )


def optimizer_overrides(req: Request, name: str) -> list[str]:
    """The ``optimizer.KEY`` overrides for optimizer ``name``: those of its settings, and any KEY that no
    selected optimizer has (so that `run`'s own error names it)."""

    def settings(opt: str) -> set[str]:
        spec = OPTIMIZER_SPECS.get(opt)
        return {f.name for f in dataclasses.fields(spec.Settings)} if spec else set()

    anyone = set().union(*(settings(o) for o in req.optimizers))
    return [
        f"optimizer.{k}={v}" for k, v in req.optimizer_overrides if k in settings(name) or k not in anyone
    ]


def add_options(ap: argparse.ArgumentParser) -> None:
    """The command's arguments: the overrides, and the options that name runs, files and replicates."""
    ap.add_argument(
        "overrides",
        nargs="*",
        help="`run`'s overrides (workload=, optimizer=, imbalance=, seed=, "
        "...), cluster=NAME, cluster.KEY=VALUE, gpus=..., and simulate's own KEY=VALUE",
    )
    ap.add_argument(
        "--calibrate", nargs="+", default=[], metavar="PATH", help="run directories and comm-bench JSON"
    )
    ap.add_argument(
        "--convergence",
        nargs="+",
        default=[],
        metavar="RUN_DIR",
        help="runs that reached a target, or tuning directories (their winning trials)",
    )
    ap.add_argument(
        "--compute-from",
        nargs="+",
        default=[],
        metavar="RUN_DIR",
        help="runs or tuning directories whose measured compute spread (over its median) replaces the "
        "preset's distribution, scaled to its step_s",
    )
    ap.add_argument(
        "--interval",
        type=int,
        default=0,
        metavar="N",
        help="also N predictions with their inputs resampled, and the assumptions moved one at a time: "
        "interval.json, which `claims` reads for a prediction's interval and what flips it",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=default_jobs(),
        metavar="N",
        help="processes that run --interval's simulations (default: the CPUs this process may use, "
        f"here {default_jobs()}); the results are the same for any N",
    )
    ap.add_argument(
        "--measured",
        metavar="FILE",
        help="measured model inputs (reproduce/scaling/measure_inputs.py, "
        "make gpu-check): AD-PSGD's exchange cost with its bootstrap replicates, the link, the spread",
    )
    ap.add_argument("--out", default="sim", help="output directory (default: sim)")
    ap.add_argument("--cfg", choices=("job",), help="print what each simulation would use, simulate nothing")


def default_jobs() -> int:
    """--jobs' default: the CPUs this process may run on (its affinity, which a SLURM step or taskset
    narrows), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity
        return os.cpu_count() or 1


def take_paths(ns: argparse.Namespace) -> None:
    """The options checked, and the KEY=VALUE items a path option took moved back to the overrides."""
    if ns.jobs < 1:
        raise UsageError(f"--jobs {ns.jobs} is not allowed; it must be a number of processes, 1 or more")
    if ns.interval < 0:
        raise UsageError(
            f"--interval {ns.interval} is not allowed; it must be 0 (none) or a number of replicates"
        )
    # `--calibrate RUN params=N`: nargs="+" also took the KEY=VALUE items that follow the paths
    for opt in ("calibrate", "convergence", "compute_from"):
        items = getattr(ns, opt)
        moved = [i for i in items if "=" in i and not Path(i).exists()]
        setattr(ns, opt, [i for i in items if i not in moved])
        ns.overrides += moved
        if items and not getattr(ns, opt):
            raise UsageError(f"--{opt.replace('_', '-')} needs at least one path")
