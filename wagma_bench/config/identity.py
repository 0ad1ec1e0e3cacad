"""A run's two hashes, named for what they are, and the rule behind the second: ``config_hash``, the whole
configuration (``run_start`` records it: which exact settings ran), and ``resume_hash``, the run's identity,
the configuration less what may change when a run is resumed or extended (a checkpoint manifest records it,
and a resume or a finished run's report must match it). Computed on the configuration as a mapping, as
recorded."""

from __future__ import annotations

import hashlib
import json

from wagma_bench.config.renamed import renamed_config

# Sections and keys that may change between a run and its resume: how it is launched and logged, how
# often it checkpoints, and how long it trains. Every other key is the run's identity (its config hash).
RESUMABLE_SECTIONS = ("launcher", "logger", "checkpoint")
BUDGET_KEYS = ("max_rounds", "epochs", "time_limit_s")

# Keys added to the suite after runs had been recorded without them, each with the value that does what those
# runs did: a run recorded before the key existed is the same run as one with the key at that value (its
# summary is found, so tune skips it and run reports it; its checkpoints resume). A key added with a default
# that keeps the old behaviour goes here (tests/test_events_record.py checks a committed tuning against
# today's plan).
ADDED_KEYS = {
    ("optimizer", "fragments"): 1,  # streaming DiLoCo (cb68197): one fragment is plain local SGD
    ("optimizer", "fragment_delay"): 0,
    ("optimizer", "fragment_alpha"): 0.0,
    ("workload", "shuffle_seed"): None,  # the batch order set apart from the seed (2026-12-05)
    # a 100-fold rounded-up budget refused unless set (2026-12-06); gone since
    # budgets end exactly (2026-12-06)
    ("train", "allow_budget_raise"): False,
    ("optimizer", "exchange_every"): 1,  # AD-PSGD's exchanges every k steps (2026-12-07): 1 is the paper's
}


def identity(raw: dict) -> dict:
    """The config minus what may legitimately change on resume (see :data:`RESUMABLE_SECTIONS`), and minus
    each key of :data:`ADDED_KEYS` at the value that keeps its old behaviour; a key recorded under an old name
    reads as its current one (:mod:`wagma_bench.config.renamed`)."""
    raw = renamed_config(raw) or {}
    out = {k: v for k, v in raw.items() if k not in RESUMABLE_SECTIONS}
    out["train"] = {k: v for k, v in (raw.get("train") or {}).items() if k not in BUDGET_KEYS}
    for (section, key), old in ADDED_KEYS.items():
        if isinstance(out.get(section), dict) and key in out[section] and out[section][key] == old:
            out[section] = {k: v for k, v in out[section].items() if k != key}
    return out


def config_hash(raw: dict) -> str:
    """The whole configuration's hash (``run_start``'s ``config_hash``: which exact settings ran)."""
    return _digest(raw)


def resume_hash(raw: dict) -> str:
    """The hash of the run's identity, what a resume must match (a checkpoint manifest's ``resume_hash``): the
    configuration less what may change on a resume (:func:`identity`)."""
    return _digest(identity(raw))


def _digest(obj: dict) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def budget(raw: dict) -> dict:
    raw = renamed_config(raw) or {}
    return {k: (raw.get("train") or {}).get(k) for k in BUDGET_KEYS}
