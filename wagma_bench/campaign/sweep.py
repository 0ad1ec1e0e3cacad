"""``wagma-bench sweep``: render, submit and follow a SLURM sweep of ``wagma-bench run`` jobs.

    wagma-bench sweep cluster=daint gpus=8,16,32,64,128,256,512,1024 \\
        'optimizer=glob(*)' experiment=paper_resnet50_stragglers \\
        data.root=/scratch/imagenet seeds=3 [--dry-run | --submit | --submitit | --cfg job] [--out DIR]
        [--no-array] [--data-on-nodes] [--step-times RUN_DIR]... [--check]
    wagma-bench sweep --smoke cluster=NAME [cluster.KEY=VALUE]... [optimizer=A,B] [--out DIR] [--submit]
                                        the first day's 2-node job: every optimizer for 50 rounds
                                        (experiment=smoke) and comm-bench across the nodes, whose fit
                                        (DIR/commbench.json) simulate --calibrate reads
        --data-on-nodes                 data.root (data.path, env.data_root) is seen only by the
                                        compute nodes: not checked here (else it must exist with its
                                        layout, or exit 2)
        --step-times RUN_DIR            finished runs (repeatable; a sweep's too) whose seconds per round the
                                        GPU-hour line takes, else the simulator's
        --check                         sbatch --test-only on the first script (where sbatch is on
                                        PATH): SLURM's answer in one line; its refusal exits 2
    wagma-bench sweep submit DIR        submit a rendered sweep; after a cancel, submit again the runs that
                                        did not finish (they resume from their checkpoints)
    wagma-bench sweep status DIR        each run's SLURM state, its own status (cancelled, when cancelled),
                                        step and last evaluation (value @ step)
    wagma-bench sweep wait DIR [--interval S] [--timeout S]
                                        poll SLURM for the whole sweep every S s (30) with a progress line
                                        until every job has ended (no timeout unless given)
    wagma-bench sweep cancel DIR        scancel every run not yet ended: each saves a checkpoint at its next
                                        synchronisation point (SIGTERM; killed after SLURM's KillWait), is
                                        marked cancelled and is not requeued

Arguments: ``cluster=NAME`` (a profile in conf/cluster/), ``cluster.KEY=VALUE`` (change one profile field),
``gpus=LIST`` (total GPUs = ranks per run), ``seeds=N`` (seed=1..N), and any ``wagma-bench run`` override;
one with several values is a sweep axis. Arguments are read by Hydra's own override parser, so the sweep
grammar of ``wagma-bench run -m`` works here too: ``optimizer=wagma,allreduce``, ``optimizer=glob(*)``,
``seed=range(1,4)``, ``optimizer=choice(wagma,sgp)``, ``gpus=range(8,33,8)``. Every combination is composed
with Hydra and checked by :func:`wagma_bench.config.schema.validate` before anything is written, so a bad
option fails at once.

Checked before the queue (:mod:`wagma_bench.campaign.prequeue`, docs/slurm.md): each run's data path exists,
is readable and has its data option's layout (ImageNet: ``train/<class>/`` and ``val/<class>/``, prepared by
reproduce/imagenet/), unless ``--data-on-nodes``; then a line with the sweep's GPU-hours (GPUs x rounds x
seconds per round, measured or simulated) and the bound of ``cluster.time``. ``cluster.array_parallelism=N``
renders each job array as ``--array=0-K%N``.

The sweep directory holds ``manifest.json`` (what was rendered and submitted), ``jobs/*.sbatch`` (readable
scripts; one job array per GPU count, or one job per run with ``--no-array``), ``logs/`` and ``runs/<name>/``
(each a normal run directory, so ``wagma-bench report DIR`` reads the sweep like any tree of runs).
Following, cancelling and submitting again: :mod:`wagma_bench.campaign.sweep_jobs`.

``--submitit`` prints instead one ``wagma-bench run -m hydra/launcher=submitit_slurm ...`` command per GPU
count, the same profile mapped onto the submitit launcher's fields (:func:`submitit_command`), for users who
prefer Hydra's launcher (it blocks until its jobs end and preempts through submitit's own USR2 handling).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import itertools
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from wagma_bench.campaign import nodefit, nodepaths
from wagma_bench.config.cluster import ClusterProfile, auto_venv, load_profile
from wagma_bench.config.cluster import slurm_hours_minutes as _minutes
from wagma_bench.config.overrides import unknown_option_message
from wagma_bench.config.paths import SLURM_DIR, conf_context
from wagma_bench.config.renamed import renamed_overrides
from wagma_bench.config.schema import RunConfig, validate
from wagma_bench.errors import ConfigError
from wagma_bench.record.files import (
    OUTPUT_HINT,
    refuse_link,
    run_subdir,
    write_json_atomic,
    write_text_atomic,
)

TEMPLATE = SLURM_DIR / "job.sbatch"
MANIFEST = "manifest.json"
MAX_ARRAY = 1000  # SLURM's default MaxArraySize is 1001 (indices 0..1000)


# --- the sweep's combinations ---------------------------------------------------------------------------


@dataclass
class SweepRun:
    name: str
    gpus: int
    overrides: list[str]  # per-run overrides (the swept axes and the seed)
    run_dir: str = ""
    job: int = -1  # index into the manifest's jobs
    array_index: int | None = None


@dataclass
class SweepSpec:
    cluster: ClusterProfile
    gpus: list[int]
    axes: dict[str, list[str]]  # key -> values (2+ values, or seed)
    common: list[str]  # overrides with one value


def parse_overrides(args: list[str]) -> list[tuple[str, list[str]]]:
    """Each argument as (key, values), read with Hydra's own override parser and sweep grammar, the one
    ``wagma-bench run -m`` reads: ``a,b``, ``choice(a,b)``, ``range(1,4)``, ``glob(*)`` over a group's
    options. A plain value is a one-element list. ``interval()`` cannot be enumerated and is refused. A
    renamed key (``train.max_steps``) comes under its current name, its deprecation line said."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        overrides = OverridesParser.create().parse_overrides(renamed_overrides(args))
    except HydraException as err:
        raise ConfigError(f"cannot parse the overrides: {err}") from None
    parsed, globs = (
        [],
        [o for o in overrides if o.value_type is not None and o.value_type.name == "GLOB_CHOICE_SWEEP"],
    )
    with _config_loader(bool(globs)) as loader:
        for o in overrides:
            if o.is_interval_sweep():
                raise ConfigError(
                    f"{o.input_line}: interval() is a continuous range for an optimizing sweeper; "
                    "a sweep enumerates its runs: use range(), choice() or a,b,c"
                )
            o.config_loader = loader
            values = (
                list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
            )
            if not values:
                raise ConfigError(f"{o.input_line} matches no value")
            parsed.append((o.get_key_element(), values))
    return parsed


