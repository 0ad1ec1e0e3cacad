"""Intervals for tuned scores and their ratios: the two-stage bootstrap, computed exactly.

A tuned score (:func:`wagma_bench.analysis.tuning.median_score`) is the median over S studies of each study's
fastest trial. Its uncertainty comes from both levels: which studies were drawn, and which trials each study
drew. The **two-stage (hierarchical) nonparametric bootstrap** (Davison & Hinkley 1997, Sec. 3.8) resamples
both: S studies with replacement, then inside each drawn study its O trials with replacement, and recomputes
the score. Nothing here draws random numbers: the bootstrap distribution has a closed form.

- One resampled study's best is the minimum of O draws with replacement from its O times, so
  P(best >= t_j) = (#times >= t_j / O)^O.
- A resampled study is a uniformly drawn study with such a best, so the S resampled bests are i.i.d. from
  the *mixture* of the per-study best distributions.
- The score is the median of those S i.i.d. draws: an order statistic (S odd) or the mean of two adjacent
  ones (S even), whose distributions follow from the mixture's CDF (:func:`median_of_draws`).

The interval is the percentile interval of that distribution (95% by default). With few trials it is
honest and wide: with S = O = 3 the lower end is the fastest trial of all whenever it has more than 2.5%
bootstrap mass. A missed target is ``inf`` (it stays a value of the distribution, so a score whose studies
mostly missed has an infinite upper end). A ratio of two independent tunings (a speed-up) gets the
distribution of the ratio of independent draws from both (:func:`ratio`), where ``inf / inf`` (both missed)
counts as a tie, 1.0.

A throughput is the median over every trial rather than over each study's best; it is resampled the same two
ways (studies, then trials), and :func:`pooled_median` gives the exact law of the median of the pooled draws.
Resampling the pooled trials in one stage instead would treat trials of one study as independent of each
other, and so give a narrower interval than the one the docs declare whenever the studies differ.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Iterable, Sequence
from math import comb

import numpy as np

Dist = dict[float, float]  # value -> probability; finite values and math.inf
LEVEL = 0.95


def best_of_resample(times: Sequence[float]) -> Dist:
    """The minimum of O draws with replacement from ``times`` (O = len(times)): one resampled study's best."""
    o = len(times)
    if o == 0:
        raise ValueError("a study needs at least one trial")
    values = sorted({float(t) for t in times})
    at_least = [(sum(t >= v for t in times) / o) ** o for v in values] + [0.0]
    return {v: at_least[i] - at_least[i + 1] for i, v in enumerate(values)}


def mixture(dists: Sequence[Dist]) -> Dist:
    """A uniformly chosen one of ``dists``."""
    out: Dist = {}
    for d in dists:
        for v, p in d.items():
            out[v] = out.get(v, 0.0) + p / len(dists)
    return out


def _cdf_steps(dist: Dist) -> tuple[list[float], list[float]]:
    values, cdf = _cdf_arrays(dist)
    return values.tolist(), cdf.tolist()


def _cdf_arrays(dist: Dist) -> tuple[np.ndarray, np.ndarray]:
    """The sorted values and the CDF at each (the masses added in that order, capped at 1, the last 1)."""
    values = np.fromiter(dist.keys(), float, len(dist))
    order = np.argsort(values)
    values = values[order]
    masses = np.fromiter(dist.values(), float, len(dist))[order]
    cdf = np.minimum(np.cumsum(masses), 1.0)  # cumsum adds in order, as a loop does
    cdf[-1] = 1.0
    return values, cdf


def _order_stat_cdf(f: float, n: int, k: int) -> float:
    """P(X_(k) <= x) for n i.i.d. draws with P(X <= x) = f: at least k of them at or below x."""
    return sum(comb(n, j) * f**j * (1 - f) ** (n - j) for j in range(k, n + 1))


def _order_stat(values: list[float], cdf: list[float], n: int, k: int) -> Dist:
    below = [_order_stat_cdf(f, n, k) for f in cdf]
    return {v: below[i] - (below[i - 1] if i else 0.0) for i, v in enumerate(values)}


