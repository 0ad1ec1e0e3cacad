"""``wagma-bench tune``: tuned comparisons by MLCommons AlgoPerf's external tuning ruleset.

    wagma-bench tune workload=resnet optimizer=allreduce,wagma tune.trials=5 tune.studies=5 \\
        [tune.seed=1] [tune.max_runtime_s=SECONDS] [space.lr_multiplier.high=2 ...] [any run override] \\
        --out DIR
    wagma-bench tune cluster=daint gpus=8,16 'optimizer=glob(*)' ... --out DIR [--dry-run | --submit] \\
        [--no-array] [--data-on-nodes] [--step-times RUN_DIR]...
    wagma-bench tune score DIR          (re)write DIR/tuning.json from the trials' run directories

Every combination of the overrides (Hydra's sweep grammar, read by
:func:`wagma_bench.campaign.sweep.parse_overrides`: ``optimizer=a,b``, ``'optimizer=glob(*)'``,
``workload=...``) is tuned on its own: its optimizer's search space (``conf/search_space/NAME.yaml``,
:mod:`wagma_bench.config.search_space`) gives S x O quasirandom points (``tune.studies`` x ``tune.trials``,
from ``tune.seed``); study s takes points (s-1)*O .. s*O-1, disjoint blocks of one sequence, so the S studies
are independent tunings of O trials each. A trial is a normal ``wagma-bench run`` into ``DIR/trials/NAME``
with the point's settings as overrides (``train.lr`` = the multiplier x the workload's ``train.lr``,
``train.warmup_epochs`` = the fraction x ``train.epochs``) and its own seed (1 + its index).
``tune.max_runtime_s`` becomes the trial's ``train.time_limit_s`` (the trainer stops it there), and a trial
past it counts as missing the target. ``space.KEY.FIELD=VALUE`` (``low``, ``high``, ``scale``, ``choices``) or
``space.KEY={low: .., high: ..}`` changes the search space for this tuning only, in every tuned optimizer's
space that has KEY (a whole dimension: in every space), checked as the file is.

Locally the trials run one after another, interleaved across combinations (:func:`run_order`: round by round,
each round's combinations in a seeded random order), with a progress line (each trial's output in
``DIR/logs/``); running the same command again skips the finished trials and resumes an interrupted one from
its checkpoint (the run directory's own resume). With ``cluster=``/``gpus=`` the trials render into a sweep
(``DIR/manifest.json``, ``DIR/jobs/``; ``sweep status|wait|submit DIR`` follow it) and ``tune score DIR``
scores them when they end.

Scoring (:mod:`wagma_bench.analysis.tuning`, written to ``DIR/tuning.json``): per study the fastest trial to
the target (training clock, as ``report``), the score is the median over the studies of those bests, a study
whose trials all missed counting as infinite (so the score is infinite when half the studies or more missed).
With no target (``eval.target=null``, a fixed budget) the same rule runs on each trial's best metric, higher
being better.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from wagma_bench.analysis.tuning import (
    PLAN,
    TRIALS,
    Trial,
    describe,
    outcome,
    yaml_value,
)
from wagma_bench.campaign.reference import VERSION as REFERENCE_VERSION
from wagma_bench.campaign.reference import reference_s
from wagma_bench.config import readback
from wagma_bench.config.overrides import CommandParser, refuse_path_options
from wagma_bench.config.paths import CONF_DIR, conf_context
from wagma_bench.config.renamed import new_key, renamed_overrides
from wagma_bench.config.search_space import draw, load_space, parse_space_override
from wagma_bench.errors import ConfigError, Interrupted
from wagma_bench.record.events import RunEvents
from wagma_bench.record.files import OUTPUT_HINT, open_run_file, run_subdir, write_json_atomic
from wagma_bench.record.summary import RunSummary

OWN_KEYS = ("trials", "studies", "seed", "max_runtime_s")
CLUSTER_FLAGS = {"--dry-run", "--submit", "--no-array", "--data-on-nodes"}


@dataclass
class TuneArgs:
    overrides: list[str]  # run overrides (sweep grammar), cluster=/gpus= included
    out: Path
    trials: int = 5  # O: trials per study
    studies: int = 5  # S
    seed: int = 1  # of the quasirandom sequence
    max_runtime_s: float | None = None
    flags: set[str] = field(default_factory=set)
    space: tuple = ()  # search-space overrides (search_space.Override), from space.KEY...
    step_times: tuple[str, ...] = ()  # --step-times: finished runs whose seconds per round the estimate takes

    @property
    def cluster(self) -> bool:
        return bool(self.flags) or any(
            o.split("=", 1)[0] in ("cluster", "gpus") or o.startswith("cluster.") for o in self.overrides
        )


def parse_args(argv: list[str]) -> TuneArgs:
    """``tune.KEY=VALUE`` (trials, studies, seed, max_runtime_s), ``space.KEY...=VALUE``, ``--out DIR``, the
    cluster flags; the rest are run overrides."""
    parser = CommandParser("wagma-bench tune", USAGE)
    parser.add_argument("--out")
    for flag in sorted(CLUSTER_FLAGS):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--step-times", action="append", default=[], metavar="RUN_DIR")
    parser.add_argument("overrides", nargs="*")
    ns = parser.parse_args(argv)
    if not ns.out:
        raise ConfigError("--out DIR is required (the tuning directory: trials, tune.json, tuning.json)")
    flags = {flag for flag in CLUSTER_FLAGS if getattr(ns, flag.lstrip("-").replace("-", "_"))}
    if "--dry-run" in flags and "--submit" in flags:
        raise ConfigError("--dry-run and --submit exclude each other")
    runs = [a for a in ns.overrides if not a.startswith(("space.", "tune."))]
    space = tuple(parse_space_override(a) for a in ns.overrides if a.startswith("space."))
    parsed = TuneArgs(runs, Path(ns.out), flags=flags, space=space, step_times=tuple(ns.step_times))
    if parsed.step_times and not parsed.cluster:
        raise ConfigError(
            "--step-times is for a tuning rendered for a cluster (cluster=, gpus=): it estimates the "
            "GPU-hours of the rendered trials"
        )
    for a in ns.overrides:
        if a.startswith("tune."):
            key, _, value = a.removeprefix("tune.").partition("=")
            if key not in OWN_KEYS:
                raise ConfigError(f"tune.{key}: unknown key; valid keys of tune: {', '.join(OWN_KEYS)}")
            setattr(parsed, key, _own_value(key, value))
    return parsed


def _own_value(key: str, value: str) -> Any:
    try:
        v = float(value) if key == "max_runtime_s" else int(value)
    except ValueError:
        kind = "a number of seconds" if key == "max_runtime_s" else "an integer"
        raise ConfigError(f"tune.{key}={value!r} is not allowed; it must be {kind}") from None
    if key in ("trials", "studies") and v < 1:
        raise ConfigError(f"tune.{key}={value} is not allowed; it must be >= 1")
    if key == "max_runtime_s" and not (math.isfinite(v) and v > 0):
        raise ConfigError(
            f"tune.max_runtime_s={value} is not allowed; it must be a finite number of seconds > 0"
        )
    return v


# --- the plan: combinations x studies x trials --------------------------------------------------------


def combinations(args: TuneArgs):
    """(spec, [(combination name, gpus, axis overrides)]): ``sweep``'s parsing and
    expansion of the overrides."""
    from wagma_bench.campaign import sweep

    for key, _ in sweep.parse_overrides(args.overrides):
        if key in ("seed", "seeds"):
            raise ConfigError(f"{key} is set by tune (each trial's seed is 1 + its index); leave it out")
        if key.startswith("hydra."):
            raise ConfigError(f"{key} is set by tune (each trial's run directory); leave it out")
    if args.cluster:
        spec = sweep.parse_spec(args.overrides)
        return spec, [(r.name, r.gpus, r.overrides) for r in sweep.expand(spec)]
    axes, common = {}, []
    for key, values in sweep.parse_overrides(args.overrides):
        if len(values) > 1:
            axes[key] = values
        else:
            common.append(f"{key}={values[0]}")
    spec = sweep.SweepSpec(None, [0], axes, common)
    return spec, [(r.name.removeprefix("0000gpu").lstrip("_"), 0, r.overrides) for r in sweep.expand(spec)]


def make_plan(args: TuneArgs) -> tuple[Any, list[Trial], dict[str, Any]]:
    """The trials of every combination, and each trial's composed, checked config
    (a RunConfig, by trial name)."""
    from hydra import compose

    from wagma_bench.config.schema import validate

    spec, combos = combinations(args)
    extra = spec.cluster.run_overrides if spec.cluster else []
    trials, configs, spaces = [], {}, {}
    with conf_context("tune"):
        for name, gpus, axis in combos:
            composed = _composed(compose, [*spec.common, *extra, *axis], name)
            base = _checked(validate, composed, [*spec.common, *extra, *axis], name)
            opt = base.optimizer.name
            if opt not in spaces:
                spaces[opt] = load_space(opt, overrides=args.space)
                _check_not_tuned(spaces[opt], [*spec.common, *axis])
            name = name or opt
            points = draw(spaces[opt], args.studies * args.trials, args.seed)
            for i, point in enumerate(points):
                study, t = divmod(i, args.trials)
                overrides = [
                    *axis,
                    f"seed={i + 1}",
                    *point_overrides(point, base.train.lr, base.train.epochs),
                ]
                if args.max_runtime_s:
                    overrides.append(f"train.time_limit_s={args.max_runtime_s:g}")
                trial = Trial(
                    f"{name}_study{study + 1}_trial{t + 1}",
                    name,
                    study + 1,
                    t + 1,
                    i + 1,
                    point,
                    overrides,
                    gpus,
                )
                trials.append(trial)
                full = [*spec.common, *extra, *overrides]
                trial_cfg = _composed(compose, full, trial.name, composed, overrides[len(axis) :])
                configs[trial.name] = _checked(validate, trial_cfg, full, trial.name)
    _check_overrides_taken(args.space, spaces)
    return spec, trials, configs


def check_data(configs: dict[str, Any], on_nodes: bool) -> list[str]:
    """The trials' data paths checked before the queue (:func:`wagma_bench.campaign.prequeue.check_data`), one
    checked config per distinct workload and data section."""
    from wagma_bench.campaign import prequeue

    distinct = {(c.workload.name, repr(c.data)): c for c in configs.values()}
    return prequeue.check_data(list(distinct.values()), on_nodes)


def _check_overrides_taken(overrides: tuple, spaces: dict) -> None:
    """Every ``space.KEY...`` override names a dimension of at least one tuned optimizer's space."""
    keys = {d.key for space in spaces.values() for d in space.dims}
    for (key, part), value in overrides:
        if key not in keys:
            name = f"space.{key}" + (f".{part}" if part else "")
            raise ConfigError(
                f"{name}={value}: no tuned search space has the dimension {key}; theirs: "
                f"{', '.join(sorted(keys))} (a new one is given whole: space.{key}={{low: .., high: ..}})"
            )


