"""Search spaces of ``wagma-bench tune``: one per optimizer, the same for every workload (AlgoPerf's external
tuning ruleset), and the quasirandom points drawn from them.

Each optimizer's space is ``conf/search_space/NAME.yaml``, a sibling of its settings in ``conf/optimizer/``,
and not a ``search_space:`` section inside that file on purpose: the optimizer file is the run's
configuration (composed by Hydra and checked against the optimizer's ``Settings`` by
:func:`wagma_bench.config.schema.validate`), and a run must not carry the space it was drawn from. One file
per optimizer also lets the registry test name the exact file a new optimizer lacks. ``run`` never composes
the folder (``cli.NOT_RUN_GROUPS``).

A space maps a key to a dimension:

- ``lr_multiplier`` (required): a factor on the workload's ``train.lr``, log-uniform;
- ``warmup_fraction`` (required): ``train.warmup_epochs`` = fraction x ``train.epochs``;
- ``optimizer.KEY`` (a setting of this optimizer) or ``train.KEY`` (the local optimizer's, except ``lr``
  and ``warmup_epochs``, which the two above set).

A dimension is ``{low, high}`` with ``scale: linear`` (default) or ``log``, integers when both bounds are
written as integers, or ``{choices: [...]}``. :func:`load_space` refuses, before anything runs, an unknown
key or field, an empty range, a log range through zero, and any bound or choice that the run configuration
itself would refuse (each is put into the optimizer's default configuration and checked by ``validate``).

Points come from ``scipy.stats.qmc.Sobol`` (scrambled, seeded): see :func:`draw`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from wagma_bench.config.paths import CONF_DIR, conf_context
from wagma_bench.config.renamed import RENAMED_KEYS, new_key, say_deprecated
from wagma_bench.errors import ConfigError

SPACE_DIR = CONF_DIR / "search_space"
REQUIRED = ("lr_multiplier", "warmup_fraction")
SET_BY_REQUIRED = ("train.lr", "train.warmup_epochs")  # tuned through lr_multiplier / warmup_fraction
FIELDS = {"low", "high", "scale", "choices"}


@dataclass(frozen=True)
class Dimension:
    """One tuned setting: a range (``low``..``high``, linear or log, integer or real) or a list of choices."""

    key: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False
    choices: tuple | None = None

    def value(self, u: float) -> Any:
        """The setting at ``u`` in [0, 1) (one coordinate of a quasirandom point)."""
        if self.choices is not None:
            return self.choices[min(int(u * len(self.choices)), len(self.choices) - 1)]
        if self.integer:  # every integer in [low, high] gets an equal share of [0, 1) (of log [0, 1) for log)
            lo, hi = (math.log(self.low), math.log(self.high + 1)) if self.log else (self.low, self.high + 1)
            x = lo + u * (hi - lo)
            return min(math.floor(math.exp(x) if self.log else x), int(self.high))
        x = (
            math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
            if self.log
            else self.low + u * (self.high - self.low)
        )
        return float(f"{x:.6g}")  # short, exact overrides; far finer than any tuning needs

    def bounds(self) -> list:
        """The extreme values the dimension can take (checked against the run configuration)."""
        if self.choices is not None:
            return list(self.choices)
        return [int(self.low), int(self.high)] if self.integer else [self.low, self.high]


@dataclass(frozen=True)
class SearchSpace:
    optimizer: str
    path: Path
    dims: tuple[Dimension, ...]  # sorted by key: the order of a point's coordinates

    def point(self, u: list[float]) -> dict[str, Any]:
        return {d.key: d.value(x) for d, x in zip(self.dims, u)}


def space_path(optimizer: str) -> Path:
    return SPACE_DIR / f"{optimizer}.yaml"


def _shown(path: Path) -> str:
    """The file as the messages name it: relative to the project root (conf/search_space/NAME.yaml)."""
    try:
        return str(path.relative_to(CONF_DIR.parent))
    except ValueError:
        return str(path)


# a command line's ``space.KEY[.FIELD]=VALUE``: ((KEY, FIELD or None), VALUE)
Override = tuple[tuple[str, str | None], Any]


def load_space(optimizer: str, check: bool = True, overrides: tuple[Override, ...] = ()) -> SearchSpace:
    """Read and check ``conf/search_space/OPTIMIZER.yaml`` with the command line's ``space.`` overrides
    applied (:func:`parse_space_override`); raises :class:`ConfigError` naming the file and the overrides."""
    path = space_path(optimizer)
    where = f"search space {_shown(path)}"
    if not path.exists():
        raise ConfigError(f"optimizer={optimizer} has no search space; add one to {_shown(path)}")
    try:
        raw = OmegaConf.to_container(OmegaConf.load(path))
    except (OmegaConfBaseException, ValueError) as err:
        raise ConfigError(f"{where}: cannot be read: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{where}: must map keys to dimensions, e.g. lr_multiplier: {{low: 0.25, high: 4, scale: log}}"
        )
    mine = tuple(o for o in overrides if _applies(o, raw))
    if mine:
        raw = apply_overrides(raw, mine)
        where += " with " + " ".join(f"space.{'.'.join(k for k in path_ if k)}={v}" for path_, v in mine)
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise ConfigError(
            f"{where}: {', '.join(missing)} not given; every space tunes {' and '.join(REQUIRED)}"
        )
    dims = tuple(_dimension(where, key, raw[key]) for key in sorted(raw))
    space = SearchSpace(optimizer, path, dims)
    if check:
        check_against_config(space, where)
    return space


def parse_space_override(item: str) -> Override:
    """``space.KEY.FIELD=VALUE`` (FIELD one of low, high, scale, choices) or ``space.KEY=VALUE`` (a whole
    dimension, e.g. ``space.optimizer.tau={low: 2, high: 8}``) -> ((KEY, FIELD or None), VALUE as YAML). A
    renamed KEY (``optimizer.period``) comes under its current name, its deprecation line said."""
    import yaml

    name, sep, text = item.partition("=")
    if not sep or not name.startswith("space.") or name == "space.":
        raise ConfigError(
            f"{item}: a search-space override is space.KEY.FIELD=VALUE (FIELD: "
            f"{', '.join(sorted(FIELDS))}) or space.KEY={{low: .., high: ..}}"
        )
    key = name[len("space.") :]
    head, _, last = key.rpartition(".")
    field = last if head and last in FIELDS else None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{item}: the value is not YAML ({str(err).splitlines()[0]})") from None
    dimension = head if field else key
    if dimension in RENAMED_KEYS:
        say_deprecated(dimension)
    return (new_key(dimension), field), value


def _applies(override: Override, raw: dict) -> bool:
    """An override goes to the spaces that have its dimension; a whole dimension that no optimizer's space has
    is new, and goes to every tuned space."""
    (key, field), _ = override
    if key in raw or key.rpartition(".")[0] in raw:
        return True
    known = {k for f in SPACE_DIR.glob("*.yaml") for k in (OmegaConf.to_container(OmegaConf.load(f)) or {})}
    return field is None and key not in known and key.rpartition(".")[0] not in known


def apply_overrides(raw: dict, overrides: tuple[Override, ...]) -> dict:
    """The space's file with the overrides applied (checked afterwards like the file itself). A field of a
    dimension this space does not have is left to the other optimizers' spaces (``tune`` refuses an
    override that no tuned space takes)."""
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for (key, field), value in overrides:
        head, _, last = key.rpartition(".")
        if field is None and key not in raw and head in raw:
            raise ConfigError(f"space.{key}: unknown field {last}; valid fields: {', '.join(sorted(FIELDS))}")
        if field is None:
            raw[key] = value
        elif isinstance(raw.get(key), dict):
            raw[key][field] = value
            if field == "choices":
                for other in ("low", "high", "scale"):
                    raw[key].pop(other, None)
            elif field in ("low", "high"):
                raw[key].pop("choices", None)
    return raw


def _dimension(where: str, key: str, spec: Any) -> Dimension:
    if not isinstance(spec, dict):
        raise ConfigError(
            f"{where}: {key}={spec!r} is not allowed; it must be {{low: .., high: ..}} or {{choices: [..]}}"
        )
    unknown = sorted(set(spec) - FIELDS)
    if unknown:
        raise ConfigError(
            f"{where}: {key}.{unknown[0]}: unknown field; valid fields: {', '.join(sorted(FIELDS))}"
        )
    if "choices" in spec:
        choices = spec["choices"]
        if set(spec) != {"choices"} or not isinstance(choices, list) or not choices:
            raise ConfigError(
                f"{where}: {key}.choices={choices!r} is not allowed; it must be a non-empty list, "
                "without low, high or scale"
            )
        if len({repr(c) for c in choices}) != len(choices):
            raise ConfigError(
                f"{where}: {key}.choices={choices} is not allowed; the choices must be distinct"
            )
        return Dimension(key, choices=tuple(choices))
    low, high, scale = spec.get("low"), spec.get("high"), spec.get("scale", "linear")
    for name, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{where}: {key}.{name}={v!r} is not allowed; it must be a number")
    if scale not in ("linear", "log"):
        raise ConfigError(f"{where}: {key}.scale={scale!r} is not allowed; choose one of: linear, log")
    if not low < high:
        raise ConfigError(f"{where}: {key} low={low} high={high} is an empty range; it must have low < high")
    if scale == "log" and low <= 0:
        raise ConfigError(f"{where}: {key}.low={low} is not allowed with scale: log; it must be > 0")
    if key == "lr_multiplier" and (low <= 0 or scale != "log"):
        raise ConfigError(
            f"{where}: lr_multiplier={{low: {low}, high: {high}, scale: {scale}}} is not allowed; "
            "it must be log-uniform with low > 0"
        )
    if key == "warmup_fraction" and (low < 0 or high >= 1):
        raise ConfigError(
            f"{where}: warmup_fraction low={low} high={high} is not allowed; it must be in [0, 1)"
        )
    integer = isinstance(low, int) and isinstance(high, int)
    return Dimension(key, float(low), float(high), scale == "log", integer)


def check_against_config(space: SearchSpace, where: str) -> None:
    """Every key a setting of the run config, every bound and choice a value the config accepts: each put
    into the optimizer's default configuration (``optimizer=NAME``, other groups at their defaults) and
    checked by :func:`wagma_bench.config.schema.validate`."""
    from hydra import compose

    from wagma_bench.config.schema import TrainConfig, validate
    from wagma_bench.optim.specs import OPTIMIZER_SPECS

    settings = {f.name for f in dataclasses.fields(OPTIMIZER_SPECS[space.optimizer].Settings)} - {"name"}
    train = {f.name for f in dataclasses.fields(TrainConfig)}
    for d in space.dims:
        section, _, name = d.key.partition(".")
        if d.key in REQUIRED:
            continue
        allowed = settings if section == "optimizer" else train if section == "train" else set()
        if name not in allowed or d.key in SET_BY_REQUIRED:
            valid = sorted(
                [
                    *REQUIRED,
                    *(f"optimizer.{k}" for k in settings),
                    *(f"train.{k}" for k in train if f"train.{k}" not in SET_BY_REQUIRED),
                ]
            )
            raise ConfigError(f"{where}: {d.key}: unknown key; valid keys: {', '.join(valid)}")
    from hydra.core.global_hydra import GlobalHydra

    overrides = [f"optimizer={space.optimizer}"]
    if GlobalHydra.instance().is_initialized():  # inside tune's own compose session (over the same conf/)
        base = compose(config_name="wagma", overrides=overrides)
    else:
        with conf_context("tune"):
            base = compose(config_name="wagma", overrides=overrides)
    for d in space.dims:
        if d.key in REQUIRED:
            continue
        for value in d.bounds():
            cfg = base.copy()
            OmegaConf.update(cfg, d.key, value, force_add=True)
            try:
                validate(cfg)
            except ConfigError as err:
                raise ConfigError(
                    f"{where}: {d.key}={value} would be refused by the run config: {err}"
                ) from None


def draw(space: SearchSpace, n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` quasirandom points of ``space``: the first ``n`` of a scrambled
    Sobol sequence seeded by ``seed``.

    ``scipy.stats.qmc`` rather than Optuna's QMC sampler: scipy is already a dependency (torchvision's
    and ours), the points are a pure function of (space, seed) with no study storage, and Optuna's sampler
    wraps the same scipy generator. Sobol rather than Halton: its scrambling (Owen) is scipy's best-kept,
    and AlgoPerf asks only for a low-discrepancy sequence."""
    import warnings

    from scipy.stats import qmc

    if n < 1:
        return []
    sampler = qmc.Sobol(d=len(space.dims), scramble=True, seed=seed)
    with warnings.catch_warnings():  # a count that is not a power of two only loses balance properties
        warnings.simplefilter("ignore", UserWarning)
        u = sampler.random(n)
    return [space.point([float(x) for x in row]) for row in u]
