"""Schemas of the configuration and their check.

Hydra composes the YAML files under ``conf/``; :func:`validate` then checks every section against a
dataclass, so a typo in a key or a wrong type fails in the launching process, before any rank starts.
Option-dependent sections (``optimizer``, ``imbalance``, ``data``, ``workload``) are checked against the
dataclass registered for the chosen option; the registries are explicit dicts, the optimizers' and workloads'
in their torch-free specs (:mod:`wagma_bench.optim.specs`, :mod:`wagma_bench.workloads.specs`), so that the
check imports no torch.

One validation style, all before any rank starts, every failure a :class:`ConfigError` that names the key,
the bad value and what is allowed: a numeric setting's range is declared with its default
(:func:`wagma_bench.ranges.setting`); a string setting's allowed values are in its schema's ``CHOICES`` (next
to the fields); a rule between settings (``comm.emulate`` needs gloo, ...) is the schema's ``__post_init__``;
data paths and installed packages are a workload's ``check``.

The schemas are not stored in Hydra's ConfigStore on purpose: ``import fairseq`` registers groups named
``optimizer``, ``model``, ``task`` ... there, and ours must never merge with them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from wagma_bench.config.renamed import conflicts, renamed_config
from wagma_bench.errors import ConfigError
from wagma_bench.imbalance import IMBALANCES
from wagma_bench.optim.specs import OPTIMIZER_SPECS
from wagma_bench.ranges import (
    ANY,
    AT_LEAST_ONE,
    FRACTION_BELOW_ONE,
    NON_NEGATIVE,
    POSITIVE,
    SEED,
    Range,
    range_of,
    setting,
)
from wagma_bench.workloads.specs import WORKLOAD_SPECS

__all__ = ["ConfigError", "RunConfig", "validate"]  # ConfigError lives in the leaf module wagma_bench.errors


def _union(classes) -> Any:
    """The union type ``A | B | ...`` of ``classes`` (each once, in registry order)."""
    return functools.reduce(operator.or_, dict.fromkeys(classes))


# The option-dependent sections' types: the union of the registered options' schemas, taken from the
# registries, so that a new option is typed here without an edit.
OptimizerSettings = _union(spec.Settings for spec in OPTIMIZER_SPECS.values())
WorkloadSettings = _union(spec.Settings for spec in WORKLOAD_SPECS.values())
DataSettings = _union(data for spec in WORKLOAD_SPECS.values() for data in spec.DATA.values())
ImbalanceSettings = _union(option.Settings for option in IMBALANCES.values())


def check_ranges(section: str, schema: type, merged: DictConfig) -> None:
    """Every numeric field of one section (merged onto its schema, so typed) within the range it declares
    (:func:`wagma_bench.ranges.setting`); nested sections (``logger.wandb``) too. A numeric field that
    declares none is refused: every number a user can set is checked before any rank starts."""
    for f in dataclasses.fields(schema):
        value = merged.get(f.name)
        if _is_section(value):
            check_ranges(f"{section}.{f.name}", OmegaConf.get_type(value), value)
            continue
        value = list(value) if OmegaConf.is_list(value) else value
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            allowed = range_of(f)
            if allowed is None:
                raise ConfigError(
                    f"{section}.{f.name} has no allowed range; {missing_range_hint(schema, f.name)}"
                )
            check_value(f"{section}.{f.name}", v, allowed, value)


def missing_range_hint(schema: type, key: str) -> str:
    """What to write for a numeric field ``key`` of ``schema`` that declares no range."""
    return (
        f"declare it in {schema.__module__}.{schema.__qualname__} as `{key}: ... = setting(DEFAULT, RANGE)` "
        "(wagma_bench/ranges.py)"
    )


def check_value(key: str, v: float, allowed: Range, whole: Any = None) -> None:
    """One number within its range, and finite (a NaN compares false with every bound, so a range alone
    would let ``train.lr=nan`` through). ``whole``: the list ``v`` is an element of, for the message."""
    shown = v if whole is None or whole is v else f"{whole} (element {v})"
    if isinstance(v, float) and not math.isfinite(v):
        finite = "" if allowed.low is None and allowed.high is None else f" {allowed}"
        raise ConfigError(f"{key}={shown} is not allowed; it must be a finite number{finite}")
    if not allowed.allows(v):
        raise ConfigError(f"{key}={shown} is not allowed; it must be {allowed}")


def check_choices(section: str, schema: type, merged: DictConfig) -> None:
    """Every string setting of one section (and of its nested sections) among its schema's ``CHOICES``."""
    for key, allowed in getattr(schema, "CHOICES", {}).items():
        value = merged[key]
        if value not in allowed:
            shown = ", ".join("null" if a is None else str(a) for a in allowed)
            raise ConfigError(f"{section}.{key}={value!r} is not allowed; choose one of: {shown}")
    for f in dataclasses.fields(schema):
        nested = merged[f.name]
        if _is_section(nested):
            check_choices(f"{section}.{f.name}", OmegaConf.get_type(nested), nested)


