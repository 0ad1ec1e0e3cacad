"""Straggler models: extra time a rank spends in a step, added to its real compute time.

Every model is a pure function of (rank, world size, step, seed), so all ranks agree on who is slow at
each step without communicating, a run is reproducible, and the simulator can use the same models.
The trainer sleeps for the returned time before the backward pass and logs it as an injected delay, so
reports can tell injected from real time.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from wagma_bench.errors import ConfigError
from wagma_bench.ranges import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, setting


class Imbalance:
    name: str
    settings: Any  # the option's Settings (the `imbalance:` section)

    def __init__(self, settings, seed: int):
        self.settings, self.seed = settings, seed  # the run's seed: every rank draws the same stragglers

    def delay(self, rank: int, world_size: int, step: int, base_s: float) -> float:
        """Seconds rank ``rank`` sleeps in local step ``step``; ``base_s`` is its measured compute time."""
        raise NotImplementedError


class NoImbalance(Imbalance):
    name = "none"

    @dataclass
    class Settings:
        name: str = "none"

    def delay(self, rank, world_size, step, base_s):
        return 0.0


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

    def delay(self, rank, world_size, step, base_s):
        rng = random.Random(((self.seed + 11) * 1_000_003 + step) * 65_537 + rank)
        return self.settings.delay_s if rng.random() < self.settings.probability else 0.0


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

    def delay(self, rank, world_size, step, base_s):
        rng = random.Random(((self.seed + 7) * 1_000_003 + step) * 65_537 + rank)
        factor = math.exp(rng.gauss(0.0, self.settings.sigma))
        base = self.settings.scale_s if self.settings.scale_s > 0 else base_s
        return max(0.0, factor - 1.0) * base


IMBALANCES: dict[str, type[Imbalance]] = {
    cls.name: cls
    for cls in (NoImbalance, SharedDrawImbalance, IndependentImbalance, FixedImbalance, LognormalImbalance)
}

# Former option names, for run records made before a rename (a user's ``imbalance=paper`` is refused, with
# the new names: config/overrides.py).
RENAMED = {"paper": SharedDrawImbalance.name}


def make_imbalance(settings, seed: int) -> Imbalance:
    return IMBALANCES[settings.name](settings, seed)
