"""Straggler models: extra time a rank spends in a step, added to its real compute time.

Every model is a pure function of (rank, world size, step, seed), so all ranks agree on who is slow at
each step without communicating, a run is reproducible, and the simulator can use the same models.
The trainer sleeps for the returned time before the backward pass and logs it as an injected delay, so
reports can tell injected from real time.

A rank asks :meth:`Imbalance.delay` for its own step; the simulator asks :meth:`Imbalance.delays` for every
rank and step at once (the same numbers, a test checks). The per-(rank, step) draws come from :func:`uniform`,
a counter-based hash that numpy evaluates for a whole world at once: a seeded generator per (rank, step) costs
a Python call each, 33 million of them for 65,536 simulated ranks and 500 rounds. (Until 2026-12-06 the draws
came from ``random.Random`` seeded per (rank, step): the same distributions, other values; runs recorded
before keep their delays in their step records.)
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wagma_bench.errors import ConfigError
from wagma_bench.ranges import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, setting

if TYPE_CHECKING:
    import numpy as np

# numpy is imported where it is used, not here: the config check and the launcher import this module and no
# numpy (tests/test_config.py, tests/test_startup.py)
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: consecutive counters land far apart


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (Steele, Lea & Flood 2014): a bijection of uint64
    whose outputs pass BigCrush."""
    import numpy as np

    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniform(seed: int, stream: int, step, rank, draw: int = 0) -> np.ndarray:
    """Uniform numbers in [0, 1), one per (step, rank) pair (numpy broadcasting), a pure function of its
    arguments: ``stream`` keeps the models' draws apart, ``draw`` numbers the draws of one (rank, step)."""
    import numpy as np

    with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design
        key = _mix(np.uint64(seed % 2**64) * np.uint64(_GOLDEN) + np.uint64(stream))
        key = _mix(key ^ (np.asarray(step, dtype=np.uint64) * np.uint64(_GOLDEN)))
        key = _mix(key ^ (np.asarray(rank, dtype=np.uint64) + np.uint64(draw) * np.uint64(_GOLDEN)))
    return (key >> np.uint64(11)).astype(np.float64) * 2.0**-53


class Imbalance:
    name: str
    settings: Any  # the option's Settings (the `imbalance:` section)

    def __init__(self, settings, seed: int):
        self.settings, self.seed = settings, seed  # the run's seed: every rank draws the same stragglers

    def delay(self, rank: int, world_size: int, step: int, base_s: float) -> float:
        """Seconds rank ``rank`` sleeps in local step ``step``; ``base_s`` is its measured compute time."""
        import numpy as np

        return float(self.delays(world_size, np.full((world_size, 1), base_s), first_step=step)[rank, 0])

    def delays(self, world_size: int, base_s: np.ndarray, first_step: int = 0) -> np.ndarray:
        """``delay`` of every rank and step at once: ``[rank, k]`` for local step ``first_step + k``, given
        ``base_s[rank, k]`` (the compute time that rank's ``delay`` would be given)."""
        raise NotImplementedError


class NoImbalance(Imbalance):
    name = "none"

    @dataclass
    class Settings:
        name: str = "none"

    def delay(self, rank, world_size, step, base_s):
        return 0.0

    def delays(self, world_size, base_s, first_step=0):
        import numpy as np

        return np.zeros(np.shape(base_s))


class SharedDrawImbalance(Imbalance):
    """Exactly ``num_slow`` ranks sleep ``delay_s`` every step, drawn with a seed shared by all ranks.

    Named ``paper`` before, but it is not the rule of the WAGMA-SGD authors' code (that is
    :class:`IndependentImbalance`): theirs delays each rank independently, with probability 1 - (1 - 1/P)^2
    (about 2/P), so the number of slow ranks varies from step to step; this one delays exactly ``num_slow``
    every step, half of the world at P=4 with the default 2. A fixed straggler load per step, whatever the
    world size."""

    name = "shared_draw"

    @dataclass
    class Settings:
        name: str = "shared_draw"
        num_slow: int = setting(2, NON_NEGATIVE)
        delay_s: float = setting(0.3, NON_NEGATIVE)

    def slow_ranks(self, world_size: int, step: int) -> set[int]:
        rng = random.Random((self.seed + 1) * 1_000_003 + step)
        return set(rng.sample(range(world_size), min(self.settings.num_slow, world_size)))

    def delay(self, rank, world_size, step, base_s):
        return self.settings.delay_s if rank in self.slow_ranks(world_size, step) else 0.0

    def delays(self, world_size, base_s, first_step=0):
        import numpy as np

        out = np.zeros(np.shape(base_s))
        for k in range(out.shape[1]):  # one draw per step (not per rank): cheap at any world size
            out[list(self.slow_ranks(world_size, first_step + k)), k] = self.settings.delay_s
        return out


