"""Communication schedules as pure functions of (rank, world size, step, config).

Shared by the real algorithms and by the simulator; unit-tested without processes.

Butterfly groups (WAGMA-SGD, Li et al. 2020). With group size ``S = 2**s`` and a world padded to the
next power of two ``Q >= P``, stage ``k`` groups the ranks that differ only in bits ``[k*s, (k+1)*s)``;
stages alternate round-robin, so after ``n_stages = ceil(log2(Q) / s)`` consecutive steps every rank has
(transitively) mixed with every other. When ``log2(Q)`` is not a multiple of ``s`` the last stage covers
the remaining bits and its groups are smaller.

Worlds that are not a power of two: groups are formed on the padded world ``[0, Q)`` and the ranks
``>= P`` are dropped, so groups get smaller (a group can shrink to a single rank, which then keeps its
model for that step). The members of a group are a prefix of its positions, so the hypercube over the
members stays connected; information reaches every rank within ``2 * n_stages`` steps (one period
carries every rank's information to rank 0 by clearing bits, the next spreads it by setting them),
and within ``n_stages`` steps when P is a power of two.
"""

from __future__ import annotations

import math
import random
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


Group = tuple[int, ...]


def _log2_exact(value: int, what: str) -> int:
    if value < 1 or value & (value - 1):
        raise ValueError(f"{what} must be a power of two, got {value}")
    return value.bit_length() - 1


