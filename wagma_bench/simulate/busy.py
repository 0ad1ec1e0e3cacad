"""AD-PSGD's busy time: the seconds each rank's gossip thread spends exchanging inside each of its steps'
compute windows (:func:`busy_between`), what its exchange cost c acts on
(:func:`~wagma_bench.simulate.des.sim_adpsgd`).

Every rank's exchanges lie on one sorted axis, rank after rank (the key ``rank * span + begin``); a window's
busy time is that before its end less that before its start, each a binary search of the axis and a running
sum. At 65,536 ranks the axis holds 33 million keys and the windows as many: the searches run a block of
ranks at a time in that block's own stretch of the axis (it stays in the caches), and the blocks in a few
threads (:mod:`wagma_bench.simulate.threads`: each block writes only its own ranks' places, so the numbers
are the same to the bit for any number of threads).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from wagma_bench.simulate.threads import in_blocks

# elements of the busy time's whole-run vector steps done at once, so that each says where it is
CHUNK = 1 << 20
# elements of the busy time searched at once (busy_between): a block of ranks whose stretch of the exchanges'
# axis stays in the caches
SEARCH_BLOCK = 1 << 16

Tick = Callable[[str, float], None]  # (phase, fraction done): des.Progress


def _silent(phase: str, fraction: float) -> None:
    """Nobody listens."""


def row_major(x: np.ndarray) -> np.ndarray:
    """``np.ascontiguousarray(x)``, a block of rows at a time (in threads, :mod:`~wagma_bench.simulate.
    threads`): a whole copy of a column-major [rank, step] array reads each rank's next step a column away (a
    TLB miss an element at 65,536 ranks)."""
    if x.ndim != 2 or x.flags.c_contiguous:
        return np.ascontiguousarray(x)
    out = np.empty(x.shape, dtype=x.dtype)
    rows = max(1, SEARCH_BLOCK // max(1, x.shape[1]))

    def turn(r: int) -> None:  # (read in x's order, turned in the caches)
        out[r : r + rows] = np.asfortranarray(x[r : r + rows])

    in_blocks(turn, range(0, x.shape[0], rows), x.size)
    return out


def busy_between(
    busy: tuple[np.ndarray, np.ndarray, np.ndarray] | tuple[np.ndarray, np.ndarray],
    world: int,
    lo: np.ndarray,
    hi: np.ndarray,
    tick: Tick = _silent,
) -> np.ndarray:
    """Seconds each rank's gossip thread spends exchanging inside ``[lo, hi]`` (arrays ``[rank, k]``), from
    its exchanges ``busy = (rank, begin, end)`` in any order, or already rank after rank as ``(each rank's
    count, [begin or end, interval])`` (:meth:`~wagma_bench.simulate.exchanges.Exchanges.by_rank`, each
    rank's in their original order): a rank's exchanges never overlap (an active has one in flight, a passive
    serves one at a time). All ranks at once: the intervals are sorted on one axis, rank after rank."""
    tick("time in exchanges", 0.0)
    counts, both = busy if len(busy) == 2 else _by_rank_intervals(*busy, world, tick)
    span = 2.0 * max(float(hi.max(initial=0.0)), float(both[1].max(initial=0.0))) + 1.0
    ranks = np.repeat(np.arange(world, dtype=float), counts)  # each interval's rank
    axis, begin, length, in_order = _on_one_axis(both, ranks, span, tick)
    if not in_order:  # not each rank's in time order: sort by the key
        later = lambda phase, fraction: tick(phase, max(0.5, fraction))  # said in order
        both = both[:, _by_rank_then_key(ranks, both[0], span, world, later)]
        axis, begin, length, _ = _on_one_axis(both, ranks, span, later)
    tick("time in exchanges", 0.5)
    before = np.zeros(len(length) + 1)  # busy time of the intervals before each one
    np.cumsum(length, out=before[1:])
    # where each rank's intervals begin on the axis (one search a rank, not one an element), and end
    first_of = np.append(np.searchsorted(axis, np.arange(world, dtype=float) * span, side="left"), len(axis))
    shape = np.broadcast_shapes(lo.shape, hi.shape)
    lo, hi = np.broadcast_to(lo, shape), np.broadcast_to(hi, shape)
    out = np.empty(shape, order="F")  # step by step, as the fixed point's other arrays (_compute_schedule)
    cols = shape[1] if len(shape) == 2 else 1
    ranks = max(1, SEARCH_BLOCK // cols)

    def search(r: int) -> None:  # a block of ranks
        block = slice(r, min(world, r + ranks))
        searched = _RankBlock(axis, begin, length, before, first_of, span, block)
        # the block's windows read once in the arrays' order and kept rank after rank, and its answer written
        # back in the arrays' order: a rank's next step lies a whole column away (a TLB miss an element)
        lo_b, hi_b = (np.ascontiguousarray(np.asfortranarray(x[block])) for x in (lo, hi))
        until_hi = searched.busy_until(hi_b)
        until_lo = searched.busy_at_starts(lo_b, hi_b, until_hi)
        out[block] = np.asfortranarray((until_hi - until_lo).reshape(out[block].shape))

    said = lambda r: tick("time in exchanges", 0.5 + 0.5 * r / world)  # where it is, block by block
    in_blocks(search, range(0, world, ranks), out.size, said)
    return out


def _by_rank_intervals(
    rank: np.ndarray, began: np.ndarray, ended: np.ndarray, world: int, tick: Tick = _silent
) -> tuple[np.ndarray, np.ndarray]:
    """Intervals ``(rank, begin, end)`` in any order as :func:`busy_between` reads them: (each rank's count,
    ``[begin or end, interval]`` rank after rank, each rank's in their original order)."""
    order = _by_rank(rank, world)
    counts = np.bincount(rank.astype(np.intp), minlength=world)  # (ranks are whole numbers below world)
    out = np.empty((2, len(order)))
    for k in range(0, len(order), CHUNK):  # a chunk at a time (seconds at 65,536 ranks), saying where it is
        tick("time in exchanges", 0.4 * k / max(1, len(order)))
        out[0, k : k + CHUNK], out[1, k : k + CHUNK] = (
            began[order[k : k + CHUNK]],
            ended[order[k : k + CHUNK]],
        )
    return counts, out


class _RankBlock:
    """The busy time before a time of ranks ``block`` (:func:`busy_between`): their queries land in their
    own stretch of the axis (each rank's keys lie in ``[rank * span, rank * span + span / 2)``), searched
    alone (:func:`search_right`), so that the search stays in the caches (the whole axis holds 33 million
    keys at 65,536 ranks)."""

    def __init__(self, axis, begin, length, before, first_of, span, block: slice):
        self.axis, self.begin, self.length, self.before = axis, begin, length, before
        self.first, self.span = first_of[block][:, None], span
        self.ranks = np.arange(block.start, block.stop)

    def busy_until(self, t: np.ndarray, row: np.ndarray | None = None) -> np.ndarray:
        """Busy time of each rank (row) before time ``t`` (its columns); with ``row``, of each rank ``row``
        (in the block) before the time ``t`` of the same place."""
        if row is None:
            t = t.reshape(len(self.ranks), -1)
            rank, first = self.ranks[:, None], self.first
        else:
            rank, first = self.ranks[row], self.first[row, 0]
        last = search_right(self.axis, rank * self.span + t)  # begun by t
        some, at = last > first, np.maximum(last - 1, 0)  # some begun; the last begun
        # (the busy time before the last begun, and of it until t; none where none had begun)
        partial = np.clip(t - self.begin[at], 0.0, self.length[at])
        return np.where(some, self.before[at] - self.before[first] + partial, 0.0)

    def busy_at_starts(self, lo: np.ndarray, hi: np.ndarray, until_hi: np.ndarray) -> np.ndarray:
        """``busy_until(lo)``, given ``busy_until(hi) = until_hi``: where a window begins at the time the one
        before it ended (a step with neither injected delay nor overhead after it: half the steps of the
        lognormal imbalance, every step without one), the busy time then, the same function of the same
        rank and time; searched only elsewhere."""
        lo, hi = lo.reshape(until_hi.shape), hi.reshape(until_hi.shape)
        again = np.ones(lo.shape, dtype=bool)
        np.not_equal(lo[:, 1:], hi[:, :-1], out=again[:, 1:])
        out = np.empty(lo.shape)
        out[:, 1:] = until_hi[:, :-1]
        at = np.flatnonzero(again)  # (flat places: numpy's pairs of indices cost what the search saves)
        out.reshape(-1)[at] = self.busy_until(lo.reshape(-1)[at], at // lo.shape[1])
        return out


def _on_one_axis(
    both: np.ndarray, ranks: np.ndarray, span: float, tick: Tick
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """The intervals ``both = [begin or end, interval]`` of ranks ``ranks``, rank after rank: their keys
    ``rank * span + begin`` on one axis, begin and length; and whether those keys are already the stable sort
    of the keys: they never fall, and an equal pair is of one rank (so in their order, each rank's in their
    original order). The gossip gives each rank's exchanges in time order (an active's follow one another, a
    passive serves its queue in order), so this holds and the stable sort by rank is the same permutation as
    the sort by key, to the element; when it does not, the caller sorts by key."""
    n = both.shape[1]
    begin, axis, length = both[0], np.empty(n), np.empty(n)

    def chunk(k: int) -> bool:  # a chunk at a time (seconds at 65,536 ranks): its keys, and their order
        part = slice(k, k + CHUNK)
        np.subtract(both[1, part], begin[part], out=length[part])
        np.add(ranks[part] * span, begin[part], out=axis[part])
        step = np.diff(axis[part])
        tied = np.flatnonzero(step == 0) + k
        return bool(np.all(step >= 0) and np.all(ranks[tied] == ranks[tied + 1]))

    chunks = range(0, n, CHUNK)
    in_order = all(in_blocks(chunk, chunks, n, lambda k: tick("time in exchanges", 0.4 + 0.1 * k / n)))
    for k in chunks[1:]:  # and where one chunk meets the next
        step = axis[k] - axis[k - 1]
        in_order = in_order and bool(step >= 0 and (step != 0 or ranks[k] == ranks[k - 1]))
    return axis, begin, length, in_order


def _by_rank(rank: np.ndarray, world: int) -> np.ndarray:
    """``np.argsort(rank, kind="stable")``: with ranks that fit 16 bits, one pass of numpy's radix sort
    (a tenth of the time of sorting the float keys, :func:`_by_rank_then_key`)."""
    if world <= 1 << 16:
        return np.argsort(rank.astype(np.uint16), kind="stable")
    return np.argsort(rank.astype(np.int64), kind="stable")


def _by_rank_then_key(
    rank: np.ndarray, t: np.ndarray, span: float, world: int, tick: Tick = _silent
) -> np.ndarray:
    """``np.argsort(rank * span + t, kind="stable")`` (t below half a span: the key grows with the rank
    first), a block of ranks at a time, saying where it is (one sort of 33 million keys took 10 s at 65,536
    ranks): a block's keys all lie below the next block's, so the blocks in rank order, each sorted stably
    from its elements in their original order, is the same order, ties included."""
    blocks = min(world, max(1, -(-len(t) // CHUNK)))
    if blocks == 1:
        return np.argsort(rank * span + t, kind="stable")
    block = rank // -(-world // blocks)
    order = np.empty(len(t), dtype=np.intp)
    done = 0
    for b in range(blocks):
        tick("time in exchanges", 0.4 * b / blocks)  # the sort is about 40% of the work
        mine = np.flatnonzero(block == b)  # the block's elements in their original order
        order[done : done + len(mine)] = mine[np.argsort(rank[mine] * span + t[mine], kind="stable")]
        done += len(mine)
    return order


def search_right(axis: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``np.searchsorted(axis, keys, side="right")``, searched only in the stretch of the axis between the
    keys' least and greatest (what lies before it is below every key, what lies after above): the same
    indices, for any keys, and a stretch that stays in the caches when the keys lie close together."""
    if not keys.size:
        return np.zeros(keys.shape, dtype=np.intp)
    lo = int(np.searchsorted(axis, keys.min(), side="left"))
    hi = int(np.searchsorted(axis, keys.max(), side="right"))
    return lo + np.searchsorted(axis[lo:hi], keys, side="right")
