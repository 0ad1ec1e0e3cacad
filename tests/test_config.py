"""Every YAML under conf/ composes with Hydra and passes the schema check; bad input fails early."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from wagma_bench.config.paths import CONF_DIR
from wagma_bench.config.schema import as_recorded, validate
from wagma_bench.errors import ConfigError
from wagma_bench.workloads import WORKLOADS

# Required paths of the real data sets are given dummy values: composing and checking is the point here.
DUMMY = {"data.root": "/data", "data.path": "/data"}


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("wagma", overrides=overrides)
    try:
        return validate(cfg)
    except ConfigError as err:
        if "required setting" not in str(err):
            raise
        missing = [k for k in DUMMY if k in str(err)]
        assert missing, err
        return _compose(overrides + [f"{k}={DUMMY[k]}" for k in missing])


def _data_workload(data: str) -> str:
    return next(name for name, cls in WORKLOADS.items() if data in cls.DATA)


GROUP_CASES = [
    (g, o) for g in ("workload", "optimizer", "comm", "launcher", "imbalance", "logger") for o in _options(g)
]


@pytest.mark.parametrize("group,option", GROUP_CASES)
def test_every_group_option_composes_and_validates(group, option):
    cfg = _compose([f"{group}={option}"])
    if group in ("workload", "optimizer", "imbalance"):
        assert getattr(cfg, group).name == option


@pytest.mark.parametrize("data", _options("data"))
def test_every_data_option_composes_with_its_workload(data):
    cfg = _compose([f"workload={_data_workload(data)}", f"data={data}"])
    assert cfg.data.name == data


@pytest.mark.parametrize("experiment", _options("experiment"))
def test_every_experiment_preset_composes(experiment):
    _compose([f"experiment={experiment}"])


def test_every_group_folder_is_covered():
    covered = {"workload", "optimizer", "comm", "launcher", "imbalance", "logger", "data", "experiment"}
    others = {p.name for p in CONF_DIR.iterdir() if p.is_dir()} - covered
    # env (ddppo), cluster (sweep, simulate) and search_space (tune) are checked by their own tests
    assert others <= {"env", "cluster", "search_space"}, others


def test_defaults_are_the_embedded_resnet_run():
    cfg = _compose([])
    assert (cfg.workload.name, cfg.data.name, cfg.optimizer.name) == ("resnet", "mnist5k", "allreduce")
    assert cfg.eval.target == pytest.approx(0.97)
    assert cfg.launcher.nproc is None  # one rank per GPU with CUDA, else 4 (launch.device_plan)


def test_imagenet_selects_resnet50_and_the_mlperf_target():
    cfg = _compose(["data=imagenet", "data.root=/x"])
    assert cfg.workload.arch == "resnet50"
    assert cfg.eval.target == pytest.approx(0.759)


def test_paper_resnet50_preset_holds_the_paper_hyperparameters():
    cfg = _compose(["experiment=paper_resnet50", "data.root=/x"])
    t = cfg.train
    assert (
        t.batch_size,
        t.lr,
        t.lr_reference_batch,
        t.warmup_epochs,
        list(t.milestones),
        t.epochs,
        t.momentum,
        t.weight_decay,
    ) == (128, 0.1, 256, 5.0, [30, 60, 80], 90.0, 0.9, 1e-4)


@pytest.mark.parametrize("world", [64, 1024])
def test_the_paper_straggler_preset_is_the_paper_set_up_with_the_authors_rule(world):
    """experiment=paper_resnet50_stragglers composes and validates at the paper's 64 ranks and at 1,024, and
    differs from paper_resnet50 in its stragglers only: the authors' rule with their 0.32 s."""
    from omegaconf import OmegaConf

    def composed(experiment: str) -> dict:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("wagma", overrides=[f"experiment={experiment}", "data.root=/x"])
        validate(cfg, world_size=world)
        return OmegaConf.to_container(cfg)

    stragglers, plain = composed("paper_resnet50_stragglers"), composed("paper_resnet50")
    assert {k for k in stragglers if stragglers[k] != plain[k]} == {"imbalance"}
    assert stragglers["imbalance"] == {"name": "authors", "delay_s": 0.32}


