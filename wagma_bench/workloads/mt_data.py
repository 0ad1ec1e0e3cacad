"""The embedded machine-translation corpus (``data=synthetic_mt``) and its fairseq binarization.

A made-up source language ("Zaran", verb-final, postpositions, nouns before their adjectives, tense and
plural as separate particles) is translated into a made-up target language ("Norrid", verb-second,
prepositions, article and adjectives before the noun, inflection instead of particles). The mapping is
learnable but not a copy:

- lexicon: every source stem has one target stem (different syllable inventories, so no string overlap);
- local reordering: object and verb swap, adjectives move before the noun, postpositions become
  prepositions in front of their phrase;
- agreement: each target noun has a gender that the source never shows; the article and every adjective
  of a noun phrase take a suffix for (gender, number), the noun a plural suffix of its gender class, the
  verb a suffix for its subject's number and the tense; the future tense becomes an auxiliary (also
  agreeing) placed before the verb.

Sentence lengths follow a WMT-like long-tailed (log-normal) distribution: a sentence is a chain of
clauses, grown until it reaches a length drawn from LogNormal(log(median), sigma). With the defaults
(median 10 source tokens, sigma 0.55) the 99th percentile is ~3.6x the median, as in WMT17 En-De
(median ~20 words, 99th percentile ~70), only shorter, so a CPU can train on it. Token-based batches
(fairseq's ``--max-tokens``) then hold very different numbers of sentences and padded positions, which
is the inherent load imbalance of the Transformer workload.

Everything is a pure function of a seed. :func:`ensure_corpus` writes the text once into a cache
directory and binarizes it with fairseq's own preprocessing (``fairseq_cli.preprocess``), under a file
lock so that concurrent ranks or runs never race.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import logging
import math
import os
import random
import shutil
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from wagma_bench.workloads.base import default_cache_root

GENERATOR_VERSION = 1  # bump when the language or the sampling changes: the cache key includes it
LANGUAGE_SEED = 20201  # the language itself is fixed; data seeds only draw sentences from it
SRC, TGT = "zr", "nr"  # language codes in file names (fairseq: train.zr-nr.zr.bin ...)

GENDERS = ("m", "f", "n")
NUMBERS = ("sg", "pl")
TENSES = ("present", "past", "future")

# Source particles (separate tokens) and target inflection (suffixes glued to stems).
SRC_PLURAL = "ri"
SRC_TENSE = {"present": None, "past": "ta", "future": "so"}
SRC_NEGATION = "nu"
SRC_CONJ = ("e", "o", "ki")  # and, but, then
TGT_CONJ = ("und", "abe", "dann")
TGT_NEGATION = "nikt"
TGT_ARTICLE = {
    ("m", "sg"): "de",
    ("f", "sg"): "di",
    ("n", "sg"): "das",
    ("m", "pl"): "dis",
    ("f", "pl"): "dis",
    ("n", "pl"): "dis",
}
ADJ_SUFFIX = {
    ("m", "sg"): "er",
    ("f", "sg"): "e",
    ("n", "sg"): "es",
    ("m", "pl"): "en",
    ("f", "pl"): "en",
    ("n", "pl"): "en",
}
NOUN_PLURAL = {"m": "e", "f": "en", "n": "er"}
VERB_SUFFIX = {
    ("present", "sg"): "t",
    ("present", "pl"): "en",
    ("past", "sg"): "te",
    ("past", "pl"): "ten",
    ("future", "sg"): "en",
    ("future", "pl"): "en",
}
TGT_FUTURE_AUX = {"sg": "wirt", "pl": "werden"}


@dataclass(frozen=True)
class CorpusSpec:
    """What :func:`generate` draws; every field enters the cache key."""

    train_sentences: int = 30000
    valid_sentences: int = 400
    seed: int = 1
    median_len: float = 10.0  # source tokens, median of the log-normal length target
    sigma: float = 0.55  # log-normal shape: p99/median = exp(2.326 sigma)
    max_len: int = 96  # hard cap on source tokens (sentences are cut at a clause boundary)
    nouns: int = 48
    adjectives: int = 16
    verbs: int = 16
    adpositions: int = 6


@dataclass(frozen=True)
class Language:
    """The fixed lexicon: source stem -> (target stem, target gender for nouns)."""

    nouns: tuple[tuple[str, str, str], ...]  # (source, target stem, gender)
    adjectives: tuple[tuple[str, str], ...]
    verbs: tuple[tuple[str, str], ...]
    adpositions: tuple[tuple[str, str], ...]


def _words(
    rng: random.Random,
    n: int,
    onsets: str,
    vowels: str,
    codas: str,
    syllables: tuple[int, int],
    taken: set[str],
) -> list[str]:
    out = []
    while len(out) < n:
        k = rng.randint(*syllables)
        w = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(k))
        if codas and rng.random() < 0.5:
            w += rng.choice(codas)
        if w not in taken:
            taken.add(w)
            out.append(w)
    return out


def make_language(spec: CorpusSpec) -> Language:
    """The lexicon for ``spec``'s vocabulary sizes, drawn from the fixed :data:`LANGUAGE_SEED`."""
    rng = random.Random(LANGUAGE_SEED)
    reserved = {SRC_PLURAL, SRC_NEGATION, *SRC_CONJ, *(p for p in SRC_TENSE.values() if p)}
    sizes = (spec.nouns, spec.adjectives, spec.verbs, spec.adpositions)
    src = [_words(rng, n, "ptkmnszrvh", "aiou", "", (2, 3), reserved) for n in sizes]
    taken_tgt = {*TGT_CONJ, TGT_NEGATION, *TGT_ARTICLE.values(), *TGT_FUTURE_AUX.values()}
    tgt = [_words(rng, n, "bdgflwbr", "aeoy", "nrlsk", (1, 2), taken_tgt) for n in sizes]
    genders = [rng.choice(GENDERS) for _ in range(spec.nouns)]
    return Language(
        nouns=tuple(zip(src[0], tgt[0], genders)),
        adjectives=tuple(zip(src[1], tgt[1])),
        verbs=tuple(zip(src[2], tgt[2])),
        adpositions=tuple(zip(src[3], tgt[3])),
    )


