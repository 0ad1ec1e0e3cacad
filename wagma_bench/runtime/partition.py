"""A job cut in two by the network: the side that is still connected names the host that is not, and records
the failure before SLURM ends the job step.

What happens without this, measured on the local two-host cluster (``slurmctl.sh start --nodes 2``, one host's
link taken down while it trains, ``comm.timeout_s=60``): every rank blocks in a collective; the heartbeats
in the shared run directory stay fresh on both sides (only the network is cut), so they cannot tell the
sides apart; SLURM marks the cut host DOWN after ``SlurmdTimeout`` and ends the step, killing the healthy
host's ranks ``KillWait`` later, long before the collectives time out, and nothing is recorded.

So each rank started by an external launcher (srun, torchrun, mpiexec) keeps a :class:`PartitionWatch`.
It listens on the address the other hosts reach it at (a socket that accepts and closes: proof of
reachability, published beside the host name in the rank's heartbeat file). Once the rank has made no
step for :data:`STALL_S`, it probes every other host (one rank there) and the SLURM controller, where there
is one. A host that fails :data:`PROBES` probes in a row is unreachable. The side that still reaches the
controller (without a controller: the side with more hosts, or on a tie the side of rank 0) is the
connected one: its lowest rank records the failure (``run_stop``, ``summary.json``, the run directory's
lock released), naming the unreachable hosts and their ranks, and every rank of the side exits. A cut-off
rank records nothing (on a real cluster it may not reach the file system either): it says that its host
was cut off and exits. A probe is a TCP connection, so a host whose ranks died but whose kernel answers
(a refused connection) counts as reachable: dead processes are the heartbeats' case
(:func:`wagma_bench.runtime.supervise.lost_ranks`).
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from wagma_bench import exits
from wagma_bench.runtime.hosts import route_interface
from wagma_bench.runtime.supervise import ranks_named

STALL_S = 5.0  # no step for this long: probe the other hosts (a healthy but slow step only costs probes)
PROBE_TIMEOUT_S = 2.0  # a host on the same network answers a TCP connection in milliseconds
PROBES = 2  # failed probes in a row that make a host unreachable
PROBE_EVERY_S = 1.0  # period of the watch: a stall is seen, and a stalled world probed, this often
SLURMCTLD_PORT = 6817  # SLURM's default
RECORD_S = 3.0  # the other connected ranks exit this much later than the one that records

_last_step = time.monotonic()


def stepped() -> None:
    """The trainer made a step: the network carried its collectives."""
    global _last_step
    _last_step = time.monotonic()


def reachable(addr: str, port: int, timeout_s: float | None = None) -> bool:
    """Whether ``addr`` answers a TCP connection to ``port`` within ``timeout_s`` (default
    :data:`PROBE_TIMEOUT_S`); a refusal is an answer."""
    try:
        with socket.create_connection((addr, port), timeout=timeout_s or PROBE_TIMEOUT_S):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:  # timed out, no route, network unreachable
        return False


def slurm_controller(env=os.environ) -> tuple[str, int] | None:
    """The SLURM controller's address and port from ``SLURM_CONF`` (``SlurmctldHost=NAME(ADDR)``); None
    outside SLURM or where the file does not say (a configless node)."""
    path = env.get("SLURM_CONF", "/etc/slurm/slurm.conf") if "SLURM_JOB_ID" in env else None
    try:
        text = Path(path).read_text() if path else ""
    except OSError:
        return None
    flags = re.MULTILINE | re.IGNORECASE
    host = re.search(r"^\s*(?:SlurmctldHost|ControlMachine)\s*=\s*([^\s(#]+)(?:\(([^)]+)\))?", text, flags)
    if host is None:
        return None
    port = re.search(r"^\s*SlurmctldPort\s*=\s*(\d+)", text, flags)
    return host.group(2) or host.group(1), int(port.group(1)) if port else SLURMCTLD_PORT


class ReachListener:
    """A TCP socket on this host's address toward ``peer_addr`` (the rendezvous host) that accepts and closes
    every connection, from a daemon thread (a listener that never accepts stops answering once its backlog
    is full)."""

    def __init__(self, peer_addr: str):
        found = route_interface(peer_addr)
        self.addr = found[1] if found else "127.0.0.1"
        self._sock = socket.create_server((self.addr, 0), backlog=64)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, name="reach-listener", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.close()


def read_peers(folder: Path, world_size: int) -> dict[int, tuple[str, str, int] | None]:
    """Each rank's (host, address, port) from its heartbeat file; None where it published no listener."""
    peers: dict[int, tuple[str, str, int] | None] = {}
    for r in range(world_size):
        try:
            lines = (folder / f"rank{r}").read_text().split()
        except OSError:
            continue
        peers[r] = (lines[0], lines[1], int(lines[2])) if len(lines) == 3 else None
    return peers


