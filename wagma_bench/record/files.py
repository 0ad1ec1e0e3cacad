"""Files a run or a command writes, written safely: never through a symbolic link (someone else's link in a
shared output directory is refused, naming it), atomically (a temporary file beside the target, then a
rename: a crash leaves the old file or the new one), as strict JSON (no bare NaN); and JSONL read back with a
torn last line skipped; a command's outputs staged beside their folder and moved in at the end (a failure
leaves the folder as it was). Every output file of every command goes through here; :mod:`.events` holds the
run's event schema and readers."""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import lzma
import math
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

# defined with the other errors: every command answers it with exit 2 (wagma_bench.exits.run_body)
from wagma_bench.errors import SymlinkRefused

RUN_HINT = "a run never writes through a link: remove it, or choose another hydra.run.dir"
OUTPUT_HINT = "wagma-bench never writes through a link: remove it, or choose another output directory"
# xz settings of a committed result's compressed files (the step table, the event log): the smallest xz makes,
# and its header has no time stamp, so the same content gives the same bytes
XZ_PRESET = 9 | lzma.PRESET_EXTREME


def refuse_link(path: Path, hint: str = RUN_HINT) -> SymlinkRefused:
    return SymlinkRefused(errno.ELOOP, f"{_is_a_link(path)}; {hint}")


def _is_a_link(path: Path) -> str:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return f"{path} is a symbolic link (to {target})"


def open_run_file(path: Path, mode: str, hint: str = RUN_HINT) -> IO:
    """Open a file of a run (or a command's log) for writing (``mode``: w, a, wb, ab) without following a
    symbolic link in its last component (O_NOFOLLOW; its folders are checked by :func:`run_subdir`). Raises
    :class:`SymlinkRefused`."""
    flags = (
        os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    )
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise refuse_link(path, hint) from None
        raise
    return os.fdopen(fd, mode)


def run_subdir(path: Path, hint: str = RUN_HINT) -> Path:
    """Create a folder of a run (``steps``, ``checkpoint/round-R``) or of a command's output (``logs``);
    refuse one that is a symbolic link (checked before mkdir too, which fails on a dangling link with "File
    exists")."""
    if path.is_symlink():
        raise refuse_link(path, hint)
    path.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        raise refuse_link(path, hint)
    return path


