"""Schemas of the configuration and their check.

Hydra composes the YAML files under ``conf/``; :func:`validate` then checks every section against a
dataclass, so a typo in a key or a wrong type fails in the launching process, before any rank starts.
Option-dependent sections (``optimizer``, ``imbalance``, ``data``, ``workload``) are checked against the
dataclass registered for the chosen option; the registries are explicit dicts in their modules.

The schemas are not stored in Hydra's ConfigStore on purpose: ``import fairseq`` registers groups named
``optimizer``, ``model``, ``task`` ... there, and ours must never merge with them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException


class ConfigError(ValueError):
    """A configuration that cannot run; the message says what is allowed."""


@dataclass
class TrainConfig:
    batch_size: int = 32
    local_optimizer: str = "sgd"
    lr: float = 0.1
    lr_reference_batch: int | None = 256   # null: no linear scaling (the peak rate is lr; RL)
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 1e-4
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    schedule: str = "step"
    warmup_epochs: float = 0.0
    warmup_start_lr: float | None = None  # rate at the start of warm-up (fairseq's warmup_init_lr); null: lr
    milestones: list[float] = field(default_factory=lambda: [30.0, 60.0, 80.0])
    decay: float = 0.1
    epochs: float = 90.0
    max_steps: int | None = None
    time_limit_s: float | None = None
    grad_clip: float | None = None
    precision: str = "fp32"  # fp32 | bf16 (autocast of the training forward; ResNets also go channels_last)


@dataclass
class EvalConfig:
    every_epochs: float = 1.0
    every_steps: int | None = None
    target: float | None = None
    stop_at_target: bool = True
    model: str = "auto"


@dataclass
class CheckpointConfig:
    every_s: float = 600.0
    resume: bool = True


@dataclass
class CommConfig:
    name: str = "torch"
    backend: str = "auto"
    timeout_s: float = 300.0
    emulate: str | None = None   # nccl: a gloo world whose data plane refuses what NCCL refuses (tests, CI)

    def __post_init__(self):  # runs in the config check, before any rank starts
        backends = {"torch": ("auto", "gloo", "nccl"), "mpi": ("mpi",)}.get(self.name, ())
        if self.name in ("torch", "mpi") and self.backend not in backends:
            raise ConfigError(f"comm.backend={self.backend!r} is not a backend of comm={self.name}; "
                              f"choose one of: {', '.join(backends)}")
        if self.emulate is None:
            return
        if self.emulate != "nccl":
            raise ConfigError(f"comm.emulate={self.emulate!r} is not valid; choose null or nccl")
        if self.name != "torch" or self.backend not in ("auto", "gloo"):
            raise ConfigError(f"comm.emulate=nccl emulates NCCL on a gloo world: it needs comm=torch with "
                              f"comm.backend=auto or gloo, not comm={self.name} comm.backend={self.backend}")


@dataclass
class LauncherConfig:
    name: str = "local"
    nproc: int | None = None  # null: one rank per visible GPU with CUDA, else 4 (launch.device_plan)
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    rendezvous_timeout_s: float = 120.0


@dataclass
class WandbConfig:
    project: str = "wagma-bench"
    entity: str | None = None
    group: str | None = None              # null: the sweep directory's name in a multirun, else none
    mode: str = "auto"                    # auto (online with an API key, else offline) | offline | online
    per_rank_step_times: bool = False     # also log every rank's compute / delay / comm times

    def __post_init__(self):
        if self.mode not in ("auto", "offline", "online"):
            raise ConfigError(f"logger.wandb.mode={self.mode!r} is not valid; choose one of: auto, offline, online")


@dataclass
class SubmissionConfig:
    """The ``submission_*`` keys of the MLPerf log (``RUN_DIR/mllog.txt``; see wagma_bench/mlperf.py)."""

    org: str = "wagma-bench"              # submission_org: who ran it
    platform: str = "unknown"             # submission_platform: the system (e.g. "daint-p100x64")
    division: str = "open"                # closed | open (our optimizers change the training: open)
    status: str = "research"              # cloud | onprem | preview | research
    poc_name: str = ""                    # point of contact (optional)
    poc_email: str = ""

    def __post_init__(self):
        for name, allowed in (("division", ("closed", "open")), ("status", ("cloud", "onprem", "preview", "research"))):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"logger.submission.{name}={getattr(self, name)!r} is not valid; "
                                  f"choose one of: {', '.join(allowed)}")
        if not self.org or not self.platform:
            raise ConfigError("logger.submission.org and logger.submission.platform must not be empty")


@dataclass
class LoggerConfig:
    progress: str = "auto"
    log_every_s: float = 10.0
    mllog: bool = False                # also print the MLPerf log (RUN_DIR/mllog.txt) to stdout at the end
    submission: SubmissionConfig = field(default_factory=SubmissionConfig)
    wandb: WandbConfig | None = None   # set by logger=wandb


CHOICES = {
    "train.local_optimizer": ("sgd", "adam"),
    "train.schedule": ("step", "cosine", "constant", "inverse_sqrt"),
    "train.precision": ("fp32", "bf16"),
    "eval.model": ("auto", "local", "average"),
    "comm.name": ("torch", "mpi"),
    "comm.backend": ("auto", "gloo", "nccl", "mpi"),
    "logger.progress": ("auto", "bar", "lines", "off"),
}

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
    from wagma_bench.workloads import WORKLOADS

    return WORKLOADS[workload].DATA


def data_section_names() -> dict[str, str]:
    """Workload -> the top-level section its data options live in (``data``; ``env`` for RL workloads)."""
    from wagma_bench.workloads import WORKLOADS

    return {name: getattr(cls, "DATA_SECTION", "data") for name, cls in WORKLOADS.items()}


def option_schemas() -> dict[str, dict[str, type]]:
    """Schemas of option-dependent sections, keyed by section then option name."""
    from wagma_bench.imbalance import IMBALANCES
    from wagma_bench.optim import OPTIMIZERS
    from wagma_bench.workloads import WORKLOADS

    return {
        "workload": {name: cls.Settings for name, cls in WORKLOADS.items()},
        "optimizer": {name: cls.Settings for name, cls in OPTIMIZERS.items()},
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
    workload: Any
    data: Any
    optimizer: Any
    imbalance: Any
    raw: dict = field(default_factory=dict, repr=False)  # the resolved config, as composed


def _typed(section: str, schema: type, node: Any) -> Any:
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        valid = ", ".join(f.name for f in dataclasses.fields(schema))
        key = getattr(err, "full_key", None) or getattr(err, "key", None)
        if isinstance(err, ConfigKeyError):
            problem = f"{section}.{key}: unknown key"
        else:
            problem = f"{section}.{key}: " if key else f"{section}: "
            problem += str(getattr(err, "msg", err)).splitlines()[0]
        raise ConfigError(f"{problem}; valid keys of {section}: {valid}") from None


def validate(cfg: DictConfig | dict) -> RunConfig:
    """Check a composed config against the schemas; return it typed. Raises :class:`ConfigError`."""
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    raw.pop("hydra", None)
    missing = sorted(OmegaConf.missing_keys(OmegaConf.create(raw)))
    if missing:
        raise ConfigError(f"required setting(s) not given: {', '.join(missing)} (pass e.g. {missing[0]}=...)")
    data_sections = data_section_names()
    known = set(FIXED_SECTIONS) | set(TOP_LEVEL_SCALARS) | {"workload", "optimizer", "imbalance", "experiment"}
    known |= set(data_sections.values())
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"unknown top-level key(s): {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
    typed: dict[str, Any] = {k: _typed(k, schema, raw.get(k, {})) for k, schema in FIXED_SECTIONS.items()}
    for section, options in option_schemas().items():
        node = dict(raw.get(section) or {})
        name = node.get("name")
        if name not in options:
            raise ConfigError(f"{section}={name!r} is not available; choose one of: {', '.join(sorted(options))}")
        typed[section] = _typed(section, options[name], node)
    # The workload's data options (an environment for RL) live in its own section; typed as `data`.
    workload = typed["workload"].name
    data_key = data_sections[workload]
    stray = sorted(k for k in set(data_sections.values()) - {data_key} if k in raw)
    if stray:
        raise ConfigError(f"workload={workload} takes its data options from `{data_key}:`; "
                          f"remove the section(s): {', '.join(stray)}")
    data_options = workload_data_schemas(workload)
    data_name = (raw.get(data_key) or {}).get("name")
    if data_name not in data_options:
        raise ConfigError(f"workload={workload} has no {data_key}={data_name!r}; choose one of: "
                          f"{', '.join(sorted(data_options))}")
    typed["data"] = _typed(data_key, data_options[data_name], raw[data_key])
    for dotted, allowed in CHOICES.items():
        section, key = dotted.split(".")
        value = getattr(typed[section], key)
        if value not in allowed:
            raise ConfigError(f"{dotted}={value!r} is not valid; choose one of: {', '.join(allowed)}")
    seed = raw.get("seed", 1)
    if not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    raw.pop("experiment", None)
    return RunConfig(seed=seed, raw=raw, **typed)