class _config_loader:
    """Hydra's config loader over conf/ (glob() lists a group's options through it), only when needed."""

    def __init__(self, needed: bool):
        self.needed, self._init = needed, None

    def __enter__(self):
        if not self.needed:
            return None
        from hydra.core.global_hydra import GlobalHydra

        self._init = conf_context()
        self._init.__enter__()
        return GlobalHydra.instance().config_loader()

    def __exit__(self, *exc):
        if self._init is not None:
            self._init.__exit__(*exc)


def parse_spec(args: list[str]) -> SweepSpec:
    """``KEY=VALUES`` arguments -> the sweep's axes (see the module docstring)."""
    cluster, cluster_overrides, gpus, seeds = "local", [], None, None
    axes: dict[str, list[str]] = {}
    common: list[str] = []
    for key, values in parse_overrides(args):
        value = values[0]
        if key == "cluster":
            if len(values) > 1:
                raise ConfigError("a sweep runs on one cluster; give one cluster=NAME")
            cluster = value
        elif key.startswith("cluster."):
            cluster_overrides.append(f"{key[len('cluster.') :]}={value}")
        elif key == "gpus":
            try:
                gpus = [int(v) for v in values]
            except ValueError:
                raise ConfigError(
                    f"gpus must be integers, e.g. gpus=8,16,32; got {','.join(values)!r}"
                ) from None
        elif key == "seeds":
            if not value.isdigit() or int(value) < 1 or len(values) > 1:
                raise ConfigError(
                    f"seeds=N takes a positive count (runs seed=1..N); got {','.join(values)!r}"
                )
            seeds = [str(s) for s in range(1, int(value) + 1)]
        elif key.startswith(("hydra.", "launcher.")):
            raise ConfigError(f"{key} is set by the sweep (run directory, SLURM world); leave it out")
        elif len(values) > 1:
            axes[key] = values
        else:
            common.append(f"{key}={value}")
    if gpus is None:
        raise ConfigError("give the GPU counts to sweep, e.g. gpus=8,16,32")
    if seeds is not None:
        if "seed" in axes or any(c.startswith("seed=") for c in common):
            raise ConfigError("give either seeds=N or seed=...")
        axes["seed"] = seeds
    profile = load_profile(cluster, cluster_overrides)
    # fail early on an impossible count, and on a node request beyond the profile's node
    nodefit.check_fits(profile, [job_shape(profile, g)["ntasks_per_node"] for g in gpus])
    return SweepSpec(profile, gpus, axes, common)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", text).strip("_")


