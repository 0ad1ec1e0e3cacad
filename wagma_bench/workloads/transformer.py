"""Transformer machine translation through fairseq's own task, model, criterion and data pipeline.

Our trainer and optimizers drive it; fairseq provides what a fairseq user trains: the ``translation``
task (binarized ``LanguagePairDataset``), a ``transformer`` architecture (``transformer_wmt_en_de`` in
the paper preset), the ``label_smoothed_cross_entropy`` criterion, token- or sentence-based batches from
``task.get_batch_iterator(..., num_shards=W, shard_id=rank)`` and beam search with ``SequenceGenerator``.
fairseq's own trainer and distributed mode are not used (they assume one CUDA device per rank).

Choices (our readings, where fairseq and the paper leave room):

- Batches: by default in tokens: ``train.batch_size`` is the maximum number of (padded) tokens per rank
  and step, fairseq's ``--max-tokens``, so every rank gets about the same work per step. With
  ``workload.max_sentences=N`` a batch is exactly N sentences per rank and step (fairseq's
  ``--batch-size``, ``max_sentences`` of ``task.get_batch_iterator`` with ``max_tokens=None``; only an
  epoch's last batch can be smaller), so its tokens vary with the sentences' lengths (fairseq sorts by
  length before batching: a batch of long sentences holds several times the tokens of a batch of short
  ones). That is the batching that gives the paper's inherent imbalance. ``train.batch_size`` then
  limits no batch; it stays the tokens per rank that the linear learning-rate scaling (peak =
  ``train.lr`` x ``train.batch_size`` x ranks / ``train.lr_reference_batch``) and the logged
  ``global_batch_size`` use, so set it to the mean tokens of an N-sentence batch to keep the peak rate.
  ``forward`` returns ``n`` = target tokens of the batch (fairseq's ``ntokens``), so samples and throughput
  in events and reports are target tokens in both modes (fairseq's "wps", MLPerf's unit for this
  benchmark); ``sample_unit = "tokens"``.
- Loss normalisation: each rank backpropagates its batch's summed label-smoothed loss divided by its own
  token count (the per-token mean). fairseq instead divides the sum over all workers by the global
  token count, which needs the token counts of every rank before the backward pass: an extra global
  collective per step that would make every wait-avoiding or decentralised optimizer wait for the
  slowest rank, the barrier they exist to avoid. With Allreduce-SGD the averaged gradient equals
  fairseq's when ranks hold equal token counts and weights batches instead of tokens otherwise
  (token-based batches keep the counts close; sentence-based ones do not, so there a short-sentence
  batch's tokens weigh more); the loss scale does not matter for Adam anyway.
- Empty batches: the sharded iterator pads the shorter shards with empty batches at the end of an
  epoch. Such a rank returns ``sum(p.sum()) * 0`` (a zero gradient connected to every parameter) and
  ``n = 0``, so it still takes part in every collective of every optimizer.
- Per-rank work per step goes to ``steps/rank<R>.jsonl`` through :meth:`step_stats`: target tokens,
  source tokens, sentences and padded positions. Token-based batches of long-tailed sentence lengths
  differ a little (padding, quadratic attention, per-sentence overhead); sentence-based batches differ
  in their tokens too, the inherent load imbalance of the paper's Transformer experiment.
- Evaluation: beam search over this rank's shard of the validation (or test) split, hypotheses and
  references decoded (BPE removed, Moses-detokenised for real WMT data) and scored with sacrebleu.
  The n-gram match counts, totals and lengths are summed over ranks before BLEU is computed, so the
  score equals sacrebleu's corpus BLEU of the whole set (not an average of per-rank scores).

Optimizer state with Adam (``train.local_optimizer=adam``): every algorithm owns only how models or
gradients are combined; the local update is a plain ``torch.optim.AdamW`` per rank.
Allreduce-SGD averages gradients, so every rank's Adam moments see the same gradients and stay
identical, as in fairseq's data parallelism. The model-averaging optimizers (WAGMA-SGD, local SGD /
PR-SGD, D-PSGD, AD-PSGD, SGP) average (or gossip) the weights only; each rank's Adam moments (and step
count) stay local and follow its own gradients. This is the paper's set-up: WAGMA-SGD averages models in
groups and applies the local optimizer's update to the averaged model.

fairseq is imported lazily (inside methods): ``import fairseq`` registers Hydra ConfigStore nodes
(``config``, ``optimizer``, ``model``, ...) and our config must be composed before that happens.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from wagma_bench.comm.base import Comm
from wagma_bench.workloads.base import Workload
from wagma_bench.workloads.mt_data import SRC, TGT, CorpusSpec, ensure_corpus, import_fairseq
from wagma_bench.workloads.specs import TransformerSpec, check_binarized_dir

BLEU_ORDER = 4


def corpus_spec(data) -> CorpusSpec:
    return CorpusSpec(
        train_sentences=data.train_sentences,
        valid_sentences=data.valid_sentences,
        seed=data.seed,
        median_len=data.median_len,
        sigma=data.sigma,
        max_len=data.max_len,
    )


def bleu_statistics(hyps: list[str], refs: list[str], tokenized: bool = False) -> list[float]:
    """sacrebleu's sufficient statistics of a corpus: [matches x4, totals x4, sys_len, ref_len].

    ``tokenized``: the text is tokenised by definition (the synthetic language), so sacrebleu's warning
    about tokenised input is not wanted; real data is detokenised before scoring.
    """
    from sacrebleu.metrics import BLEU

    if not hyps:
        return [0.0] * (2 * BLEU_ORDER + 2)
    score = BLEU(force=tokenized).corpus_score(hyps, [refs])
    return [*map(float, score.counts), *map(float, score.totals), float(score.sys_len), float(score.ref_len)]


def bleu_signature(tokenized: bool = False) -> str:
    """sacrebleu's signature of the BLEU that :func:`bleu_statistics` computes (``nrefs:1|case:mixed|eff:no|
    tok:13a|smooth:exp|version:...``): what makes two BLEU values comparable. sacrebleu knows the number of
    references only after scoring, so a one-sentence corpus is scored first (ours have one reference)."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(force=tokenized)
    bleu.corpus_score(["a"], [["a"]])
    return str(bleu.get_signature())