def _noun_phrase(rng: random.Random, lang: Language) -> tuple[list[str], list[str], str]:
    """(source tokens, target tokens, number) of one noun phrase with 0-2 adjectives."""
    src_noun, tgt_noun, gender = rng.choice(lang.nouns)
    number = "pl" if rng.random() < 0.35 else "sg"
    adjs = [rng.choice(lang.adjectives) for _ in range(rng.choices((0, 1, 2), (0.5, 0.35, 0.15))[0])]
    src = [src_noun] + ([SRC_PLURAL] if number == "pl" else []) + [a[0] for a in adjs]
    noun = tgt_noun + (NOUN_PLURAL[gender] if number == "pl" else "")
    tgt = [TGT_ARTICLE[gender, number]] + [a[1] + ADJ_SUFFIX[gender, number] for a in adjs] + [noun]
    return src, tgt, number


def _clause(rng: random.Random, lang: Language) -> tuple[list[str], list[str]]:
    """One clause: source ``S [O] [NP ADP] V [TENSE] [NEG]`` -> target ``S [AUX] V [NEG] [O] [ADP NP]``."""
    subj_s, subj_t, number = _noun_phrase(rng, lang)
    obj = _noun_phrase(rng, lang) if rng.random() < 0.7 else None
    pp = None
    if rng.random() < 0.35:
        np_s, np_t, _ = _noun_phrase(rng, lang)
        adp_s, adp_t = rng.choice(lang.adpositions)
        pp = (np_s + [adp_s], [adp_t] + np_t)
    src_verb, tgt_verb = rng.choice(lang.verbs)
    tense = rng.choices(TENSES, (0.5, 0.3, 0.2))[0]
    negated = rng.random() < 0.15
    src = subj_s + (obj[0] if obj else []) + (pp[0] if pp else []) + [src_verb]
    src += [SRC_TENSE[tense]] if SRC_TENSE[tense] else []
    src += [SRC_NEGATION] if negated else []
    if tense == "future":
        verb = [TGT_FUTURE_AUX[number], tgt_verb + "en"]
    else:
        verb = [tgt_verb + VERB_SUFFIX[tense, number]]
    tgt = (
        subj_t + verb + ([TGT_NEGATION] if negated else []) + (obj[1] if obj else []) + (pp[1] if pp else [])
    )
    return src, tgt


def sample_length(rng: np.random.Generator, spec: CorpusSpec) -> int:
    """A target source length from LogNormal(log(median), sigma), clipped to [3, max_len]."""
    return int(min(spec.max_len, max(3, round(rng.lognormal(math.log(spec.median_len), spec.sigma)))))


def _sentence(rng: random.Random, nrng: np.random.Generator, lang: Language, spec: CorpusSpec):
    want = sample_length(nrng, spec)
    src, tgt = _clause(rng, lang)
    while len(src) < want:
        s, t = _clause(rng, lang)
        grown = len(src) + 1 + len(s)
        if grown + 1 > spec.max_len or grown - want > want - len(src):  # stop at the closer length
            break
        k = rng.randrange(len(SRC_CONJ))
        src, tgt = src + [SRC_CONJ[k]] + s, tgt + [TGT_CONJ[k]] + t
    return " ".join(src + ["."]), " ".join(tgt + ["."])