def expand(spec: SweepSpec) -> list[SweepRun]:
    """Every combination of GPU count and axes, in a stable order (GPU count outermost)."""
    keys = list(spec.axes)
    runs = []
    for gpus in spec.gpus:
        for values in itertools.product(*(spec.axes[k] for k in keys)):
            parts = [f"{gpus:04d}gpu"]
            for k, v in zip(keys, values):
                parts.append(f"s{v}" if k == "seed" else (v if "." not in k else f"{k.split('.')[-1]}-{v}"))
            runs.append(SweepRun(_slug("_".join(parts)), gpus, [f"{k}={v}" for k, v in zip(keys, values)]))
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ConfigError("two runs of the sweep got the same directory name; make the axes' values distinct")
    return runs


def check_run_configs(spec: SweepSpec, runs: list[SweepRun]) -> dict[str, RunConfig]:
    """Compose every combination with Hydra and validate it at its GPU count (the world's rules: a slow rank
    that exists, a group size that divides it); returns each run's checked config by its name. Seeds and GPU
    counts do not change the composition, so each distinct set of the other overrides is composed once (about
    0.05 s each) and validated once per GPU count."""
    from hydra import compose
    from hydra.errors import HydraException

    composed: dict[tuple, object] = {}
    seen: dict[tuple, RunConfig] = {}
    configs: dict[str, RunConfig] = {}
    with conf_context("sweep"):
        for run in runs:
            rest = tuple(o for o in run.overrides if not o.startswith("seed="))
            if (rest, run.gpus) in seen:
                configs[run.name] = seen[rest, run.gpus]
                continue
            overrides = spec.common + spec.cluster.run_overrides + list(rest)
            try:
                if rest not in composed:
                    composed[rest] = compose(config_name="wagma", overrides=overrides)
                seen[rest, run.gpus] = configs[run.name] = validate(composed[rest], world_size=run.gpus)
            except ConfigError as err:
                raise ConfigError(f"run {run.name} ({' '.join(overrides)}): {err}") from None
            except (HydraException, OmegaConfBaseException) as err:  # bad override, unknown option
                what = unknown_option_message(err) or f"{type(err).__name__}: {err}"
                raise ConfigError(f"run {run.name} ({' '.join(overrides)}): {what}") from None
        for run in runs:
            seed = next((o.split("=", 1)[1] for o in run.overrides if o.startswith("seed=")), "1")
            if not re.fullmatch(r"-?\d+", seed):
                raise ConfigError(f"run {run.name}: seed={seed!r} is not allowed; it must be an integer")
    return configs


def print_configs(spec: SweepSpec, runs: list[SweepRun]) -> None:
    """Each run's composed configuration (Hydra's ``--cfg job`` view), headed by its name and overrides."""
    from hydra import compose

    with conf_context():
        for run in runs:
            overrides = spec.common + spec.cluster.run_overrides + run.overrides
            cfg = compose(config_name="wagma", overrides=overrides)
            print(f"# run {run.name} ({run.gpus} GPUs): {' '.join(overrides)}\n{OmegaConf.to_yaml(cfg)}")


# --- rendering ------------------------------------------------------------------------------------------