def bleu_from_statistics(stats: list[float]) -> float:
    """Corpus BLEU (0-100, sacrebleu's default 'exp' smoothing) from summed :func:`bleu_statistics`."""
    from sacrebleu.metrics import BLEU

    stats = [round(s) for s in stats]
    if stats[2 * BLEU_ORDER] == 0:
        return 0.0
    return BLEU.compute_bleu(
        correct=stats[:BLEU_ORDER],
        total=stats[BLEU_ORDER : 2 * BLEU_ORDER],
        sys_len=stats[-2],
        ref_len=stats[-1],
    ).score


class TransformerWorkload(TransformerSpec, Workload):
    def __init__(self, cfg, rank, world_size, device):
        super().__init__(cfg, rank, world_size, device)
        # exactly one of the two limits a training batch (see the module docstring, "Batches")
        self.max_sentences = cfg.workload.max_sentences
        self.batch_tokens = cfg.train.batch_size if self.max_sentences is None else None
        shuffle_seed = cfg.workload.shuffle_seed
        self.shuffle_seed = cfg.seed if shuffle_seed is None else shuffle_seed  # the batches' order
        data = cfg.data
        if data.name == "synthetic_mt":
            self.data_dir = ensure_corpus(corpus_spec(data), data.cache_dir)  # file lock: one builder
            self.src, self.tgt, self.eval_split = SRC, TGT, "valid"
            self.remove_bpe, self.detok = None, None
        else:
            self.data_dir = check_binarized_dir(
                data.path, data.source_lang, data.target_lang, data.eval_split
            )
            self.src, self.tgt, self.eval_split = data.source_lang, data.target_lang, data.eval_split
            self.remove_bpe = data.remove_bpe
            self.detok = _moses_detokenizer(self.tgt) if data.detokenize == "moses" else None
        self._setup_fairseq()
        self._stats: dict = {}

    # --- fairseq set-up ---
    def fairseq_args(self) -> list[str]:
        """Our settings as fairseq's command line (its own parser fills in every architecture default)."""
        w = self.cfg.workload
        args = [
            str(self.data_dir),
            "--task",
            "translation",
            "--source-lang",
            self.src,
            "--target-lang",
            self.tgt,
            "--arch",
            w.arch,
            "--criterion",
            "label_smoothed_cross_entropy",
            "--label-smoothing",
            str(w.label_smoothing),
            "--dropout",
            str(w.dropout),
            *self._batch_args(),
            "--seed",
            str(self.cfg.seed),
            "--max-source-positions",
            str(w.max_positions),
            "--max-target-positions",
            str(w.max_positions),
        ]
        if self.device.type != "cuda":
            args.append("--cpu")
        if w.share_embeddings == "decoder":
            args.append("--share-decoder-input-output-embed")
        elif w.share_embeddings == "all":
            args.append("--share-all-embeddings")
        for flag, value in (
            ("layers", (w.encoder_layers, w.decoder_layers)),
            ("embed-dim", (w.embed_dim,) * 2),
            ("ffn-embed-dim", (w.ffn_dim,) * 2),
            ("attention-heads", (w.attention_heads,) * 2),
        ):
            for side, v in zip(("encoder", "decoder"), value):
                if v is not None:
                    args += [f"--{side}-{flag}", str(v)]
        return args

    def _batch_args(self) -> list[str]:
        """What limits a training batch, as fairseq's flag: tokens or
        (``workload.max_sentences``) sentences."""
        if self.cfg.workload.max_sentences is None:
            return ["--max-tokens", str(self.cfg.train.batch_size)]
        return ["--batch-size", str(self.cfg.workload.max_sentences)]

    def _setup_fairseq(self) -> None:
        import_fairseq()
        # fairseq's DataLoaders always ask for pinned memory and its attention mixes mask types: harmless
        # on CPU, but warned about on every epoch and batch.
        warnings.filterwarnings("ignore", message="'pin_memory' argument is set as true")
        warnings.filterwarnings("ignore", message="Support for mismatched key_padding_mask and attn_mask")
        from fairseq import options, tasks
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf

        parser = options.get_training_parser()
        ns = options.parse_args_and_arch(parser, self.fairseq_args())
        with fairseq_hydra():
            self.fs_cfg = convert_namespace_to_omegaconf(ns)
        self.task = tasks.setup_task(self.fs_cfg.task)
        self.task.load_dataset("train")
        self.task.load_dataset(self.eval_split)
        self.criterion = self.task.build_criterion(self.fs_cfg.criterion)
        self.max_positions = (self.cfg.workload.max_positions, self.cfg.workload.max_positions)
        self.train_itr = self.task.get_batch_iterator(
            dataset=self.task.dataset("train"),
            max_tokens=self.batch_tokens,
            max_sentences=self.max_sentences,
            max_positions=self.max_positions,
            ignore_invalid_inputs=True,
            seed=self.shuffle_seed,
            num_shards=self.world_size,
            shard_id=self.rank,
            disable_iterator_cache=True,
        )

    def build_model(self) -> nn.Module:
        return self.task.build_model(self.fs_cfg.model)

    # --- data ---
    @property
    def train_size(self) -> int:
        """Target tokens in one epoch (fairseq counts the end-of-sentence token)."""
        return int(self.task.dataset("train").tgt_sizes.sum())

    @property
    def eval_size(self) -> int:
        """Sentence pairs of the evaluation split."""
        return len(self.task.dataset(self.eval_split))

    def steps_per_epoch(self) -> int:
        """Batches per shard: fairseq pads shorter shards, so every rank has the same count."""
        return len(self.train_itr)

    def batches(self, start_step: int) -> Iterator[Any]:
        epoch, offset = divmod(start_step, self.steps_per_epoch())
        if start_step:
            self.train_itr.load_state_dict(
                {"epoch": epoch + 1, "iterations_in_epoch": offset, "shuffle": True, "version": 2}
            )
        while True:
            yield from self.train_itr.next_epoch_itr(shuffle=True)

    def forward(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
        if not batch:  # a padding batch of the sharded iterator: zero gradient, same collectives
            self._stats = {"tokens": 0, "src_tokens": 0, "sentences": 0, "padded_tokens": 0}
            return sum(p.sum() for p in model.parameters()) * 0.0, 0
        sample = self._to_device(batch)
        loss, sample_size, _ = self.criterion(model, sample)
        net = sample["net_input"]
        self._stats = {
            "tokens": int(sample["ntokens"]),
            "src_tokens": int(net["src_lengths"].sum()),
            "sentences": int(sample["target"].size(0)),
            "padded_tokens": int(net["src_tokens"].numel() + sample["target"].numel()),
        }
        return loss / max(float(sample_size), 1.0), int(sample["ntokens"])

    def step_stats(self) -> dict:
        return dict(self._stats)

    def split(self, batch: Any, parts: int) -> list[Any]:
        """A fairseq sample as ``parts`` samples of consecutive sentences (its token count recounted): what
        DropCompute computes one after another. A padding batch (empty) gives empty parts."""
        if not batch:
            return [{} for _ in range(parts)]
        pad = self.task.target_dictionary.pad()
        sentences = batch["target"].size(0)
        out = []
        for rows in torch.tensor_split(torch.arange(sentences), parts):
            if len(rows) == 0:
                out.append({})
                continue
            part = _rows_of(batch, rows, sentences)
            part["ntokens"], part["nsentences"] = int(part["target"].ne(pad).sum()), len(rows)
            out.append(part)
        return out

    def _to_device(self, sample):
        from fairseq import utils

        if self.device.type == "cpu":
            return sample
        return utils.apply_to_sample(lambda t: t.to(self.device, non_blocking=True), sample)

    # --- evaluation ---
    def eval_metadata(self) -> dict:
        return {"sacrebleu_signature": bleu_signature(tokenized=self.cfg.data.name == "synthetic_mt")}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, comm: Comm) -> float:
        hyps, refs = self.translate_shard(model)
        stats = bleu_statistics(hyps, refs, tokenized=self.cfg.data.name == "synthetic_mt")
        stats = torch.tensor(stats, dtype=torch.float64, device=comm.device)
        comm.allreduce(stats, op="sum")
        return bleu_from_statistics(stats.cpu().tolist())

    def translate_shard(self, model: nn.Module) -> tuple[list[str], list[str]]:
        """Beam-search translations of this rank's shard of the evaluation split, with their references."""
        from fairseq import utils
        from fairseq.sequence_generator import SequenceGenerator

        w = self.cfg.workload
        was_training = model.training
        model.eval()
        gen = SequenceGenerator(
            [model],
            self.task.target_dictionary,
            beam_size=w.beam,
            max_len_a=w.max_len_a,
            max_len_b=w.max_len_b,
            len_penalty=w.lenpen,
        )
        itr = self.task.get_batch_iterator(
            dataset=self.task.dataset(self.eval_split),
            max_tokens=w.eval_max_tokens,
            max_positions=self.max_positions,
            seed=1,
            num_shards=self.world_size,
            shard_id=self.rank,
            disable_iterator_cache=True,
        ).next_epoch_itr(shuffle=False)
        tgt_dict, hyps, refs = self.task.target_dictionary, [], []
        for sample in itr:
            if not sample:
                continue
            sample = self._to_device(sample)
            out = gen.generate([model], sample)
            for i, hypos in enumerate(out):
                ref = utils.strip_pad(sample["target"][i], tgt_dict.pad())
                hyps.append(self._decode(hypos[0]["tokens"], "UNKNOWNTOKENINHYP"))
                refs.append(self._decode(ref, "UNKNOWNTOKENINREF"))
        model.train(was_training)
        return hyps, refs

    def _decode(self, tokens: torch.Tensor, unk: str) -> str:
        # distinct <unk> strings so that unknown words never match (as fairseq's own BLEU validation)
        text = self.task.target_dictionary.string(tokens.int().cpu(), self.remove_bpe, unk_string=unk)
        return self.detok(text) if self.detok else text


