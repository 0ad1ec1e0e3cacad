"""A paper-scale prediction's interval and the assumption that flips it, read from ``interval.json``.

``wagma-bench simulate --interval N`` (:mod:`wagma_bench.simulate.uncertainty`) writes the file beside
``predictions.json``: N predictions with their inputs resampled, and the prediction with one assumption moved
at a time along a grid. ``wagma-bench claims`` asks here for a claim's speed-up in each replicate (its 95%
interval) and for where along each assumption's grid the speed-up crosses the claim's threshold.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

INTERVAL_FILE = "interval.json"


def claim_ratio(
    rows: dict[str, dict[str, float | None]],
    subject: str,
    comparators: Sequence[str],
    metric: str,
    lower_is_better: bool,
) -> tuple[float, str] | None:
    """(subject against the best comparator, that comparator) in one prediction;
    None where either is missing."""
    subject_value = (rows.get(subject) or {}).get(metric)
    have = {o: (rows.get(o) or {}).get(metric) for o in comparators}
    have = {o: v for o, v in have.items() if v}
    if not subject_value or not have:
        return None
    if lower_is_better:
        best = min(have, key=have.get)
        return have[best] / subject_value, best
    best = max(have, key=have.get)
    return subject_value / have[best], best


def speedup_interval(data: dict, world: int, **claim: Any) -> tuple[float, float] | None:
    """The 2.5th and 97.5th percentiles of the claim's speed-up over the replicates
    (each against its own best)."""
    values = [
        r[0]
        for rep in data["predictions"]
        if (r := claim_ratio(rep.get(str(world)) or rep.get(world) or {}, **claim)) is not None
    ]
    if len(values) < 2:
        return None
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi)


def _found(data: dict, knob: str, world: int, claim: dict, present: set[str]) -> dict | None:
    """The root-found crossings ``simulate --interval`` wrote for this assumption, world and claim (its
    subject, its comparators among the optimizers ``present`` in the prediction, its metric), if it wrote them
    (files before the root finding have none)."""
    metric = claim["metric"]  # throughput | time_to_target_s
    comparators = set(claim["comparators"]) & present
    for entry in data.get("flips", []):
        if (
            entry["knob"] == knob
            and int(entry["world"]) == int(world)
            and entry["metric"] == metric
            and entry["subject"] == claim["subject"]
            and set(entry["comparators"]) == comparators
        ):
            return entry
    return None


def flip_points(data: dict, world: int, threshold: float = 1.0, **claim: Any) -> list[dict]:
    """Per assumption, every value where the claim's speed-up crosses ``threshold``: the simulator's own
    crossings, found by root finding on each monotone piece of the grid (``simulate --interval``,
    :func:`wagma_bench.simulate.uncertainty.find_flips`), where the file has them for this claim; else linear
    between the grid points around each sign change (older files). ``crossing`` is the one nearest the base
    value, with the distance from the base that takes: the log of the factor for a scaling, the difference of
    the shares for AD-PSGD's exchange cost (from 0 to 1), none for the barrier."""
    out = []
    by_knob: dict[str, list[dict]] = {}
    for point in data["sensitivity"]:
        by_knob.setdefault(point["knob"], []).append(point)
    for name, points in by_knob.items():
        curve = []
        for p in sorted(points, key=lambda p: p["value"]):
            r = claim_ratio(p["predicted"].get(str(world)) or p["predicted"].get(world) or {}, **claim)
            if r is not None:
                curve.append((p["value"], r[0]))
        first = points[0]
        base = first["base"]
        at = 1.0 if first["factor"] else base
        present = set(first["predicted"].get(str(world)) or first["predicted"].get(world) or {})
        found = _found(data, name, world, claim, present) if threshold == 1.0 else None
        if found is not None:
            crossings, how = [float(x) for x in found["crossings"]], "root finding"
        else:
            crossings, how = [], "grid interpolation"
            for (x0, y0), (x1, y1) in itertools.pairwise(curve):
                if (y0 - threshold) * (y1 - threshold) <= 0 and y0 != y1:
                    crossings.append(x0 + (threshold - y0) * (x1 - x0) / (y1 - y0))
        entry = {
            "knob": name,
            "says": first["says"],
            "base": base,
            "factor": first["factor"],
            "curve": curve,
            "crossings": crossings,
            "found_by": how,
            "crossing": None,
            "distance": None,
        }
        if crossings:
            x = min(crossings, key=lambda c: abs(c - at))
            entry["crossing"] = x
            if name == "gossip_cost":
                entry["distance"] = abs(x - base)
            elif first["factor"] and x > 0:
                entry["distance"] = abs(math.log(x))
            elif first["factor"]:
                entry["distance"] = math.inf
        out.append(entry)
    return out


