"""Schedules are pure functions: tested without processes."""

from __future__ import annotations

import itertools

import pytest

from wagma_bench.comm import topology as t


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 31, 64, 100, 1024])
def test_default_group_size_is_a_power_of_two_near_sqrt(p):
    s = t.default_group_size(p)
    assert s & (s - 1) == 0
    if p >= 2:
        assert 2 <= s <= t.padded_world(p)
        assert s / 2 < p**0.5 * 2**0.5 + 1e-9 and s >= p**0.5 / 2**0.5 - 1e-9


def butterfly_group(rank: int, world_size: int, group_size: int, step: int) -> tuple[int, ...]:
    """The group of ``rank`` at ``step`` (stages alternate round-robin with the step)."""
    (group,) = [g for g in t.butterfly_stage(world_size, group_size, step) if rank in g]
    return group


def test_paper_group_sizes():
    assert t.default_group_size(64) == 8
    assert t.default_group_size(1024) == 32
    assert t.default_group_size(4) == 2
    assert t.default_group_size(16) == 4


@pytest.mark.parametrize(
    "p,s",
    [(2, 2), (4, 2), (8, 2), (8, 4), (16, 4), (64, 8), (1024, 32), (3, 2), (6, 2), (7, 4), (12, 4), (100, 8)],
)
def test_every_stage_partitions_the_world_into_groups_of_the_expected_size(p, s):
    q = t.padded_world(p)
    for k in range(t.num_stages(p, s)):
        groups = t.butterfly_stage(p, s, k)
        members = sorted(itertools.chain.from_iterable(groups))
        assert members == list(range(p))
        if p == q:  # power of two: groups of exactly S, except a narrower last stage
            bits = q.bit_length() - 1
            width = min(s.bit_length() - 1, bits - k * (s.bit_length() - 1))
            assert {len(g) for g in groups} == {1 << width}
        else:
            assert all(1 <= len(g) <= s for g in groups)
        for g in groups:  # ranks in a group differ only in the stage's bits
            lo = k * (s.bit_length() - 1)
            mask = ~((s - 1) << lo)
            assert len({r & mask for r in g}) == 1


def test_two_consecutive_stages_connect_every_pair_at_p64_s8():
    p, s = 64, 8
    assert t.num_stages(p, s) == 2
    reach = {r: set(butterfly_group(r, p, s, 0)) for r in range(p)}
    for r in range(p):
        two_hop = set()
        for m in reach[r]:
            two_hop |= set(butterfly_group(m, p, s, 1))
        assert two_hop == set(range(p))


def _mixing_steps(p, s):
    known = {r: {r} for r in range(p)}
    step = 0
    while any(len(v) < p for v in known.values()):
        nxt = {}
        for g in t.butterfly_stage(p, s, step):
            union = set().union(*(known[r] for r in g))
            nxt.update({r: union for r in g})
        known, step = nxt, step + 1
        assert step <= 4 * t.num_stages(p, s), "schedule does not mix"
    return step


@pytest.mark.parametrize("p,s", [(4, 2), (8, 2), (16, 4), (64, 8), (1024, 32), (32, 8)])
def test_power_of_two_worlds_mix_within_one_period(p, s):
    assert _mixing_steps(p, s) == t.num_stages(p, s)


@pytest.mark.parametrize("p,s", [(3, 2), (5, 2), (6, 4), (7, 2), (12, 4), (100, 8), (1000, 32)])
def test_other_worlds_mix_within_two_periods(p, s):
    assert _mixing_steps(p, s) <= 2 * t.num_stages(p, s)


def test_stages_alternate_round_robin():
    assert butterfly_group(5, 16, 4, 0) == butterfly_group(5, 16, 4, 2)
    assert butterfly_group(5, 16, 4, 0) != butterfly_group(5, 16, 4, 1)


def test_group_size_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        t.butterfly_stage(8, 3, 0)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_hypercube_neighbours_are_symmetric_and_connected(n):
    group = tuple(range(10, 10 + n))
    nbrs = {r: t.hypercube_neighbours(r, group) for r in group}
    for r, ns in nbrs.items():
        assert all(r in nbrs[m] for m in ns)
    seen, frontier = {group[0]}, [group[0]]
    while frontier:
        frontier = [m for r in frontier for m in nbrs[r] if m not in seen]
        seen |= set(frontier)
    assert seen == set(group)


def test_ring_and_exponential_graph():
    assert t.ring_neighbours(0, 5) == (4, 1)
    assert t.ring_neighbours(0, 2) == (1,)
    assert t.ring_neighbours(0, 1) == ()
    p = 8
    for step in range(6):
        outs = [t.exponential_peer(r, p, step) for r in range(p)]
        assert sorted(outs) == list(range(p))  # a permutation: every rank receives exactly once
        assert all(t.exponential_in_peer(o, p, step) == r for r, o in enumerate(outs))
        assert outs[0] == 1 << (step % 3)


@pytest.mark.parametrize("p", [2, 4, 7, 8])
def test_random_matching_pairs_actives_with_passives(p):
    for step in range(5):
        m = t.random_matching(p, step, seed=3)
        assert m == t.random_matching(p, step, seed=3)
        for a, b in m.items():
            assert m[b] == a
            assert a == b or (a % 2) != (b % 2)


@pytest.mark.parametrize("p", [1, 2, 3, 7, 8, 130])
def test_exponential_peers_are_every_rank_s_peers(p):
    for step in range(10):
        out, inn = t.exponential_peers(p, step)
        assert out.tolist() == [t.exponential_peer(r, p, step) for r in range(p)]
        assert inn.tolist() == [t.exponential_in_peer(r, p, step) for r in range(p)]