@contextlib.contextmanager
def fairseq_hydra():
    """Let fairseq compose its own Hydra config inside a process that runs ours.

    ``convert_namespace_to_omegaconf`` clears the global Hydra state (ours, when this rank runs inside
    ``wagma-bench run`` under srun / torchrun / mpiexec) and uses the legacy ``hydra.experimental`` API,
    which raises once our app has set version_base 1.3. Both are restored afterwards; fairseq's
    deprecation warnings are silenced (they are fairseq's, not the user's).
    """
    from hydra import version
    from hydra.core.global_hydra import GlobalHydra

    ours, base = GlobalHydra.instance().hydra, version.VersionBase.instance().getbase()
    version.VersionBase.instance().setbase(version.__compat_version__)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        version.VersionBase.instance().version_base = base
        GlobalHydra.instance().clear()
        if ours is not None:
            GlobalHydra.instance().initialize(ours)


def _moses_detokenizer(lang: str):
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=lang)
    return lambda text: detok.detokenize(text.split())


def _rows_of(sample: Any, rows: torch.Tensor, sentences: int) -> Any:
    """The rows ``rows`` of every tensor of a (nested) fairseq sample whose first
    dimension is its sentences."""
    if isinstance(sample, dict):
        return {k: _rows_of(v, rows, sentences) for k, v in sample.items()}
    if isinstance(sample, torch.Tensor) and sample.dim() and sample.size(0) == sentences:
        return sample.index_select(0, rows)
    return sample
