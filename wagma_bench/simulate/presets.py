"""Workload presets of ``wagma-bench simulate``, chosen by `run`'s ``workload`` and ``data`` options (every
field can be overridden, e.g. step_s=0.5).

The numbers are the paper's set-ups where the paper gives them and stated assumptions where it does not;
a calibrated run (``--calibrate RUN_DIR``) replaces them with measurements.
"""

from __future__ import annotations

from wagma_bench.simulate.des import Workload

PRESETS: dict[str, Workload] = {
    # ResNet-50 / ImageNet on Piz Daint (one P100 per node), per-GPU batch 128 (WAGMA-SGD, Sec. 6).
    # params: torchvision resnet50 (25,557,032). step_s: the paper's injected delay, 0.32 s, is described as
    # about one training step. sigma: small GPU jitter (assumption).
    "resnet50": Workload(
        name="resnet50",
        step_s=0.32,
        batch=128,
        params=25_557_032,
        compute="lognormal",
        sigma=0.02,
        overhead_s=0.0,
        backward_fraction=2 / 3,
    ),
    # Deep RL navigation (DD-PPO-style): one step = rollout + PPO update. Assumptions, not paper figures:
    # a ResNet-50-sized visual encoder plus a recurrent policy (~28M parameters), 1 s median step, 128
    # frames per rank and step; environment heterogeneity comes from the imbalance model
    # (imbalance=lognormal imbalance.sigma=..., reproduce/scaling/paper_scale.sh) or from the rollout cycles
    # of real runs (--compute-from, the claims' prediction).
    "rl": Workload(
        name="rl",
        step_s=1.0,
        batch=128,
        params=28e6,
        compute="lognormal",
        sigma=0.05,
        overhead_s=0.0,
        backward_fraction=0.2,
    ),
    # Transformer on WMT17 En-De (experiment=paper_transformer: fairseq's transformer_wmt_en_de, all
    # embeddings shared, at most 4,096 tokens per GPU). params: 6 encoder layers of 3,152,384, 6 decoder
    # layers of 4,204,032, and a 512-wide embedding of the ~40k types of reproduce/transformer's joint BPE
    # (40k merges): 64,618,496 with 40,000 types, as fairseq's model built over such a dictionary counts them.
    # step_s (assumption): Vaswani et al. 2017 report about 0.4 s per step of the base model on 8 P100s at
    # ~3,100 tokens per GPU; scaled to 4,096 tokens. batch: tokens (a run's samples are its target tokens).
    # sigma: small GPU jitter; the sentence-length imbalance comes from --compute-from the tuned runs.
    "transformer_wmt": Workload(
        name="transformer_wmt",
        step_s=0.5,
        batch=4096,
        params=64.6e6,
        compute="lognormal",
        sigma=0.02,
        overhead_s=0.0,
        backward_fraction=2 / 3,
    ),
    # The embedded local workload (ResNet-20 on mnist5k, batch 32): 272k parameters; the step time is a
    # placeholder for a quiet 2-core machine -- calibrate with --calibrate RUN_DIR.
    "resnet20": Workload(
        name="resnet20", step_s=0.15, batch=32, params=272_474, compute="lognormal", sigma=0.1
    ),
}


# `wagma-bench run`'s names (workload, data) -> the preset that models them, so that one dialect serves
# every subcommand: `simulate workload=resnet data=imagenet` is the ResNet-50 / ImageNet set-up. The data
# option defaults as in `run` (Hydra composes it: workload=resnet alone is the embedded mnist5k default).
RUN_NAMES: dict[tuple[str, str], str] = {
    ("resnet", "imagenet"): "resnet50",
    ("resnet", "synthetic"): "resnet50",
    ("resnet", "mnist5k"): "resnet20",
    ("ddppo", "miniworld_pointnav"): "rl",
    ("ddppo", "gridnav"): "rl",
    ("ddppo", "habitat"): "rl",
    ("transformer", "wmt17_en_de"): "transformer_wmt",
}


def preset_for(workload: str, data: str) -> Workload:
    """The preset of a composed `run` configuration's workload and data options."""
    key = (workload, data)
    if key not in RUN_NAMES:
        known = ", ".join(f"workload={w} data={d}" for w, d in RUN_NAMES)
        raise ValueError(
            f"no simulate preset for workload={key[0]} data={key[1]}; choose one of: {known} "
            "(a preset's numbers can then be changed: step_s=, params=, train.batch_size=, ...)"
        )
    return preset(RUN_NAMES[key])


def preset(name: str) -> Workload:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown workload preset {name!r}; choose one of: {', '.join(PRESETS)}") from None