def test_typo_in_a_yaml_key_names_the_valid_keys():
    raw = as_recorded(_compose([]))
    raw["optimizer"]["bucket_mbb"] = 3
    with pytest.raises(
        ConfigError, match=r"optimizer.bucket_mbb: unknown key; valid keys of optimizer: name, bucket_mb"
    ):
        validate(raw)


def test_wrong_type_and_bad_choice_fail():
    raw = as_recorded(_compose([]))
    raw["train"]["batch_size"] = "big"
    with pytest.raises(ConfigError, match="train"):
        validate(raw)
    raw = as_recorded(_compose([]))
    raw["train"]["schedule"] = "linear"
    with pytest.raises(ConfigError, match="choose one of: step, cosine"):
        validate(raw)


def test_unknown_option_in_the_raw_config_lists_the_registry():
    raw = as_recorded(_compose([]))
    raw["optimizer"] = {"name": "nope"}
    with pytest.raises(ConfigError, match="choose one of: .*allreduce.*wagma"):
        validate(raw)


def test_primary_config_is_not_named_config():
    # fairseq registers a `config` node in Hydra's ConfigStore; ours must not collide with it
    assert (CONF_DIR / "wagma.yaml").exists() and not (CONF_DIR / "config.yaml").exists()
    assert Path(CONF_DIR).name == "conf"


def test_the_specs_the_config_check_reads_are_the_registries_torch_free_twins():
    """validate() reads the optimizers' and workloads' specs (optim/specs.py, workloads/specs.py), never their
    classes: each registered class inherits the spec of its name, and the two registries list the same names
    in the same order."""
    from wagma_bench.optim import OPTIMIZERS
    from wagma_bench.optim.specs import OPTIMIZER_SPECS
    from wagma_bench.workloads.ddppo.policy import RESNETS
    from wagma_bench.workloads.specs import RESNET_BACKBONES, WORKLOAD_SPECS

    for classes, specs in ((OPTIMIZERS, OPTIMIZER_SPECS), (WORKLOADS, WORKLOAD_SPECS)):
        assert list(classes) == list(specs)
        for name, cls in classes.items():
            assert issubclass(cls, specs[name]) and cls.name == specs[name].name == name, name
            assert cls.Settings is specs[name].Settings, name
    assert tuple(RESNETS) == RESNET_BACKBONES  # workload.backbone's choices are the policy's ResNets


def test_the_config_check_imports_no_torch():
    """The launching process validates every option without torch (1.3 s of CPU a command here), nor NumPy
    (the DD-PPO environments' settings: 0.07-0.15 s). A fresh interpreter, so that what this session imported
    does not count."""
    from tests.proc_util import heavy_modules_after

    code = (
        "from hydra import compose, initialize_config_dir\n"
        "from wagma_bench.config.paths import CONF_DIR\n"
        "from wagma_bench.config.schema import validate\n"
        "from wagma_bench.optim.specs import OPTIMIZER_SPECS\n"
        "from wagma_bench.workloads.specs import WORKLOAD_SPECS\n"
        "with initialize_config_dir(config_dir=str(CONF_DIR), version_base='1.3'):\n"
        "    for w in WORKLOAD_SPECS:\n"
        "        for o in OPTIMIZER_SPECS:\n"
        "            if (w, o) != ('ddppo', 'dropcompute'):  # refused: DD-PPO's batches do not split\n"
        "                validate(compose(config_name='wagma', overrides=[f'workload={w}', "
        "f'optimizer={o}']), 4)"
    )
    assert heavy_modules_after(code, ("torch", "torchvision", "fairseq", "numpy")) == []