def padded_world(world_size: int) -> int:
    """The smallest power of two >= world_size."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return 1 << (world_size - 1).bit_length()


def default_group_size(world_size: int) -> int:
    """sqrt(P) rounded (half up, in log space) to a power of two, between 2 and the padded world."""
    q = padded_world(world_size)
    if q == 1:
        return 1
    exponent = math.floor(math.log2(world_size) / 2 + 0.5)
    return max(2, min(q, 1 << exponent))


def num_stages(world_size: int, group_size: int) -> int:
    """Number of distinct butterfly stages (the schedule's period)."""
    bits = padded_world(world_size).bit_length() - 1
    s = _log2_exact(group_size, "group_size")
    if bits == 0 or s == 0:
        return 1
    return math.ceil(bits / s)


@lru_cache(maxsize=4096)
def butterfly_stage(world_size: int, group_size: int, stage: int) -> tuple[Group, ...]:
    """The partition of ranks ``[0, world_size)`` into the groups of butterfly ``stage``."""
    q = padded_world(world_size)
    bits = q.bit_length() - 1
    s = _log2_exact(group_size, "group_size")
    lo = (stage % num_stages(world_size, group_size)) * s
    width = max(0, min(s, bits - lo))
    mask = ((1 << width) - 1) << lo
    groups: dict[int, list[int]] = {}
    for rank in range(world_size):
        groups.setdefault(rank & ~mask, []).append(rank)
    return tuple(tuple(g) for g in groups.values())


def hypercube_neighbours(rank: int, group: Group) -> tuple[int, ...]:
    """Neighbours of ``rank`` on the hypercube over the positions of ``group`` (activation tree edges)."""
    pos = group.index(rank)
    dims = max(1, (len(group) - 1).bit_length())
    return tuple(group[pos ^ (1 << d)] for d in range(dims) if (pos ^ (1 << d)) < len(group))


# --- D-PSGD: ring ----------------------------------------------------------------------------------
def ring_neighbours(rank: int, world_size: int) -> tuple[int, ...]:
    """Left and right ring neighbours (deduplicated for P <= 2; empty for P == 1)."""
    if world_size == 1:
        return ()
    left, right = (rank - 1) % world_size, (rank + 1) % world_size
    return (left,) if left == right else (left, right)


# --- SGP: time-varying directed exponential graph ---------------------------------------------------
def exponential_peer(rank: int, world_size: int, step: int) -> int:
    """Out-peer of ``rank`` at ``step``: ``(rank + 2**k) % P`` with ``k = step mod ceil(log2 P)``.

    Exact powers of two hops; for P that is not a power of two ``ceil(log2 P)`` hop lengths are used.
    """
    if world_size == 1:
        return rank
    hops = max(1, math.ceil(math.log2(world_size)))
    return (rank + (1 << (step % hops))) % world_size


def exponential_in_peer(rank: int, world_size: int, step: int) -> int:
    """The rank that sends to ``rank`` at ``step`` on the exponential graph."""
    if world_size == 1:
        return rank
    hops = max(1, math.ceil(math.log2(world_size)))
    return (rank - (1 << (step % hops))) % world_size


def exponential_peers(world_size: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's :func:`exponential_peer` and :func:`exponential_in_peer` at ``step``, as two arrays: the
    simulator asks for a whole world's each hop (a Python call a rank took most of SGP's simulation time)."""
    import numpy as np

    ranks = np.arange(world_size)
    if world_size == 1:
        return ranks, ranks.copy()
    hop = 1 << (step % max(1, math.ceil(math.log2(world_size))))
    return (ranks + hop) % world_size, (ranks - hop) % world_size


# --- AD-PSGD: random perfect matchings over a bipartite active/passive split -------------------------
def random_matching(world_size: int, step: int, seed: int = 0) -> dict[int, int]:
    """A random pairing of even (active) with odd (passive) ranks, the same on every rank for (step, seed).

    The bipartite split is AD-PSGD's deadlock-avoidance rule: actives only initiate, passives only
    respond. With an odd world the last even rank sits out this step (maps to itself).
    """
    return dict(enumerate(matching_partners(world_size, step, seed).tolist()))


def matching_partners(world_size: int, step: int, seed: int = 0) -> np.ndarray:
    """:func:`random_matching` as an array: each rank's partner (itself when it sits out). The passives are
    shuffled by numpy's generator seeded with (seed, step), in C: the simulator asks for one matching per
    exchange round, at up to 65,536 ranks. (numpy is imported here: the launcher imports this module and no
    numpy.)"""
    import numpy as np

    actives, passives = np.arange(0, world_size, 2), np.arange(1, world_size, 2)
    shuffled = passives[np.random.default_rng([seed, step]).permutation(len(passives))]
    partners = np.arange(world_size)
    paired = actives[: len(shuffled)]
    partners[paired], partners[shuffled] = shuffled, paired
    return partners


# --- eager-SGD majority allreduce: one random initiator per round -------------------------------------
def random_initiator(world_size: int, round_: int, seed: int = 0) -> int:
    """The rank whose arrival activates ``round_`` of a majority allreduce, the same on every rank.

    Drawn uniformly with a shared seed (eager-SGD, Li et al. PPoPP 2020): the initiator arrives at a random
    position among the ranks, so in expectation half of them contribute a fresh gradient.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return random.Random(seed * 1_000_003 + round_ * 7919 + 17).randrange(world_size)


# --- round schedules of the wait-avoiding engine ------------------------------------------------------
# How a late WAGMA-SGD rank treats the rounds its progress thread joined passively (optim/wagma.py).
CATCH_UP = ("replay", "skip")


# One object answers "with whom does this rank reduce in round r, and is r the synchronous round": the
# optimizer, the wait-avoiding engine (wagma_bench.comm.wait_avoiding) and the simulator all ask it.
class RoundSchedule:
    """Rounds are numbered 1, 2, 3, ...; every ``period``-th round is synchronous over the whole world
    (``period`` 0: never), and so is round ``last``, the run's budget (None: not known), where every rank
    meets to end the run with the same global average a synchronous round makes."""

    world_size: int
    period: int
    last: int | None = None

    def is_sync(self, round_: int) -> bool:
        return (self.period > 0 and round_ % self.period == 0) or round_ == self.last

    def stage(self, round_: int) -> tuple[Group, ...]:
        """The partition of the world that reduces in group round ``round_``."""
        raise NotImplementedError

    def all_groups(self) -> list[Group]:
        """Every group any round uses (created once, collectively, before the first round)."""
        raise NotImplementedError

    def group(self, rank: int, round_: int) -> Group:
        if self.is_sync(round_):
            return tuple(range(self.world_size))
        return next(g for g in self.stage(round_) if rank in g)


def wagma_sync_period(tau: int) -> int:
    """WAGMA-SGD's sync period from the paper's staleness bound ``tau``: ``tau`` group rounds, then the
    synchronous global average. The one place the rule is written (the schedule, the optimizer's settings and
    the simulator read it here)."""
    return tau + 1


class WagmaSchedule(RoundSchedule):
    """WAGMA-SGD: round ``r`` uses butterfly stage ``r - 1`` (stages alternate round-robin); every
    ``tau + 1``-th round is the synchronous global average that bounds the staleness, and so is round ``last``
    (the run's budget), which need not be a multiple of ``tau + 1``."""

    def __init__(self, world_size: int, group_size: int | None, tau: int, last: int | None = None):
        if tau < 1:
            raise ValueError(f"tau must be >= 1, got {tau}")
        self.world_size = world_size
        self.group_size = group_size or default_group_size(world_size)
        self.stages = num_stages(world_size, self.group_size)  # validates the power of two
        self.tau = tau
        self.period = wagma_sync_period(tau)
        self.last = last

    def stage_index(self, round_: int) -> int:
        """Which of the ``stages`` butterfly stages group round ``round_`` uses."""
        return (round_ - 1) % self.stages

    def stage(self, round_: int) -> tuple[Group, ...]:
        return butterfly_stage(self.world_size, self.group_size, self.stage_index(round_))

    def all_groups(self) -> list[Group]:
        return [g for k in range(self.stages) for g in butterfly_stage(self.world_size, self.group_size, k)]


class FixedSchedule(RoundSchedule):
    """The same partition every round (eager-SGD: the whole world as one group)."""

    def __init__(
        self,
        world_size: int,
        groups: tuple[Group, ...] | None = None,
        period: int = 0,
        last: int | None = None,
    ):
        self.world_size = world_size
        self.groups = groups or (tuple(range(world_size)),)
        self.period = period
        self.last = last

    def stage(self, round_: int) -> tuple[Group, ...]:
        return self.groups

    def all_groups(self) -> list[Group]:
        return list(self.groups)


def world_hypercube_neighbours(rank: int, world_size: int) -> tuple[int, ...]:
    """Neighbours of ``rank`` on the hypercube over the whole world (``rank ^ 2**d`` below the world size):
    the edges over which an activation spreads to every rank, as the authors' activation schedule does."""
    return hypercube_neighbours(rank, tuple(range(world_size)))