def _is_section(node: Any) -> bool:
    """A nested section with a schema of its own (``logger.submission``, ``logger.wandb``)."""
    return OmegaConf.is_dict(node) and dataclasses.is_dataclass(OmegaConf.get_type(node))


def check_target(target: float | None, workload: WorkloadSettings, data: DataSettings) -> None:
    """``eval.target`` within the range of the workload's metric (a top-1 fraction cannot reach 1.5); the
    workload class declares its metrics' ranges (``METRIC_RANGES``)."""
    if target is None:
        return
    cls = WORKLOAD_SPECS[workload.name]
    metric = cls.metric_of(SimpleNamespace(workload=workload, data=data))
    allowed = Range(*cls.METRIC_RANGES[metric])
    check_value("eval.target", target, ANY)
    if not allowed.allows(target):
        raise ConfigError(
            f"eval.target={target} is not allowed with workload={workload.name}; its metric "
            f"({metric}) is {allowed}, so the target must be too"
        )


def check_outer(optimizer: OptimizerSettings) -> None:
    """An outer optimizer only where the models are averaged (the algorithm's ``outer_at``)."""
    if optimizer.outer == "none" or OPTIMIZER_SPECS[optimizer.name].outer_at is not None:
        return
    applies = ", ".join(name for name, cls in OPTIMIZER_SPECS.items() if cls.outer_at is not None)
    raise ConfigError(
        f"optimizer.outer={optimizer.outer} is not allowed with optimizer={optimizer.name}: "
        f"{OPTIMIZER_SPECS[optimizer.name].outer_refusal}; an outer optimizer applies to: {applies}"
    )


def runs_on(optimizer: str, workload: str) -> bool:
    """Whether optimizer ``optimizer`` runs on workload ``workload``: one that computes a batch in parts
    (DropCompute) only where the batches split."""
    return not OPTIMIZER_SPECS[optimizer].computes_in_parts or WORKLOAD_SPECS[workload].splittable


def check_parts(optimizer: OptimizerSettings, workload: WorkloadSettings) -> None:
    """An optimizer that computes a batch in parts (DropCompute) only on a workload whose batches split."""
    if runs_on(optimizer.name, workload.name):
        return
    splittable = ", ".join(name for name, cls in WORKLOAD_SPECS.items() if cls.splittable)
    raise ConfigError(
        f"optimizer={optimizer.name} is not allowed with workload={workload.name}: it computes each "
        f"batch in micro-batches, and {workload.name}'s batches do not split; it runs on: {splittable}"
    )


def check_world(optimizer: OptimizerSettings, imbalance: ImbalanceSettings, world_size: int | None) -> None:
    """The settings that depend on the world size, once it is known (``None``: not yet): the optimizer's own
    rules (its spec's ``check_world``), then the imbalance's."""
    OPTIMIZER_SPECS[optimizer.name].check_world(optimizer, world_size)
    ranks = getattr(imbalance, "ranks", None)  # imbalance=fixed names its slow ranks
    if ranks is not None and world_size is not None and any(r >= world_size for r in ranks):
        raise ConfigError(
            f"imbalance.ranks={list(ranks)} is not allowed with {world_size} ranks; every rank "
            f"must be below {world_size}"
        )
    # imbalance=shared_draw delays num_slow ranks a step; more than the world
    # would quietly be every rank, always
    num_slow = getattr(imbalance, "num_slow", None)
    if num_slow is not None and world_size is not None and num_slow > world_size:
        raise ConfigError(
            f"imbalance.num_slow={num_slow} is not allowed with {world_size} ranks; it must be at "
            f"most {world_size}"
        )


