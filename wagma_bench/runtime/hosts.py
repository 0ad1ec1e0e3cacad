"""Ranks on several hosts: the rendezvous host's address, gloo's socket interface, and a reachability check.

Three things that only go wrong across hosts, each measured on the local multi-host cluster
(``slurm/local/slurmctl.sh start --nodes N``, docs/multinode.md):

- A SLURM node name need not resolve (DNS or /etc/hosts); slurmctld reaches the node at its ``NodeAddr``.
  :func:`node_address` asks slurmctld when the name does not resolve.
- gloo binds to the address its host name resolves to, and falls back to loopback where it resolves to none
  (or, as on Debian's default /etc/hosts, to 127.0.1.1): ranks on other hosts then cannot connect.
  :func:`choose_gloo_interface` sets ``GLOO_SOCKET_IFNAME`` to the interface of the route to the rendezvous
  host when the user has not named one.
- A named interface that does not exist, or that the other hosts cannot reach, ends in gloo's own error,
  which names addresses only (``failed to connect ... remote=[127.0.0.1]:PORT ... Connection refused``,
  after 3 retries where the connection is refused; where nothing answers, after the connect timeout).
  :func:`check_reachable` fails in seconds, naming the interface, the hosts and the ranks.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import socket
import struct
import subprocess
from datetime import timedelta

SIOCGIFADDR = 0x8915  # ioctl: an interface's IPv4 address
CONNECT_TIMEOUT_S = 5.0  # a neighbour's listener answers at once where the route exists


class NetworkError(RuntimeError):
    """The ranks' hosts cannot reach each other as configured; the message names the interface and hosts."""


def node_address(host: str) -> str:
    """An address of a SLURM node: its name where the resolver knows it, else the ``NodeAddr`` slurmctld
    has for it (nodes named apart from their addresses, as the local cluster's hosts are)."""
    try:
        socket.getaddrinfo(host, None, socket.AF_INET)
        return host
    except socket.gaierror:
        pass
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", "-o", host], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    found = re.search(r"\bNodeAddr=(\S+)", out)
    if found is None:
        raise NetworkError(
            f"the rendezvous host {host} (the job's first node) does not resolve, and scontrol "
            "knows no NodeAddr for it; set MASTER_ADDR to an address of that node"
        )
    return found.group(1)


def interface_address(name: str) -> str:
    """The IPv4 address of interface ``name``; NetworkError naming it (and the host's interfaces) if none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError as err:
            have = ", ".join(n for _, n in socket.if_nameindex())
            why = "no such interface" if err.errno == 19 else f"no IPv4 address ({err.strerror})"
            raise NetworkError(
                f"GLOO_SOCKET_IFNAME={name}: {why} on host {socket.gethostname()} (its interfaces: {have})"
            ) from None
    return socket.inet_ntoa(packed[20:24])


def route_interface(addr: str) -> tuple[str, str] | None:
    """The interface (name, address) this host sends from to reach ``addr``; None where none is found."""
    try:
        target = socket.gethostbyname(addr)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))  # no packet is sent: this only asks the routing table
            source = s.getsockname()[0]
    except OSError:
        return None
    for _, name in socket.if_nameindex():
        try:
            if interface_address(name) == source:
                return name, source
        except NetworkError:
            continue
    return None


def choose_gloo_interface(master_addr: str, env) -> str | None:
    """Set ``GLOO_SOCKET_IFNAME`` (in ``env``) to the interface that reaches the rendezvous host, unless the
    user named one or the rendezvous is on loopback (one host). Returns the interface gloo will use."""
    if env.get("GLOO_SOCKET_IFNAME"):
        return env["GLOO_SOCKET_IFNAME"]
    found = route_interface(master_addr)
    if found is None or ipaddress.ip_address(found[1]).is_loopback:
        return None
    env["GLOO_SOCKET_IFNAME"] = found[0]
    return found[0]


def check_reachable(
    store,
    rank: int,
    world_size: int,
    interface: str | None,
    prefix: str = "wagma/reach",
    timeout_s: float = CONNECT_TIMEOUT_S,
) -> None:
    """Before gloo connects its full mesh: each rank listens on the address gloo will use, publishes it in
    the rendezvous store, and connects to the next rank's (a ring visits every host). Any rank that cannot
    connect records why; after all have tried, every rank raises :class:`NetworkError` with the first
    reason, so the whole world fails in seconds, naming the interface, the hosts and the ranks.

    The listener never accepts: the kernel completes the connection (the backlog), so no thread of ours
    must run while the main thread waits in the store (which holds the interpreter)."""
    host = socket.gethostname()
    addr = interface_address(interface) if interface else "127.0.0.1"
    named = os.environ.get("GLOO_SOCKET_IFNAME") == interface and interface is not None
    mine = f"GLOO_SOCKET_IFNAME={interface}" if named else f"interface {interface or 'lo'}"
    with socket.create_server((addr, 0), backlog=8) as listener:
        store.set(f"{prefix}/{rank}", f"{host} {addr} {listener.getsockname()[1]} {mine}")
        peer = (rank + 1) % world_size
        peer_host, peer_addr, peer_port, peer_if = store.get(f"{prefix}/{peer}").decode().split(" ", 3)
        error = _try_connect(addr, peer_addr, int(peer_port), timeout_s)
        if error:
            store.compare_set(
                f"{prefix}/error",
                "",
                (
                    f"{peer_if}: rank {peer} on host {peer_host} listens at {peer_addr}, which rank {rank} "
                    f"on host {host} ({mine}, {addr}) cannot reach: {error}; name an interface that the "
                    "other hosts reach in GLOO_SOCKET_IFNAME, or unset it (the interface of the route to the "
                    "rendezvous host is chosen)"
                ),
            )
        if store.add(f"{prefix}/tried", 1) == world_size:
            store.set(f"{prefix}/done", "1")
        store.wait([f"{prefix}/done"], timedelta(seconds=max(timeout_s * 4, 60)))
    if store.check([f"{prefix}/error"]):
        message = store.get(f"{prefix}/error").decode()
        if message:
            raise NetworkError(message)


def _try_connect(source: str, addr: str, port: int, timeout_s: float) -> str | None:
    """None if a connection from ``source`` to ``addr:port`` is established; else why not."""
    try:
        with socket.create_connection((addr, port), timeout=timeout_s, source_address=(source, 0)):
            return None
    except OSError as err:
        return err.strerror or type(err).__name__
