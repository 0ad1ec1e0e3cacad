"""Each default has one value: conf/ and the schema dataclasses agree, for every option of every group.

The rule (docs/configuration.md, "Where a default lives"): an option's YAML file lists every setting of its
section with the value a run uses (users read and override them there, and `wagma-bench run --cfg job` shows
them); the schema dataclass holds the same value as its default, for code that builds a section directly
(tests, the simulator). Exceptions, each with its reason: a required value (``???`` in YAML) has no default;
the options of a group that share one schema (comm, logger) differ from its defaults in the keys that make the
option. Values one group sets in another's section (a data option choosing the ResNet's depth, an experiment)
are not defaults and are not compared here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from wagma_bench.config.schema import FIXED_SECTIONS, option_schemas, validate
from wagma_bench.workloads import WORKLOADS

CONF = Path(__file__).resolve().parents[1] / "conf"
REQUIRED = {"data.root": "/data", "data.path": "/data"}  # composing and checking is the point: dummy paths

# Keys in which an option of a group with one shared schema differs from the schema's defaults (those are the
# default option's): what makes the option what it is.
OPTION_KEYS = {"comm/mpi": {"name", "backend"}, "logger/wandb": {"wandb"}}


def _defaults(schema: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(schema):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _as_plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def mismatches(where: str, schema: type, node: dict, skip: set[str] = frozenset()) -> list[str]:
    """Every disagreement of one YAML section with its schema's defaults, nested sections included."""
    out = []
    defaults = _defaults(schema)
    for key, default in defaults.items():
        if key in skip:
            continue
        if key not in node:
            if (
                default is not None
            ):  # an optional sub-section (logger.wandb) is absent unless its option is chosen
                out.append(f"{where}.{key}: not listed in the YAML (the dataclass default is {default!r})")
            continue
        value = node[key]
        if value == "???":
            continue  # required: the user gives it
        if dataclasses.is_dataclass(default) and isinstance(value, dict):
            out += mismatches(f"{where}.{key}", type(default), value)
        elif value != _as_plain(default):
            out.append(f"{where}.{key}: YAML {value!r} != dataclass default {default!r}")
    out += [
        f"{where}.{key}: in the YAML but not a setting"
        for key in node
        if key not in defaults and key != "defaults"
    ]
    return out


def _load(path: Path) -> dict:
    return OmegaConf.to_container(OmegaConf.load(path))


def _option_files() -> list[tuple[str, Path, type, str]]:
    """(label, file, schema, section) for every option of every group with a schema."""
    cases = []
    schemas = option_schemas()
    for group in ("comm", "launcher", "logger", "workload", "optimizer", "imbalance"):
        for path in sorted((CONF / group).glob("*.yaml")):
            node = _load(path)
            section = node.get(group, node)  # `@package _global_` files hold the section by name
            schema = FIXED_SECTIONS[group] if group in FIXED_SECTIONS else schemas[group][section["name"]]
            cases.append((f"{group}/{path.stem}", path, schema, group))
    for workload in WORKLOADS.values():
        for name, schema in workload.DATA.items():
            cases.append(
                (
                    f"{workload.DATA_SECTION}/{name}",
                    CONF / workload.DATA_SECTION / f"{name}.yaml",
                    schema,
                    workload.DATA_SECTION,
                )
            )
    return cases


CASES = _option_files()


@pytest.mark.parametrize("label,path,schema,section", CASES, ids=[c[0] for c in CASES])
def test_option_yaml_lists_every_setting_with_the_dataclass_default(label, path, schema, section):
    node = _load(path)
    node = node.get(section, node)
    assert not mismatches(section, schema, node, OPTION_KEYS.get(label, set()))


def test_primary_config_sections_equal_the_dataclass_defaults():
    primary = _load(CONF / "wagma.yaml")
    problems = [
        p
        for section in ("train", "eval", "checkpoint")
        for p in mismatches(section, FIXED_SECTIONS[section], primary[section])
    ]
    assert not problems


def test_every_option_of_every_group_composes_and_passes_the_check():
    """Through Hydra's compose API as `run` does; every group's every option (other groups at their defaults;
    a data option with its workload)."""
    groups = {
        g: sorted(p.stem for p in (CONF / g).glob("*.yaml"))
        for g in ("workload", "optimizer", "comm", "launcher", "imbalance", "logger", "experiment")
    }
    runs = [[f"{g}={o}"] for g, options in groups.items() for o in options]
    runs += [[f"workload={w.name}", f"{w.DATA_SECTION}={d}"] for w in WORKLOADS.values() for d in w.DATA]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for overrides in runs:
            cfg = compose("wagma", overrides=overrides)
            for key in OmegaConf.missing_keys(cfg):
                OmegaConf.update(cfg, key, REQUIRED[key])
            validate(cfg)


def test_the_comparison_sees_a_drift():
    @dataclasses.dataclass
    class Schema:
        name: str = "x"
        hidden_size: int = 256

    assert mismatches("workload", Schema, {"name": "x", "hidden_size": 128}) == [
        "workload.hidden_size: YAML 128 != dataclass default 256"
    ]