class IndependentImbalance(Imbalance):
    """The WAGMA-SGD authors' rule: every step each rank sleeps ``delay_s`` with probability ``probability``,
    independently of the other ranks and of the other steps.

    Their ResNet-50 script (Shigangli/WAGMA-SGD, ``resnet_run_loop_wagma_sgd.py``, ``my_func``) does, each
    step on each rank, ``if comm.rank == np.random.randint(comm.size) or comm.rank ==
    np.random.randint(comm.size): time.sleep(0.32)``. ``np.random`` is seeded identically on every rank, but
    the short-circuit ``or`` takes one draw on a rank that matched the first draw and two elsewhere, so the
    ranks' streams part after the first delays and each rank is in effect delayed on its own with probability
    1 - (1 - 1/P)^2, about 2/64 at the paper's P = 64 (docs/imbalance.md). The default keeps that per-rank
    probability at any world size (two draws per rank at P = 4 would delay 44% of the ranks each step). Here
    the draw is a pure function of (seed, rank, step), so a run is reproducible and the simulator asks the
    same function."""

    name = "independent"

    @dataclass
    class Settings:
        name: str = "independent"
        delay_s: float = setting(0.32, NON_NEGATIVE)  # the paper's, about one ResNet-50 step on a P100
        # 1 - (63/64)**2 = 127/4096: the paper's per-rank probability at P=64
        probability: float = setting(0.031005859375, FRACTION)

    stream = 11

    def delay(self, rank, world_size, step, base_s):
        return (
            self.settings.delay_s
            if float(uniform(self.seed, self.stream, step, rank)) < self.settings.probability
            else 0.0
        )

    def delays(self, world_size, base_s, first_step=0):
        import numpy as np

        steps = first_step + np.arange(np.shape(base_s)[1])
        u = uniform(self.seed, self.stream, steps[None, :], np.arange(world_size)[:, None])
        return np.where(u < self.settings.probability, float(self.settings.delay_s), 0.0)


class AuthorsImbalance(Imbalance):
    """The WAGMA-SGD authors' straggler rule as their code runs it, at any world size P: one random stream,
    seeded alike on every rank; in each step each rank draws a rank from it (``np.random.randint(P)``) and
    sleeps ``delay_s`` if the draw is its own, else draws a second time and sleeps if that one is (their
    ResNet-50 script, ``resnet_run_loop_wagma_sgd.py``, ``my_func``: ``comm.rank == randint(P) or comm.rank ==
    randint(P)``; the short-circuit ``or`` takes one draw on a match, two otherwise).

    So each rank reads the stream at its own position, one draw further after a first-draw match than after a
    miss, and the ranks that matched the first draw a different number of times read different draws: a rank
    is delayed with probability 1 - (1 - 1/P)^2 in every step, and a step delays 2 - 1/P ranks on average at
    every P (1.98 at the paper's 64, 2.0 at 1,024). :class:`IndependentImbalance` keeps instead the per-rank
    probability of P = 64 at every P. The stream is :func:`uniform` at consecutive positions (not numpy's
    Mersenne Twister: other values, the same rule); each rank's position is a function of (seed, P, rank,
    step), computed forward from step 0 once and then step by step (a resumed run recomputes it, microseconds
    a step)."""

    name = "authors"

    @dataclass
    class Settings:
        name: str = "authors"
        delay_s: float = setting(0.32, NON_NEGATIVE)  # the paper's, about one ResNet-50 step on a P100

    stream = 13

    def __init__(self, settings, seed: int):
        super().__init__(settings, seed)
        # (world size, ranks asked) -> (the next step, each asked rank's position in the stream before it)
        self._cursor: dict[tuple[int, tuple[int, ...] | None], tuple[int, np.ndarray]] = {}

    def _drawn(self, world_size: int, position: np.ndarray) -> np.ndarray:
        """The rank drawn at each stream position: randint(P) from a uniform number."""
        import numpy as np

        u = uniform(self.seed, self.stream, position, 0)
        return np.minimum((u * world_size).astype(np.int64), world_size - 1)

    def _slow(self, world_size: int, ranks: np.ndarray, first_step: int, steps: int, key) -> np.ndarray:
        """Whether each of ``ranks`` sleeps in each of the steps ``first_step ..``: ``[rank, k]``."""
        import numpy as np

        step, position = self._cursor.get(key, (0, np.zeros(len(ranks), dtype=np.uint64)))
        if step > first_step:  # asked for an earlier step (a resumed run, a new simulation): from step 0
            step, position = 0, np.zeros(len(ranks), dtype=np.uint64)
        out = np.zeros((len(ranks), steps), dtype=bool)
        while step < first_step + steps:
            first = self._drawn(world_size, position) == ranks
            second = ~first & (self._drawn(world_size, position + np.uint64(1)) == ranks)
            if step >= first_step:
                out[:, step - first_step] = first | second
            position = position + np.where(first, np.uint64(1), np.uint64(2))
            step += 1
        self._cursor[key] = (step, position)
        return out

    def delay(self, rank, world_size, step, base_s):
        import numpy as np

        slow = self._slow(world_size, np.array([rank]), step, 1, (world_size, (rank,)))
        return self.settings.delay_s if bool(slow[0, 0]) else 0.0

    def delays(self, world_size, base_s, first_step=0):
        import numpy as np

        slow = self._slow(
            world_size, np.arange(world_size), first_step, np.shape(base_s)[1], (world_size, None)
        )
        return np.where(slow, float(self.settings.delay_s), 0.0)


