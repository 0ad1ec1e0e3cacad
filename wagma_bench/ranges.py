"""The values a numeric setting may take, declared next to its default.

Every numeric field of every configuration schema (the fixed sections in ``config/schema.py``, each
optimizer's, workload's, imbalance's and data option's ``Settings``) is declared with :func:`setting`, which
keeps its :class:`Range` in the field's metadata; the config check
(:func:`wagma_bench.config.schema.check_ranges`) reads it there before any rank starts, and refuses a numeric
field that declares none. A leaf module, so that a schema in any layer can import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RANGE_KEY = "range"  # the key of a field's metadata that holds its Range


@dataclass(frozen=True)
class Range:
    """The values a numeric setting may take; ``None`` (unset, where the schema allows it) always passes."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself is excluded
    high_open: bool = False  # high itself is excluded

    def allows(self, value: float) -> bool:
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or not (value > self.high or (self.high_open and value == self.high))

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {_number(self.low)}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{_number(self.low)}, {_number(self.high)}{right}"


def _number(x: float) -> str:
    """A bound as written: 2147483647, not 2.14748e+09; 0.5 and 1e-06 as usual."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
AT_LEAST_ONE = Range(1)
FRACTION = Range(0, 1)  # a probability or a share
FRACTION_BELOW_ONE = Range(0, 1, high_open=True)
ANY = Range()  # any finite number
# Seeds: numpy refuses negative ones, and torch's generators take (seed * 7919 + rank) * 1_000_003 + step
# (wagma_bench/workloads/resnet.py), which must stay below 2**64.
SEED = Range(0, 2**31 - 1)


def setting(
    default: Any = dataclasses.MISSING,
    allowed: Range | None = None,
    *,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A numeric dataclass field with its default (or ``factory``, for a list) and its allowed range; a list
    setting's range applies to each element."""
    if allowed is None:
        raise TypeError("setting() needs the allowed Range of its values")
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={RANGE_KEY: allowed})
    return dataclasses.field(default=default, metadata={RANGE_KEY: allowed})


def range_of(f: dataclasses.Field) -> Range | None:
    """The Range a field declares with :func:`setting`; None where it declares none."""
    return f.metadata.get(RANGE_KEY)
