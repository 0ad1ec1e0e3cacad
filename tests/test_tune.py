"""``wagma-bench tune``: search spaces, quasirandom points, AlgoPerf scoring, resume, the command end to end."""

from __future__ import annotations

import pytest

from wagma_bench import search_space
from wagma_bench.config import ConfigError
from wagma_bench.optim import OPTIMIZERS

# --- search spaces ------------------------------------------------------------------------------------

def test_every_registered_optimizer_has_a_valid_search_space():
    """Walks the registry: a new optimizer without a space fails here with the file to add."""
    for name in OPTIMIZERS:
        path = search_space.space_path(name)
        assert path.exists(), f"{name}: add a search space to conf/search_space/{name}.yaml (see docs/tuning.md)"
        space = search_space.load_space(name)  # refuses what the run config would refuse
        keys = [d.key for d in space.dims]
        assert "lr_multiplier" in keys and "warmup_fraction" in keys, name


def _space_file(tmp_path, monkeypatch, text: str, name: str = "wagma") -> None:
    (tmp_path / f"{name}.yaml").write_text(text)
    monkeypatch.setattr(search_space, "SPACE_DIR", tmp_path)


BASE = "lr_multiplier: {low: 0.5, high: 2.0, scale: log}\nwarmup_fraction: {low: 0.0, high: 0.1}\n"


@pytest.mark.parametrize("extra,message", [
    ("optimizer.tau: {low: 5, high: 5}\n", "optimizer.tau low=5 high=5 is an empty range; it must have low < high"),
    ("optimizer.tua: {low: 2, high: 5}\n", "optimizer.tua: unknown key; valid keys: "),
    ("optimizer.tau: {low: 0, high: 5}\n", ("optimizer.tau=0 would be refused by the run config: optimizer.tau=0 is "
                                           "not allowed; it must be >= 1")),
    ("optimizer.group_size: {choices: [2, 3]}\n", ("optimizer.group_size=3 would be refused by the run config: "
                                                  "optimizer.group_size=3 is not allowed; it must be a power of two")),
    ("optimizer.catch_up: {choices: [replay, later]}\n", "optimizer.catch_up='later' is not allowed; choose one"),
    ("optimizer.tau: {low: 2, high: 5, step: 1}\n", "optimizer.tau.step: unknown field"),
    ("optimizer.tau: {choices: []}\n", "optimizer.tau.choices=[] is not allowed; it must be a non-empty list"),
    ("train.lr: {low: 0.1, high: 0.2}\n", "train.lr: unknown key"),
    ("train.momentum: {low: 0.0, high: 1.0}\n", "train.momentum=1.0 would be refused by the run config"),
])
def test_a_bad_search_space_is_refused_up_front(tmp_path, monkeypatch, extra, message):
    _space_file(tmp_path, monkeypatch, BASE + extra)
    with pytest.raises(ConfigError) as err:
        search_space.load_space("wagma")
    assert message in str(err.value)
    assert str(err.value).startswith(f"search space {tmp_path}/wagma.yaml: ")


@pytest.mark.parametrize("text,message", [
    ("warmup_fraction: {low: 0.0, high: 0.1}\n", "lr_multiplier not given"),
    ("lr_multiplier: {low: 0.5, high: 2.0}\nwarmup_fraction: {low: 0.0, high: 0.1}\n", "it must be log-uniform"),
    ("lr_multiplier: {low: 0.0, high: 2.0, scale: log}\nwarmup_fraction: {low: 0.0, high: 0.1}\n",
     "lr_multiplier.low=0.0 is not allowed with scale: log"),
    ("lr_multiplier: {low: 0.5, high: 2.0, scale: log}\nwarmup_fraction: {low: 0.0, high: 1.0}\n",
     "it must be in [0, 1)"),
])
def test_the_required_dimensions_are_checked(tmp_path, monkeypatch, text, message):
    _space_file(tmp_path, monkeypatch, text)
    with pytest.raises(ConfigError) as err:
        search_space.load_space("wagma")
    assert message in str(err.value)


def test_an_optimizer_without_a_space_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(search_space, "SPACE_DIR", tmp_path)
    with pytest.raises(ConfigError, match=f"optimizer=sgp has no search space; add one to {tmp_path}/sgp.yaml"):
        search_space.load_space("sgp")


# --- quasirandom points -------------------------------------------------------------------------------

def test_the_same_seed_draws_the_same_points_and_another_seed_others():
    space = search_space.load_space("wagma", check=False)
    a, b, c = (search_space.draw(space, 6, seed) for seed in (7, 7, 8))
    assert a == b and a != c
    for p in a:  # inside the declared space, with the declared types
        assert 0.25 <= p["lr_multiplier"] <= 4.0 and 0.0 <= p["warmup_fraction"] <= 0.1
        assert isinstance(p["optimizer.tau"], int) and 2 <= p["optimizer.tau"] <= 20
        assert p["optimizer.group_size"] in (None, 2)
    assert search_space.draw(space, 3, 7) == a[:3]  # a prefix of the same sequence


def test_integer_log_dimension_reaches_both_bounds():
    dim = search_space.Dimension("optimizer.tau", 2.0, 20.0, log=True, integer=True)
    assert dim.value(0.0) == 2 and dim.value(0.999999) == 20
    assert sorted({dim.value(i / 1000) for i in range(1000)}) == list(range(2, 21))