def generate(spec: CorpusSpec, split: str) -> list[tuple[str, str]]:
    """The (source, target) sentence pairs of ``split`` ('train' or 'valid'); deterministic in ``spec``."""
    if split not in ("train", "valid"):
        raise ValueError(f"split must be 'train' or 'valid', got {split!r}")
    lang = make_language(spec)
    n = spec.train_sentences if split == "train" else spec.valid_sentences
    salt = 0 if split == "train" else 1
    rng = random.Random(f"{spec.seed}/{salt}")
    nrng = np.random.default_rng((spec.seed, salt))
    return [_sentence(rng, nrng, lang, spec) for _ in range(n)]


def cache_key(spec: CorpusSpec) -> str:
    blob = json.dumps(
        {"version": GENERATOR_VERSION, "language_seed": LANGUAGE_SEED, **asdict(spec)}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


DONE = "COMPLETE"  # written last: a directory with this file is a whole corpus


def ensure_corpus(spec: CorpusSpec, cache_root: str | Path | None = None) -> Path:
    """The fairseq-binarized directory of ``spec``, built on first use.

    Builds under an exclusive file lock into a temporary directory that is renamed into place, so
    concurrent callers (several ranks, several runs) wait for one builder and never see a partial corpus.
    """
    root = Path(cache_root).expanduser() if cache_root else default_cache_root()
    final = root / "synthetic_mt" / cache_key(spec)
    if (final / DONE).exists():
        return final / "bin"
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / DONE).exists():
            tmp = final.parent / f".{final.name}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            _build(spec, tmp)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
    return final / "bin"


def _build(spec: CorpusSpec, out: Path) -> None:
    raw = out / "raw"
    raw.mkdir(parents=True)
    for split in ("train", "valid"):
        pairs = generate(spec, split)
        for lang, column in ((SRC, 0), (TGT, 1)):
            (raw / f"{split}.{lang}").write_text("".join(p[column] + "\n" for p in pairs))
    binarize(raw / "train", raw / "valid", out / "bin", SRC, TGT)
    (out / "spec.json").write_text(json.dumps({"version": GENERATOR_VERSION, **asdict(spec)}, indent=2))
    (out / DONE).write_text("")


def import_fairseq() -> None:
    """Import the fairseq modules we use without their import-time side effects on logging.

    ``import fairseq`` and ``fairseq_cli.preprocess`` call ``logging.basicConfig`` (a root handler at INFO
    on stdout, in every rank) and torch warns about ``torch.jit.script``; fairseq's own loggers are set
    to WARNING (it logs every dataset load at INFO) and the root logger is restored.

    fairseq's progress bar imports wandb where it is installed (for its own W&B option, which we never use:
    our logger is ``logger=wandb``), and wandb makes two temporary folders at import that only the
    interpreter's finalization removes; a rank ends without it (``launch._exit_now``), so every rank of every
    Transformer run left ``/tmp/tmp*wandb-media`` and ``tmp*wandb-artifacts`` behind. wandb is hidden from
    that import (fairseq takes it as not installed) unless it is imported already.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    for name in ("fairseq", "fairseq_cli"):
        logging.getLogger(name).setLevel(logging.WARNING)
    hide_wandb = "wandb" not in sys.modules
    if hide_wandb:
        sys.modules["wandb"] = None  # `import wandb` raises ImportError
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            for module in (
                "fairseq.options",
                "fairseq.sequence_generator",
                "fairseq.tasks",
                "fairseq_cli.preprocess",
            ):
                importlib.import_module(module)
    finally:
        if hide_wandb:
            sys.modules.pop("wandb", None)
    root.handlers[:] = handlers
    root.setLevel(level)


def binarize(trainpref: Path, validpref: Path, destdir: Path, src: str, tgt: str, workers: int = 1) -> None:
    """Binarize tokenised text with fairseq's preprocessing (what ``fairseq-preprocess`` runs)."""
    import_fairseq()
    from fairseq import options
    from fairseq_cli import preprocess

    parser = options.get_preprocessing_parser()
    args = parser.parse_args(
        [
            "--source-lang",
            src,
            "--target-lang",
            tgt,
            "--trainpref",
            str(trainpref),
            "--validpref",
            str(validpref),
            "--destdir",
            str(destdir),
            "--workers",
            str(workers),
            "--dataset-impl",
            "mmap",
        ]
    )
    log = logging.getLogger("fairseq_cli.preprocess")
    before = list(log.handlers)
    try:
        preprocess.main(args)
    finally:
        for h in log.handlers[len(before) :]:  # main() adds a FileHandler per call
            log.removeHandler(h)
            h.close()
