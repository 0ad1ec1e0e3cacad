"""How far a prediction can be trusted: an interval from its inputs' uncertainty,
and the assumptions that flip it.

A paper-scale prediction rests on inputs measured here with error (the compute spread of a handful of runs,
the samples a handful of runs took to the target, what AD-PSGD's exchange costs the compute) and on
assumptions that were never measured at that scale (the network, how much slower a straggler is, the trainer's
barrier). Two answers, both written by ``wagma-bench simulate --interval N`` into ``interval.json`` beside
``predictions.json``:

- **replicates**: N predictions, each with its inputs resampled -- the runs behind the compute spread and
  behind each optimizer's samples to target drawn with replacement (a bootstrap over runs), the measured
  exchange cost drawn from its bootstrap replicates (``--measured``), and a fresh seed for the simulation's
  own draws. A claim's speed-up computed in each replicate gives its 95% interval
  (:func:`wagma_bench.analysis.predictions.speedup_interval`).
- **sensitivity**: the prediction with one assumption moved along a grid (:data:`KNOBS`), the others at their
  values: ``wagma-bench claims`` finds where the claim's speed-up crosses its threshold
  (:func:`wagma_bench.analysis.predictions.flip_points`).

Both only re-run the simulator (its cost: docs/simulator.md); neither decides a verdict.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wagma_bench.analysis.predictions import claim_ratio
from wagma_bench.simulate.costs import Link, Network
from wagma_bench.simulate.des import Workload
from wagma_bench.simulate.flips import crossings
from wagma_bench.simulate.spread import fit_spread
from wagma_bench.simulate.structures import combinations


@dataclass
class Inputs:
    """Everything one prediction takes that the interval or a sensitivity point changes."""

    workload: Workload
    network: Network
    imbalance: Any  # an Imbalance (imbalance.py)
    samples_to_target: dict[str, float]
    control_every: int
    seed: int


@dataclass
class Sources:
    """What the replicates resample: each a list over the runs it was measured in."""

    spread_runs: list[Any] = field(
        default_factory=list
    )  # per run: its compute shape (empirical) or its ranks
    spread_kind: str = "empirical"  # empirical | persistent
    hits: dict[str, list[float]] = field(
        default_factory=dict
    )  # per optimizer: samples at the first target hit
    gossip_costs: list[float] = field(default_factory=list)  # bootstrap replicates of the measured k

    def said(self) -> list[str]:
        out = ["the simulation's own draws (a new seed)"]
        if self.spread_runs:
            out.append(f"the {len(self.spread_runs)} runs behind the compute spread")
        if self.hits:
            out.append("each optimizer's runs behind its samples to target")
        if self.gossip_costs:
            out.append(f"AD-PSGD's measured exchange cost ({len(self.gossip_costs)} bootstrap replicates)")
        return out


def resample(base: Inputs, sources: Sources, b: int) -> Inputs:
    """Replicate ``b``'s inputs (a pure function of ``b`` and the base seed)."""
    rng = np.random.default_rng([base.seed, 7919, b])
    workload = base.workload
    if sources.spread_runs:
        pick = [
            sources.spread_runs[i]
            for i in rng.integers(len(sources.spread_runs), size=len(sources.spread_runs))
        ]
        if sources.spread_kind == "persistent":
            fit = fit_spread(pick)
            workload = dataclasses.replace(workload, sigma_rank=fit.sigma_rank, sigma=fit.sigma, rho=fit.rho)
        else:
            workload = dataclasses.replace(
                workload, samples=tuple(workload.step_s * x for run in pick for x in run)
            )
    if sources.gossip_costs:
        workload = dataclasses.replace(workload, gossip_cost=float(rng.choice(sources.gossip_costs)))
    conv = dict(base.samples_to_target)
    for name, hits in sources.hits.items():
        conv[name] = statistics.median(rng.choice(hits, size=len(hits)).tolist())
    return dataclasses.replace(base, workload=workload, samples_to_target=conv, seed=base.seed + 1 + b)


# --- the assumptions a prediction is moved along ------------------------------------------------------------


def _spread(inputs: Inputs, f: float) -> Inputs:
    """The compute spread scaled: every log-deviation from the median times ``f``
    (0: every step the median)."""
    wl = inputs.workload
    samples = tuple(wl.step_s * (x / wl.step_s) ** f for x in wl.samples) if wl.samples else ()
    return dataclasses.replace(
        inputs,
        workload=dataclasses.replace(wl, samples=samples, sigma=wl.sigma * f, sigma_rank=wl.sigma_rank * f),
    )


def _bandwidth(inputs: Inputs, f: float) -> Inputs:
    net = inputs.network

    def scaled(link: Link) -> Link:
        return Link(link.alpha_s, link.beta_s_per_byte / f)

    return dataclasses.replace(
        inputs, network=dataclasses.replace(net, intra=scaled(net.intra), inter=scaled(net.inter), _cache={})
    )


