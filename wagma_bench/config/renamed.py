"""Names renamed, and the one translation of their old names under one policy: settings and options on a
command line, in a YAML file and in a recorded configuration; the fields of a run's records (events,
``summary.json``, step records, ``claims.json``).

A setting that counts rounds is named for rounds (``train.max_rounds``, ``eval.every_rounds``,
``optimizer.warmup_rounds``); until 2026-12-06 they were named for steps, which in an asynchronous optimizer
are another count. The rounds between an optimizer's sync points are ``optimizer.sync_period`` for every
optimizer that sets them (local SGD's ``period`` and AD-PSGD's and eager-SGD's ``sync_every`` before).

The one policy, for every old name: the old names stay accepted for one release. An override or a YAML key
under an old name (``train.max_steps=5``), and an option under its old name (``imbalance=paper``, now
``shared_draw``), is read as the new one, with one line on stderr naming the new name; a configuration or a
record written under the old names (a run directory's ``run_start``, its ``summary.json``, its step records, a
checkpoint manifest or an algorithm's checkpointed state, a committed tuning plan or ``claims.json``) reads as
the same, silently, so a finished run is still
found and a checkpoint still resumes (docs/configuration.md). An old and a new name at two values are refused,
naming both. Imports only the error types (a leaf): every layer from config/ up translates through it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from wagma_bench.errors import ConfigError

# old dotted key -> (new dotted key, the new key's defaults: an old key given beside its new key at a default
# is read as the old value; given beside another value, the two disagree and the configuration is refused).
# The sync period had three names (local SGD's period, AD-PSGD's and eager-SGD's sync_every; WAGMA-SGD keeps
# the paper's tau, from which its sync period follows: optim/specs.py); its defaults are local SGD's and the
# other two's.
RENAMED_KEYS: dict[str, tuple[str, tuple]] = {
    "train.max_steps": ("train.max_rounds", (None,)),
    "eval.every_steps": ("eval.every_rounds", (None,)),
    "optimizer.warmup_steps": ("optimizer.warmup_rounds", (0,)),
    "optimizer.period": ("optimizer.sync_period", (4,)),
    "optimizer.sync_every": ("optimizer.sync_period", (10,)),
}

# a script's flag (reproduce/) -> its new spelling
RENAMED_FLAGS = {"--max-steps": "--max-rounds"}
# group -> {old option: new option}; what the line adds where the old name could mislead
RENAMED_OPTIONS: dict[str, dict[str, str]] = {"imbalance": {"paper": "shared_draw"}}
NOTES = {
    "imbalance=paper": " (exactly num_slow ranks delayed every step; the WAGMA-SGD authors' per-rank rule is "
    "imbalance=independent)"
}

# Fields of a run's records renamed since runs were recorded (old -> today's), read under today's names:
RENAMED_METADATA = {"step": "round"}  # an event's metadata
RENAMED_SUMMARY = {"steps": "rounds", "steps_to_target": "rounds_to_target"}  # summary.json
RENAMED_STEP_FIELDS = {"step": "local_step"}  # a step record (steps/rank<R>.jsonl)
RENAMED_CLAIM_FIELDS = {"steps": "rounds"}  # an optimizer's measurement in claims.json
# an algorithm's state in a checkpoint (optim/base.py's state_dict): the rank's torch optimizer, ``optimizer``
# before 2026-12-06; the checkpoint's reader (record/checkpoint.py) hands the algorithm today's names
RENAMED_ALGORITHM_STATE = {"optimizer": "local_optimizer"}

_SAID: set[str] = set()  # old keys this process has already said a line about


def deprecation_line(old: str) -> str:
    """The one line said of an old key, or of an old option (``group=option``)."""
    group, eq, option = old.partition("=")
    new = (
        RENAMED_FLAGS[old]
        if old in RENAMED_FLAGS
        else f"{group}={RENAMED_OPTIONS[group][option]}"
        if eq
        else RENAMED_KEYS[old][0]
    )
    return (
        f"wagma-bench: {old} is deprecated: it is named {new} now, and is read as {new} until the next "
        f"release{NOTES.get(old, '')}"
    )


def say_deprecated(old: str, quiet: bool = False) -> None:
    """The deprecation line of ``old`` on stderr, once per process (``quiet``: not at all, as a rank beside
    rank 0 of an external launcher, whose command line rank 0 has spoken for)."""
    if quiet or old in _SAID:
        return
    _SAID.add(old)
    print(deprecation_line(old), file=sys.stderr, flush=True)


def new_key(key: str) -> str:
    """``key`` under its current name (itself where it was not renamed)."""
    return RENAMED_KEYS[key][0] if key in RENAMED_KEYS else key


def renamed_override(override: str, quiet: bool = False) -> str:
    """One Hydra override (``train.max_steps=5``, ``+eval.every_steps=1,2``) with its key under the current
    name, the deprecation line said where it was an old one. Hydra's flags (``-m``) and the rest pass
    unchanged."""
    key, eq, value = override.partition("=")
    bare = key.lstrip("+~")
    if eq and bare in RENAMED_OPTIONS:  # an option, or a sweep's list of them (imbalance=none,paper)
        return key + eq + ",".join(renamed_option(bare, v, quiet) for v in value.split(","))
    if not eq and not key.startswith("~") or bare not in RENAMED_KEYS:
        return override
    if not quiet:
        say_deprecated(bare)
    return key[: len(key) - len(bare)] + RENAMED_KEYS[bare][0] + eq + value


def renamed_option(group: str, option: str, quiet: bool = False) -> str:
    """``option`` of ``group`` under its current name, the deprecation line said where it was an old one
    (``quiet``: not said, as for a record read back)."""
    new = RENAMED_OPTIONS.get(group, {}).get(option)
    if new is None:
        return option
    say_deprecated(f"{group}={option}", quiet)
    return new


def renamed_flags(argv: list[str], quiet: bool = False) -> list[str]:
    """A script's arguments with each old flag (``--max-steps 8``, ``--max-steps=8``) under its new
    spelling, the deprecation line said."""
    out = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if flag in RENAMED_FLAGS:
            say_deprecated(flag, quiet)
            arg = RENAMED_FLAGS[flag] + eq + value
        out.append(arg)
    return out


def renamed_overrides(overrides: list[str] | tuple[str, ...], quiet: bool = False) -> list[str]:
    """Every override of a command line under the current names (:func:`renamed_override`). A key given under
    an old and another name at two values (``train.max_steps=5 train.max_rounds=7``) is refused naming both,
    as in a YAML file (:func:`conflicts`): Hydra would silently take the last."""
    given: dict[str, tuple[str, str]] = {}  # current key -> (the spelling given, its value)
    for override in overrides:
        key, eq, value = override.partition("=")
        bare = key.lstrip("+~")
        if not eq or bare.startswith("-"):
            continue
        spelling, earlier = bare, given.setdefault(new_key(bare), (bare, value))
        if earlier[1] != value and (spelling in RENAMED_KEYS or earlier[0] in RENAMED_KEYS):
            raise ConfigError(
                f"{earlier[0]}={earlier[1]} and {spelling}={value} are both given; they name one setting, "
                f"{new_key(bare)}: give only {new_key(bare)}"
            )
    return [renamed_override(o, quiet) for o in overrides]


def renamed_config(config: Mapping | None, say: bool = False) -> dict | None:
    """A configuration (a composed one, a recorded one) with its keys under the current names, as a new dict.

    An old key beside its new key at the new key's default (a YAML file of old names composed over today's
    defaults) gives its value; beside another value it is the caller's to refuse (:func:`conflicts`): here the
    new key wins. ``say``: say the deprecation line of each old key found (a configuration being composed for
    a run, not one read back from a record)."""
    if not isinstance(config, Mapping):
        return config
    out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in config.items()}
    for old, (new, defaults) in RENAMED_KEYS.items():
        section, old_name = old.split(".")
        node = out.get(section)
        if not isinstance(node, dict) or old_name not in node:
            continue
        value = node.pop(old_name)
        new_name = new.split(".")[1]
        if new_name not in node or node[new_name] in defaults:
            node[new_name] = value
        if say:
            say_deprecated(old)
    return out


def conflicts(config: Mapping | None) -> list[tuple[str, Any, str, Any]]:
    """(old key, its value, new key, its value) for each old key given beside its new key at another value
    than the old key's and the new key's defaults: the configuration says two things."""
    out = []
    for old, (new, defaults) in RENAMED_KEYS.items():
        section, old_name = old.split(".")
        node = config.get(section) if isinstance(config, Mapping) else None
        if not isinstance(node, Mapping) or old_name not in node or new.split(".")[1] not in node:
            continue
        theirs = node[new.split(".")[1]]
        if theirs not in (*defaults, node[old_name]):
            out.append((old, node[old_name], new, theirs))
    return out


def renamed_fields(record: dict, names: Mapping[str, str]) -> dict:
    """A flat record written before fields were renamed (an event's metadata, a summary, a step record) with
    each field under today's name (``names``: old -> today's). A field already present under today's name
    keeps its value, and the old one stays as it was. The record itself where nothing was renamed."""
    if not any(old in record for old in names):
        return record
    return {names.get(k, k) if names.get(k, k) not in record else k: v for k, v in record.items()}
