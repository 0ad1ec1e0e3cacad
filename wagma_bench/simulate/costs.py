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
nodes over ``inter`` (Aries, InfiniBand). Ranks are placed on nodes in blocks of ``gpus_per_node`` (SLURM's
default block distribution). A flat algorithm (ring, recursive doubling, tree) whose group spans nodes is
charged at the inter-node level for every step (an upper bound: its intra-node steps are cheaper).

The node's network interface is shared: ``injection_GBps`` is what one node can send per direction, and the
flows that leave one node at the same time split it (:func:`flow_beta`: each gets the smaller of its own
link's bandwidth and the node's share). A flat ring sends one flow out of each node it crosses; recursive
doubling and the tree send one per member of the group on that node (every member's partner is off the node
in the stages that cross nodes); and the groups of one round that share a node (WAGMA's stage groups, one
member per node each) add up. ``hierarchical`` is the allreduce NCCL and Horovod pick on multi-GPU nodes:
a ring reduce-scatter inside each node, one ring allreduce between the nodes per local rank on its slice
(``m`` concurrent flows of ``n / m`` bytes out of each node), and a ring allgather inside the node:

``2 (m-1) alpha_intra + 2 (m-1)/m n beta_intra + 2 (N-1) alpha_inter + 2 (N-1)/N (n/m) beta_flow(m)``

with ``m`` members of the group per node and ``N`` nodes; with one rank per node it is the flat ring. ``auto``
(the default) takes the cheapest of the four, as tuned MPI and NCCL pick per size and scale.
``injection_GBps: null`` (the default) gives each rank of a node its own ``inter`` bandwidth (one NIC per GPU,
as in a DGX; or one rank per node, as on Daint): no flow is ever slowed by its neighbours, the model before
the injection limit existed.

The ``network`` section of ``conf/cluster/NAME.yaml`` holds the parameters::

    network:
      allreduce: auto                # ring | recursive_doubling | tree | hierarchical | auto
      intra: {alpha_s: 3.0e-6, bandwidth_GBps: 150}
      inter: {alpha_s: 1.5e-6, bandwidth_GBps: 9.0}
      injection_GBps: null           # a node's NIC bandwidth per direction, shared by its flows; null: none
      control_alpha_s: null          # latency of tiny control messages (WAGMA activations); null: link alpha

``bandwidth_GBps`` is per rank and direction (``beta = 1 / (bandwidth_GBps * 1e9)`` s/byte);
``beta_s_per_byte`` may be given instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

ALGORITHMS = ("ring", "recursive_doubling", "tree")  # flat: one link level for every step
HIERARCHICAL = "hierarchical"  # intra-node reduce-scatter, inter-node ring per local rank, intra allgather
CHOICES = (*ALGORITHMS, HIERARCHICAL, "auto")


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
    raise ValueError(f"unknown allreduce algorithm {algorithm!r}; choose one of: {', '.join(CHOICES)}")


def allreduce_time(algorithm: str, p: int, nbytes: float, link: Link) -> float:
    """Seconds of one flat allreduce of ``nbytes`` over ``p`` ranks on ``link``; ``auto``: the cheapest."""
    if algorithm == "auto":
        return min(allreduce_time(a, p, nbytes, link) for a in ALGORITHMS)
    a, b = allreduce_terms(algorithm, p, nbytes)
    return a * link.alpha_s + b * link.beta_s_per_byte


def flow_beta(link: Link, injection_Bps: float | None, flows: int) -> float:
    """Inverse bandwidth (s/byte) of one of ``flows`` flows that leave one node at the same time: each gets
    the smaller of its link's bandwidth and an equal share of the node's injection bandwidth (max-min
    fairness on the one shared resource); no limit where ``injection_Bps`` is None."""
    if injection_Bps is None or flows < 1:
        return link.beta_s_per_byte
    return max(link.beta_s_per_byte, flows / injection_Bps)


def concurrent_p2p_time(nbytes: float, flows: int, link: Link, injection_Bps: float | None) -> float:
    """Seconds until every one of ``flows`` concurrent messages of ``nbytes`` out of one node has arrived."""
    return link.alpha_s + nbytes * flow_beta(link, injection_Bps, flows)


