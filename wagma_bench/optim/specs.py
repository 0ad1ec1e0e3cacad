"""What the configuration knows of each distributed optimizer, without torch: its settings and its rules.

Each algorithm class (``optim/<name>.py``) inherits its spec from here: the ``optimizer:`` section's schema
(``Settings``, with the checks between its keys), whether an outer optimizer applies (``outer_at``, else the
reason it does not), whether it computes a batch in parts, and its rules about the world size. The
configuration check (:mod:`wagma_bench.config.schema`) reads only these, so that ``wagma-bench run`` refuses a
bad value, and starts its ranks, without importing torch in the launching process (about 1.3 s of CPU a
command here); the ranks import the algorithms themselves. :data:`OPTIMIZER_SPECS` is the one table of the
optimizers: :data:`wagma_bench.optim.OPTIMIZERS` (the algorithm classes) and the simulator's models are read
from it (``tests/test_config.py`` checks that each class inherits its spec).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from wagma_bench.comm.topology import CATCH_UP, padded_world, wagma_sync_period
from wagma_bench.errors import ConfigError
from wagma_bench.ranges import AT_LEAST_ONE, FRACTION, FRACTION_BELOW_ONE, NON_NEGATIVE, POSITIVE, setting

OUTER = ("none", "slowmo", "nesterov")
#: outer period of the bases without a global average of their own (D-PSGD, SGP): our choice, of the order of
#: the averaging periods of local SGD (4) and WAGMA-SGD (11) here; fairscale's SlowMo default is 48
EXACT_DEFAULT_PERIOD = 12


@dataclass
class OuterSettings:
    """The outer optimizer's settings (:mod:`wagma_bench.optim.outer`), mixed into the Settings of every
    optimizer whose models are averaged. The others declare only ``outer: str = "none"``, so that
    ``optimizer.outer=...`` reaches the config check, which refuses it with the reason
    (:func:`wagma_bench.config.schema.check_outer`)."""

    outer: str = "none"  # none | slowmo | nesterov
    # slowmo: alpha (times the local lr); nesterov: the outer lr; null: optim/outer.py's DEFAULTS
    outer_lr: float | None = setting(None, POSITIVE)
    # slowmo: beta; nesterov: the Nesterov momentum mu; null: optim/outer.py's DEFAULTS
    outer_momentum: float | None = setting(None, FRACTION_BELOW_ONE)
    # rounds between outer steps; null: the base's global averaging rounds
    outer_period: int | None = setting(None, AT_LEAST_ONE)

    CHOICES: ClassVar[dict[str, tuple]] = {"outer": OUTER}

    def averaging_period(self) -> int:
        """Rounds between the base's own global averages (1: it has none, any period works)."""
        return 1

    def default_outer_period(self) -> int:
        return EXACT_DEFAULT_PERIOD

    def effective_outer_period(self) -> int:
        return self.outer_period or self.default_outer_period()

    def __post_init__(self):  # runs in the config check, before any rank starts
        every = self.averaging_period()
        if self.outer != "none" and self.outer_period is not None and self.outer_period % every:
            raise ConfigError(
                f"optimizer.outer_period={self.outer_period} is not allowed with optimizer={self.name}; "
                f"it must be a multiple of {every}, the rounds between the models' global averages"
            )


class AlgorithmSpec:
    """The configuration's view of one algorithm; its class in ``optim/<name>.py`` inherits it."""

    name: ClassVar[str]
    Settings: ClassVar[type]  # schema of the `optimizer:` section
    # Its algorithm is the class of ``optim/<name>.py`` that inherits this spec (found there by
    # :data:`wagma_bench.optim.registry.OPTIMIZERS`), its simulation the function of
    # :mod:`wagma_bench.simulate.des` registered with ``@simulates(name)``: neither is named by a string here,
    # so neither can be misspelt.
    #: where an outer optimizer (:mod:`wagma_bench.optim.outer`) steps: "average" (the base averages the
    #: models globally itself and calls ``outer_round`` right after), "exact" (the base never averages
    #: globally: ``outer_round``, called at the end of each round, takes the average first), None: it does not
    #: apply
    outer_at: ClassVar[str | None] = None
    #: why an outer optimizer does not apply (outer_at None): the config check's message says it
    outer_refusal: ClassVar[str] = ""
    #: the trainer computes each batch in ``micro_batches`` parts (DropCompute); the config check refuses it
    #: on a workload whose batches do not split
    computes_in_parts: ClassVar[bool] = False
    #: what the algorithm does at the run's last round when it is not a multiple of its sync period (a run
    #: ends at exactly its budget: ``Algorithm.end_at``), as docs/run-budget-and-exit-codes.md's table says it
    #: (a test keeps the two in step); "" for those that meet
    #: every round
    final_sync: ClassVar[str] = ""

    @classmethod
    def sync_period_of(cls, settings) -> int:
        """Rounds between the points where every rank meets (evaluation, checkpoint, stop and the trainer's
        control exchange happen only there): the one rule that the algorithm (its ``sync_period``), the
        trainer's plan and the simulator all read. One name for every optimizer: its settings' ``sync_period``
        (a setting, or WAGMA-SGD's, which follows from its tau); 1 for an optimizer whose ranks meet every
        round."""
        return getattr(settings, "sync_period", 1)

    @classmethod
    def check_world(cls, settings, world_size: int | None) -> None:
        """Refuse, with a ``ConfigError`` naming the key, settings this algorithm cannot run on ``world_size``
        ranks (None: not known yet). The configuration check calls it before any rank starts; an algorithm
        with a rule about the world (WAGMA-SGD's power-of-two groups) overrides it."""