def _check_not_tuned(space, overrides: list[str]) -> None:
    """A setting the search space tunes cannot also be given (the trial's value would silently win)."""
    tuned = {d.key for d in space.dims} | {"train.warmup_epochs"}
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+")
        if key in tuned:
            raise ConfigError(
                f"{o}: {key} is tuned by the search space {space.path.name} of "
                f"optimizer={space.optimizer}; leave it out (train.lr sets the base of lr_multiplier)"
            )


@contextlib.contextmanager
def _named(name: str, overrides: list[str]):
    """A refused configuration said as the trial's (or combination's), with its overrides, in one line."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except ConfigError as err:
        raise ConfigError(f"trial {name} ({' '.join(overrides)}): {err}") from None
    except (HydraException, OmegaConfBaseException) as err:
        from wagma_bench.config.overrides import unknown_option_message

        what = unknown_option_message(err) or f"{type(err).__name__}: {err}"
        raise ConfigError(f"trial {name} ({' '.join(overrides)}): {what}") from None


def _composed(compose, overrides: list[str], name: str, base=None, added: list[str] | tuple = ()):
    """The configuration of ``overrides``, composed by Hydra; with ``base`` (what Hydra composed from
    ``overrides`` less their tail ``added``), ``added`` applied to a copy of it, as Hydra applies a command
    line's values once the defaults are composed (``ConfigLoaderImpl._apply_overrides_to_config``, in
    order, after the same earlier ones): a trial adds its seed and its point's values to its combination's,
    so one composition per combination serves its trials (70 compositions, 0.1 CPU-seconds each, were most of
    a tuning's plan). An added override that is not a plain value of a key the base has (a group, ``+``,
    ``~``, an unknown key) is composed whole, as before."""
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    with _named(name, overrides):
        refuse_path_options(overrides, CONF_DIR)  # `optimizer=../x`: in the user's words, as `run` says it
        if base is not None:
            parsed = OverridesParser.create().parse_overrides(list(added))
            if all(_a_value_of(base, o) for o in parsed):
                cfg = copy.deepcopy(base)
                ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
                return cfg
        return compose(config_name="wagma", overrides=overrides)


def _a_value_of(base, override) -> bool:
    """Whether ``override`` sets a value of a key ``base`` has (not a group, nor ``+``/``~``/``@``)."""
    from omegaconf import Container, OmegaConf

    if override.is_add() or override.is_force_add() or override.is_delete() or override.package is not None:
        return False
    found = OmegaConf.select(base, override.key_or_group, default=_ABSENT, throw_on_resolution_failure=False)
    return found is not _ABSENT and not isinstance(found, Container)


_ABSENT = object()


def _checked(validate, cfg, overrides: list[str], name: str):
    with _named(name, overrides):
        return validate(cfg)


def point_overrides(point: dict[str, Any], base_lr: float, epochs: float) -> list[str]:
    """A point of a search space as run overrides (the multiplier and fraction made absolute)."""
    lr, warmup = _short(base_lr * point["lr_multiplier"]), _short(epochs * point["warmup_fraction"])
    out = [f"train.lr={lr}", f"train.warmup_epochs={warmup}"]
    for key, value in point.items():
        if key not in ("lr_multiplier", "warmup_fraction"):
            out.append(f"{key}={yaml_value(value)}")
    return out


def _short(x: float) -> float:
    return float(f"{x:.6g}")


def write_plan(args: TuneArgs, spec, trials: list[Trial], command: list[str]) -> dict:
    """``DIR/tune.json``; a rerun must plan the same trials (else it is another tuning: refused)."""
    plan = {
        "version": 1,
        "command": command,
        "seed": args.seed,
        "studies": args.studies,
        "trials_per_study": args.trials,
        "max_runtime_s": args.max_runtime_s,
        "common": spec.common,
        "trials": [asdict(t) for t in trials],
    }
    path = args.out / PLAN
    if path.exists():
        earlier = readback.load(path, readback.TUNE_PLAN)
        if in_current_names(earlier) != (plan["common"], plan["trials"]):
            differs = first_difference(in_current_names(earlier), (plan["common"], plan["trials"]))
            raise ConfigError(
                f"{args.out} holds another tuning ({PLAN}: {differs}); run the same command to resume "
                "it, or choose another --out"
            )
        return earlier
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {**plan, "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")})
    return plan


def first_difference(there: tuple, now: tuple) -> str:
    """The first setting in which a recorded plan's (common overrides, trials) differ from those asked now."""
    (common_there, trials_there), (common_now, trials_now) = there, now
    if common_there != common_now:
        return f"common overrides {common_there} there, {common_now} now"
    if len(trials_there or []) != len(trials_now):
        return f"{len(trials_there or [])} trials there, {len(trials_now)} now"
    for a, b in zip(trials_there, trials_now, strict=True):
        key = next((k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)), None)
        if key is not None:
            return f"trial {b.get('name')}: {key}={a.get(key)!r} there, {b.get(key)!r} now"
    return "other trials or settings"


