"""Every exchange of one pass of AD-PSGD's gossip (:func:`wagma_bench.simulate.des._gossip`), stored by the
rank that made it: an active's ``e``-th exchange at ``[e, active]``, a passive's ``j``-th service at ``[j,
passive]``, each ``(begin, end)``.

The busy time (:func:`~wagma_bench.simulate.busy.busy_between`) needs every rank's intervals rank after rank,
each rank's in time order. The gossip makes them batch by batch, in time order; a sort of every interval by
its rank and a gather in that order put them rank after rank at a cache and TLB miss an interval (4.6 CPU s
a pass of the fixed point at 65,536 ranks, in a reproduction of that sort and gather alone, under load).
Stored by slot, a batch writes a few neighbouring rows (its actives are at nearby exchanges), and the
intervals come out rank after rank by turning a block of ranks' slots around at a time
(:meth:`Exchanges.by_rank`): the same intervals in the same order as the stable sort by rank, since each
rank's slots are in the order it made them.
"""

from __future__ import annotations

import numpy as np

from wagma_bench.simulate.threads import in_blocks

# ranks whose slots are turned around at once (Exchanges.by_rank): a block of a few megabytes
TRANSPOSE_BLOCK = 256


class Exchanges:
    """The exchanges of a world's actives (the even ranks) with its passives (the odd ranks), ``partners[e,
    i]`` the partner of active ``i`` (rank ``2 i``) in its ``e``-th exchange. An active is paired in every
    matching or, the last active of an odd world, in none (:func:`~wagma_bench.comm.topology.
    matching_partners`), so an active's exchanges are its slots ``0 .. count - 1``, slot ``e`` its ``e``-th
    exchange."""

    def __init__(self, world: int, partners: np.ndarray):
        self.world, self.partners = world, partners
        slots, actives = partners.shape
        # made once a simulation and written again by each pass of the fixed point (clear): fresh memory costs
        # a page fault a page as it is first written
        self.active = np.empty((2, slots, actives))  # [begin or end, e, active]
        self.passive = np.empty((2, slots, world // 2))  # [begin or end, j, passive]
        self.served_as = np.empty((slots, actives), dtype=np.int32)  # [e, active]: j, its passive's slot
        self._flat = _flat(self.active), _flat(self.passive), self.served_as.reshape(-1)  # (views, made once)
        self.active_count = np.zeros(actives, dtype=np.intp)
        self.passive_count = np.zeros(world // 2, dtype=np.intp)
        self._by_rank, self._ordered = (
            np.empty((2, 0)),
            None,
        )  # by_rank's buffer; its answer since the last add

    def clear(self) -> None:
        """No exchange made yet (the slots are kept, to be written again)."""
        self.active_count[:] = 0
        self.passive_count[:] = 0
        self._ordered = None

    @property
    def count(self) -> int:
        return int(self.active_count.sum())

    def add(
        self,
        i: np.ndarray,
        e: np.ndarray,
        p: np.ndarray,
        position: np.ndarray,
        begin: np.ndarray,
        end: np.ndarray,
        queues: np.ndarray | None = None,
    ) -> None:
        """Actives ``i`` (each once) had their ``e``-th exchange with passive ranks ``p``, ``position``-th in
        ``p``'s queue of this batch, from ``begin`` to ``end``; the requests in service order (a passive's
        in its queue's order; ``queues``: each queue's length in that order, if the caller has them)."""
        self._ordered = None
        (active_begin, active_end), _, served_as = self._flat
        slot = e * self.active.shape[2] + i
        active_begin[slot], active_end[slot] = begin, end
        self.active_count[i] = e + 1
        q = p // 2
        j = self.passive_count[q] + position
        if len(j) and j.max() >= self.passive.shape[1]:  # a passive served more often than there are steps
            grown = np.empty((2, int(j.max()) + 1 + self.passive.shape[1] // 4, self.passive.shape[2]))
            grown[:, : self.passive.shape[1]] = self.passive
            self.passive = grown
            self._flat = self._flat[0], _flat(self.passive), served_as
        passive_begin, passive_end = self._flat[1]
        at = j * self.passive.shape[2] + q
        passive_begin[at], passive_end[at] = begin, end
        served_as[slot] = j
        if queues is None:
            last = np.append(q[1:] != q[:-1], True)  # each passive's last request: its queue's length
            self.passive_count[q[last]] = j[last] + 1
        else:  # (each passive once: its first request's place)
            self.passive_count[q[position == 0]] += queues

    def pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every exchange as ``(active rank, passive rank, begin, end)`` arrays, exchange after exchange."""
        made = np.arange(self.active.shape[1])[:, None] < self.active_count[None, :]
        e, i = np.nonzero(made)
        return 2 * i, self.partners[e, i], self.active[0][made], self.active[1][made]

    def in_by_rank(self) -> tuple[np.ndarray, np.ndarray]:
        """Where each exchange lies in :meth:`by_rank`'s order, at its active and at its passive (exchange
        after exchange, as :meth:`pairs`)."""
        made = np.arange(self.active.shape[1])[:, None] < self.active_count[None, :]
        e, i = np.nonzero(made)
        offsets = self._offsets()
        return offsets[2 * i] + e, offsets[self.partners[made]] + self.served_as[made]

    def _offsets(self) -> np.ndarray:
        """Where each rank's intervals begin in :meth:`by_rank`'s order (and, last, their number)."""
        offsets = np.zeros(self.world + 1, dtype=np.intp)
        np.cumsum(self.counts(), out=offsets[1:])
        return offsets

    def counts(self) -> np.ndarray:
        """Each rank's number of exchanges."""
        counts = np.empty(self.world, dtype=np.intp)
        counts[0::2], counts[1::2] = self.active_count, self.passive_count
        return counts

    def by_rank(self) -> tuple[np.ndarray, np.ndarray]:
        """(each rank's number of intervals, ``[begin or end, interval]`` rank after rank, each rank's in the
        order it made them)."""
        if self._ordered is None:
            self._ordered = self._by_rank_anew()
        return self._ordered

    def _by_rank_anew(self) -> tuple[np.ndarray, np.ndarray]:
        counts, offsets = self.counts(), self._offsets()
        if self._by_rank.shape[1] < offsets[-1]:
            self._by_rank = np.empty((2, int(offsets[-1]) + int(offsets[-1]) // 8))
        both = self._by_rank[:, : offsets[-1]]  # (the last pass's intervals, written over)

        def turn(r0: int) -> None:  # ranks r0 .. r1 - 1, actives first (in threads: simulate/threads.py)
            r1 = min(self.world, r0 + 2 * TRANSPOSE_BLOCK)
            c = counts[r0:r1]
            slots = int(c.max(initial=0))
            if not slots:
                return
            keep = (np.arange(slots)[None, :] < c[:, None]).ravel()  # (a flat mask: numpy's fast path)
            rows = np.empty((r1 - r0, slots))
            mine, theirs = rows[0::2], rows[1::2]  # actives' rows, passives' rows
            some = min(slots, self.active.shape[1])  # (the columns past a rank's count are never read)
            for side in (0, 1):
                mine[:, :some] = self.active[side, :some, r0 // 2 : r0 // 2 + len(mine)].T
                theirs[:] = self.passive[side, :slots, r0 // 2 : r0 // 2 + len(theirs)].T
                both[side, offsets[r0] : offsets[r1]] = rows.ravel()[keep]

        in_blocks(turn, range(0, self.world, 2 * TRANSPOSE_BLOCK), int(offsets[-1]))
        return counts, both


def _flat(slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat views of the begins and the ends of ``slots`` ``[begin or end, slot, rank]``."""
    return slots[0].reshape(-1), slots[1].reshape(-1)