# Allreduce-SGD's reason, which DropCompute shares: one averaged gradient, one model
GRADIENT_AVERAGING = "it averages gradients, not models: every rank holds the same model after every step"


class AllreduceSpec(AlgorithmSpec):
    name = "allreduce"
    outer_refusal = GRADIENT_AVERAGING

    @dataclass
    class Settings:
        name: str = "allreduce"
        bucket_mb: float = setting(25.0, POSITIVE)
        outer: str = "none"  # refused unless none (outer_refusal)


class WagmaSpec(AlgorithmSpec):
    name = "wagma"
    outer_at = "average"  # at the synchronous rounds, between the global average and the local step
    final_sync = (
        "a synchronous round (the global average of the models, then the local step), as every "
        "(tau + 1)-th round"
    )

    @dataclass
    class Settings(OuterSettings):
        name: str = "wagma"
        group_size: int | None = setting(
            None, AT_LEAST_ONE
        )  # power of two; None: topology.default_group_size
        tau: int = setting(10, AT_LEAST_ONE)  # group rounds between synchronous global averages
        catch_up: str = "replay"  # replay | skip: how a late rank treats rounds it joined passively

        # checked with the config (wagma_bench.config.schema)
        CHOICES: ClassVar[dict[str, tuple]] = {**OuterSettings.CHOICES, "catch_up": CATCH_UP}

        @property
        def sync_period(self) -> int:
            """Every sync_period-th round is the synchronous global average (topology.wagma_sync_period)."""
            return wagma_sync_period(self.tau)

        def averaging_period(self) -> int:
            return self.sync_period

        def default_outer_period(self) -> int:
            return self.sync_period

    @classmethod
    def check_world(cls, settings, world_size: int | None) -> None:
        """Groups of a power of two that fits the world padded to the next power of two (the butterfly)."""
        size = settings.group_size
        if size is None:
            return
        if size < 1 or size & (size - 1):
            raise ConfigError(
                f"optimizer.group_size={size} is not allowed; it must be a power of two (1, 2, 4, ...)"
            )
        if world_size is None:
            return
        padded = padded_world(world_size)
        if size > padded:
            raise ConfigError(
                f"optimizer.group_size={size} is not allowed with {world_size} ranks; it must be a "
                f"power of two up to {padded} (the world padded to a power of two)"
            )


class LocalSGDSpec(AlgorithmSpec):
    name = "local_sgd"
    outer_at = "average"  # right after the global average (optim/outer.py)
    final_sync = (
        "a global average of the models, as every sync_period-th round (streaming DiLoCo: of the whole model)"
    )

    @dataclass
    class Settings(OuterSettings):
        name: str = "local_sgd"
        sync_period: int = setting(4, AT_LEAST_ONE)  # PR-SGD's I: rounds between global model averages
        warmup_rounds: int = setting(0, NON_NEGATIVE)
        average_momentum: bool = False
        # streaming DiLoCo: the outer step fragment by fragment (torchft's fragments)
        fragments: int = setting(1, AT_LEAST_ONE)
        # inner steps a fragment's average overlaps (torchft's fragment_sync_delay)
        fragment_delay: int = setting(0, NON_NEGATIVE)
        # weight of the local parameters when a fragment syncs (fragment_update_alpha)
        fragment_alpha: float = setting(0.0, FRACTION)

        def streaming(self) -> bool:
            return self.fragments > 1 or self.fragment_delay > 0 or self.fragment_alpha > 0

        def __post_init__(self):  # runs in the config check, before any rank starts
            super().__post_init__()
            if not self.streaming():
                return
            per_fragment = self.sync_period // max(self.fragments, 1)
            rules = [
                (
                    self.outer == "none",
                    "optimizer.outer",
                    self.outer,
                    ("slowmo or nesterov (streaming DiLoCo is an outer step taken fragment by fragment)"),
                ),
                (
                    self.sync_period % self.fragments != 0,
                    "optimizer.fragments",
                    self.fragments,
                    (
                        f"a divisor of optimizer.sync_period={self.sync_period} (every fragment is synced "
                        "once a period)"
                    ),
                ),
                (
                    self.fragment_delay >= per_fragment,
                    "optimizer.fragment_delay",
                    self.fragment_delay,
                    (
                        f"below sync_period/fragments = {per_fragment} (a fragment's average must end "
                        "before the next fragment's begins)"
                    ),
                ),
                (self.warmup_rounds > 0, "optimizer.warmup_rounds", self.warmup_rounds, "0 with fragments"),
                (self.average_momentum, "optimizer.average_momentum", "true", "false with fragments"),
                (
                    self.outer_period is not None,
                    "optimizer.outer_period",
                    self.outer_period,
                    "null with fragments (each fragment's outer step comes every period)",
                ),
            ]
            for broken, key, value, allowed in rules:
                if broken:
                    raise ConfigError(
                        f"{key}={value} is not allowed with streaming DiLoCo; it must be {allowed}"
                    )

        def averaging_period(self) -> int:
            return self.sync_period

        def default_outer_period(self) -> int:
            return self.sync_period


