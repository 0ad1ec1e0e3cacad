"""Every string setting with a fixed set of values is checked with the config, before any rank starts, with
one message style: the key, the bad value and what is allowed (the numeric ranges: tests/test_faults.py)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from tests.cli_util import compose
from wagma_bench.config.schema import FIXED_SECTIONS, WandbConfig, option_schemas, validate
from wagma_bench.errors import ConfigError
from wagma_bench.ranges import POSITIVE, setting
from wagma_bench.workloads import WORKLOADS, get_workload


def _choice_cases() -> list[tuple[list[str], str, tuple]]:
    """(overrides that choose the option, dotted key, allowed values) for every declared choice."""
    cases = []
    for section, schema in FIXED_SECTIONS.items():
        cases += [([], f"{section}.{k}", v) for k, v in getattr(schema, "CHOICES", {}).items()]
    cases += [(["logger=wandb"], f"logger.wandb.{k}", v) for k, v in WandbConfig.CHOICES.items()]
    cases += [
        ([], f"logger.submission.{k}", v)
        for k, v in FIXED_SECTIONS["logger"]
        .__dataclass_fields__["submission"]
        .default_factory.CHOICES.items()
    ]
    for section, options in option_schemas().items():
        for name, schema in options.items():
            cases += [
                ([f"{section}={name}"], f"{section}.{k}", v)
                for k, v in getattr(schema, "CHOICES", {}).items()
            ]
    for workload in WORKLOADS.values():
        for name, schema in workload.DATA.items():
            pick = [f"workload={workload.name}", f"{workload.DATA_SECTION}={name}"]
            pick += ["data.path=/data"] if name == "wmt17_en_de" else []  # required there
            cases += [
                (pick, f"{workload.DATA_SECTION}.{k}", v) for k, v in getattr(schema, "CHOICES", {}).items()
            ]
    return cases


CASES = _choice_cases()


def test_choices_are_declared_where_rank_time_code_used_to_check_them():
    keys = {key for _, key, _ in CASES}
    assert {
        "optimizer.mode",
        "optimizer.catch_up",
        "comm.emulate",
        "workload.backbone",
        "workload.rnn",
        "workload.metric",
        "workload.share_embeddings",
        "data.eval_split",
        "data.detokenize",
        "env.layout",
        "logger.wandb.mode",
        "logger.submission.division",
        "train.precision",
    } <= keys


@pytest.mark.parametrize("pick,key,allowed", CASES, ids=[key for _, key, _ in CASES])
def test_a_value_outside_the_choices_fails_the_config_check(pick, key, allowed):
    with pytest.raises(ConfigError) as err:
        validate(compose(*pick, f"{key}=nope"))
    shown = ", ".join("null" if a is None else str(a) for a in allowed)
    assert str(err.value) == f"{key}='nope' is not allowed; choose one of: {shown}"


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["workload=ddppo", "workload.sync_frac=0"],
            "workload.sync_frac=0.0 is not allowed; it must be in (0, 1]",
        ),
        (["workload=transformer", "data.max_len=2"], "data.max_len=2 is not allowed; it must be >= 3"),
        (["imbalance=fixed", "imbalance.ranks=[]"], "imbalance.ranks=[] is not allowed"),
        (
            [
                "imbalance=fixed",
                "imbalance.ranks=[1,7]",
                "launcher.nproc=4",
            ],  # was taken modulo the world: rank 3
            "imbalance.ranks=[1, 7] is not allowed with 4 ranks; every rank must be below 4",
        ),
        (["seed=1.5"], "seed=1.5 is not allowed; it must be an integer"),
    ],
)
def test_rules_once_checked_on_the_ranks_fail_the_config_check(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(compose(*overrides))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["workload.arch=resnet21"],
            "workload.arch='resnet21' is not allowed; choose resnet50 or resnet<6n+2>",
        ),
        (
            ["workload=ddppo", "workload.num_mini_batch=8"],
            "workload.num_mini_batch=8 is not allowed with env.num_envs=4",
        ),
    ],
)
def test_workload_rules_fail_its_check_in_the_launching_process(overrides, message):
    cfg = validate(compose(*overrides))
    with pytest.raises(ConfigError, match=re.escape(message)):
        get_workload(cfg.workload.name).check(cfg)


@dataclasses.dataclass
class _Inner:
    timeout_s: float = setting(1.0, POSITIVE)


@dataclasses.dataclass
class _Outer:
    inner: _Inner = dataclasses.field(default_factory=_Inner)


def test_a_nested_section_is_range_checked():
    """`logger.wandb` is a section inside a section: its numbers are checked like any other."""
    from omegaconf import OmegaConf

    from wagma_bench.config.schema import check_ranges

    merged = OmegaConf.merge(OmegaConf.structured(_Outer), {"inner": {"timeout_s": -1}})
    with pytest.raises(ConfigError, match=re.escape("x.inner.timeout_s=-1.0 is not allowed; it must be > 0")):
        check_ranges("x", _Outer, merged)


def test_each_optimizer_checks_the_ranges_it_declares():
    """A key two optimizers share (`sync_every` of eager-SGD and AD-PSGD) is checked by each one's own
    field."""
    with pytest.raises(ConfigError, match=re.escape("optimizer.tau=0 is not allowed; it must be >= 1")):
        validate(compose("optimizer=wagma", "optimizer.tau=0"))
    for name in ("eager", "adpsgd"):
        assert validate(compose(f"optimizer={name}", "optimizer.sync_period=3")).optimizer.sync_period == 3
        with pytest.raises(
            ConfigError, match=re.escape("optimizer.sync_period=0 is not allowed; it must be >= 1")
        ):
            validate(compose(f"optimizer={name}", "optimizer.sync_period=0"))


@dataclasses.dataclass
class _NewOptimizer:
    tau: int = 3


def test_a_numeric_setting_without_a_range_is_refused_saying_where_to_declare_it():
    """A new optimizer's `tau` is not checked with WAGMA-SGD's range: it has none until declared."""
    from omegaconf import OmegaConf

    from wagma_bench.config.schema import check_ranges

    merged = OmegaConf.structured(_NewOptimizer)
    with pytest.raises(ConfigError) as err:
        check_ranges("optimizer", _NewOptimizer, merged)
    assert str(err.value) == (
        "optimizer.tau has no allowed range; declare it in tests.test_config_checks._NewOptimizer as "
        "`tau: ... = setting(DEFAULT, RANGE)` (wagma_bench/ranges.py)"
    )