def structural_range(data: dict, world: int, **claim: Any) -> dict | None:
    """The claim's speed-up over every combination of the structures the model cannot decide (barrier or
    none, flat or hierarchical allreduce, AD-PSGD's exchange cost at the ends of its interval:
    :mod:`wagma_bench.simulate.structures`): ``{"range": [low, high], "structures": [...]}``, None where the
    file has no structures (older files) or no combination predicts the claim."""
    block = data.get("structures")
    if not block:
        return None
    values = [
        r[0]
        for combo in block["predictions"]
        if (
            r := claim_ratio(
                combo["predicted"].get(str(world)) or combo["predicted"].get(world) or {}, **claim
            )
        )
        is not None
    ]
    if not values:
        return None
    said = [f"{s['name']}: {' | '.join(s['alternatives'])}" for s in block["evaluated"]]
    return {"range": [min(values), max(values)], "structures": said, "combinations": len(values)}


def undetermined(structural: dict | None, threshold: float = 1.0) -> bool:
    """Whether the structural range spans the threshold: no structure the model cannot decide decides it."""
    return structural is not None and structural["range"][0] < threshold < structural["range"][1]


def nearest_flip(flips: list[dict]) -> dict | None:
    """The assumption whose smallest move flips the claim (the barrier, a yes/no, is reported apart)."""
    ranked = [f for f in flips if f["distance"] is not None]
    return min(ranked, key=lambda f: f["distance"]) if ranked else None


def flip_sentence(flip: dict | None, barrier: dict | None = None) -> str:
    """What ties the claim: the nearest assumption; where none within its grid does, whether the trainer's
    barrier (the suite's AD-PSGD and WAGMA-SGD meet every 10 rounds; the papers' never) does."""
    if flip is None:
        if barrier is not None and barrier["crossing"] is not None:
            ratio = dict(barrier["curve"]).get(10.0)
            return "no assumption moved within its grid ties it but the trainer's barrier every 10 rounds" + (
                f" ({ratio:.2f}x)" if ratio is not None else ""
            )
        return "no assumption moved within its grid ties it"
    x = flip["crossing"]
    others = [c for c in flip.get("crossings", []) if c != x]
    also = f" (also at {', '.join(f'{c:.3g}' for c in others)})" if others else ""
    if flip["knob"] == "gossip_cost":
        return f"ties if {flip['says']} {x:.3f} (here {flip['base']:.2f}){also}"
    return f"ties if {flip['says']} {x:.3g}{also}"


def barrier_sentence(flip: dict | None) -> str | None:
    """The prediction with and without the trainer's barrier (the suite's runs meet every 10 rounds; the
    papers' implementations never do), from the ``control_every`` points of the grid."""
    if flip is None or len(flip["curve"]) < 2:
        return None
    said = {int(x): y for x, y in flip["curve"]}
    parts = [
        f"{y:.2f}x with {'no barrier' if x == 0 else f'the barrier every {x} rounds'}"
        for x, y in sorted(said.items())
    ]
    return "; ".join(parts)