def in_current_names(plan: dict) -> tuple[list | None, list | None]:
    """A plan's common overrides and trials with each renamed key under its current name
    (:mod:`wagma_bench.config.renamed`): a plan written under the old names (``train.max_steps=300``) is the
    same tuning as today's command plans, so a resume finds its trials."""
    trials = plan.get("trials")
    if isinstance(trials, list):
        trials = [
            {
                **t,
                "overrides": renamed_overrides(t.get("overrides", []), quiet=True),
                "params": {new_key(k): v for k, v in (t.get("params") or {}).items()},
            }
            for t in trials
        ]
    common = plan.get("common")
    return (renamed_overrides(common, quiet=True) if isinstance(common, list) else common), trials


# --- running ------------------------------------------------------------------------------------------


def run_order(trials: list[Trial], seed: int) -> list[Trial]:
    """The order the trials run in: interleaved across combinations, so that a machine whose speed drifts (a
    background job, thermal state) is spread over every optimizer rather than falling on one optimizer's
    block.

    Round r holds each combination's r-th trial in plan order (study 1's trials, then study 2's, ...), the
    combinations shuffled per round by a generator seeded with ``seed`` (the same tuning, the same order, so
    a resumed tuning goes on where it stopped); where a round would start with the combination that ended
    the round before, its first two trials swap, so no combination runs twice in a row while another has
    trials left. A pure function of the plan: ``tune`` locally, and the rendered sweep's array order."""
    import random

    by_combo: dict[str, list[Trial]] = {}
    for t in trials:
        by_combo.setdefault(t.combo, []).append(t)
    rng = random.Random(f"wagma-bench tune order {seed}")
    order: list[Trial] = []
    for r in range(max((len(v) for v in by_combo.values()), default=0)):
        this_round = [mine[r] for mine in by_combo.values() if r < len(mine)]
        rng.shuffle(this_round)
        if order and len(this_round) > 1 and this_round[0].combo == order[-1].combo:
            this_round[0], this_round[1] = this_round[1], this_round[0]
        order += this_round
    return order