class FixedImbalance(Imbalance):
    """The given ranks are ``factor`` times slower, every step: each sleeps ``(factor - 1)`` times its
    compute time (``ranks: [2, 3]`` makes a whole butterfly group of P=4, S=2 slow)."""

    name = "fixed"

    @dataclass
    class Settings:
        name: str = "fixed"
        ranks: list[int] = setting(allowed=NON_NEGATIVE, factory=lambda: [0])
        factor: float = setting(2.0, AT_LEAST_ONE)

        def __post_init__(self):  # runs in the config check (after the ranges), before any rank starts
            if not self.ranks:
                raise ConfigError("imbalance.ranks=[] is not allowed; it must list at least one rank")

    def delay(self, rank, world_size, step, base_s):
        # every listed rank exists: config.check_world refuses a rank outside the world before any rank starts
        return (self.settings.factor - 1.0) * base_s if rank in self.settings.ranks else 0.0

    def delays(self, world_size, base_s, first_step=0):
        import numpy as np

        slow = np.isin(np.arange(world_size), self.settings.ranks)[:, None]
        return np.where(slow, (self.settings.factor - 1.0) * np.asarray(base_s, dtype=float), 0.0)


class LognormalImbalance(Imbalance):
    """Per-rank, per-step noise: the step takes ``base * X`` with ``X ~ LogNormal(0, sigma)``
    truncated below at 1 (delays only; a computation cannot be sped up by sleeping)."""

    name = "lognormal"

    @dataclass
    class Settings:
        name: str = "lognormal"
        sigma: float = setting(0.5, NON_NEGATIVE)
        # > 0: use this as the step-time base instead of the measured compute time
        scale_s: float = setting(0.0, NON_NEGATIVE)

    stream = 7

    def delay(self, rank, world_size, step, base_s):
        import numpy as np

        return float(self.delays(world_size, np.full((1, 1), base_s), first_step=step, ranks=[rank])[0, 0])

    def delays(self, world_size, base_s, first_step=0, ranks=None):
        import numpy as np

        steps = (first_step + np.arange(np.shape(base_s)[1]))[None, :]
        ranks = np.arange(world_size)[:, None] if ranks is None else np.asarray(ranks)[:, None]
        # a standard normal by Box-Muller from two uniforms of the same (rank, step); 1 - u is in (0, 1]
        u1 = 1.0 - uniform(self.seed, self.stream, steps, ranks, 0)
        u2 = uniform(self.seed, self.stream, steps, ranks, 1)
        normal = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)
        factor = np.exp(self.settings.sigma * normal)
        base = self.settings.scale_s if self.settings.scale_s > 0 else np.asarray(base_s, dtype=float)
        return np.maximum(0.0, factor - 1.0) * base


IMBALANCES: dict[str, type[Imbalance]] = {
    cls.name: cls
    for cls in (
        NoImbalance,
        SharedDrawImbalance,
        IndependentImbalance,
        AuthorsImbalance,
        FixedImbalance,
        LognormalImbalance,
    )
}


def make_imbalance(settings, seed: int) -> Imbalance:
    return IMBALANCES[settings.name](settings, seed)
