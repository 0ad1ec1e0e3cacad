"""Alpha-beta (latency-bandwidth) cost models of the collectives the optimizers use.

A message of ``n`` bytes over a link costs ``alpha + n * beta`` (Hockney's model). Collectives over ``p``
ranks follow the classic formulas (Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication
Operations in MPICH", IJHPCA 2005), reduction arithmetic folded into ``beta``:

==================  ===========================================  ==========================================
algorithm           allreduce time                               used by
==================  ===========================================  ==========================================
ring                ``2 (p-1) alpha + 2 (p-1)/p n beta``         NCCL / gloo for large messages
recursive_doubling  ``ceil(log2 p) (alpha + n beta)``            MPI for small messages
tree                ``2 ceil(log2 p) (alpha + n beta)``          binomial reduce + broadcast
auto                the cheapest of the three (what tuned MPI / NCCL pick per size)
==================  ===========================================  ==========================================

Two link levels: ranks on one node talk over ``intra`` (NVLink, PCIe, shared memory), ranks on different
nodes over ``inter`` (Aries, InfiniBand). A collective whose group spans several nodes is charged at the
slower level for every step (a flat, not hierarchical, algorithm: an upper bound for hierarchical NCCL).
Ranks are placed on nodes in blocks of ``gpus_per_node`` (SLURM's default block distribution).

The ``network`` section of ``conf/cluster/NAME.yaml`` holds the parameters::

    network:
      allreduce: auto                # ring | recursive_doubling | tree | auto
      intra: {alpha_s: 3.0e-6, bandwidth_GBps: 150}
      inter: {alpha_s: 1.5e-6, bandwidth_GBps: 9.0}
      control_alpha_s: null          # latency of tiny control messages (WAGMA activations); null: link alpha

``bandwidth_GBps`` is per rank and direction (``beta = 1 / (bandwidth_GBps * 1e9)`` s/byte);
``beta_s_per_byte`` may be given instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ALGORITHMS = ("ring", "recursive_doubling", "tree")


@dataclass(frozen=True)
class Link:
    alpha_s: float  # per-message latency (s)
    beta_s_per_byte: float  # inverse bandwidth (s/byte)

    def p2p(self, nbytes: float) -> float:
        return self.alpha_s + nbytes * self.beta_s_per_byte


def _log2_steps(p: int) -> int:
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


def allreduce_terms(algorithm: str, p: int, nbytes: float) -> tuple[float, float]:
    """The coefficients ``(a, b)`` with ``time = a * alpha + b * beta`` (the least-squares features)."""
    if p <= 1:
        return 0.0, 0.0
    if algorithm == "ring":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p * nbytes
    if algorithm == "recursive_doubling":
        k = _log2_steps(p)
        return float(k), k * float(nbytes)
    if algorithm == "tree":
        k = _log2_steps(p)
        return 2.0 * k, 2.0 * k * float(nbytes)
    raise ValueError(
        f"unknown allreduce algorithm {algorithm!r}; choose one of: {', '.join(ALGORITHMS)}, auto"
    )


def allreduce_time(algorithm: str, p: int, nbytes: float, link: Link) -> float:
    """Seconds of one allreduce of ``nbytes`` over ``p`` ranks on ``link``; ``auto``: the cheapest."""
    if algorithm == "auto":
        return min(allreduce_time(a, p, nbytes, link) for a in ALGORITHMS)
    a, b = allreduce_terms(algorithm, p, nbytes)
    return a * link.alpha_s + b * link.beta_s_per_byte


# a link's numbers and what each may be: latencies and inverse bandwidths >= 0, bandwidths > 0, all finite
LINK_RANGES = {
    "alpha_s": (0.0, "a finite number of seconds >= 0"),
    "beta_s_per_byte": (0.0, "a finite number of seconds per byte >= 0"),
    "bandwidth_GBps": (None, "a finite number of GB/s > 0"),
}


def link_value(key: str, value: Any, name: str) -> float:
    """One of a link's numbers, checked (``name``: how to call it in the
    refusal, e.g. the user's override)."""
    low, allowed = LINK_RANGES[key]
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if not math.isfinite(v) or (v < low if low is not None else v <= 0):
        raise ValueError(f"{name}={value} is not allowed; it must be {allowed}")
    return v