def run_local(args: TuneArgs, spec, trials: list[Trial], configs: dict[str, Any], out=None) -> None:
    """Each trial through ``wagma-bench run``, one after another; finished ones (same config and budget) are
    skipped, an interrupted one resumes from its checkpoint. Progress lines go to ``out`` (stdout)."""
    from wagma_bench.config.schema import as_recorded
    from wagma_bench.record.rundir import finished_summary
    from wagma_bench.runtime.handover import CHECKED_ENV, write_checked

    out = out or sys.stdout

    run_subdir(args.out / "logs", OUTPUT_HINT)
    n, t0 = len(trials), time.monotonic()
    for k, trial in enumerate(run_order(trials, args.seed), 1):
        run_dir = args.out / TRIALS / trial.name
        head = f"[tune {k}/{n} {_dt.timedelta(seconds=round(time.monotonic() - t0))}] {trial.name}"
        done = finished_summary(run_dir, as_recorded(configs[trial.name]))
        if done is not None:
            print(
                f"{head}: finished earlier, {outcome(done, args.max_runtime_s)}; skipped",
                file=out,
                flush=True,
            )
            continue
        print(f"{head}: {describe(trial.params)} ...", file=out, flush=True)
        cmd = [
            sys.executable,
            "-m",
            "wagma_bench",
            "run",
            *spec.common,
            *trial.overrides,
            f"hydra.run.dir={run_dir.resolve()}",
        ]
        log = args.out / "logs" / f"{trial.name}.log"
        run_dir.mkdir(parents=True, exist_ok=True)
        # the trial's run takes the configuration checked above, and checks it no more
        checked = write_checked(run_dir, as_recorded(configs[trial.name]), f"tune-{os.getpid()}")
        before = reference_s()
        with open_run_file(log, "a", OUTPUT_HINT) as f:
            f.write(f"$ {shlex.join(cmd)}\n")
            f.flush()
            rc, interrupted = run_trial(cmd, f, {**os.environ, CHECKED_ENV: str(checked)})
        summary = RunEvents.read(run_dir).saved_summary
        if summary is not None and not interrupted:
            summary = add_reference(run_dir, summary, before, reference_s())
        result = outcome(summary, args.max_runtime_s) if summary else "no summary"
        head = f"[tune {k}/{n} {_dt.timedelta(seconds=round(time.monotonic() - t0))}] {trial.name}"
        print(f"{head}: {result}" + (f" (exit {rc}; see {log})" if rc else ""), file=out, flush=True)
        if interrupted:
            raise TuneInterrupted(
                f"interrupted in trial {trial.name} ({result}); run the same command again to go "
                f"on: finished trials are kept, an interrupted one resumes from its checkpoint"
            )