class DPSGDSpec(AlgorithmSpec):
    name = "dpsgd"
    outer_at = "exact"  # no global average of its own: the outer layer takes one (optim/outer.py)

    @dataclass
    class Settings(OuterSettings):
        name: str = "dpsgd"


class ADPSGDSpec(AlgorithmSpec):
    name = "adpsgd"
    outer_refusal = (
        "its gossip thread keeps averaging corrections in flight at every round, so no round holds the "
        "models' exact average (not implemented)"
    )
    final_sync = (
        "where every rank meets, as every sync_period-th round (no global average: evaluation "
        "averages the models)"
    )

    @dataclass
    class Settings:
        name: str = "adpsgd"
        sync_period: int = setting(10, AT_LEAST_ONE)
        outer: str = "none"  # refused unless none (outer_refusal)


class SGPSpec(AlgorithmSpec):
    name = "sgp"
    outer_at = "exact"  # no global average of its own: the outer layer takes one (optim/outer.py)

    @dataclass
    class Settings(OuterSettings):
        name: str = "sgp"
        overlap: bool = False

        def __post_init__(self):
            super().__post_init__()
            if self.overlap and self.outer != "none":
                raise ConfigError(
                    f"optimizer.outer={self.outer} is not allowed with optimizer=sgp optimizer.overlap=true: "
                    "push-sum mass is in flight at every round, so no round has the models' exact "
                    "average; use overlap=false"
                )


EAGER_MODES = ("solo", "majority")


class EagerSpec(AlgorithmSpec):
    name = "eager"
    outer_refusal = (
        "it averages gradients, not models: every rank applies every round's result, so the models "
        "stay identical and there is no model average to correct"
    )
    final_sync = "a synchronous allreduce of the gradients, as every sync_period-th round"

    @dataclass
    class Settings:
        name: str = "eager"
        mode: str = "majority"
        sync_period: int = setting(10, AT_LEAST_ONE)
        outer: str = "none"  # refused unless none (outer_refusal)

        CHOICES: ClassVar[dict[str, tuple]] = {"mode": EAGER_MODES}  # checked with the config (config.schema)


DROPCOMPUTE_NORMALIZE = ("nominal", "computed")


def parse_threshold(value: str) -> float | None:
    """DropCompute's ``optimizer.threshold_s`` as seconds (inf: never drop), or None for ``auto``."""
    text = str(value).strip().lower()
    if text == "auto":
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not seconds > 0:
        raise ConfigError(
            f"optimizer.threshold_s={value} is not allowed; it must be auto or a number of seconds > 0 "
            "(inf: never drop)"
        )
    return seconds


class DropComputeSpec(AlgorithmSpec):
    name = "dropcompute"
    computes_in_parts = True
    outer_refusal = GRADIENT_AVERAGING  # Allreduce-SGD's reason: one averaged gradient, one model

    @dataclass
    class Settings:
        name: str = "dropcompute"
        micro_batches: int = setting(4, AT_LEAST_ONE)
        threshold_s: str = "auto"
        calibrate_steps: int = setting(20, AT_LEAST_ONE)
        normalize: str = "nominal"
        bucket_mb: float = setting(25.0, POSITIVE)
        outer: str = "none"  # refused unless none (outer_refusal)

        CHOICES: ClassVar[dict[str, tuple]] = {"normalize": DROPCOMPUTE_NORMALIZE}

        def __post_init__(self):  # runs in the config check, before any rank starts
            parse_threshold(self.threshold_s)


#: option name (``optimizer=NAME``) -> spec: the one table of the optimizers, from which
#: :data:`wagma_bench.optim.OPTIMIZERS` (the class of ``optim/NAME.py`` that inherits the spec) and
#: :data:`wagma_bench.simulate.des.SIMULATIONS` (``@simulates("NAME")``) are built in this order: adding an
#: optimizer adds one entry here.
OPTIMIZER_SPECS: dict[str, type[AlgorithmSpec]] = {
    spec.name: spec
    for spec in (
        AllreduceSpec,
        WagmaSpec,
        LocalSGDSpec,
        DPSGDSpec,
        ADPSGDSpec,
        SGPSpec,
        EagerSpec,
        DropComputeSpec,
    )
}
