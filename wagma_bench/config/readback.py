"""The one reader of every file the suite reads back (a sweep's manifest, a tuning's plan, the claims file and
the simulator outputs it reads, a W&B spec, a measured-inputs file, a handed-over checked configuration, a
checkpoint's records, a run's summary and lock notes): each is parsed, then checked against its schema (the
type of every section) before anyone trusts it. A file cut short, emptied, of another shape or with a
wrongly typed section ends in one :class:`ReadBackError` naming the file, the field and what was expected;
being a :class:`~wagma_bench.errors.ConfigError`, every command answers it with exit 2 and that one line.

A schema is data: a type (or a tuple of types), ``{key: schema}`` for a mapping (keys wrapped in
:func:`optional` may be absent), ``[schema]`` for a list of items alike, :data:`ANY` for anything. Every
schema is made with :class:`Schema`, which registers it in :data:`SCHEMAS`; tests/test_readback.py feeds
every registered reader damaged files and checks by an AST walk that no module of the package parses a
read-back file without this module."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from wagma_bench.errors import ConfigError


class ReadBackError(ConfigError):
    """A file the suite reads back that is damaged or not of its kind; the message is one line."""


ANY = object()
NUMBER = (int, float)
NONE = type(None)
SCHEMAS: dict[str, Schema] = {}


@dataclass(frozen=True)
class optional:
    key: str


@dataclass
class Schema:
    """What a read-back file holds: ``spec`` its shape, ``made_by`` what writes it (said in every error),
    ``fmt`` json or yaml."""

    name: str
    spec: Any
    made_by: str
    fmt: str = "json"

    def __post_init__(self) -> None:
        SCHEMAS[self.name] = self


def load(path: Path | str, schema: Schema) -> Any:
    """The file at ``path`` parsed and checked against ``schema``; :class:`ReadBackError` otherwise. A file
    that is absent raises FileNotFoundError as ever (the callers say what its absence means)."""
    path = Path(path)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ReadBackError(f"{path}: not text (binary bytes); {_hint(schema)}") from None
    return parse(text, schema, str(path))


def parse(text: str, schema: Schema, where: str) -> Any:
    """``text`` (a file's bytes, or a record another process handed over) parsed and checked."""
    if not text.strip():
        raise ReadBackError(f"{where}: empty; {_hint(schema)}")
    try:
        data = yaml.safe_load(text) if schema.fmt == "yaml" else json.loads(text)
    except (ValueError, yaml.YAMLError) as err:
        said = " ".join(str(err).split())
        raise ReadBackError(f"{where}: not valid {schema.fmt.upper()} ({said}); {_hint(schema)}") from None
    check(data, schema.spec, where, "", schema)
    return data


def check(value: Any, spec: Any, where: str, field: str, schema: Schema) -> None:
    """Raise :class:`ReadBackError` at the first part of ``value`` that ``spec`` does not allow."""
    if spec is ANY:
        return
    if isinstance(spec, tuple) and not all(isinstance(s, type) for s in spec):  # e.g. ({...}, NONE)
        fits = [s for s in spec if _shape_fits(value, s)]
        if not fits:
            _refuse(where, field, _expected(spec), value, schema)
        return check(value, fits[0], where, field, schema)
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            _refuse(where, field, "a mapping", value, schema)
        for key, sub in spec.items():
            name = key.key if isinstance(key, optional) else key
            if name not in value:
                if not isinstance(key, optional):
                    _refuse(where, _join(field, name), _expected(sub), _MISSING, schema)
                continue
            check(value[name], sub, where, _join(field, name), schema)
        return
    if isinstance(spec, list):
        if not isinstance(value, list):
            _refuse(where, field, "a list", value, schema)
        for i, item in enumerate(value):
            check(item, spec[0], where, f"{field}[{i}]", schema)
        return
    # a bool is an int to Python, never to a schema that asks for a number
    if not _shape_fits(value, spec):
        _refuse(where, field, _expected(spec), value, schema)


def _shape_fits(value: Any, spec: Any) -> bool:
    """Whether ``value`` is of the outer kind ``spec`` asks for (its parts are checked after)."""
    if spec is ANY:
        return True
    if isinstance(spec, dict):
        return isinstance(value, dict)
    if isinstance(spec, list):
        return isinstance(value, list)
    if isinstance(spec, tuple) and not all(isinstance(s, type) for s in spec):
        return any(_shape_fits(value, s) for s in spec)
    kinds = spec if isinstance(spec, tuple) else (spec,)
    return isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)


def _expected(spec: Any) -> str:
    if spec is ANY:
        return "any value"
    if isinstance(spec, dict):
        return "a mapping"
    if isinstance(spec, list):
        return "a list"
    if isinstance(spec, tuple):
        return " or ".join(map(_expected, spec))
    return _KIND.get(spec, spec.__name__)


_MISSING = object()
_KIND = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    NONE: "null",
    dict: "a mapping",
    list: "a list",
}