def add_reference(run_dir: Path, summary: RunSummary, before: float, after: float) -> RunSummary:
    """The trial's speed reference, timed just before it started and just after it ended, added to its
    ``summary.json`` (``reference_s``: their mean; :mod:`wagma_bench.campaign.reference`)."""
    from wagma_bench.record.summary import write_summary

    fields = {
        **summary.to_json(),
        "reference_s": (before + after) / 2,
        "reference_before_after_s": [before, after],
        "reference_version": REFERENCE_VERSION,
    }
    write_summary(run_dir, fields)
    return RunSummary.from_json(fields)


class TuneInterrupted(Interrupted):
    pass


def run_trial(cmd: list[str], log, env: dict | None = None) -> tuple[int, bool]:
    """Run one trial's ``wagma-bench run`` to its end; returns its exit code and
    whether Ctrl-C interrupted it.

    The trial runs in a process group of its own, so that a terminal's Ctrl-C reaches it once, through tune:
    tune forwards each Ctrl-C to the trial's launcher (the first stops the trial at a checkpoint, the second
    at once) and waits for it to end. Should tune die, the launcher gets SIGINT (Linux's parent-death
    signal)."""
    import signal

    proc = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
        preexec_fn=_interrupt_when_parent_dies,  # noqa: PLW1509 - tune starts no thread
    )
    presses = 0

    def forward(signum, frame):
        nonlocal presses
        presses += 1
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGINT, forward)
    try:
        rc = proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    return rc, presses > 0


def _interrupt_when_parent_dies() -> None:
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGINT, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the trial then runs to its end on its own
        pass


# --- command line -------------------------------------------------------------------------------------

USAGE = __doc__.split("\n\n")[1]