def median_of_draws(dist: Dist, n: int) -> Dist:
    """The distribution of ``statistics.median`` of ``n`` i.i.d. draws from ``dist``."""
    if n < 1:
        raise ValueError("the median needs at least one draw")
    values, cdf = _cdf_steps(dist)
    if n % 2:
        return _clean(_order_stat(values, cdf, n, (n + 1) // 2))
    k = n // 2
    # Joint law of the two middle order statistics (X_(k), X_(k+1)) = (v_i, v_j): for i < j exactly k draws
    # are <= v_i (with v_i among them) and the other n - k are >= v_j (with v_j among them).
    lower = _order_stat(values, cdf, n, k)
    out: Dist = {}
    for i, vi in enumerate(values):
        f_i, f_prev = cdf[i], cdf[i - 1] if i else 0.0
        low_part = comb(n, k) * (f_i**k - f_prev**k)
        apart = 0.0
        for j in range(i + 1, len(values)):
            above_prev, above = 1 - cdf[j - 1], 1 - cdf[j]
            p = low_part * (above_prev ** (n - k) - above ** (n - k))
            apart += p
            _add(out, (vi + values[j]) / 2, p)
        _add(out, vi, lower[vi] - apart)
    return _clean(out)


def tuned_score(study_times: Sequence[Sequence[float]]) -> Dist:
    """The two-stage bootstrap distribution of a tuned score from each study's trial times (inf = missed)."""
    if not study_times:
        raise ValueError("a tuned score needs at least one study")
    return median_of_draws(mixture([best_of_resample(t) for t in study_times]), len(study_times))


def pooled_median(study_values: Sequence[Sequence[float]]) -> Dist:
    """The two-stage bootstrap law of the median over all trials (a throughput): S studies drawn with
    replacement, each drawn study's O_s trials drawn with replacement from it, the median of every value
    drawn.

    The pooled draws are not i.i.d. (a drawn study brings O_s values from one distribution), so their order
    statistics come from counts: below any value v, each drawn study contributes Binomial(O_s, F_s(v)) values
    where F_s is its empirical CDF; the S drawn studies are i.i.d. mixtures of those, and their sum is a
    convolution (:func:`_pooled_counts`, which also carries the pool's size where studies differ in size).
    An odd pool's median is its k-th value; an even pool's is the mean of the k-th and (k+1)-th, whose joint
    law follows from the chance that exactly k values lie at or below v_i and none in (v_i, v_j).
    """
    studies = [sorted(float(v) for v in s) for s in study_values]
    if not studies or not all(studies):
        raise ValueError("a pooled median needs at least one study, each with at least one value")
    values = sorted({v for s in studies for v in s})
    m = len(values)
    cdf = [[bisect.bisect_right(s, x) / len(s) for x in values] for s in studies]  # cdf[s][i] = F_s(v_i)
    # at_most[i][(c, n)]: c of the n pooled values are <= v_i (i = -1: below every value)
    drawn = tuple(len(s) for s in studies)
    at_most = {i: _pooled_counts(tuple((c[i], 1 - c[i]) for c in cdf), drawn) for i in range(m)}
    at_most[-1] = _pooled_counts(((0.0, 1.0),) * len(studies), drawn)
    sizes = sorted({n for (_, n) in at_most[-1]})
    gaps = _even_gaps(cdf, studies, values, at_most, tuple((n // 2, n) for n in sizes if n % 2 == 0))
    out: Dist = {}
    for n in sizes:
        k = (n + 1) // 2 if n % 2 else n // 2
        below = [sum(p for (c, nn), p in at_most[i].items() if nn == n and c >= k) for i in range(-1, m)]
        kth = {i: below[i + 1] - below[i] for i in range(m)}  # P(X_(k) = v_i, N = n)
        if n % 2:
            for i, p in kth.items():
                _add(out, values[i], p)
            continue
        gap = functools.partial(gaps, n)  # (i, j) -> P(X_(k) <= v_i, X_(k+1) >= v_j, N = n)
        for i in range(m):
            apart = 0.0
            for j in range(i + 1, m):
                p = gap(i, j) - gap(i - 1, j) - gap(i, j + 1) + gap(i - 1, j + 1)
                apart += p
                _add(out, (values[i] + values[j]) / 2, p)
            _add(out, values[i], kth[i] - apart)
    return _clean(out)


def _even_gaps(cdf, studies, values, at_most, wanted: tuple[tuple[int, int], ...]):
    """(n, i, j) -> P(X_(k) <= v_i and X_(k+1) >= v_j, pool size n) for i < j and k = n / 2: exactly k pooled
    values at or below v_i and none in (v_i, v_j); 0 outside the table (no value below v_0, none at or above
    v_m). ``wanted``: every even pool's (k, n), read from one table per band."""
    m, memo = len(values), {}
    drawn = tuple(len(s) for s in studies)

    def gap(n: int, i: int, j: int) -> float:
        if i < 0 or j >= m:
            return 0.0
        if (i, j) not in memo:
            if j == i + 1:
                memo[i, j] = at_most[i]
            else:  # the band (v_i, v_{j-1}] must stay empty
                memo[i, j] = _pooled_counts(tuple((c[i], 1 - c[j - 1]) for c in cdf), drawn, wanted)
        return memo[i, j].get((n // 2, n), 0.0)

    return gap


# Memoized (the tables are only read): the same empirical-CDF fractions recur across the pairs (i, j) of one
# law and across the drift adjustment's elasticities, which re-score the same trials with other values but the
# same counts.
@functools.lru_cache(maxsize=4096)
def _pooled_counts(
    low_high: tuple[tuple[float, float], ...],
    sizes: tuple[int, ...],
    only: tuple[tuple[int, int], ...] | None = None,
) -> dict[tuple[int, int], float]:
    """For S studies drawn uniformly with replacement, each bringing its O_s values drawn with replacement:
    the law of (how many drawn values fall low, how many were drawn), where a value of study s falls low with
    probability low_high[s][0], high with low_high[s][1], and in between (the rest) never, as a constraint:
    the masses are of "c low, all others high" (they sum to less than 1 where a band between has mass).

    With ``only``, a tuple of entries (c, n), the table holds those alone (and what was on the way to them):
    each draw only adds to both counts, so a partial sum that can no longer end at one of them is not carried.
    What is carried is summed from the same products in the same order as in the full table: the entries are
    bitwise the same."""
    one: dict[tuple[int, int], float] = {}
    for (low, high), o in zip(low_high, sizes, strict=True):
        for c in range(o + 1):
            p = comb(o, c) * low**c * high ** (o - c) / len(sizes)
            if p:
                one[c, o] = one.get((c, o), 0.0) + p
    # (c, n) as the one int c * wide + n (n < wide): the same sums, in the same order, with cheaper keys
    wide = len(sizes) * max(sizes) + 1  # S draws of at most max(sizes) values each
    steps = [(c * wide + n, q) for (c, n), q in one.items()]
    total: dict[int, float] = {0: 1.0}
    for left in range(len(sizes) - 1, -1, -1):  # draws still to come after this one
        nxt: dict[int, float] = {}
        get = nxt.get
        alive = None if only is None else _on_the_way(sizes, only, left, wide)
        for key, p in total.items():
            for step, q in steps:
                if alive is None or key + step in alive:
                    nxt[key + step] = get(key + step, 0.0) + p * q
        total = nxt
    return {divmod(key, wide): p for key, p in total.items()}


@functools.lru_cache(maxsize=1024)
def _on_the_way(sizes: tuple[int, ...], only: tuple[tuple[int, int], ...], left: int, wide: int) -> frozenset:
    """The counts (c, n), as c * wide + n, from which ``left`` more draws (each adding 0 to O_s to c and O_s
    to n, O_s one of ``sizes``) can still end at one of ``only``."""
    least, most = min(sizes), max(sizes)
    return frozenset(
        c * wide + n
        for want_c, want_n in only
        for c in range(want_c + 1)
        for n in range(want_n + 1)
        if c + left * most >= want_c and n + left * least <= want_n <= n + left * most
    )


def combine(a: Dist, b: Dist, op: Callable[[float, float], float]) -> Dist:
    """The law of op(X, Y) for independent X ~ a, Y ~ b."""
    fast = _ARRAY_OPS.get(op)
    if fast is not None and a and b:
        out = _combine_arrays(a, b, fast)
        if out is not None:
            return out
    out = {}
    for x, p in a.items():
        for y, q in b.items():
            _add(out, op(x, y), p * q)
    return _clean(out)


def _combine_arrays(a: Dist, b: Dist, op: Callable) -> Dist | None:
    """:func:`combine` over every pair at once, bit for bit the loop's result: the same IEEE minima, maxima
    and quotients, each value's mass summed from 0.0 in the loop's order (``np.bincount`` adds in index
    order), and the values kept in the order the loop first meets them (a later combine sums in that order).
    None (the loop decides) where a NaN or a signed zero could make the two differ."""
    xs, ps = np.fromiter(a.keys(), float, len(a)), np.fromiter(a.values(), float, len(a))
    ys, qs = np.fromiter(b.keys(), float, len(b)), np.fromiter(b.values(), float, len(b))
    if op is not _divide_arrays and (not xs.all() or not ys.all()):  # min(0.0, -0.0) is not np.minimum's
        return None
    keys = op(xs[:, None], ys[None, :]).ravel()
    if np.isnan(keys).any():
        return None
    return _grouped_sums(keys, (ps[:, None] * qs[None, :]).ravel())


def _grouped_sums(keys: np.ndarray, masses: np.ndarray) -> Dist:
    """{key: the sum of its masses}, as a dict filled in array order builds it: each sum from 0.0 in array
    order, keys in the order first met, -0.0 and 0.0 one key under the first met (a stable sort); cleaned
    (:func:`_clean`)."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    starts = np.concatenate(([True], ordered[1:] != ordered[:-1]))
    group = np.empty(len(keys), dtype=np.intp)
    group[order] = np.cumsum(starts) - 1
    sums = np.bincount(group, weights=masses)
    first = order[starts]  # each key's first position: equal keys keep their array order
    met = np.argsort(first, kind="stable")
    sums, first = sums[met], first[met]
    kept = sums > 1e-15  # what _clean keeps
    return dict(zip(keys[first[kept]].tolist(), sums[kept].tolist(), strict=True))


def _divide_arrays(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """:func:`divide` elementwise (the same IEEE quotients and the same two exceptions)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = x / y
    out = np.where(np.isinf(x) & np.isinf(y), 1.0, out)
    return np.where(y == 0, math.inf, out)


def ratio(num: Dist, den: Dist) -> Dist:
    """num / den for independent draws; inf / inf (both missed the target) is a tie, 1.0."""
    return combine(num, den, divide)


def divide(x: float, y: float) -> float:
    if math.isinf(x) and math.isinf(y):
        return 1.0
    if y == 0:
        return math.inf
    return x / y


# The operations :func:`combine` runs over arrays (bit for bit the same values; see _combine_arrays).
_ARRAY_OPS: dict[Callable, Callable] = {min: np.minimum, max: np.maximum, divide: _divide_arrays}


def best_of(dists: Iterable[Dist], lower_is_better: bool) -> Dist:
    """The law of the best of independent draws, one from each (min for times, max for throughputs)."""
    pick = min if lower_is_better else max
    out: Dist | None = None
    for d in dists:
        out = d if out is None else combine(out, d, pick)
    if out is None:
        raise ValueError("the best of nothing")
    return out


def quantile(dist: Dist, q: float) -> float:
    """The smallest value whose CDF reaches q."""
    return _quantile(*_cdf_arrays(dist), q)


def _quantile(values: np.ndarray, cdf: np.ndarray, q: float) -> float:
    reached = np.flatnonzero(cdf >= q - 1e-12)
    return float(values[reached[0]] if len(reached) else values[-1])


def interval(dist: Dist, level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval: the (1 - level)/2 and (1 + level)/2 quantiles."""
    tail = (1 - level) / 2
    steps = _cdf_arrays(dist)
    return _quantile(*steps, tail), _quantile(*steps, 1 - tail)


def _add(out: Dist, v: float, p: float) -> None:
    out[v] = out.get(v, 0.0) + p


def _clean(dist: Dist) -> Dist:
    """Drop the zero (and float-noise negative) masses of an exact computation."""
    return {v: p for v, p in dist.items() if p > 1e-15}