def atomic_write(path: Path, write: Callable[[Any], Any], binary: bool = False) -> None:
    """Write ``path`` through ``write(file)`` on a temporary file beside it, then rename it into place: a
    crash leaves the old or the new file. On an error (a full disk) the temporary file is removed. Every
    output file of every command is written here (run files, reports, tunings, sweeps, predictions, claims).

    A symbolic link at ``path`` is refused, naming it (someone else's link in a shared output directory must
    not be silently replaced, nor written through). The temporary file gets a fresh name, created exclusively
    (O_CREAT|O_EXCL, never through a link planted under a guessable name)."""
    if path.is_symlink():
        raise refuse_link(path, OUTPUT_HINT)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp")
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the run's files from the user's group
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def staged_outputs(out: Path, hint: str = OUTPUT_HINT, owned: tuple[str, ...] = ()) -> Iterator[Path]:
    """A command's outputs (``report --out``, ``claims --out``) built in a fresh folder beside ``out``, then
    moved in: the caller writes every file into the folder yielded, and only when the block ends without
    an error is each moved to the same name under ``out`` (``os.replace``). So a refusal, a full disk or any
    error partway leaves ``out`` as it was, its previous outputs or nothing, never a mix of two runs of the
    command; the folder is removed in every case.

    The folder (``.NAME.tmp-XXXXXXXX``, mkdtemp: fresh, private) is a sibling of ``out`` so that the moves are
    renames inside one file system: they need no room and cannot fail halfway for want of it. A symbolic link
    in ``out`` where an output goes is refused, naming it, before the first file is moved. ``out`` itself may
    be a link (the user's own choice, followed as ``hydra.run.dir`` is).

    ``owned``: the names of every output the command may write; those this run did not write are removed from
    ``out`` with the move (an earlier run's figure would otherwise sit beside this run's table). The folder's
    name holds the host and PID that made it: one that a killed run left (SIGKILL runs no ``finally``) is
    removed by the next run on its host, and one of another host is named, never touched."""
    out = Path(out)
    real = out.resolve()
    real.parent.mkdir(parents=True, exist_ok=True)
    _clear_leftovers(real)
    prefix = f".{real.name}.tmp-{socket.gethostname()}-{os.getpid()}-"
    stage = Path(tempfile.mkdtemp(dir=real.parent, prefix=prefix))
    try:
        yield stage
        stale = [out / n for n in owned if not (stage / n).exists()]  # an earlier run's, not this one's
        _move_in(stage, out, hint)
        for path in stale:
            if path.is_file() and not path.is_symlink():
                path.unlink()
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _clear_leftovers(real: Path) -> None:
    """Remove the staging folders beside ``real`` that a killed run of this host left; name the others."""
    for folder in sorted(real.parent.glob(f".{glob.escape(real.name)}.tmp-*")):
        host, _, rest = folder.name[len(real.name) + 6 :].rpartition("-")[0].rpartition("-")
        pid = int(rest) if rest.isdigit() else None
        if host == socket.gethostname() and pid is not None and not _alive(pid):
            shutil.rmtree(folder, ignore_errors=True)
            print(f"wagma-bench: removed {folder}, left by a killed run (PID {pid})", file=sys.stderr)
        elif host != socket.gethostname() or pid is None:
            print(
                f"wagma-bench: {folder} is left from an earlier run (of another host, or older); "
                "remove it once no run writes there",
                file=sys.stderr,
            )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _move_in(stage: Path, out: Path, hint: str) -> None:
    files = sorted(p.relative_to(stage) for p in stage.rglob("*") if not p.is_dir())
    # every destination checked before the first move, so a refusal leaves ``out`` as it was; all the links
    # named at once, so that one rerun after removing them goes through
    places = dict.fromkeys(out / p for rel in files for p in [*reversed(rel.parents), rel] if p != Path("."))
    links = [path for path in places if path.is_symlink()]
    if links:
        raise SymlinkRefused(errno.ELOOP, "; ".join(map(_is_a_link, links)) + f"; {hint}")
    folder = next((out / rel for rel in files if (out / rel).is_dir()), None)  # os.replace would fail there
    if folder is not None:
        raise IsADirectoryError(errno.EISDIR, f"{folder} is a folder where an output file goes; remove it")
    out.mkdir(parents=True, exist_ok=True)
    for rel in files:
        if rel.parent != Path("."):  # ``out`` itself may be the user's link; a folder under it may not
            run_subdir(out / rel.parent, hint)
        os.replace(stage / rel, out / rel)


def strict_json(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` that writes valid JSON: Python writes a NaN or an infinity as the bare tokens ``NaN`` /
    ``Infinity``, which strict readers (jq, JavaScript, Go) refuse; here they are ``null`` (a diverged run's
    loss: its run_stop says where and why)."""
    return json.dumps(_finite(obj), allow_nan=False, **kwargs)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_json_atomic(path: Path, obj: Any) -> None:
    atomic_write(path, lambda f: f.write(strict_json(obj, indent=2, sort_keys=True) + "\n"))


def write_text_atomic(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text))


def rewrite_jsonl(path: Path, records: list[dict]) -> None:
    """Replace a JSONL file by ``records``, atomically (a crash leaves the old or the new file)."""
    atomic_write(path, lambda f: f.writelines(strict_json(r, sort_keys=True) + "\n" for r in records))


def read_jsonl(path: Path, skipped: list[int] | None = None) -> list[dict]:
    """Every complete line of a JSONL file; a torn last line (crash mid-write) is skipped, and so is any other
    line that is not JSON (``skipped``, when given, receives their 1-based numbers, for a warning)."""
    try:
        with open(path) as f:
            return parse_jsonl(f, skipped)
    except FileNotFoundError:
        return []


def parse_jsonl(lines: Iterable[str], skipped: list[int] | None = None) -> list[dict]:
    """:func:`read_jsonl`'s reading of lines already in memory (a decompressed log), the same rules."""
    out = []
    for number, line in enumerate(lines, 1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if skipped is not None:
                skipped.append(number)
    return out


def open_for_attempt(path: Path, resume_step: int | None, keep) -> Any:
    """Open a log for this attempt: empty on a fresh start (never appending to an earlier attempt's lines);
    on a resume, cut back to what the checkpoint at ``resume_step`` has seen (``keep(record, step)``)."""
    if resume_step is None:
        return open_run_file(path, "w")  # the caller closes it
    if path.is_symlink():
        raise refuse_link(path)
    if path.exists():
        rewrite_jsonl(path, [r for r in read_jsonl(path) if keep(r, resume_step)])
    return open_run_file(path, "a")