def _imbalance(inputs: Inputs, f: float) -> Inputs:
    """The injected imbalance scaled: its delay (independent, shared_draw) or its sigma (lognormal)."""
    imb = inputs.imbalance
    key = next((k for k in ("delay_s", "sigma") if hasattr(imb.settings or (), k)), None)
    if key is None:
        return inputs
    settings = dataclasses.replace(imb.settings, **{key: getattr(imb.settings, key) * f})
    return dataclasses.replace(inputs, imbalance=type(imb)(settings, imb.seed))


def _gossip(inputs: Inputs, c: float) -> Inputs:
    return dataclasses.replace(inputs, workload=dataclasses.replace(inputs.workload, gossip_cost=c))


def _barrier(inputs: Inputs, every: float) -> Inputs:
    return dataclasses.replace(inputs, control_every=int(every))


@dataclass(frozen=True)
class Knob:
    name: str
    says: str  # "ties if {says} {value}"
    grid: tuple[float, ...]  # values (factors of the base where ``factor``)
    apply: Callable[[Inputs, float], Inputs]
    factor: bool  # grid values multiply the base value (1 = the base)
    base: Callable[[Inputs], float] = lambda inputs: 1.0

    def applies(self, inputs: Inputs) -> bool:
        if self.name == "imbalance":
            return any(hasattr(inputs.imbalance.settings or (), k) for k in ("delay_s", "sigma"))
        return True


KNOBS = (
    Knob(
        "gossip_cost",
        "AD-PSGD's exchange took from its compute this share of its own time:",
        (0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0),
        _gossip,
        False,
        lambda i: i.workload.gossip_cost,
    ),
    Knob(
        "spread", "the compute spread (log scale) were times", (0.0, 0.5, 1.0, 1.5, 2.0, 3.0), _spread, True
    ),
    Knob(
        "bandwidth",
        "the network's bandwidth were times",
        (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0),
        _bandwidth,
        True,
    ),
    Knob(
        "imbalance",
        "the injected imbalance (delay or sigma) were times",
        (0.0, 0.5, 1.0, 2.0, 4.0),
        _imbalance,
        True,
    ),
    Knob(
        "control_every",
        "the trainer's barrier came every N rounds (0: none), N =",
        (0.0, 10.0),
        _barrier,
        False,
        lambda i: float(i.control_every),
    ),
)


# --- producing interval.json --------------------------------------------------------------------------------

FLIP_SUBJECT = "wagma"  # the claims' subject: its speed-up over the best other optimizer is what flips
METRICS = (("throughput", False), ("time_to_target_s", True))  # (metric, lower is better)


def comparator_sets(others: set[str]) -> list[list[str]]:
    """The comparator sets a claim takes the best of: every other optimizer, or the decentralized ones
    (without Allreduce-SGD), each with and without DropCompute (no baseline of the papers)."""
    sets = []
    for drop in ((), ("dropcompute",), ("allreduce",), ("allreduce", "dropcompute")):
        s = sorted(others - set(drop))
        if s and s not in sets:
            sets.append(s)
    return sets


Predictor = Callable[[Inputs], dict[int, dict[str, dict[str, float | None]]]]  # {P: {optimizer: {metric: v}}}
# the predictions of several inputs, yielded in their order (a pool hands all of their simulations out first)
ManyPredictor = Callable[[list[Inputs]], Iterable[dict[int, dict[str, dict[str, float | None]]]]]