def _join(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


def _refuse(where: str, field: str, expected: str, value: Any, schema: Schema) -> None:
    if value is _MISSING:
        raise ReadBackError(f"{where}: {field} is missing (it must be {expected}); {_hint(schema)}")
    said = f"must be {expected}, found {_describe(value)}"
    raise ReadBackError(f"{where}: {field or 'the file'} {said}; {_hint(schema)}")


def _describe(value: Any) -> str:
    kind = _KIND.get(type(value), type(value).__name__)
    shown = json.dumps(value, default=str)
    return f"{kind} {shown[:40]}{'...' if len(shown) > 40 else ''}"


def _hint(schema: Schema) -> str:
    return f"a {schema.name} is written by {schema.made_by}"


def inside(root: Path, relative: str, where: str, field: str) -> Path:
    """``root / relative`` for a path a read-back file names, refused (:class:`ReadBackError`) unless it stays
    inside ``root``: a manifest's ``run_dir`` of ``../../home`` must not make a command write there."""
    path = (Path(root) / relative).resolve()
    if not path.is_relative_to(Path(root).resolve()):
        raise ReadBackError(
            f"{where}: {field}={relative!r} leads outside {root}; it must be a path inside it"
        )
    return Path(root) / relative


# --- the schemas ------------------------------------------------------------------------------------------

SWEEP_MANIFEST = Schema(
    "sweep manifest",
    {
        "version": int,
        optional("dir"): str,
        "jobs": [
            {
                "script": str,
                "gpus": int,
                "array": bool,
                "job_id": (str, NONE),
                optional("submitted"): (str, NONE),
            }
        ],
        "runs": [
            {
                "name": str,
                "gpus": int,
                "overrides": [str],
                "run_dir": str,
                "job": int,
                "array_index": (int, NONE),
                optional("job_id"): (str, NONE),
                optional("earlier_jobs"): [(str, NONE)],
                optional("cancelled"): (dict, NONE),
            }
        ],
        optional("checks"): (dict, NONE),
    },
    "wagma-bench sweep (render again with --out into a fresh folder)",
)
TRIAL = {
    "name": str,
    "combo": str,
    "study": int,
    "trial": int,
    "seed": int,
    "params": dict,
    "overrides": [str],
    optional("gpus"): int,
}
TUNE_PLAN = Schema(
    "tuning plan (tune.json)",
    {
        "version": int,
        "studies": int,
        "trials_per_study": int,
        "trials": [TRIAL],
        optional("common"): ([str], NONE),
        optional("seed"): (int, NONE),
        optional("max_runtime_s"): (*NUMBER, NONE),
    },
    "wagma-bench tune, which rewrites it when the same command runs again",
)
CLAIMS = Schema("claims file", {"claims": [dict]}, "hand (reproduce/claims.yaml)", fmt="yaml")
PREDICTIONS = Schema(
    "simulator prediction table (predictions.json)",
    [
        {
            "optimizer": str,
            "world_size": int,
            optional("throughput"): (*NUMBER, NONE),
            optional("time_to_target_s"): (*NUMBER, NONE),
        }
    ],
    "wagma-bench simulate --out",
)
INTERVALS = Schema(
    "simulator interval file (interval.json)",
    {"predictions": [dict], "sensitivity": [dict]},
    "wagma-bench simulate --interval N --out",
)
INTERVAL_RESUME = Schema(
    "simulate --interval's resume file",
    {"format": str, "command": str, "simulations": [{"key": str, "row": dict}]},
    "wagma-bench simulate --interval N --out OUT (beside OUT, while it runs)",
)
WANDB_SPEC = Schema(
    "W&B report spec",
    {"version": int, "report": dict, "workspace": dict},
    "wagma-bench report --wandb-report (offline)",
)
MEASURED = Schema(
    "measured-inputs file",
    {
        "format": str,
        optional("measured_on"): (str, NONE),  # checked with format, against the places it may name
        optional("source"): (str, NONE),
        optional("skipped"): ([ANY], NONE),
        optional("gossip_cost"): ({"value": ANY, optional("replicates"): [ANY]}, NONE),
        optional("network"): ({optional("intra"): (dict, NONE)}, NONE),
        optional("compute"): (dict, NONE),
    },
    "reproduce/scaling/measure_inputs.py or make gpu-check",
)
CHECKED_CONFIG = Schema(
    "checked configuration (checked_config.json)",
    {"launch": str, "run_dir": str, optional("config"): dict, optional("refused"): str},
    "the launching wagma-bench run, for its ranks",
)
CHECKPOINT_WHERE = Schema(
    "checkpoint folder record (checkpoint.json)", {"dir": str}, "rank 0 of the run, at its start"
)
CHECKPOINT_MANIFEST = Schema(
    "checkpoint manifest",
    {
        "round": int,
        "world_size": int,
        optional("resume_hash"): str,
        optional("config_hash"): str,
        optional("config"): dict,
        "files": dict,
    },
    "rank 0, after every rank's file of the set is on disk",
)
RUN_SUMMARY = Schema(
    "run summary (summary.json)",
    {
        optional("status"): (str, NONE),
        optional("rounds"): (int, NONE),
        optional("compute_contention"): (*NUMBER, NONE),
        optional("ranks_per_cpu"): (*NUMBER, NONE),
    },
    "rank 0 of the run, at its end",
)
STEP_TABLE = Schema(
    "step table (steps.json.xz)", dict, "wagma-bench from a run's steps/rank*.jsonl (record/steps.py)"
)
WANDB_IMPORT_NOTE = Schema(
    "W&B import note",
    {
        "project": str,
        optional("entity"): (str, NONE),
        optional("group"): (str, NONE),
        optional("id"): (str, NONE),
    },
    "wagma-bench wandb-import",
)
SMOKE_MANIFEST = Schema(
    "smoke sweep's manifest", {"smoke": dict, optional("cluster"): (dict, NONE)}, "wagma-bench sweep --smoke"
)
RUN_NOTE = Schema(
    "run directory note (.lock, cancelled.json)",
    dict,
    "wagma-bench run (its lock) or wagma-bench sweep cancel",
)
