"""Straggler models: extra time a rank spends in a step, added to its real compute time.

Every model is a pure function of (rank, world size, step, seed), so all ranks agree on who is slow at
each step without communicating (the paper's "shared seed"), and the simulator can use the same models.
The trainer sleeps for the returned time before the backward pass and logs it as an injected delay, so
reports can tell injected from real time.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from wagma_bench.errors import ConfigError
from wagma_bench.ranges import AT_LEAST_ONE, NON_NEGATIVE, setting


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


class PaperImbalance(Imbalance):
    """WAGMA-SGD's ResNet-50 experiment: each step ``num_slow`` ranks, drawn with a seed shared by all
    ranks, sleep ``delay_s`` (0.32 s in the paper, about one ResNet-50 step on a P100)."""

    name = "paper"

    @dataclass
    class Settings:
        name: str = "paper"
        num_slow: int = setting(2, NON_NEGATIVE)
        delay_s: float = setting(0.3, NON_NEGATIVE)

    def slow_ranks(self, world_size: int, step: int) -> set[int]:
        rng = random.Random((self.seed + 1) * 1_000_003 + step)
        return set(rng.sample(range(world_size), min(self.settings.num_slow, world_size)))

    def delay(self, rank, world_size, step, base_s):
        return self.settings.delay_s if rank in self.slow_ranks(world_size, step) else 0.0


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
    cls.name: cls for cls in (NoImbalance, PaperImbalance, FixedImbalance, LognormalImbalance)
}


def make_imbalance(settings, seed: int) -> Imbalance:
    return IMBALANCES[settings.name](settings, seed)