def parse_link(spec: Mapping[str, Any], where: str) -> Link:
    """A link from ``{alpha_s, bandwidth_GBps | beta_s_per_byte}``, each checked (:data:`LINK_RANGES`)."""
    if "alpha_s" not in spec:
        raise ValueError(f"{where}: needs alpha_s and bandwidth_GBps (or beta_s_per_byte), got {dict(spec)}")
    if spec.get("beta_s_per_byte") is not None:
        beta = link_value("beta_s_per_byte", spec["beta_s_per_byte"], f"{where}.beta_s_per_byte")
    elif spec.get("bandwidth_GBps") is not None:
        beta = 1.0 / (link_value("bandwidth_GBps", spec["bandwidth_GBps"], f"{where}.bandwidth_GBps") * 1e9)
    else:
        raise ValueError(f"{where}: needs bandwidth_GBps or beta_s_per_byte")
    return Link(link_value("alpha_s", spec["alpha_s"], f"{where}.alpha_s"), beta)


@dataclass
class Network:
    """Costs of the operations the simulated optimizers issue, for one cluster."""

    intra: Link
    inter: Link
    gpus_per_node: int = 1
    allreduce: str = "auto"
    control_alpha_s: float | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_profile(cls, network: Mapping[str, Any], gpus_per_node: int, name: str = "network") -> Network:
        if not network:
            raise ValueError(
                f"{name}: the cluster profile has an empty `network:` section; "
                "fill it (alpha/beta per link level) or pass --calibrate RUN_DIR"
            )
        intra = parse_link(network.get("intra") or network["inter"], f"{name}.intra")
        inter = parse_link(network["inter"], f"{name}.inter")
        algo = network.get("allreduce", "auto")
        if algo not in (*ALGORITHMS, "auto"):
            raise ValueError(f"{name}.allreduce={algo!r}; choose one of: {', '.join(ALGORITHMS)}, auto")
        ctrl = network.get("control_alpha_s")
        return cls(intra, inter, max(1, int(gpus_per_node)), algo, None if ctrl is None else float(ctrl))

    @classmethod
    def free(cls) -> Network:
        """Zero-cost communication (the tests' ideal machine)."""
        zero = Link(0.0, 0.0)
        return cls(zero, zero, 1, "ring", 0.0)

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def link(self, ranks: Sequence[int]) -> Link:
        first = self.node(ranks[0])
        return self.intra if all(self.node(r) == first for r in ranks) else self.inter

    def group_allreduce(self, group: Sequence[int], nbytes: float) -> float:
        """One allreduce over the ranks of ``group`` (cached by size and whether it leaves a node)."""
        spans = self.link(group) is self.inter
        key = ("ar", len(group), spans, nbytes)
        if key not in self._cache:
            self._cache[key] = allreduce_time(
                self.allreduce, len(group), nbytes, self.inter if spans else self.intra
            )
        return self._cache[key]

    def world_allreduce(self, world_size: int, nbytes: float) -> float:
        return self.group_allreduce(range(world_size), nbytes) if world_size > 1 else 0.0

    def p2p(self, a: int, b: int, nbytes: float) -> float:
        return (self.intra if self.node(a) == self.node(b) else self.inter).p2p(nbytes)

    def control_latencies(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """:meth:`control` of each pair ``(a[i], b[i])``, for arrays of ranks."""
        if self.control_alpha_s is not None:
            return np.full(np.shape(a), float(self.control_alpha_s))
        same = np.asarray(a) // self.gpus_per_node == np.asarray(b) // self.gpus_per_node
        return np.where(same, self.intra.alpha_s, self.inter.alpha_s)

    def control(self, a: int, b: int) -> float:
        """A tiny control message (WAGMA's activation): latency only."""
        if self.control_alpha_s is not None:
            return self.control_alpha_s
        return (self.intra if self.node(a) == self.node(b) else self.inter).alpha_s
