"""The network as clusters are built (wagma_bench/simulate/costs.py): a node's injection bandwidth shared by
the flows that leave it at once, and the hierarchical allreduce beside the flat ones. Pure functions, no
simulation."""

from __future__ import annotations

import numpy as np
import pytest

from wagma_bench.simulate.configure import load_network
from wagma_bench.simulate.costs import (
    Link,
    Network,
    allreduce_time,
    concurrent_p2p_time,
    hierarchical_time,
)
from wagma_bench.simulate.des import p2p_each

NIC = 3.125e9  # 25 Gbit/s, bytes/s
LINK = Link(2e-6, 1 / NIC)  # one flow alone can fill the NIC


def test_eight_flows_out_of_one_node_take_eight_times_one_flow_at_the_nic_limit():
    n = 100e6
    one = concurrent_p2p_time(n, 1, LINK, NIC) - LINK.alpha_s
    eight = concurrent_p2p_time(n, 8, LINK, NIC) - LINK.alpha_s
    assert eight == pytest.approx(8 * one)
    # a NIC eight times a flow's own bandwidth (one NIC per GPU) does not slow them
    assert concurrent_p2p_time(n, 8, LINK, 8 * NIC) == pytest.approx(concurrent_p2p_time(n, 1, LINK, 8 * NIC))
    # and without a shared limit (injection_GBps: null) the flows are independent
    assert concurrent_p2p_time(n, 8, LINK, None) == pytest.approx(LINK.p2p(n))


def _net(gpus_per_node: int, algo: str = "auto", injection: float | None = NIC) -> Network:
    return Network(Link(5e-6, 1 / 12e9), LINK, gpus_per_node, algo, None, injection)


def test_a_network_sends_concurrent_messages_through_the_shared_nic():
    net = _net(8)
    n = 50e6
    assert net.p2p(0, 8, n, flows=8) - LINK.alpha_s == pytest.approx(8 * (net.p2p(0, 8, n) - LINK.alpha_s))
    assert net.p2p(0, 1, n, flows=8) == pytest.approx(net.intra.p2p(n))  # inside a node: no NIC
    # ranks 0..7 of node 0 all send to node 1, rank 8 inside node 1: eight flows leave node 0, none node 1
    flows = net.node_flows(np.arange(9), np.array([8] * 8 + [9]))
    assert flows.tolist() == [8] * 8 + [0]


def test_hierarchical_allreduce_is_the_ring_with_one_rank_per_node_and_pays_the_nic_once_per_node():
    n, nodes = 100e6, 16
    flat = _net(1, "ring")
    hier = _net(1, "hierarchical")
    assert hier.world_allreduce(nodes, n) == pytest.approx(flat.world_allreduce(nodes, n))
    # four ranks a node sharing one NIC: the node's whole model crosses its NIC, 2 (N-1)/N n / NIC, plus the
    # intra-node reduce-scatter and allgather
    net4 = _net(4, "hierarchical")
    inside = 2 * 3 * 5e-6 + 2 * 3 / 4 * n / 12e9
    between = 2 * (nodes - 1) * LINK.alpha_s + 2 * (nodes - 1) / nodes * n / NIC
    assert net4.world_allreduce(4 * nodes, n) == pytest.approx(inside + between)
    assert hierarchical_time(nodes, 4, n, net4.intra, net4.inter, 4 / NIC) == pytest.approx(inside + between)
    # the flat ring over all 64 ranks: one flow a node, but every step crosses at the inter-node rate
    assert _net(4, "ring").world_allreduce(4 * nodes, n) == pytest.approx(allreduce_time("ring", 64, n, LINK))
    # auto: the cheapest of the four
    auto = _net(4).world_allreduce(4 * nodes, n)
    assert auto == pytest.approx(
        min(
            _net(4, a).world_allreduce(4 * nodes, n)
            for a in ("ring", "recursive_doubling", "tree", "hierarchical")
        )
    )


def test_with_one_rank_per_node_hierarchical_costs_what_the_ring_costs_to_the_bit():
    """Network.as_costed (simulate --interval's memo key): one rank a node, the hierarchical allreduce is the
    ring to the bit, for any group, size and sharing of the NIC; with several ranks a node it is kept."""
    for injection in (NIC, None):
        hier, flat = _net(1, "hierarchical", injection), _net(1, "ring", injection)
        assert hier.as_costed() == flat and hier.as_costed().allreduce == "ring"
        for p in (1, 2, 3, 7, 64, 1000):
            for n in (4.0, 1e6 + 0.3, 1.1e8):
                assert hier.world_allreduce(p, n).hex() == flat.world_allreduce(p, n).hex(), (p, n)
                for sharing in (1, 3):
                    got = hier.group_allreduce(range(1, p + 1), n, sharing)
                    assert got.hex() == flat.group_allreduce(range(1, p + 1), n, sharing).hex(), (p, n)
    several = _net(4, "hierarchical")
    assert several.as_costed() is several and _net(1, "auto").as_costed().allreduce == "auto"


def test_groups_that_share_a_node_share_its_nic():
    """WAGMA's later stages: eight groups, one member on each of eight nodes: every node sends eight flows."""
    net, n = _net(8, "ring"), 100e6
    across = [[node * 8 + k for node in range(8)] for k in range(8)]
    alone = net.group_allreduce(across[0], n)
    together = net.groups_allreduce(across, n)
    bw = lambda t: t - 2 * 7 * LINK.alpha_s  # the bandwidth term
    assert bw(together[0]) == pytest.approx(8 * bw(alone))
    inside = [list(range(node * 8, node * 8 + 8)) for node in range(8)]
    assert net.groups_allreduce(inside, n).tolist() == pytest.approx(
        [allreduce_time("ring", 8, n, net.intra)] * 8
    )


def test_the_profile_keys_are_read_and_checked():
    net = load_network("generic4", ["network.injection_GBps=3.125", "network.allreduce=hierarchical"])
    assert net.injection_Bps == pytest.approx(NIC) and net.allreduce == "hierarchical"
    assert load_network("daint", []).injection_Bps is None
    with pytest.raises(ValueError, match="injection_GBps=-1 is not allowed"):
        Network.from_profile({"inter": {"alpha_s": 0, "bandwidth_GBps": 1}, "injection_GBps": -1}, 4)
    with pytest.raises(ValueError, match="hierarchical"):
        Network.from_profile({"inter": {"alpha_s": 0, "bandwidth_GBps": 1}, "allreduce": "butterfly"}, 4)


def test_p2p_each_is_each_message_s_p2p_to_the_bit():
    """The simulator's costs of many messages at once (des.p2p_each: once per kind of message) are each
    message's own, float for float, inside and between nodes, with and without a NIC limit."""
    rng = np.random.default_rng(3)
    src, dst = rng.integers(0, 40, 300), rng.integers(0, 40, 300)
    for injection in (None, 3e9):
        net = Network(Link(1e-6, 1 / 20e9), Link(5e-6, 1 / 9e9), 4, injection_Bps=injection)
        flows = net.node_flows(src, dst)
        for nbytes in (0, 112e6):
            want = [net.p2p(int(a), int(b), nbytes, int(f)) for a, b, f in zip(src, dst, flows)]
            assert p2p_each(net, src, dst, nbytes, flows).tolist() == want
