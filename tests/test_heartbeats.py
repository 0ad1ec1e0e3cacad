"""Heartbeats in the shared run directory (ranks of srun, torchrun, mpiexec): each host writes at most
``HOST_BEATS_PER_S`` times a second whatever its number of ranks, and the readers, which name lost hosts,
apply the same periods (a rank that beats slowly is not taken for a lost one; a lost one is still named)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from wagma_bench.runtime import supervise
from wagma_bench.runtime.supervise import (
    HEARTBEATS,
    HOST_BEATS_PER_S,
    LOST_AFTER_BEATS,
    end_heartbeat,
    lost_ranks,
    shared_period_s,
    start_heartbeat,
)


def test_a_hosts_heartbeat_writes_are_bounded_whatever_its_ranks():
    for ranks in (1, 2, 4, 8, 16, 64):
        assert ranks / shared_period_s(ranks) <= HOST_BEATS_PER_S
        assert shared_period_s(ranks) >= supervise.SHARED_HEARTBEAT_S
    assert shared_period_s(2) == 2.0 and shared_period_s(8) == 8.0  # 2 ranks a host: as fast as before


def test_eight_ranks_of_one_host_write_at_most_the_hosts_bound(tmp_path, monkeypatch):
    """Eight ranks' heartbeat threads, as the launcher starts them (period ``shared_period_s(8)``), on a clock
    20 times faster than the real one; every write (``os.utime``) counted over a window once all have started.
    One beat every SHARED_HEARTBEAT_S per rank, as before, writes 4 times the bound."""
    monkeypatch.setattr(supervise, "SHARED_HEARTBEAT_S", supervise.SHARED_HEARTBEAT_S / 20)
    monkeypatch.setattr(supervise, "HOST_BEATS_PER_S", HOST_BEATS_PER_S * 20)
    folder, ranks, window_s = tmp_path / HEARTBEATS, 8, 2.0
    writes, lock, counting = [], threading.Lock(), threading.Event()
    real_utime = os.utime

    def utime(path, *args, **kwargs):
        if counting.is_set() and Path(path).parent == folder:
            with lock:
                writes.append(path)
        return real_utime(path, *args, **kwargs)

    monkeypatch.setattr(os, "utime", utime)
    for r in range(ranks):
        start_heartbeat(folder, r, supervise.shared_period_s(ranks))
    counting.set()
    time.sleep(window_s)
    counting.clear()
    for r in range(ranks):
        end_heartbeat(folder, r)
    bound = (
        supervise.HOST_BEATS_PER_S * window_s + ranks
    )  # each rank may beat once more in a window (its phase)
    assert 0 < len(writes) <= bound, (len(writes), bound)
    assert len({str(p) for p in writes}) == ranks  # and every rank beat in it


def _beats(folder: Path, hosts: dict[int, str], ages: dict[int, float]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for r, host in hosts.items():
        path = folder / f"rank{r}"
        path.write_text(host)
        os.utime(path, (now - ages.get(r, 0.0), now - ages.get(r, 0.0)))


def test_slow_beats_of_a_crowded_host_are_not_a_loss_but_a_stopped_host_is_named(tmp_path):
    """Host a runs 8 ranks (period 8 s), host b one (2 s). Rank 8's collective failed: a 20 s old beat of host
    a is within 3 of its periods (before: lost after 6 s, whatever the host); 30 s old, host a is lost."""
    hosts = {**{r: "a" for r in range(8)}, 8: "b"}
    folder = tmp_path / HEARTBEATS
    within = LOST_AFTER_BEATS * shared_period_s(8) - 4
    _beats(folder, hosts, {r: within for r in range(8)})
    periods = supervise._shared_periods(hosts)
    assert periods == {**{r: 8.0 for r in range(8)}, 8: 2.0}
    assert supervise._stale_shared(folder, 8, 9, periods) == {}
    _beats(folder, hosts, {r: within + 10 for r in range(8)})
    lost = lost_ranks(tmp_path, 8, 9, RuntimeError("Connection closed by peer"))
    assert lost is not None and lost.ranks == list(range(8))
    assert str(lost).startswith("host a lost: ranks 0, 1, 2, 3, 4, 5, 6, 7 (no heartbeat for 30 s)"), str(
        lost
    )
