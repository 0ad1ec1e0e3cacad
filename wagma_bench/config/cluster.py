"""Cluster profiles: ``conf/cluster/NAME.yaml``, how jobs are requested and started on one cluster (SLURM's
request, the launcher per comm, the node hardware) and the network ``simulate`` models it with. Read and
checked here for ``sweep``, ``tune`` and ``simulate`` alike: a misspelt key anywhere is refused with its full
path."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from wagma_bench.config.paths import CONF_DIR
from wagma_bench.errors import ConfigError


@dataclass
class Hardware:
    nodes: int = 1  # nodes in the partition
    cpus_per_node: int = 1
    gpus_per_node: int = 0  # GRES gpus SLURM knows per node (0: none declared)
    mem_gb: float | None = None  # the node's memory (GB; null: not stated, a --mem request is not checked)
    features: list[str] = field(default_factory=list)
    max_time: str = "INFINITE"


@dataclass
class LinkProfile:
    """One link level of `simulate`'s alpha-beta model (wagma_bench/simulate/costs.py: ``parse_link``)."""

    alpha_s: float | None = None  # latency (s)
    bandwidth_GBps: float | None = None  # per rank and direction (GB/s)
    beta_s_per_byte: float | None = None  # or the inverse bandwidth directly


@dataclass
class NetworkProfile:
    """The ``network:`` section of a profile, typed so that a misspelt key anywhere in it is refused."""

    allreduce: str = "auto"  # ring | recursive_doubling | tree | hierarchical | auto (the cheapest)
    intra: LinkProfile | None = None  # a group within one node (null: as inter)
    inter: LinkProfile | None = None
    injection_GBps: float | None = (
        None  # a node's NIC bandwidth per direction, shared by its flows; null: none
    )
    control_alpha_s: float | None = None  # latency of a control message (null: inter's alpha)

    def as_dict(self) -> dict[str, Any]:
        """The set keys, as ``Network.from_profile`` reads them."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        for level in ("intra", "inter"):
            if level in out:
                out[level] = {k: v for k, v in out[level].items() if v is not None}
        return out


LAUNCHER_KEYS = ("torch", "mpi")  # profile.launcher: the command that starts the ranks, per comm


@dataclass
class ClusterProfile:
    """conf/cluster/NAME.yaml: how jobs are requested and started on one cluster."""

    name: str
    gpus_per_node: int  # tasks (ranks) per node: one per GPU
    cpus_per_task: int = 1
    gres: str | None = None  # GRES to request per node: --gres=<gres>:<tasks per node>
    partition: str | None = None
    account: str | None = None
    constraint: str | None = None
    qos: str | None = None
    time: str = "01:00:00"
    signal: str = "USR1@90"
    max_num_timeout: int = (
        3  # --submitit: times a job that hits its time limit is requeued (submitit's default 0)
    )
    # job-array tasks SLURM runs at once (sbatch --array=0-N%K); null: no
    # throttle, as many as the queue starts
    array_parallelism: int | None = None
    sbatch_extra: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    venv: str | None = None  # auto | a prefix | null
    launcher: dict[str, str] = field(default_factory=lambda: {"torch": "srun", "mpi": "srun --mpi=pmi2"})
    run_overrides: list[str] = field(default_factory=list)
    hardware: Hardware = field(default_factory=Hardware)
    network: NetworkProfile | None = None


def auto_venv(env=os.environ) -> str:
    """The Python prefix ``venv: auto`` puts on the jobs' PATH: the one running the sweep, named as the user
    reached it: ``VIRTUAL_ENV`` (the activated path, a symbolic link or a per-user path such as ``$HOME/venv``
    kept as given) where it is this prefix, else ``sys.prefix`` (a console script's ``#!`` line names the
    prefix as pip wrote it, which may be the link's target: a path that compute nodes may reach differently,
    or not at all)."""
    given = env.get("VIRTUAL_ENV")
    try:
        if given and os.path.samefile(given, sys.prefix):
            return given
    except OSError:  # a VIRTUAL_ENV that no longer exists
        pass
    return sys.prefix


def cluster_names() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "cluster").glob("*.yaml"))


def load_profile(name: str, overrides: list[str] = ()) -> ClusterProfile:
    """Read conf/cluster/NAME.yaml, apply ``KEY=VALUE`` overrides, check it
    against :class:`ClusterProfile`."""
    path = CONF_DIR / "cluster" / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"cluster={name!r} is not available; choose one of: {', '.join(cluster_names())}")
    try:
        node = OmegaConf.merge(
            OmegaConf.structured(ClusterProfile),
            OmegaConf.load(path),
            OmegaConf.create(_override_values(overrides)),
        )
        profile = OmegaConf.to_object(node)
    except OmegaConfBaseException as err:
        raise ConfigError(_profile_error(name, err)) from None
    check_slurm_time("cluster.time", profile.time)
    stray = sorted(set(profile.launcher) - set(LAUNCHER_KEYS))
    if stray:
        raise ConfigError(
            f"cluster.launcher.{stray[0]}: unknown key (cluster {name}); valid keys of "
            f"cluster.launcher: {', '.join(LAUNCHER_KEYS)}"
        )
    if profile.array_parallelism is not None and profile.array_parallelism < 1:
        raise ConfigError(
            f"cluster.array_parallelism={profile.array_parallelism} is not allowed; it must be a "
            "positive number of array tasks running at once, or null (no throttle)"
        )
    if profile.gpus_per_node < 1:
        raise ConfigError(f"cluster {name}: gpus_per_node must be >= 1, got {profile.gpus_per_node}")
    return profile


def _override_values(overrides: list[str]) -> dict:
    """``KEY=VALUE`` overrides (as the command line's Hydra grammar wrote them, escapes included) as the
    nested values they mean: ``time=24\\:00\\:00`` is the string ``24:00:00`` (OmegaConf's dotlist would read
    YAML, where ``24:00:00`` is a number), ``setup=[module load cuda/12.4]`` one shell line."""
    if not overrides:
        return {}
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as err:
        raise ConfigError(f"cannot parse the cluster overrides: {err}") from None
    out: dict = {}
    for o in parsed:
        *path, last = o.key_or_group.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = o.value()
    return out


SLURM_TIME = re.compile(r"(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2}|INFINITE|UNLIMITED)")


def check_slurm_time(key: str, value: str) -> None:
    """``value`` in SLURM's own time format (sbatch --time), else a ConfigError naming ``key``."""
    if not SLURM_TIME.fullmatch(str(value)):
        raise ConfigError(
            f"{key}={value} is not allowed; it must be in SLURM's time format: MM, MM:SS, HH:MM:SS, "
            "D-HH, D-HH:MM or D-HH:MM:SS"
        )


def slurm_hours_minutes(limit: str) -> tuple[int, int]:
    """SLURM time 'D-HH:MM:SS' | 'HH:MM:SS' | 'MM' -> (hours, minutes), seconds rounded up."""
    days, _, rest = limit.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        parts = (parts + [0, 0])[:3]
    elif len(parts) == 1:  # MM
        parts = [0, parts[0], 0]
    elif len(parts) == 2:  # MM:SS
        parts = [0, *parts]
    h, m, s = parts
    return int(days or 0) * 24 + h, m + (1 if s else 0)


# A profile's nested sections by their path, for the valid keys of the section a misspelt key is in.
PROFILE_SECTIONS: dict[str, type] = {
    "": ClusterProfile,
    "hardware": Hardware,
    "network": NetworkProfile,
    "network.intra": LinkProfile,
    "network.inter": LinkProfile,
}


def _profile_error(name: str, err: OmegaConfBaseException) -> str:
    """The common message for a profile key that does not fit its schema: the key with its full path under
    ``cluster.``, what is wrong, and the valid keys of the section it is in (nested sections too)."""
    key = str(getattr(err, "full_key", "") or "")
    parent = key.rpartition(".")[0]
    schema = PROFILE_SECTIONS.get(parent, ClusterProfile)
    section = f"cluster.{parent}" if parent in PROFILE_SECTIONS and parent else "cluster"
    valid = ", ".join(f.name for f in dataclasses.fields(schema))
    unknown = isinstance(err, (ConfigKeyError, ConfigAttributeError))
    what = "unknown key" if unknown else str(err).splitlines()[0]
    return f"cluster.{key}: {what} (cluster {name}); valid keys of {section}: {valid}"