def job_shape(profile: ClusterProfile, gpus: int) -> dict[str, int]:
    """Nodes and tasks for ``gpus`` ranks, one task per GPU, whole nodes beyond one node."""
    per_node = profile.gpus_per_node
    if gpus < 1:
        raise ConfigError(f"gpus must be positive, got {gpus}")
    if gpus > per_node and gpus % per_node:
        raise ConfigError(
            f"gpus={gpus} is not a multiple of cluster {profile.name}'s {per_node} GPUs per node"
        )
    nodes = max(1, gpus // per_node)
    return {"nodes": nodes, "ntasks": gpus, "ntasks_per_node": min(gpus, per_node)}


def comm_of(overrides: list[str]) -> str:
    return next((o.split("=", 1)[1] for o in reversed(overrides) if o.startswith("comm=")), "torch")


def sbatch_lines(profile: ClusterProfile, gpus: int, job_name: str, log: str, array: int | None) -> list[str]:
    shape = job_shape(profile, gpus)
    opts = [f"--job-name={job_name}"]
    opts += [
        f"--{k}={v}"
        for k, v in (
            ("partition", profile.partition),
            ("account", profile.account),
            ("qos", profile.qos),
            ("constraint", profile.constraint),
        )
        if v
    ]
    opts += [
        f"--nodes={shape['nodes']}",
        f"--ntasks={shape['ntasks']}",
        f"--ntasks-per-node={shape['ntasks_per_node']}",
        f"--cpus-per-task={profile.cpus_per_task}",
    ]
    if profile.gres:
        opts.append(f"--gres={profile.gres}:{shape['ntasks_per_node']}")
    opts += [
        f"--time={profile.time}",
        f"--signal={profile.signal}",
        "--requeue",
        "--open-mode=append",
        f"--output={log}",
    ]
    if array is not None:
        opts.append(array_option(array, profile.array_parallelism))
    opts += list(profile.sbatch_extra)
    return [f"#SBATCH {o}" for o in opts]


def array_option(tasks: int, parallelism: int | None) -> str:
    """``--array=0-<tasks-1>``, throttled to ``cluster.array_parallelism`` tasks
    at a time (``%N``) when set."""
    return f"--array=0-{tasks - 1}" + (f"%{parallelism}" if parallelism else "")


def venv_prefix(profile: ClusterProfile) -> str | None:
    """The Python prefix the jobs put first on PATH, as the user reached it (links unresolved)."""
    return auto_venv() if profile.venv == "auto" else profile.venv


def setup_lines(profile: ClusterProfile) -> list[str]:
    lines = list(profile.setup)
    prefix = venv_prefix(profile)
    if prefix:
        lines.append(f"export PATH={shlex.quote(str(Path(prefix) / 'bin'))}:$PATH  # venv: {profile.venv}")
    return lines


def select_run_lines(runs: list[SweepRun], array: bool) -> list[str]:
    def assign(run: SweepRun) -> str:
        return (
            f"RUN_DIR={shlex.quote(run.run_dir)}; "
            f"OVERRIDES=({' '.join(shlex.quote(o) for o in run.overrides)})"
        )

    if not array:
        return [f"# run {runs[0].name}", assign(runs[0])]
    lines = ['case "${SLURM_ARRAY_TASK_ID:?this script is a job array: submit it with sbatch}" in']
    lines += [f"  {run.array_index}) {assign(run)} ;;" for run in runs]
    lines += ['  *) echo "no run for array task $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;', "esac"]
    return lines


def render_script(spec: SweepSpec, runs: list[SweepRun], script: Path, log_dir: Path, array: bool) -> str:
    profile, gpus = spec.cluster, runs[0].gpus
    sweep = script.parent.parent.name
    name = f"wb-{sweep}-{gpus}g" if array else f"wb-{runs[0].name}"
    log = str(log_dir / ("%x_%A_%a.out" if array else "%x_%j.out"))
    comm = comm_of(spec.common + runs[0].overrides)
    if comm not in profile.launcher:
        raise ConfigError(
            f"cluster {profile.name} has no launcher for comm={comm}; it has: {', '.join(profile.launcher)}"
        )
    title = f"{len(runs)} runs at {gpus} GPUs (job array)" if array else f"run {runs[0].name} at {gpus} GPUs"
    values = {
        "title": f"wagma-bench sweep {sweep}: {title}",
        "cluster": profile.name,
        "script": str(script),
        "signal_seconds": profile.signal.rpartition("@")[2],
        "sbatch_lines": "\n".join(sbatch_lines(profile, gpus, name, log, len(runs) if array else None)),
        "setup_lines": "\n".join(setup_lines(profile)),
        "select_run": "\n".join(select_run_lines(runs, array)),
        # Slurm 22.05-23.02 do not pass sbatch's --cpus-per-task on to srun:
        # without it each rank gets one core
        "launcher": f'{profile.launcher[comm]} --cpus-per-task="$SLURM_CPUS_PER_TASK" --kill-on-bad-exit=1',
        "common_overrides": " ".join(shlex.quote(o) for o in spec.common + profile.run_overrides),
    }
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], TEMPLATE.read_text())


