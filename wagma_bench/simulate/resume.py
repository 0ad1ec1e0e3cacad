"""What ``simulate --interval`` has simulated, kept while it runs so that a failure loses none of it.

``simulate`` writes its ``--out`` folder only at the end (:func:`~wagma_bench.record.files.staged_outputs`): a
late failure of an hour-long interval used to lose all of it (a regeneration of the claims' predictions lost
17 minutes that way). So the simulations done so far (each row under the digest of its memo key,
:func:`wagma_bench.simulate.pool.sim_key`) are written, atomically, every :data:`SAVE_EVERY_S` and when the
command fails, to a hidden file beside ``--out`` (``.OUT.interval-resume.json``, as the staging folders sit
beside it); the same command run again reads it back (its schema checked by
:mod:`wagma_bench.config.readback`) and simulates only the rest. Its outputs are the same to the bit: a row
comes back with the same floats (JSON writes a float's shortest exact repr). The file is removed once the
command has written ``--out``.

A file of another command, or of other code, is not used (its ``command`` fingerprint differs: the optimizers'
settings, the rounds, and the package's source byte for byte, since a simulation's result depends on more
than the simulator's modules); the line that says so names it, and it is replaced as the command goes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

import wagma_bench
from wagma_bench.config import readback
from wagma_bench.record.files import OUTPUT_HINT, refuse_link, write_text_atomic

FORMAT = "wagma-bench interval resume 1"
# between two writes of the file while the command runs (a module constant: tests shorten it)
SAVE_EVERY_S = 30.0


def resume_path(out: Path) -> Path:
    """Where ``simulate --interval --out OUT`` keeps what it has simulated: beside ``OUT``."""
    real = Path(out).resolve()
    return real.parent / f".{real.name}.interval-resume.json"


def fingerprint(runs: dict[str, Any], steps: int) -> str:
    """What a simulation's result depends on besides its memo key: every optimizer's composed configuration,
    the rounds, and the package's source."""
    digest = hashlib.sha256()
    config = {name: dataclasses.asdict(run) for name, run in runs.items()}
    digest.update(json.dumps([config, steps], sort_keys=True, default=repr).encode())
    root = Path(wagma_bench.__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def key_digest(key: tuple) -> str:
    """A memo key (:func:`~wagma_bench.simulate.pool.sim_key`: tuples of names, float bits and bytes) as a
    file can hold it."""
    return hashlib.sha256(repr(key).encode()).hexdigest()


def load(path: Path, command: str) -> dict[str, dict]:
    """The rows a run of the same command saved at ``path`` (digest -> row); none when there is no file or it
    is another command's (said in a line). A damaged file is refused in one line (ReadBackError), and so is a
    symbolic link there (never written through)."""
    if path.is_symlink():
        raise refuse_link(path, OUTPUT_HINT)
    try:
        data = readback.load(path, readback.INTERVAL_RESUME)
    except FileNotFoundError:
        return {}
    if data["format"] != FORMAT or data["command"] != command:
        print(
            f"simulate --interval: {path} holds another command's simulations (or older code's): not used, "
            "replaced as this one goes",
            file=sys.stderr,
        )
        return {}
    done = {s["key"]: s["row"] for s in data["simulations"]}
    print(
        f"simulate --interval: resuming: {len(done)} simulations done before, read from {path}",
        file=sys.stderr,
    )
    return done


def save(path: Path, command: str, done: dict[str, dict]) -> None:
    """Write ``done`` (digest -> row) atomically: a crash leaves the former file or this one."""
    simulations = [{"key": k, "row": row} for k, row in done.items()]
    text = json.dumps({"format": FORMAT, "command": command, "simulations": simulations}, default=_plain)
    write_text_atomic(path, text + "\n")


def forget(out: Path) -> None:
    """The command wrote ``--out``: what it kept to resume from is not needed any more."""
    resume_path(out).unlink(missing_ok=True)


def _plain(x: Any) -> Any:
    if isinstance(x, np.generic):  # a row's numpy scalar: its Python value (the same number)
        return x.item()
    raise TypeError(f"a simulation row holds a {type(x).__name__}")