def check_memory(workload: str, nproc: int, total_mb: float | None = None) -> None:
    """``nproc`` local ranks within this machine's memory, estimated as ranks x the workload's measured
    per-rank footprint (``RANK_MEMORY_MB`` of its class; ``total_mb``: the machine's, None to read it). A
    world that cannot fit would only swap or meet the OOM killer before its first step."""
    check_ranks_fit(
        "launcher.nproc",
        nproc,
        WORKLOAD_SPECS[workload].RANK_MEMORY_MB,
        f"workload={workload}, measured",
        total_mb,
    )


def check_ranks_fit(
    key: str, nproc: int, per_rank_mb: float, whose: str, total_mb: float | None = None
) -> None:
    """The rule of every command that starts local ranks (`run`, `comm-bench`): ``nproc`` ranks of
    ``per_rank_mb`` each (``whose``: where the figure comes from) within this machine's memory (``total_mb``:
    None to read it), else a ConfigError naming ``key``, the value and the most that fit."""
    total_mb = machine_memory_mb() if total_mb is None else total_mb
    if not total_mb or nproc * per_rank_mb <= total_mb:
        return
    most = max(1, int(total_mb // per_rank_mb))
    raise ConfigError(
        f"{key}={nproc} is not allowed on this machine: {nproc} ranks x about {per_rank_mb:.0f} "
        f"MiB per rank ({whose}) = {nproc * per_rank_mb / 1024:.1f} GiB, more than its "
        f"{total_mb / 1024:.1f} GiB of memory; it must be at most {most}"
    )


def machine_memory_mb() -> float | None:
    """This machine's physical memory in MiB (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError, AttributeError):
        return None


@dataclass
class TrainConfig:
    batch_size: int = setting(32, AT_LEAST_ONE)
    local_optimizer: str = "sgd"
    lr: float = setting(0.1, POSITIVE)
    lr_reference_batch: int | None = setting(
        256, AT_LEAST_ONE
    )  # null: no linear scaling (the peak rate is lr; RL)
    momentum: float = setting(0.9, FRACTION_BELOW_ONE)
    nesterov: bool = False
    weight_decay: float = setting(1e-4, NON_NEGATIVE)
    adam_betas: list[float] = setting(allowed=FRACTION_BELOW_ONE, factory=lambda: [0.9, 0.98])
    schedule: str = "step"
    warmup_epochs: float = setting(0.0, NON_NEGATIVE)
    # rate at the start of warm-up (fairseq's warmup_init_lr); null: lr
    warmup_start_lr: float | None = setting(None, NON_NEGATIVE)
    milestones: list[float] = setting(allowed=NON_NEGATIVE, factory=lambda: [30.0, 60.0, 80.0])
    decay: float = setting(0.1, POSITIVE)
    # The budget. A run's length is train.max_rounds when set (also beyond train.epochs: max_rounds wins, and
    # train.epochs then only shapes the learning-rate schedule: a cosine reaches zero there), else
    # train.epochs. The run ends earlier at eval.target (with eval.stop_at_target) or at train.time_limit_s of
    # training time; rank 0 says at the start which budget ends it.
    epochs: float = setting(90.0, POSITIVE)
    max_rounds: int | None = setting(None, AT_LEAST_ONE)
    time_limit_s: float | None = setting(None, POSITIVE)
    grad_clip: float | None = setting(None, POSITIVE)
    precision: str = "fp32"  # fp32 | bf16 (autocast of the training forward; ResNets also go channels_last)

    CHOICES: ClassVar[dict[str, tuple]] = {
        "local_optimizer": ("sgd", "adam"),
        "schedule": ("step", "cosine", "constant", "inverse_sqrt"),
        "precision": ("fp32", "bf16"),
    }


@dataclass
class EvalConfig:
    every_epochs: float = setting(1.0, POSITIVE)
    every_rounds: int | None = setting(None, AT_LEAST_ONE)
    target: float | None = setting(None, ANY)
    stop_at_target: bool = True
    model: str = "auto"

    CHOICES: ClassVar[dict[str, tuple]] = {"model": ("auto", "local", "average")}


@dataclass
class CheckpointConfig:
    every_s: float = setting(600.0, NON_NEGATIVE)
    resume: bool = True
    # null: RUN_DIR/checkpoint; else a folder (a scratch file system; relative: under the run directory) that
    # gets one subfolder per run (wagma_bench/record/checkpoint.py), checked before any rank starts
    # (check_folder)
    dir: str | None = None


@dataclass
class CommConfig:
    name: str = "torch"
    backend: str = "auto"
    timeout_s: float = setting(300.0, POSITIVE)
    emulate: str | None = None  # nccl: a gloo world whose data plane refuses what NCCL refuses (tests, CI)

    CHOICES: ClassVar[dict[str, tuple]] = {
        "name": ("torch", "mpi"),
        "backend": ("auto", "gloo", "nccl", "mpi"),
        "emulate": (None, "nccl"),
    }

    def __post_init__(self):  # runs in the config check, before any rank starts
        backends = {"torch": ("auto", "gloo", "nccl"), "mpi": ("mpi",)}.get(self.name, ())
        if self.name in ("torch", "mpi") and self.backend not in backends:
            raise ConfigError(
                f"comm.backend={self.backend!r} is not allowed with comm={self.name}; "
                f"choose one of: {', '.join(backends)}"
            )
        if self.emulate is not None and (self.name != "torch" or self.backend not in ("auto", "gloo")):
            raise ConfigError(
                f"comm.emulate=nccl is not allowed with comm={self.name} comm.backend={self.backend}: "
                "it emulates NCCL on a gloo world, so it needs comm=torch with comm.backend=auto or gloo"
            )


@dataclass
class LauncherConfig:
    name: str = "local"
    # null: one rank per visible GPU with CUDA, else 4 (launch.device_plan)
    nproc: int | None = setting(None, AT_LEAST_ONE)
    master_addr: str = "127.0.0.1"
    master_port: int | None = setting(None, Range(1, 65535))
    rendezvous_timeout_s: float = setting(120.0, POSITIVE)


@dataclass
class WandbConfig:
    project: str = "wagma-bench"
    entity: str | None = None
    group: str | None = None  # null: the sweep directory's name in a multirun, else none
    mode: str = "auto"  # auto (online with an API key, else offline) | offline | online
    per_rank_step_times: bool = False  # also log every rank's compute / delay / comm times
    timeout_s: float = setting(
        30.0, POSITIVE
    )  # an online start slower than this falls back to an offline run

    CHOICES: ClassVar[dict[str, tuple]] = {"mode": ("auto", "offline", "online")}


@dataclass
class SubmissionConfig:
    """The ``submission_*`` keys of the MLPerf log (``RUN_DIR/mllog.txt``; see
    wagma_bench/record/mlperf.py)."""

    org: str = "wagma-bench"  # submission_org: who ran it
    platform: str = "unknown"  # submission_platform: the system (e.g. "daint-p100x64")
    division: str = "open"  # closed | open (our optimizers change the training: open)
    status: str = "research"  # cloud | onprem | preview | research
    poc_name: str = ""  # point of contact (optional)
    poc_email: str = ""

    CHOICES: ClassVar[dict[str, tuple]] = {
        "division": ("closed", "open"),
        "status": ("cloud", "onprem", "preview", "research"),
    }

    def __post_init__(self):
        for key in ("org", "platform"):
            if not getattr(self, key):
                raise ConfigError(
                    f"logger.submission.{key}='' is not allowed; it must name the submitter's "
                    f"{'organisation' if key == 'org' else 'system'}"
                )


@dataclass
class LoggerConfig:
    progress: str = "auto"
    log_every_s: float = setting(10.0, NON_NEGATIVE)
    mllog: bool = False  # also print the MLPerf log (RUN_DIR/mllog.txt) to stdout at the end
    submission: SubmissionConfig = field(default_factory=SubmissionConfig)
    wandb: WandbConfig | None = None  # set by logger=wandb

    CHOICES: ClassVar[dict[str, tuple]] = {"progress": ("auto", "bar", "lines", "off")}


FIXED_SECTIONS: dict[str, type] = {
    "train": TrainConfig,
    "eval": EvalConfig,
    "checkpoint": CheckpointConfig,
    "comm": CommConfig,
    "launcher": LauncherConfig,
    "logger": LoggerConfig,
}
TOP_LEVEL_SCALARS = {"seed": int}


def workload_data_schemas(workload: str) -> dict[str, type]:
    """Data options of a workload: option name -> schema dataclass (the workload's ``DATA``)."""
    return WORKLOAD_SPECS[workload].DATA


def data_section_names() -> dict[str, str]:
    """Workload -> the top-level section its data options live in (``data``; ``env`` for RL workloads)."""
    return {name: cls.DATA_SECTION for name, cls in WORKLOAD_SPECS.items()}


def option_schemas() -> dict[str, dict[str, type]]:
    """Schemas of option-dependent sections, keyed by section then option name."""
    return {
        "workload": {name: cls.Settings for name, cls in WORKLOAD_SPECS.items()},
        "optimizer": {name: cls.Settings for name, cls in OPTIMIZER_SPECS.items()},
        "imbalance": {name: cls.Settings for name, cls in IMBALANCES.items()},
    }


@dataclass
class RunConfig:
    """The whole, checked configuration of one run (typed; built by :func:`validate`)."""

    seed: int
    train: TrainConfig
    eval: EvalConfig
    checkpoint: CheckpointConfig
    comm: CommConfig
    launcher: LauncherConfig
    logger: LoggerConfig
    workload: WorkloadSettings  # the chosen option's schema (``workload.name``)
    data: DataSettings  # the workload's data option (its ``data:`` or, for RL, ``env:`` section)
    optimizer: OptimizerSettings
    imbalance: ImbalanceSettings
    # The resolved configuration as composed, values as written (``600`` where the typed field holds 600.0):
    # what the run records (run_start, checkpoint manifests, W&B) and its hashes are computed on, so that they
    # match the runs recorded before. Not a way to read settings: outside config/ it is taken whole, through
    # :func:`as_recorded`, and never read by key (tests/test_config_once.py).
    composed: dict = field(default_factory=dict, repr=False)


def as_recorded(cfg: RunConfig) -> dict:
    """The configuration of a live run as its records keep it: the resolved mapping as composed, on which its
    hashes are computed (:mod:`wagma_bench.config.identity`) and which ``run_start``, the checkpoint
    manifests, W&B and the checked configuration handed to its ranks hold. Taken whole: settings are read from
    ``cfg``'s typed fields."""
    return cfg.composed


def _typed(section: str, schema: type, node: Any) -> Any:
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
        check_ranges(section, schema, merged)  # before the schema's __post_init__ (rules between keys)
        check_choices(section, schema, merged)
        typed = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        valid = ", ".join(f.name for f in dataclasses.fields(schema))
        key = getattr(err, "full_key", None) or getattr(err, "key", None)
        message = str(getattr(err, "msg", err)).splitlines()[0]
        kind = next((k for pattern, k in WRONG_TYPE.items() if pattern in message), None)
        if (
            key and kind
        ):  # a value of the wrong type: the key is right, so no list of keys (it reads as a typo)
            raise ConfigError(
                f"{section}.{key}={getattr(err, 'value', '?')!r} is not allowed; it must be {kind}"
            ) from None
        if isinstance(err, ConfigKeyError):
            problem = f"{section}.{key}: unknown key"
        else:
            problem = (f"{section}.{key}: " if key else f"{section}: ") + message
        raise ConfigError(f"{problem}; valid keys of {section}: {valid}") from None
    return typed


def _current_names(raw: dict) -> dict:
    """``raw`` with each renamed key under its current name (:mod:`wagma_bench.config.renamed`: an old YAML
    file's ``train.max_steps``), its deprecation line said; an old key beside its new one at another value is
    refused."""
    for old, value, new, theirs in conflicts(raw):
        raise ConfigError(
            f"{old}={value} and {new}={theirs} are both given; {old} is the old name of {new}: "
            f"give only {new}"
        )
    return renamed_config(raw, say=True)


# OmegaConf's conversion errors -> what the key takes
WRONG_TYPE = {
    "converted to Integer": "an integer",
    "converted to Float": "a number",
    "is not a valid bool": "true or false",
}


def validate(cfg: DictConfig | dict, world_size: int | None = None) -> RunConfig:
    """Check a composed config against the schemas; return it typed. Raises :class:`ConfigError`.

    ``world_size``: the world an external launcher (torchrun, srun, mpiexec) gives; None: ``launcher.nproc``.
    """
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    raw.pop("hydra", None)
    raw = _current_names(raw)
    missing = sorted(OmegaConf.missing_keys(OmegaConf.create(raw)))
    if missing:
        raise ConfigError(f"required setting(s) not given: {', '.join(missing)} (pass e.g. {missing[0]}=...)")
    data_sections = data_section_names()
    known = (
        set(FIXED_SECTIONS) | set(TOP_LEVEL_SCALARS) | {"workload", "optimizer", "imbalance", "experiment"}
    )
    known |= set(data_sections.values())
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(
            f"unknown top-level key(s): {', '.join(unknown)}; valid: {', '.join(sorted(known))}"
        )
    typed: dict[str, Any] = {k: _typed(k, schema, raw.get(k, {})) for k, schema in FIXED_SECTIONS.items()}
    for section, options in option_schemas().items():
        node = dict(raw.get(section) or {})
        name = node.get("name")
        if name not in options:
            raise ConfigError(
                f"{section}={name!r} is not available; choose one of: {', '.join(sorted(options))}"
            )
        typed[section] = _typed(section, options[name], node)
    # The workload's data options (an environment for RL) live in its own section; typed as `data`.
    workload = typed["workload"].name
    data_key = data_sections[workload]
    stray = sorted(k for k in set(data_sections.values()) - {data_key} if k in raw)
    if stray:
        raise ConfigError(
            f"workload={workload} takes its data options from `{data_key}:`; "
            f"remove the section(s): {', '.join(stray)}"
        )
    data_options = workload_data_schemas(workload)
    data_name = (raw.get(data_key) or {}).get("name")
    if data_name not in data_options:
        raise ConfigError(
            f"workload={workload} has no {data_key}={data_name!r}; choose one of: "
            f"{', '.join(sorted(data_options))}"
        )
    typed["data"] = _typed(data_key, data_options[data_name], raw[data_key])
    seed = raw.get("seed", 1)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed={seed!r} is not allowed; it must be an integer")
    check_value("seed", seed, SEED)
    check_target(typed["eval"].target, typed["workload"], typed["data"])
    check_outer(typed["optimizer"])
    check_parts(typed["optimizer"], typed["workload"])
    check_world(typed["optimizer"], typed["imbalance"], world_size or typed["launcher"].nproc)
    raw.pop("experiment", None)
    return RunConfig(seed=seed, composed=raw, **typed)


def from_checked(raw: dict) -> RunConfig:
    """The typed configuration of ``raw``, a configuration :func:`validate` passed before (in the run's
    launching process, or on rank 0 of its world: :mod:`wagma_bench.runtime.handover`), built again without
    checking it again: the sections' option classes chosen by their names, the values as recorded."""
    typed: dict[str, Any] = {k: _built(schema, raw.get(k, {})) for k, schema in FIXED_SECTIONS.items()}
    for section, options in option_schemas().items():
        typed[section] = _built(options[raw[section]["name"]], raw[section])
    data_key = data_section_names()[typed["workload"].name]
    data_options = workload_data_schemas(typed["workload"].name)
    typed["data"] = _built(data_options[raw[data_key]["name"]], raw[data_key])
    return RunConfig(seed=raw.get("seed", 1), composed=raw, **typed)


def _built(schema: type, node: Any) -> Any:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), node))