def hierarchical_time(
    nodes: int, per_node: int, nbytes: float, intra: Link, inter: Link, beta_flow: float
) -> float:
    """Seconds of the hierarchical allreduce over ``nodes`` nodes with ``per_node`` members each: ring
    reduce-scatter inside the node, ring allreduce of each ``1/per_node`` slice between the nodes (the
    ``per_node`` rings run at once, each flow at inverse bandwidth ``beta_flow``), ring allgather inside."""
    m, n = max(1, per_node), max(1, nodes)
    inside = 2.0 * (m - 1) * intra.alpha_s + 2.0 * (m - 1) / m * nbytes * intra.beta_s_per_byte
    between = 2.0 * (n - 1) * inter.alpha_s + 2.0 * (n - 1) / n * (nbytes / m) * beta_flow if n > 1 else 0.0
    return inside + between


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
    injection_Bps: float | None = None  # a node's send bandwidth, shared by its concurrent flows; None: none
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
        if algo not in CHOICES:
            raise ValueError(f"{name}.allreduce={algo!r}; choose one of: {', '.join(CHOICES)}")
        ctrl = network.get("control_alpha_s")
        inj = network.get("injection_GBps")
        inj = None if inj is None else link_value("bandwidth_GBps", inj, f"{name}.injection_GBps") * 1e9
        return cls(intra, inter, max(1, int(gpus_per_node)), algo, None if ctrl is None else float(ctrl), inj)

    @classmethod
    def free(cls) -> Network:
        """Zero-cost communication (the tests' ideal machine)."""
        zero = Link(0.0, 0.0)
        return cls(zero, zero, 1, "ring", 0.0)

    def as_costed(self) -> Network:
        """This network in the form its costs read it: with one rank per node the hierarchical allreduce is
        the flat ring term for term (:func:`hierarchical_time` with one member a node: no part inside a node,
        0.0 added to the ring between the nodes on the whole model, the same products in the same order;
        inside one node it is the ring by definition), so ``allreduce: hierarchical`` is written ``ring``
        there. ``simulate --interval`` keys its memo with it (:func:`~wagma_bench.simulate.pool.sim_key`):
        on Piz Daint (one GPU a node) half of the structures (:mod:`~wagma_bench.simulate.structures`) are
        the other half's simulations (``tests/test_network_model.py`` checks every collective's cost to the
        bit)."""
        if self.allreduce == HIERARCHICAL and self.gpus_per_node == 1:
            return replace(self, allreduce="ring", _cache={})
        return self

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def link(self, ranks: Sequence[int]) -> Link:
        first = self.node(ranks[0])
        return self.intra if all(self.node(r) == first for r in ranks) else self.inter

    def group_allreduce(self, group: Sequence[int], nbytes: float, sharing: int = 1) -> float:
        """One allreduce over the ranks of ``group``, while ``sharing`` groups that span nodes (this one among
        them) send out of the same node at once (cached by size, nodes spanned and sharing)."""
        nodes = len({self.node(r) for r in group})
        if self.injection_Bps is None:
            sharing = 1  # no shared limit: the count cannot change the cost, keep the cache small
        key = ("ar", len(group), nodes, sharing, nbytes)
        if key not in self._cache:
            self._cache[key] = self._allreduce(len(group), nodes, nbytes, sharing)
        return self._cache[key]

    def _allreduce(self, p: int, nodes: int, nbytes: float, sharing: int) -> float:
        if nodes <= 1:  # inside one node: a flat algorithm on the intra-node link (hierarchical is the ring)
            algo = "ring" if self.allreduce == HIERARCHICAL else self.allreduce
            return allreduce_time(algo, p, nbytes, self.intra)
        per_node = -(-p // nodes)  # the most members of the group on one node
        costs = {}
        for algo in (*ALGORITHMS, HIERARCHICAL) if self.allreduce == "auto" else (self.allreduce,):
            flows = sharing * (1 if algo == "ring" else per_node)
            beta = flow_beta(self.inter, self.injection_Bps, flows)
            if algo == HIERARCHICAL:
                costs[algo] = hierarchical_time(nodes, per_node, nbytes, self.intra, self.inter, beta)
            else:
                costs[algo] = allreduce_time(algo, p, nbytes, Link(self.inter.alpha_s, beta))
        return min(costs.values())

    def groups_allreduce(self, groups: Sequence[Sequence[int]], nbytes: float) -> np.ndarray:
        """The cost of each of ``groups``' allreduces, run at once (one round's groups): a group that spans
        nodes shares each of its nodes' injection bandwidth with the other spanning groups there."""
        sharing = np.ones(len(groups), dtype=int)
        if self.injection_Bps is not None and self.gpus_per_node > 1:
            nodes = [{self.node(r) for r in g} for g in groups]
            on_node: dict[int, int] = {}
            for ns in nodes:
                for n in ns if len(ns) > 1 else ():
                    on_node[n] = on_node.get(n, 0) + 1
            sharing = np.array([max((on_node.get(n, 1) for n in ns), default=1) for ns in nodes])
        return np.array(
            [self.group_allreduce(g, nbytes, int(k)) if len(g) > 1 else 0.0 for g, k in zip(groups, sharing)]
        )

    def world_allreduce(self, world_size: int, nbytes: float) -> float:
        return self.group_allreduce(range(world_size), nbytes) if world_size > 1 else 0.0

    def p2p(self, a: int, b: int, nbytes: float, flows: int = 1) -> float:
        """One message from ``a`` to ``b`` while ``flows`` messages (this one among them) leave a's node."""
        if self.node(a) == self.node(b):
            return self.intra.p2p(nbytes)
        return concurrent_p2p_time(nbytes, flows, self.inter, self.injection_Bps)

    def node_flows(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """For messages ``src[i] -> dst[i]`` sent at once: how many leave ``src[i]``'s node (0 if intra)."""
        src_node, dst_node = np.asarray(src) // self.gpus_per_node, np.asarray(dst) // self.gpus_per_node
        off = src_node != dst_node
        counts = np.bincount(src_node[off], minlength=int(src_node.max(initial=0)) + 1)
        return np.where(off, counts[src_node], 0)

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
