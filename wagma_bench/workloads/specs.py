"""What the configuration knows of each workload, without torch: its settings, its data options and its rules.

Each workload class (``workloads/<name>.py``) inherits its spec from here: the ``workload:`` section's schema
(``Settings``), the schemas of its data options (``DATA``, in the section ``DATA_SECTION``), its metrics and
their ranges, the memory one rank needs, whether its batches split, and the checks of its data made before any
rank starts (:meth:`WorkloadSpec.check`). The configuration check reads only these, so that the launching
process of ``wagma-bench run`` imports no torch, and a refusal comes before anything heavy is imported.
:data:`WORKLOAD_SPECS` is the torch-free twin of
:data:`wagma_bench.workloads.WORKLOADS` (``tests/test_config.py`` checks that they name the same classes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from wagma_bench.errors import ConfigError
from wagma_bench.ranges import (
    ANY,
    AT_LEAST_ONE,
    FRACTION,
    FRACTION_BELOW_ONE,
    NON_NEGATIVE,
    POSITIVE,
    SEED,
    Range,
    setting,
)
from wagma_bench.workloads.ddppo.envs.specs import ENVS, check_habitat


class WorkloadSpec:
    """The configuration's view of one workload; its class in ``workloads/<name>.py`` inherits it."""

    name: ClassVar[str]
    Settings: ClassVar[type]  # schema of the `workload:` section
    DATA: ClassVar[dict[str, type]]  # data option name -> schema of the `data:` section
    DATA_SECTION: ClassVar[str] = "data"  # the config section holding the data options (ddppo: `env`)
    metric_name: ClassVar[str] = "top1"  # evaluation metric; higher is better
    # Peak resident memory of one rank on the workload's embedded default data, in MiB, measured by
    # reproduce/memory/footprint.py (peak VmRSS of a rank of a 2-rank CPU run;
    # docs/run-budget-and-exit-codes.md): ranks x this must fit in the machine's memory (config.check_memory,
    # before any rank starts). A lower bound for larger data (ImageNet, WMT), so it refuses only worlds that
    # cannot fit.
    RANK_MEMORY_MB: ClassVar[float]
    # every metric's range (eval.target is checked against it before any rank starts)
    METRIC_RANGES: ClassVar[dict[str, tuple[float, float]]] = {"top1": (0.0, 1.0)}  # a fraction
    sample_unit: ClassVar[str] = "samples"
    #: what a run's throughput (samples over training seconds) counts, as the report's columns name it
    throughput_unit: ClassVar[str] = "samples/s"
    #: its batches split into micro-batches (``Workload.split``), as DropCompute needs
    splittable: ClassVar[bool] = True

    @classmethod
    def metric_of(cls, cfg) -> str:
        """The name of the evaluation metric a configuration uses, known before the workload is built."""
        return cls.metric_name

    @classmethod
    def check(cls, cfg) -> None:
        """Validate data paths and options in the launching process (raise ConfigError)."""


# --- ResNet -------------------------------------------------------------------------------------------------