def decide(hosts: dict[str, list[int]], unreachable: set[str], controller: bool | None) -> bool:
    """Whether this rank's side of a partition is the connected one: it reaches the controller, where there
    is one (``controller``: None without); else it holds more hosts than the other side, or as many and
    rank 0's."""
    if controller is not None:
        return controller
    mine = len(hosts) - len(unreachable)
    if mine != len(unreachable):
        return mine > len(unreachable)
    return any(0 in ranks for host, ranks in hosts.items() if host not in unreachable)


class PartitionWatch:
    """Watch this rank's steps; on a stall, probe the other hosts and act on a partition (module docstring).

    ``record(error)`` writes the failure record (the lowest connected rank calls it); ``exit`` ends the
    process (``exits.die_now``: the main thread is blocked in a collective that will not return)."""

    def __init__(
        self,
        folder: Path,
        rank: int,
        world_size: int,
        record: Callable[[str], None],
        controller: tuple[str, int] | None = None,
        exit: Callable[[int], None] = exits.die_now,
    ):
        self.folder, self.rank, self.world_size = Path(folder), rank, world_size
        self.record, self.controller, self.exit = record, controller, exit
        self.host = socket.gethostname()
        self._failures: dict[str, int] = {}
        self._peers: dict[int, tuple[str, str, int] | None] = {}  # read once all ranks have published
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="partition-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(PROBE_EVERY_S):
            if time.monotonic() - _last_step < STALL_S:
                self._failures.clear()
                continue
            verdict = self.check()
            if verdict is not None:
                self._act(*verdict)
                return

    def check(self) -> tuple[dict[str, list[int]], set[str]] | None:
        """Probe once; the hosts (their ranks) and the unreachable ones once some host failed PROBES probes in
        a row, else None."""
        if len(self._peers) < self.world_size:  # the files are read again only while some are missing
            self._peers = read_peers(self.folder, self.world_size)
        peers = self._peers
        hosts: dict[str, list[int]] = {}
        for r, peer in sorted(peers.items()):
            if peer is not None:
                hosts.setdefault(peer[0], []).append(r)
        for host, ranks in hosts.items():
            if host == self.host:
                continue
            _, addr, port = peers[ranks[0]]
            self._failures[host] = 0 if reachable(addr, port) else self._failures.get(host, 0) + 1
        unreachable = {h for h, n in self._failures.items() if n >= PROBES}
        return (hosts, unreachable) if unreachable else None

    def _act(self, hosts: dict[str, list[int]], unreachable: set[str]) -> None:
        controller = None if self.controller is None else reachable(*self.controller)
        stalled = time.monotonic() - _last_step
        if decide(hosts, unreachable, controller):
            lost = "; ".join(f"host {h} lost: {ranks_named(hosts[h])}" for h in sorted(unreachable))
            error = (
                f"{lost} (unreachable from host {self.host} for {stalled:.0f} s without a step: its "
                "network link or the host is down)"
            )
            # the lowest rank of this side records (this rank's own host is on it)
            recorder = min(r for h, ranks in hosts.items() if h not in unreachable for r in ranks)
            if self.rank == recorder:
                self.record(error)
            else:
                time.sleep(RECORD_S)  # under --kill-on-bad-exit, SLURM would kill the recorder when we exit
            message = f"rank {self.rank} on {self.host}: {error}"
        else:
            where = "the SLURM controller" if controller is not None else "the other hosts"
            message = (
                f"rank {self.rank} on {self.host}: this host is cut off (it reaches neither "
                f"{where} nor hosts {', '.join(sorted(unreachable))}); the ranks on the other side "
                "record the failure"
            )
        print(f"wagma-bench run: error: {message}", file=sys.stderr, flush=True)
        self.exit(exits.FAILED)