def group_jobs(runs: list[SweepRun], array: bool) -> list[list[SweepRun]]:
    """One job array per GPU count and comm (they share the script's resources and srun line), split at
    MAX_ARRAY tasks; or one job per run."""
    if not array:
        return [[r] for r in runs]
    groups: dict[tuple, list[SweepRun]] = {}
    for run in runs:
        groups.setdefault((run.gpus, comm_of(run.overrides)), []).append(run)
    return [g[i : i + MAX_ARRAY] for g in groups.values() for i in range(0, len(g), MAX_ARRAY)]


def render(
    spec: SweepSpec,
    out: Path,
    array: bool = True,
    command: list[str] | None = None,
    runs: list[SweepRun] | None = None,
    runs_dir: str = "runs",
    data_on_nodes: bool = False,
    step_times: tuple[str, ...] = (),
    slurm_check: bool = False,
) -> dict:
    """Validate every combination and check it before the queue (:mod:`~wagma_bench.campaign.prequeue`: the
    data paths unless ``data_on_nodes``, the GPU-hours with ``step_times``' measured runs), then write scripts
    and the manifest into ``out``; returns the manifest (its ``checks``: what was checked and estimated).
    ``runs``: these runs instead of the spec's combinations (``tune``'s trials), in ``out/<runs_dir>/``."""
    from wagma_bench.campaign import prequeue

    runs = expand(spec) if runs is None else runs
    configs = check_run_configs(spec, runs)
    checks = {
        "data": prequeue.check_data(configs.values(), on_nodes=data_on_nodes),
        "gpu_hours": prequeue.gpu_hours(spec.cluster, [(r.gpus, configs[r.name]) for r in runs], step_times),
        "node": nodefit.request_line(
            spec.cluster, [job_shape(spec.cluster, g)["ntasks_per_node"] for g in spec.gpus]
        ),
    }
    checks["paths"] = nodepaths.warning_line({"--out": str(out), "venv": venv_prefix(spec.cluster)})
    out = out.resolve()
    folders = [out / MANIFEST, *(out / d for d in ("jobs", "logs", runs_dir))]
    for folder in folders:  # every one checked before any is made: a refusal leaves --out as it was
        if folder.is_symlink():
            raise refuse_link(folder, OUTPUT_HINT)
    if (out / MANIFEST).exists():
        raise ConfigError(f"{out} already holds a sweep ({MANIFEST}); choose another --out")
    scripts = []
    for j, group in enumerate(group_jobs(runs, array)):
        script = (
            out / "jobs" / (f"{j:03d}_{group[0].gpus:04d}gpu.sbatch" if array else f"{group[0].name}.sbatch")
        )
        for i, run in enumerate(group):
            run.run_dir, run.job = str(out / runs_dir / run.name), j
            run.array_index = i if array else None
        scripts.append((script, group, render_script(spec, group, script, out / "logs", array)))
    if slurm_check:  # SLURM's answer on the first script, before anything is written
        checks["slurm"] = slurm_check_line(spec, scripts[0])
    for folder in folders[1:]:  # through the one writer: SLURM writes the logs and the runs into these later
        run_subdir(folder, OUTPUT_HINT)
    jobs = []
    for script, group, text in scripts:
        write_text_atomic(script, text)
        script.chmod(0o755)
        jobs.append(
            {
                "script": str(script.relative_to(out)),
                "gpus": group[0].gpus,
                "array": array,
                "runs": len(group),
                "job_id": None,
                "submitted": None,
            }
        )
    manifest = manifest_of(spec, out, command, jobs, checks, runs)
    write_json_atomic(out / MANIFEST, manifest)
    return manifest