def uncertainty(
    predict: Predictor,
    base: Inputs,
    sources: Sources,
    replicates: int,
    progress: Callable[[str], None] = lambda _: None,
    subject: str = FLIP_SUBJECT,
    many: ManyPredictor | None = None,
    threads: int = 1,
    bulk: ManyPredictor | None = None,
) -> dict:
    """``interval.json``'s content: ``replicates`` resampled predictions, the sensitivity grid, every crossing
    of 1 along each assumption of ``subject`` against the best other optimizer (:func:`find_flips`), and the
    predictions over the structures the model cannot decide (:mod:`wagma_bench.simulate.structures`)
    (``progress`` is told after each prediction). ``many``: ``predict`` over a list at once (the sensitivity
    points and the flip search's); ``bulk``: the same for the replicates and structures, which a pool
    simulates while the flip search waits for its points (default ``many``); ``threads``: the flip searches
    run at once (:func:`find_flips`). None of them changes a result."""
    many = many or (lambda inputs: (predict(i) for i in inputs))
    points = [(knob, value) for knob in KNOBS if knob.applies(base) for value in knob.grid]
    evaluated, combos = combinations(base, sources)
    rest = [
        *((f"replicate {b + 1}/{replicates}", resample(base, sources, b)) for b in range(replicates)),
        *(("structure " + ", ".join(f"{k}: {v}" for k, v in choice.items()), i) for choice, i in combos),
    ]
    # the sensitivity points first (the flip search starts from them), then the rest queued behind them
    at_points = many([knob.apply(base, value) for knob, value in points])
    at_rest = (bulk or many)([inputs for _, inputs in rest])
    sensitivity = []
    for (knob, value), prediction in zip(points, at_points, strict=True):
        sensitivity.append(
            {
                "knob": knob.name,
                "says": knob.says,
                "value": value,
                "factor": knob.factor,
                "base": knob.base(base),
                "predicted": prediction,
            }
        )
        progress(f"sensitivity {knob.name}={value:g}")
    flips = find_flips(predict, base, sensitivity, subject, progress, threads, many)
    predicted = []
    for (label, _), prediction in zip(rest, at_rest, strict=True):
        predicted.append(prediction)
        progress(label)
    reps = predicted[:replicates]
    structural = [
        {"choice": choice, "predicted": prediction}
        for (choice, _), prediction in zip(combos, predicted[replicates:], strict=True)
    ]
    return {
        "replicates": replicates,
        "resampled": sources.said(),
        "predictions": reps,
        "sensitivity": sensitivity,
        "flips": flips,
        "structures": {"evaluated": evaluated, "predictions": structural},
    }


# --- every crossing of 1 along each assumption, by root finding ---------------------------------------------


def find_flips(
    predict: Predictor,
    base: Inputs,
    sensitivity: list[dict],
    subject: str,
    progress: Callable[[str], None] = lambda _: None,
    threads: int = 1,
    many: ManyPredictor | None = None,
) -> list[dict]:
    """Per numeric assumption, world size and metric: every value where ``subject``'s speed-up over the best
    other optimizer crosses 1 (:func:`wagma_bench.simulate.flips.crossings` over the grid's points, each new
    point one more prediction, shared by every world and metric). ``threads`` > 1: the searches run at once,
    each in a thread that waits for its predictions (a pool's processes simulate them; ``predict`` must be
    safe to call from threads); each search's points are its own, so the result is the same. ``many``: a
    pool's ``predict_many``, told the points a search is about to read (``crossings``' ``ahead``)."""
    searches, failed = [], []  # failed: the first error of a search, which ends every other at its next point
    lock = threading.Lock()
    for knob in KNOBS:
        points = [p for p in sensitivity if p["knob"] == knob.name]
        if not points or knob.name == "control_every":  # the barrier is yes or no: its two points say it
            continue
        cache = {float(p["value"]): p["predicted"] for p in points}
        sent = set(cache)  # the points handed out ahead (a spread point's inputs take 40 ms to make)

        def at(x: float, knob=knob, cache=cache) -> dict:
            if failed:
                raise failed[0]
            with lock:  # one thread makes a point's prediction, the others wait for it (its inputs cost time)
                got = cache.get(x)
                mine = got is None
                if mine:
                    got = cache[x] = Future()
            if mine:
                try:
                    got.set_result(predict(knob.apply(base, x)))
                except BaseException as err:
                    got.set_exception(err)
                    raise
                progress(f"flip search {knob.name}={x:.4g}")
            return got.result() if isinstance(got, Future) else got

        first = next(iter(cache.values()))
        for world in first:
            names = set(first[world])
            if subject not in names:
                continue
            for others, metric_lower in itertools.product(comparator_sets(names - {subject}), METRICS):
                metric, lower = metric_lower
                if not (first[world].get(subject) or {}).get(metric):
                    continue

                def ratio(
                    x: float, world=world, metric=metric, lower=lower, others=others, at=at
                ) -> float | None:
                    r = claim_ratio(at(x)[world], subject, others, metric, lower)
                    return None if r is None else r[0]

                def ahead(xs: list[float], knob=knob, sent=sent) -> None:  # handed out, not waited for
                    new = [x for x in xs if x not in sent]  # once a knob: its searches share their points
                    sent.update(new)
                    if many is not None and new:
                        many([knob.apply(base, x) for x in new])

                grid = [float(p["value"]) for p in points]
                head = {"knob": knob.name, "world": world, "metric": metric, "subject": subject}
                searches.append((dict(head, comparators=others), ratio, grid, knob.factor, ahead))

    def search(item: tuple) -> dict:
        head, ratio, grid, log, ahead = item
        try:
            found = crossings(ratio, grid, 1.0, log=log, ahead=ahead)
        except BaseException as err:
            failed.append(err)
            raise
        return dict(head, crossings=found, ratios=[float(ratio(x)) for x in found])

    if threads <= 1 or len(searches) <= 1:
        return [search(s) for s in searches]
    with ThreadPoolExecutor(len(searches)) as pool:  # results in the searches' order
        return list(pool.map(search, searches))
