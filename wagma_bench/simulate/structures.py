"""The structures a paper-scale prediction cannot decide, each a named list of alternatives.

A replicate interval (:mod:`wagma_bench.simulate.uncertainty`) moves the measured inputs; it keeps the model's
structure. Some structural choices move a prediction more than every measured input together: whether the
ranks meet at a barrier every 10 rounds (the suite's runs) or never (the papers' implementations), whether
the allreduce is the flat ring or the hierarchical one, what AD-PSGD's exchange costs its compute anywhere in
its measured interval, whether its authors' per-step averaging with the shared buffer is charged.
``simulate --interval`` predicts every combination of the alternatives below and
writes them to ``interval.json`` (``structures``); ``wagma-bench claims`` gives each claim the range of its
speed-up over them (:func:`wagma_bench.analysis.predictions.structural_range`) and says "undetermined at the
paper's scale" where that range spans the threshold.

A structure is one entry of :data:`STRUCTURES`: a name and a function from the base inputs (and what the
interval resamples) to its alternatives, each a label and the inputs it changes.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from wagma_bench.simulate.costs import HIERARCHICAL


@dataclass(frozen=True)
class Structure:
    name: str
    alternatives: Callable[[Any, Any], list[tuple[str, Callable[[Any], Any]]]]  # (inputs, sources) -> options


def _barrier(inputs, sources):
    return [
        ("none", lambda i: dataclasses.replace(i, control_every=0)),
        ("every 10 rounds", lambda i: dataclasses.replace(i, control_every=10)),
    ]


def _allreduce(inputs, sources):
    def use(algo):
        return lambda i: dataclasses.replace(
            i, network=dataclasses.replace(i.network, allreduce=algo, _cache={})
        )

    return [("flat ring", use("ring")), ("hierarchical", use(HIERARCHICAL))]


def _gossip_cost(inputs, sources):
    """c at the ends of its measured 95% interval (the bootstrap replicates of ``--measured``); with none,
    the base value only (nothing to span)."""
    if not sources.gossip_costs:
        return []
    lo, hi = (float(x) for x in np.percentile(sources.gossip_costs, [2.5, 97.5]))

    def use(c):
        return lambda i: dataclasses.replace(i, workload=dataclasses.replace(i.workload, gossip_cost=c))

    return [(f"c = {lo:.2f}", use(lo)), (f"c = {hi:.2f}", use(hi))]


def _averaging(inputs, sources):
    """The authors' per-step averaging of every layer with the shared buffer (``adpsgd_averaging``): charged
    (their code) or not (a fused or overlapped averaging)."""

    def use(mode):
        return lambda i: dataclasses.replace(
            i, workload=dataclasses.replace(i.workload, adpsgd_averaging=mode)
        )

    return [("in", use("per_step")), ("out", use("none"))]


STRUCTURES = (
    Structure("barrier", _barrier),
    Structure("allreduce", _allreduce),
    Structure("AD-PSGD exchange cost c", _gossip_cost),
    Structure("AD-PSGD per-step averaging", _averaging),
)


def combinations(base, sources) -> tuple[list[dict], list[tuple[dict[str, str], Any]]]:
    """The structures evaluated (name and alternatives' labels) and every combination of their
    alternatives: ``({structure: label}, inputs)``."""
    named = [(s.name, s.alternatives(base, sources)) for s in STRUCTURES]
    named = [(n, alts) for n, alts in named if alts]
    evaluated = [{"name": n, "alternatives": [label for label, _ in alts]} for n, alts in named]
    combos = []
    for choice in itertools.product(*(alts for _, alts in named)):
        inputs = base
        for _, apply in choice:
            inputs = apply(inputs)
        combos.append(({n: label for (n, _), (label, _) in zip(named, choice)}, inputs))
    return evaluated, combos
