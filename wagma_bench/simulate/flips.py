"""Where a prediction's ratio crosses 1 along one assumption: every crossing, found by root finding.

The sensitivity grid (:data:`~wagma_bench.simulate.uncertainty.KNOBS`) says roughly where a claim's speed-up
lies along an assumption; a straight line between two grid points does not say where it crosses 1 (the
ratio is not linear in a bandwidth factor, nor monotone: WAGMA-SGD can lead only inside a band). So the grid
is cut into monotone pieces (each interval halved once, then every local extremum's neighbourhood halved
again until its side of the threshold is known), and each piece whose ends lie on both sides of the
threshold holds exactly one crossing, found by Brent's method on the simulator itself (``scipy``'s
``brentq``; a factor's axis searched in log space). A test runs the simulator at every stated crossing.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from scipy.optimize import brentq

XTOL = 1e-4  # on the searched axis: log of a factor, or a share from 0 to 1
REFINE = 3  # halvings around a local extremum before it is taken not to cross


def _to_axis(x: float, log: bool) -> float:
    return math.log(x) if log else x


def _from_axis(u: float, log: bool) -> float:
    return math.exp(u) if log else u


def _mid(a: float, b: float, log: bool) -> float:
    """The midpoint of a and b on the axis (geometric for a factor; arithmetic where one end is 0)."""
    if log and a > 0 and b > 0:
        return math.sqrt(a * b)
    return (a + b) / 2


def crossings(
    f: Callable[[float], float | None],
    grid: list[float],
    threshold: float = 1.0,
    log: bool = True,
    ahead: Callable[[list[float]], None] = lambda xs: None,
) -> list[float]:
    """Every ``x`` within ``grid``'s range where ``f(x)`` crosses ``threshold``, ascending. ``f`` is the
    prediction's ratio at ``x`` (None where it has none); it is called on the grid, on midpoints that cut it
    into monotone pieces, and by the root finder. ``log``: ``x`` is a factor (searched as its log).
    ``ahead(xs)`` is told the points about to be read one by one (the grid and midpoints, a halving's
    points), so that a pool can simulate them at once; it changes no result."""
    cache: dict[float, float | None] = {}

    def at(x: float) -> float | None:
        if x not in cache:
            cache[x] = f(x)
        return cache[x]

    xs = sorted(set(grid))
    pts = xs[:1]
    for a, b in itertools.pairwise(xs):  # halve every interval once: a piece's interior is seen at least once
        pts += [_mid(a, b, log), b]
    ahead(pts)
    pts = [x for x in pts if at(x) is not None]
    for _ in range(REFINE):  # halve again around each interior local extremum that stays on one side
        extra = []
        for i in range(1, len(pts) - 1):
            y0, y1, y2 = at(pts[i - 1]), at(pts[i]), at(pts[i + 1])
            if (y1 - y0) * (y2 - y1) < 0:
                extra += [_mid(pts[i - 1], pts[i], log), _mid(pts[i], pts[i + 1], log)]
        if not extra:
            break
        ahead(extra)
        pts = sorted(set(pts) | {x for x in extra if at(x) is not None})
    found = []
    for a, b in itertools.pairwise(pts):
        ga, gb = at(a) - threshold, at(b) - threshold
        if ga == 0:
            found.append(a)
        elif ga * gb < 0:
            u_log = log and a > 0  # a factor's axis is its log, but a bracket that starts at 0 is linear
            ua, ub = _to_axis(a, u_log), _to_axis(b, u_log)

            # the bracket's ends are the points that chose it, never re-run a hair away (exp(log(0.1)) is not
            # 0.1): a ratio that is not continuous (a fixed point stopped at its cap) could lie on the other
            # side there, and Brent's method refuses a bracket whose ends do not differ in sign
            def g(u, lg=u_log, ends={ua: a, ub: b}):  # noqa: B006 (the bracket's own ends, read only)
                return (at(ends.get(u, _from_axis(u, lg))) or threshold) - threshold

            u = brentq(g, ua, ub, xtol=XTOL)
            found.append(a if u == ua else b if u == ub else _from_axis(u, u_log))
    if pts and at(pts[-1]) - threshold == 0:
        found.append(pts[-1])
    return sorted(set(found))