def manifest_of(
    spec: SweepSpec,
    out: Path,
    command: list[str] | None,
    jobs: list[dict],
    checks: dict,
    runs: list[SweepRun],
) -> dict:
    """manifest.json of a sweep rendered into ``out``: what was rendered, checked and (later) submitted."""
    return {
        "version": 1,
        "dir": str(out),  # where its scripts write: a copy elsewhere is refused (sweep_jobs.load_manifest)
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "cluster": dataclasses.asdict(spec.cluster),
        "gpus": spec.gpus,
        "axes": spec.axes,
        "common_overrides": spec.common,
        "jobs": jobs,
        "checks": checks,
        "runs": [
            {
                "name": r.name,
                "gpus": r.gpus,
                "overrides": r.overrides,
                "run_dir": str(Path(r.run_dir).relative_to(out)),
                "job": r.job,
                "array_index": r.array_index,
            }
            for r in runs
        ],
    }


def slurm_check_line(spec: SweepSpec, first: tuple[Path, list[SweepRun], str]) -> str:
    """``sbatch --test-only`` on the first script (written to a temporary file: nothing of the sweep exists
    yet), SLURM's answer in one line; a ConfigError where SLURM refuses it. Without sbatch here, said."""
    import tempfile

    if not nodefit.sbatch_on_path():
        return "--check: sbatch is not on PATH here: not checked against SLURM (the profile's node was)"
    script, group, text = first
    with tempfile.TemporaryDirectory(prefix="wagma-check-") as tmp:
        path = Path(tmp) / script.name
        path.write_text(text)
        tasks = job_shape(spec.cluster, group[0].gpus)["ntasks_per_node"]
        return nodefit.slurm_test_only(path, spec.cluster, tasks)


# --- Hydra's submitit launcher ----------------------------------------------------------------------------


def submitit_overrides(profile: ClusterProfile, gpus: int) -> list[str]:
    """The same profile as ``hydra/launcher=submitit_slurm`` fields (hydra-submitit-launcher 1.2)."""
    shape = job_shape(profile, gpus)
    if profile.time in ("INFINITE", "UNLIMITED"):  # submitit's timeout_min is a number of minutes
        raise ConfigError(
            f"cluster.time={profile.time} is not allowed with --submitit: the submitit launcher takes a "
            "time limit in minutes; give one in SLURM's format, e.g. cluster.time=24:00:00"
        )
    hours, minutes = _minutes(profile.time)
    out = [
        "hydra/launcher=submitit_slurm",
        f"hydra.launcher.nodes={shape['nodes']}",
        f"hydra.launcher.tasks_per_node={shape['ntasks_per_node']}",
        f"hydra.launcher.cpus_per_task={profile.cpus_per_task}",
        f"hydra.launcher.timeout_min={hours * 60 + minutes}",
        f"hydra.launcher.max_num_timeout={profile.max_num_timeout}",
        f"hydra.launcher.setup={json.dumps(setup_lines(profile))}",
        "+hydra.launcher.additional_parameters.requeue=true",
    ]
    fields = {
        "partition": profile.partition,
        "account": profile.account,
        "qos": profile.qos,
        "constraint": profile.constraint,
        "gres": f"{profile.gres}:{shape['ntasks_per_node']}" if profile.gres else None,
    }
    out += [f"hydra.launcher.{k}={v}" for k, v in fields.items() if v]
    if profile.array_parallelism:  # submitit's own throttle of the job array (its default: 256)
        out.append(f"hydra.launcher.array_parallelism={profile.array_parallelism}")
    return out


def submitit_command(spec: SweepSpec, gpus: int, sweep_dir: Path) -> list[str]:
    """``wagma-bench run -m`` over the sweep's axes at one GPU count, through Hydra's submitit launcher."""
    axes = [f"{k}={','.join(v)}" for k, v in spec.axes.items()]
    return [
        "wagma-bench",
        "run",
        "-m",
        *submitit_overrides(spec.cluster, gpus),
        f"hydra.sweep.dir={Path(sweep_dir).resolve() / 'runs' / f'{gpus:04d}gpu'}",
        *spec.common,
        *spec.cluster.run_overrides,
        *axes,
    ]