def rounds_per_epoch(samples: int, batch_size: int, world_size: int) -> int:
    """Rounds of one epoch of ``samples`` at ``batch_size`` per rank (the last batch partial): the unit of
    eval.every_epochs, train.epochs and the LR schedule, for a run (Workload.steps_per_epoch) and for an
    estimate made before one (campaign/prequeue.py)."""
    return max(1, -(-samples // (batch_size * world_size)))


def updates_per_rollout(settings) -> int:
    """DD-PPO's rounds per rollout, its epoch: ``ppo_epoch`` passes of ``num_mini_batch`` updates."""
    return settings.ppo_epoch * settings.num_mini_batch


@dataclass
class Mnist5kData:
    name: str = "mnist5k"
    root: str | None = None
    shift: int = setting(
        2, NON_NEGATIVE
    )  # training augmentation: random translation by up to this many pixels


@dataclass
class ImageNetData:
    name: str = "imagenet"
    root: str | None = None  # ROOT/train/<class>/*.JPEG, ROOT/val/<class>/*.JPEG


@dataclass
class SyntheticImageData:
    name: str = "synthetic"
    root: str | None = None
    num_samples: int = setting(4096, AT_LEAST_ONE)  # per rank
    image_size: int = setting(224, AT_LEAST_ONE)  # ImageNet's; smaller for quick checks of the same code path


def check_arch(arch: str) -> None:
    """workload.arch: torchvision's resnet50, or a CIFAR-style ResNet of depth
    6n+2 (resnet20, resnet32, ...)."""
    depth = arch.removeprefix("resnet")
    if arch == "resnet50" or (arch.startswith("resnet") and depth.isdigit() and int(depth) % 6 == 2):
        return
    raise ConfigError(
        f"workload.arch={arch!r} is not allowed; choose resnet50 or resnet<6n+2> (resnet20, resnet32, "
        "resnet56, ...)"
    )


# The extensions torchvision's ImageFolder accepts (torchvision.datasets.folder.IMG_EXTENSIONS), spelled out:
# importing torchvision for them imports torch, 5 CPU-seconds before a refusal could be said
# (tests/test_prequeue.py holds them equal to torchvision's).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _has_image(folder: Path) -> bool:
    return any(f.suffix.lower() in IMAGE_EXTENSIONS for f in folder.rglob("*") if f.is_file())


IMAGENET_LAYOUT = "ROOT/train/<class>/*.JPEG and ROOT/val/<class>/*.JPEG (torchvision ImageFolder)"
IMAGENET_PREPARE = "reproduce/imagenet/README.md"  # the official archives into that layout


def check_imagenet_root(root: str | None) -> Path:
    """``data.root`` has ImageNet's ImageFolder layout: ``train/`` and ``val/``, each with class folders that
    hold an image each at least (what torchvision's ImageFolder refuses inside every rank, after the world
    started)."""
    expected = f"expected {IMAGENET_LAYOUT}, as {IMAGENET_PREPARE} prepares it"
    if not root:
        raise ConfigError(
            f"data=imagenet needs data.root=PATH with the layout {IMAGENET_LAYOUT} ({IMAGENET_PREPARE})"
        )
    path = Path(root).expanduser()
    names = {}
    for split in ("train", "val"):
        d = path / split
        if not d.is_dir():
            raise ConfigError(f"data.root={root}: no '{split}/' folder in {path}; {expected}")
        try:
            entries = sorted(d.iterdir())
        except OSError as err:
            raise ConfigError(f"data.root={root}: cannot read {d} ({err.strerror}); {expected}") from None
        stray = next((e for e in entries if not e.is_dir()), None)
        if stray is not None:  # ImageFolder skips it: the classes after it would be numbered differently
            raise ConfigError(
                f"data.root={root}: {stray} is a file where '{split}/' holds class folders only; {expected}"
            )
        classes, names[split] = entries, [e.name for e in entries]
        if not classes:
            raise ConfigError(
                f"data.root={root}: {d} holds no class sub-folders ({split}/<class>/); {expected}"
            )
        empty = [c for c in classes if not _has_image(c)]
        if empty:  # torchvision's ImageFolder would fail inside every rank, after the world started
            raise ConfigError(
                f"data.root={root}: class folder {empty[0]} holds no images "
                f"({len(empty)} of {len(classes)} '{split}/' class folders are empty); "
                f"every class needs at least one image: {expected}"
            )
    if names["train"] != names["val"]:  # ImageFolder numbers each split's classes by their sorted names
        first = next(iter(sorted(set(names["train"]) ^ set(names["val"]))))
        where = "only in 'train/'" if first in names["train"] else "only in 'val/'"
        raise ConfigError(
            f"data.root={root}: 'val/' has not the classes of 'train/' ({first} is {where}; "
            f"{len(names['train'])} and {len(names['val'])} classes): a label would name another class "
            f"in each; {expected}"
        )
    return path


class ResNetSpec(WorkloadSpec):
    name = "resnet"
    metric_name = "top1"
    throughput_unit = "images/s"
    # peak RSS of one rank, ResNet-20 on mnist5k: 1,095 MiB (reproduce/memory/footprint.py, 2026-12-01)
    RANK_MEMORY_MB: ClassVar[float] = 1100.0
    DATA: ClassVar[dict] = {"mnist5k": Mnist5kData, "imagenet": ImageNetData, "synthetic": SyntheticImageData}

    @dataclass
    class Settings:
        name: str = "resnet"
        arch: str = "resnet20"  # resnet20 | resnet32 | resnet56 (CIFAR-style) | resnet50 (torchvision)
        num_workers: int = setting(0, NON_NEGATIVE)  # DataLoader worker processes per rank (ImageFolder data)

    @classmethod
    def check(cls, cfg) -> None:
        check_arch(cfg.workload.arch)
        if cfg.data.name == "imagenet":
            check_imagenet_root(cfg.data.root)


# --- Transformer --------------------------------------------------------------------------------------------


@dataclass
class SyntheticMTData:
    """The embedded corpus (see :mod:`wagma_bench.workloads.mt_data`), generated and binarized once."""

    name: str = "synthetic_mt"
    cache_dir: str | None = None  # null: $WAGMA_BENCH_CACHE or ~/.cache/wagma-bench
    seed: int = setting(1, SEED)  # corpus seed (the language itself is fixed)
    train_sentences: int = setting(30000, AT_LEAST_ONE)
    valid_sentences: int = setting(400, AT_LEAST_ONE)
    median_len: float = setting(10.0, POSITIVE)  # source tokens; lengths are log-normal around it
    sigma: float = setting(0.55, NON_NEGATIVE)
    max_len: int = setting(96, Range(3))


@dataclass
class WMT17Data:
    """A fairseq-binarized WMT17 En-De directory (the output of ``fairseq-preprocess``)."""

    name: str = "wmt17_en_de"
    # DIR with dict.{src,tgt}.txt and {train,valid,test}.SRC-TGT.{SRC,TGT}.{bin,idx}
    path: str | None = None
    source_lang: str = "en"
    target_lang: str = "de"
    eval_split: str = "test"  # valid | test: the split scored (newstest2013 | newstest2017)
    remove_bpe: str | None = (
        "subword_nmt"  # fairseq post-process of the BPE ("@@ " continuations); null: none
    )
    detokenize: str = "moses"  # moses | none: applied to hypotheses and references before sacrebleu

    # checked with the config (wagma_bench.config.schema)
    CHOICES: ClassVar[dict[str, tuple]] = {"eval_split": ("valid", "test"), "detokenize": ("moses", "none")}


SHARE_EMBEDDINGS = ("none", "decoder", "all")


def binarized_files(path: Path, src: str, tgt: str, splits: tuple[str, ...]) -> list[Path]:
    """The files fairseq's translation task reads from a binarized directory."""
    files = [path / f"dict.{src}.txt", path / f"dict.{tgt}.txt"]
    for split in splits:
        for lang in (src, tgt):
            files += [path / f"{split}.{src}-{tgt}.{lang}.bin", path / f"{split}.{src}-{tgt}.{lang}.idx"]
    return files


def check_binarized_dir(path: str | None, src: str, tgt: str, eval_split: str) -> Path:
    expected = (
        f"dict.{src}.txt, dict.{tgt}.txt and {{train,{eval_split}}}.{src}-{tgt}.{{{src},{tgt}}}.{{bin,idx}}"
    )
    if not path:
        raise ConfigError(
            f"data=wmt17_en_de needs data.path=DIR, a fairseq-binarized directory "
            f"(fairseq-preprocess output) holding {expected}; see reproduce/transformer/README.md, "
            f"'Preparing WMT17 English-German'"
        )
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ConfigError(
            f"data.path={root} is not a directory; expected fairseq-preprocess output with {expected}"
        )
    missing = [f.name for f in binarized_files(root, src, tgt, ("train", eval_split)) if not f.exists()]
    if missing:
        raise ConfigError(
            f"data.path={root} is not a fairseq-binarized {src}-{tgt} directory: missing "
            f"{', '.join(missing)} (expected {expected})"
        )
    return root


class TransformerSpec(WorkloadSpec):
    name = "transformer"
    metric_name = "bleu"
    # peak RSS of one rank, synthetic_mt: 1,247 MiB (reproduce/memory/footprint.py, 2026-12-01)
    RANK_MEMORY_MB: ClassVar[float] = 1250.0
    METRIC_RANGES: ClassVar[dict[str, tuple[float, float]]] = {"bleu": (0.0, 100.0)}  # sacrebleu's scale
    sample_unit = "tokens"
    throughput_unit = "target tokens/s"  # forward's n: the batch's target tokens (fairseq's wps)
    DATA: ClassVar[dict[str, type]] = {"synthetic_mt": SyntheticMTData, "wmt17_en_de": WMT17Data}

    @dataclass
    class Settings:
        name: str = "transformer"
        arch: str = "transformer"  # a fairseq architecture: transformer, transformer_wmt_en_de, ...
        encoder_layers: int | None = setting(
            None, AT_LEAST_ONE
        )  # null: the architecture's default (likewise below)
        decoder_layers: int | None = setting(None, AT_LEAST_ONE)
        embed_dim: int | None = setting(None, AT_LEAST_ONE)  # encoder and decoder embedding width
        ffn_dim: int | None = setting(None, AT_LEAST_ONE)  # encoder and decoder feed-forward width
        attention_heads: int | None = setting(None, AT_LEAST_ONE)
        dropout: float = setting(0.1, FRACTION_BELOW_ONE)
        share_embeddings: str = (
            "decoder"  # none | decoder (input = output embedding) | all (joined dictionary)
        )
        label_smoothing: float = setting(0.1, FRACTION_BELOW_ONE)
        # longest source / target sequence (longer training pairs are skipped)
        max_positions: int = setting(1024, AT_LEAST_ONE)
        beam: int = setting(4, AT_LEAST_ONE)  # beam search at evaluation
        lenpen: float = setting(0.6, ANY)
        max_len_a: float = setting(1.2, NON_NEGATIVE)  # hypotheses up to a * source length + b tokens
        max_len_b: int = setting(10, NON_NEGATIVE)
        eval_max_tokens: int = setting(8192, AT_LEAST_ONE)  # tokens per generation batch
        # null: token batches (train.batch_size tokens at most, fairseq --max-tokens); N: exactly N sentences
        # per rank and step (fairseq --batch-size), so the tokens vary with the sentences' lengths
        max_sentences: int | None = setting(None, AT_LEAST_ONE)
        # the order of the training batches (fairseq's epoch shuffle); null: the run's seed, which also seeds
        # the model's initialisation and dropout. Set apart to tell the two sources of run-to-run spread
        # apart (reproduce/transformer/spread.py)
        shuffle_seed: int | None = setting(None, NON_NEGATIVE)

        CHOICES: ClassVar[dict[str, tuple]] = {"share_embeddings": SHARE_EMBEDDINGS}

    @classmethod
    def check(cls, cfg) -> None:
        data = cfg.data
        if data.name == "wmt17_en_de":
            check_binarized_dir(data.path, data.source_lang, data.target_lang, data.eval_split)


# --- DD-PPO -------------------------------------------------------------------------------------------------

RESNET_BACKBONES = ("resnet18", "resnet50")  # the GroupNorm ResNets of workloads/ddppo/policy.py
BACKBONES = ("cnn", *RESNET_BACKBONES)  # workload.backbone
RNNS = ("gru", "lstm")  # workload.rnn


class DDPPOSpec(WorkloadSpec):
    name = "ddppo"
    metric_name = "success"
    # peak RSS of one rank, miniworld_pointnav: 1,244 MiB (reproduce/memory/footprint.py, 2026-12-01)
    RANK_MEMORY_MB: ClassVar[float] = 1250.0
    # a success rate, and SPL (success weighted by path length) is at most the success
    METRIC_RANGES: ClassVar[dict[str, tuple[float, float]]] = {"success": (0.0, 1.0), "spl": (0.0, 1.0)}
    sample_unit = "frames"
    throughput_unit = "environment frames/s"
    DATA = ENVS
    DATA_SECTION = "env"
    # a PPO mini-batch carries its recurrent state per environment: not split into micro-batches (DropCompute)
    splittable = False

    @dataclass
    class Settings:
        name: str = "ddppo"
        backbone: str = "cnn"  # cnn (habitat's SimpleCNN) | resnet18 | resnet50 (GroupNorm ResNets)
        base_planes: int = setting(
            32, AT_LEAST_ONE
        )  # ResNet width at the first stage (DD-PPO: 32, half width)
        hidden_size: int = setting(128, AT_LEAST_ONE)  # visual fc and recurrent state (DD-PPO: 512)
        rnn: str = "gru"  # gru | lstm (DD-PPO: lstm)
        rnn_layers: int = setting(1, AT_LEAST_ONE)  # (DD-PPO: 2)
        num_steps: int = setting(64, AT_LEAST_ONE)  # rollout length per environment (DD-PPO: 128)
        ppo_epoch: int = setting(2, AT_LEAST_ONE)  # passes over a rollout (DD-PPO: 2)
        num_mini_batch: int = setting(
            2, AT_LEAST_ONE
        )  # minibatches per pass, split over environments (DD-PPO: 2)
        clip: float = setting(0.2, POSITIVE)  # PPO ratio clip, also the value-loss clip
        clip_value_loss: bool = True
        value_loss_coef: float = setting(0.5, NON_NEGATIVE)
        entropy_coef: float = setting(0.01, NON_NEGATIVE)
        gamma: float = setting(0.99, FRACTION)
        gae_lambda: float = setting(0.95, FRACTION)  # tau in habitat-baselines
        use_gae: bool = True  # false: discounted returns bootstrapped at the rollout end
        normalize_advantage: bool = False
        preemption: bool = True  # DD-PPO's straggler preemption
        # preempt once this fraction of ranks finished their rollout
        sync_frac: float = setting(0.6, Range(0, 1, low_open=True))
        metric: str = "success"  # success | spl (the evaluation metric that eval.target refers to)
        # held-out start/goal pairs per evaluation (all ranks together)
        num_eval_episodes: int = setting(64, AT_LEAST_ONE)
        eval_deterministic: bool = False  # greedy actions in evaluation (habitat-baselines samples)

        CHOICES: ClassVar[dict[str, tuple]] = {
            "backbone": BACKBONES,
            "rnn": RNNS,
            "metric": ("success", "spl"),
        }

    @classmethod
    def metric_of(cls, cfg) -> str:
        return cfg.workload.metric

    @classmethod
    def check(cls, cfg) -> None:
        settings, env = cfg.workload, cfg.data
        if env.num_envs < settings.num_mini_batch:
            raise ConfigError(
                f"workload.num_mini_batch={settings.num_mini_batch} is not allowed with env.num_envs="
                f"{env.num_envs}; it must be <= env.num_envs (minibatches split the environments)"
            )
        if cfg.data.name == "habitat":
            check_habitat(cfg.data)


#: option name (``workload=NAME``) -> spec, in the order of :data:`wagma_bench.workloads.WORKLOADS`
WORKLOAD_SPECS: dict[str, type[WorkloadSpec]] = {
    spec.name: spec for spec in (ResNetSpec, DDPPOSpec, TransformerSpec)
}


def throughput_unit(workload: str | None) -> str:
    """What a workload's throughput counts (``samples/s`` for a workload this version does not know)."""
    spec = WORKLOAD_SPECS.get(workload) if isinstance(workload, str) else None
    return spec.throughput_unit if spec else WorkloadSpec.throughput_unit
