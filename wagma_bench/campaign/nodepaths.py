"""Paths the compute nodes can see: a sweep rendered on a login node writes its run directories, logs and
scripts under ``--out`` and starts the Python of its venv there; a path under ``/tmp``, ``/dev/shm`` or on a
memory file system of the rendering host is that host's own, and the jobs fail at their start on the nodes
(or write where nobody looks). Said in one warning line naming the paths, not refused: a one-host cluster
(``cluster=local``, the tests) shares them."""

from __future__ import annotations

from pathlib import Path

NODE_LOCAL_PREFIXES = ("/tmp", "/var/tmp", "/dev/shm", "/run/user")
NODE_LOCAL_FS = {"tmpfs", "ramfs"}  # memory file systems: always the host's own
MOUNTS = Path("/proc/mounts")


def _mounts() -> list[tuple[str, str]]:
    """(mount point, file system type) of this host, longest mount point first."""
    try:
        lines = MOUNTS.read_text().splitlines()
    except OSError:
        return []
    rows = [(f[1].replace("\\040", " "), f[2]) for f in (line.split() for line in lines) if len(f) >= 3]
    return sorted(rows, key=lambda r: len(r[0]), reverse=True)


def node_local(path: str | Path) -> str | None:
    """Why ``path`` is this host's own (a node-local prefix or a memory file system), None where not known to
    be. Both the path as given and its resolution count: a link into /tmp is still /tmp."""
    given = Path(path).expanduser().absolute()
    for candidate in dict.fromkeys((given, given.resolve())):
        text = str(candidate)
        for prefix in NODE_LOCAL_PREFIXES:
            if text == prefix or text.startswith(prefix + "/"):
                return f"under {prefix}"
        for mount, fstype in _mounts():
            if text == mount or text.startswith(mount.rstrip("/") + "/"):
                if fstype in NODE_LOCAL_FS:
                    return f"on {fstype} at {mount}"
                break
    return None


def warning_line(named: dict[str, str | None]) -> str | None:
    """One warning naming each of ``named`` (what -> path) that compute nodes may not see; None if none."""
    found = [(what, path, node_local(path)) for what, path in named.items() if path]
    found = [f"{what} {path} ({why})" for what, path, why in found if why]
    if not found:
        return None
    return (
        f"warning: {'; '.join(found)}: a path of this host that compute nodes do not see (their /tmp, "
        "/dev/shm are their own); render into a shared file system (home, project, scratch), unless "
        "this host is the cluster"
    )
