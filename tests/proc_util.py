"""The processes of a local ``wagma-bench run``, as the tests find them from the launcher's PID.

The launcher starts a fork server (``multiprocessing.forkserver``) and the run's store process and its ranks
are forked from it, so the ranks are the server's children, not the launcher's; they are forked in rank order,
so PID order is rank order (the tests' runs are far from a PID wrap-around)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from wagma_bench.runtime.launch import STORE_PROCESS_NAME


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:  # it has ended
        return []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def fork_servers(launcher: int) -> list[int]:
    """The fork server of the local launcher ``launcher`` (a list: empty before it starts and after it
    ends)."""
    return [p for p in children(launcher) if b"forkserver" in _cmdline(p)]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def rank_pids(launcher: int) -> list[int]:
    """The live ranks of the local launcher ``launcher``, by rank (not its fork server, its resource tracker,
    or the run's store process, which the server forks first and which names itself)."""
    return sorted(
        p for server in fork_servers(launcher) for p in children(server) if _comm(p) != STORE_PROCESS_NAME
    )


def first_fork_server(launcher: subprocess.Popen) -> int:
    """The PID of the fork server of ``launcher`` (a local ``wagma-bench run`` or ``comm-bench``) as soon as
    it exists, polled every 5 ms: it starts early, its imports overlapping the launcher's own start-up."""
    deadline = time.monotonic() + 60
    while not (servers := fork_servers(launcher.pid)):
        assert time.monotonic() < deadline and launcher.poll() is None, "no fork server started"
        time.sleep(0.005)
    return servers[0]


@contextlib.contextmanager
def held(pid: int):
    """Process ``pid`` stopped (SIGSTOP) for the block and continued (SIGCONT) after it, if it still
    exists."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def held_fork_server(launcher: subprocess.Popen):
    """The fork server of ``launcher`` held from the moment it appears until the block ends: no rank can be
    forked in the block. Yields its PID."""
    with held(first_fork_server(launcher)) as server:
        yield server


def listening_ports(pid: int) -> list[int]:
    """The TCP ports (IPv4) on which process ``pid`` itself listens: its sockets' inodes, found in the
    kernel's table of its network namespace in the LISTEN state."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = []
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # st 0A: LISTEN
            ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` now: its children, theirs, ... (the launcher's fork server, resource
    tracker, store process and ranks)."""
    out, todo = [], children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return sorted(out)


def heavy_modules_after(code: str, heavy: tuple[str, ...]) -> list[str]:
    """Which of the ``heavy`` modules a fresh interpreter has imported after running ``code`` (so that what
    the test session imported does not count); fails on the code's own error."""
    import ast
    import sys

    probe = f"{code}\nimport sys\nprint(sorted(m for m in {heavy!r} if m in sys.modules))\n"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])
