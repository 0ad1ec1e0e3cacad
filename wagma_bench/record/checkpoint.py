"""Checkpoints as verified sets.

Layout under the run's checkpoint folder (``RUN_DIR/checkpoint/`` by default; see :func:`configured_folder`
for ``checkpoint.dir``)::

    round-R/rank<r>.pt     every rank's state (decentralised models differ per rank), written first
    round-R/manifest.json  rank 0, once every rank has written: round, world size, config identity and
                           its hash, the sha256 of each rank's file; written last, so it marks a complete set
    latest                 the name of the newest complete set, replaced atomically after the manifest

The last two complete sets are kept, so a crash while writing loses at most one checkpoint period. The
config hash covers the config minus what may change on resume (:func:`wagma_bench.config.identity.identity`:
``launcher``, ``logger``, ``checkpoint`` and the budget ``train.max_rounds/epochs/time_limit_s``).

Before resuming, the launching process checks the manifest against the run (:func:`check_against_run`:
world size, config, every file present) and refuses a mismatch before any rank starts; then every rank
checks its own file's checksum and all ranks agree with one small allgather (:meth:`Checkpointer.agree`),
so a damaged file is a clear error on every rank, never a hang or a silent load.

With ``checkpoint.dir`` set (a scratch file system) the sets go to
``DIR/<run name>-<hash of the run directory's path>/``: one folder per run, so that every run of a sweep can
share one setting without two runs ever writing into one folder (the alternative, refusing a folder that holds
another run's sets, would make a sweep's user give each run its own path). The run directory records where its
sets are (``RUN_DIR/checkpoint.json``), so a requeue, ``report`` and the launcher's own messages find them,
and a rerun whose ``checkpoint.dir`` no longer leads to them is refused rather than started afresh
(:func:`check_folder`).

torch is imported inside the ranks' methods (:class:`Checkpointer`'s), not at the top: the launching process
makes the checks above without importing it.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
from pathlib import Path

from wagma_bench.config import readback
from wagma_bench.config.identity import identity, resume_hash
from wagma_bench.config.recorded import setting
from wagma_bench.config.renamed import RENAMED_ALGORITHM_STATE, renamed_fields
from wagma_bench.errors import ConfigError
from wagma_bench.record.checkpoint_size import file_bytes, human_size
from wagma_bench.record.events import EVENTS, EVENTS_XZ, RunEvents
from wagma_bench.record.files import atomic_write, refuse_link, run_subdir, write_json_atomic

LATEST = "latest"
MANIFEST = "manifest.json"
DEFAULT = "checkpoint"  # the folder in the run directory without checkpoint.dir
WHERE = "checkpoint.json"  # in the run directory, when its sets live elsewhere: {"dir": FOLDER}
KEEP = 2  # complete sets kept
_MESSAGE_BYTES = 1024  # room for one rank's error message in the agreement


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed; the message names the file or the mismatch."""


CHECKPOINT_HINT = "a run never writes through a link: remove it, or choose another checkpoint.dir"


def _set_name(round_: int) -> str:
    return f"round-{round_}"


def _write_atomic(path: Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data), binary=True)  # no temporary file left on a full disk


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def configured_folder(run_dir: Path, setting: str | None) -> Path:
    """The folder ``checkpoint.dir`` (``setting``) gives the run in ``run_dir``: ``RUN_DIR/checkpoint`` when
    unset; else ``DIR/<run name>-<8 hex of the run directory's absolute path>``, ``DIR`` relative to the run
    directory (``~`` expanded). Absolute paths without resolving links: every rank, on any host, computes the
    same name from the same command line, and a requeue the same one again."""
    run_dir = Path(os.path.abspath(run_dir))
    if setting is None:
        return run_dir / DEFAULT
    base = Path(os.path.expanduser(str(setting)))
    tag = hashlib.sha256(str(run_dir).encode()).hexdigest()[:8]
    return Path(os.path.abspath(run_dir / base)) / f"{run_dir.name}-{tag}"


def recorded_folder(run_dir: Path) -> Path:
    """Where the run in ``run_dir`` keeps its sets: as
    ``RUN_DIR/checkpoint.json`` records, else the default."""
    try:
        return Path(readback.load(Path(run_dir) / WHERE, readback.CHECKPOINT_WHERE)["dir"])
    except FileNotFoundError:
        return Path(os.path.abspath(run_dir)) / DEFAULT
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"{Path(run_dir) / WHERE} cannot be read ({err}); it records where the run's checkpoints are"
        ) from None


def record_folder(run_dir: Path, folder: Path) -> None:
    """Rank 0, at every start: record ``folder`` as the run's (nothing to record for the default)."""
    path = Path(run_dir) / WHERE
    if folder == Path(os.path.abspath(run_dir)) / DEFAULT:
        path.unlink(missing_ok=True)
    else:
        write_json_atomic(path, {"dir": str(folder)})


def check_folder(run_dir: Path, setting: str | None, resume: bool) -> Path:
    """In the launching process, before any rank starts: the folder ``checkpoint.dir`` gives can be created
    and written, holds no symbolic link the run would write through, and (on a resume) is where the run's
    earlier sets are. Returns the folder; raises :class:`ConfigError` naming the key, the value and what is
    allowed."""
    folder = configured_folder(run_dir, setting)
    shown = f"checkpoint.dir={setting}"
    existing = next(p for p in (folder, *folder.parents) if p.exists() or p.is_symlink())
    if existing.is_file():
        raise ConfigError(
            f"{shown} is not allowed: {existing} is a file; it must be a folder that the run can "
            f"create and write (a relative path is under the run directory)"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{shown} is not allowed: {existing} cannot be written by this user; it must be a "
            f"folder that the run can create and write (a relative path is under the run directory)"
        )
    if (
        setting is not None
    ):  # the user's DIR may be a link (as hydra.run.dir); what the run writes under it not
        inner = [folder, *(sorted(folder.rglob("*")) if folder.is_dir() and not folder.is_symlink() else [])]
        link = next((p for p in inner if p.is_symlink()), None)
        if link is not None:
            raise ConfigError(f"{shown} is not allowed: {refuse_link(link).strerror}")
    earlier = recorded_folder(run_dir)
    if resume and earlier != folder and _latest_in(earlier, quiet=True) is not None:
        raise ConfigError(
            f"{shown} is not allowed on this rerun: the run's checkpoints are in {earlier} (its "
            f"{WHERE if earlier.name != DEFAULT else 'default folder'}), and {shown} gives {folder}; "
            f"set checkpoint.dir back, or start afresh with checkpoint.resume=false"
        )
    return folder


def latest_set(run_dir: Path) -> tuple[Path, dict] | None:
    """The newest complete set of the run in ``run_dir`` (its folder and manifest), or None when the run never
    checkpointed."""
    return _latest_in(recorded_folder(run_dir))


def _latest_in(root: Path, quiet: bool = False) -> tuple[Path, dict] | None:
    """The newest complete set in a checkpoint folder; ``quiet``: None for one that cannot be read."""
    try:
        name = (root / LATEST).read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return root / name, readback.load(root / name / MANIFEST, readback.CHECKPOINT_MANIFEST)
    except (OSError, ValueError) as err:
        if quiet:
            return None
        raise CheckpointError(
            f"checkpoint {root / LATEST} points to {name}, whose {MANIFEST} cannot be read ({err})"
        ) from None


def check_against_run(run_dir: Path, raw: dict, world_size: int, world_from: str) -> None:
    """In the launching process, before any rank starts: the latest set fits this run (world size, config)
    and all its files are there. ``world_from`` says where the world size came from, for the message."""
    found = latest_set(run_dir)
    if found is None:
        return
    folder, manifest = found
    name = folder.name
    if manifest["world_size"] != world_size:
        raise ConfigError(
            f"checkpoint {name} in {folder.parent} was written by {manifest['world_size']} ranks, "
            f"this run has {world_size} ({world_from}); resume with the same world size, or "
            f"start afresh with checkpoint.resume=false or another hydra.run.dir"
        )
    if _written_identity(manifest) != resume_hash(raw):
        before, now = _flat(identity(manifest.get("config", {}))), _flat(identity(raw))
        changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
        shown = ", ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in changed[:5])
        raise ConfigError(
            f"checkpoint {name} in {folder.parent} was written with another configuration "
            f"({shown or 'resume hash ' + _written_identity(manifest)}); only launcher, logger, "
            f"checkpoint and the budget (train.max_rounds, train.epochs, train.time_limit_s) "
            f"may change on resume"
        )
    missing = [f for f in manifest["files"] if not (folder / f).is_file()]
    if missing:
        raise ConfigError(
            f"checkpoint {name} is incomplete: {folder / missing[0]} is missing "
            f"({len(missing)} of {len(manifest['files'])} rank files)" + _older_hint(folder)
        )


def _written_identity(manifest: dict) -> str:
    """The resume hash of the configuration a set was written with, recomputed by today's rule from the config
    the manifest keeps (a manifest written before that rule changed still matches its own run); a manifest
    without its config: the hash it stored (``resume_hash``; named ``config_hash`` before 2026-12-06)."""
    if "config" in manifest:
        return resume_hash(manifest["config"])
    return manifest["resume_hash"] if "resume_hash" in manifest else manifest["config_hash"]


def check_event_log(run_dir: Path) -> None:
    """A checkpoint to resume from needs the run's record: an ``events.jsonl`` with its ``run_start``. Without
    it a resume would train on while the run's identity (workload, optimizer, world, seed), its evaluations
    and its clock are gone, and the report would not find the run; refused, saying how to start afresh."""
    found = latest_set(run_dir)
    if found is None:
        return
    path = Path(run_dir) / EVENTS
    record = RunEvents.read(run_dir)
    if record.start is not None:
        return
    what = (
        f"its event log {path} is missing"
        if not path.exists()
        else f"its event log {path} has no readable run_start event"
    )
    raise ConfigError(
        f"run directory {run_dir} holds checkpoint {found[0].name} but {what}, so a resume would "
        f"continue a run whose record is lost; restore that file, or start afresh with "
        f"checkpoint.resume=false (the old checkpoints are then discarded) or another hydra.run.dir"
    )


def refuse_compacted(run_dir: Path) -> None:
    """A committed result (its events compacted to ``events.jsonl.xz``) is a read-only record: a run neither
    resumes nor appends to it (its checkpoints and raw logs are gone, and a live ``events.jsonl`` beside it
    would make two records of one run); refused before any rank starts."""
    if (Path(run_dir) / EVENTS_XZ).exists():
        raise ConfigError(
            f"run directory {run_dir} holds {EVENTS_XZ}: a committed result, a read-only record that no run "
            f"resumes or appends to; choose another hydra.run.dir (or, for a tuning, another --out)"
        )


def discard_incomplete_sets(run_dir: Path) -> None:
    """After a failed run (in the launcher, once every rank has ended): remove the sets without a manifest,
    which no resume can use; after a failure on a full disk this is the space the summary needs."""
    root = recorded_folder(run_dir)
    if root.is_symlink():  # planted while the run ran (which failed on it): nothing removed through it
        return
    for p in root.glob("round-*"):
        if not (p / MANIFEST).exists():
            shutil.rmtree(p, ignore_errors=True)


def _older_hint(folder: Path) -> str:
    older = sorted(
        (p for p in folder.parent.glob("round-*") if (p / MANIFEST).exists() and p != folder),
        key=lambda p: int(p.name.split("-")[1]),
    )
    if not older:
        return "; start afresh with checkpoint.resume=false"
    return (
        f"; the previous complete set is {older[-1].name}: write its name into "
        f"{folder.parent / LATEST} to resume from it, or start afresh with checkpoint.resume=false"
    )


def payload(model, algo, state: dict, clock, largest: bool = False) -> dict:
    """What one rank's checkpoint file holds (the one definition: :meth:`Checkpointer.save` writes it);
    ``largest``: with the algorithm's state at its largest (its ``largest_state_dict``: a message in flight),
    for sizing."""
    import torch

    algo_state = algo.largest_state_dict() if largest else algo.state_dict()
    return {
        "model": model.state_dict(),
        "algo": algo_state,
        "state": dict(state),
        "clock": (clock.train_s, clock.eval_s, clock.wall_s),
        "rng": torch.get_rng_state(),
    }


def algorithm_state(saved: dict) -> dict:
    """The algorithm's state in a rank's checkpoint file (:func:`payload`'s ``algo``) under today's names: one
    written before a rename reads as the same (config/renamed.py, its one table and policy)."""
    return renamed_fields(saved["algo"], RENAMED_ALGORITHM_STATE)


class Checkpointer:
    """One rank's side of the run's checkpoint sets."""

    def __init__(self, run_dir: Path, rank: int, composed: dict):
        self.run_dir = Path(run_dir)
        self.dir = configured_folder(run_dir, setting(composed, "checkpoint.dir"))
        self.rank = rank
        self.raw = composed
        self._found: tuple[Path, dict] | None = None

    # --- resume ------------------------------------------------------------------------------------
    def agree(self, comm, resume: bool) -> bool:
        """Whether to resume, agreed by every rank (collective). Each rank checks the latest set's
        manifest and its own file's checksum; any rank's problem fails all of them with the same message."""
        problem = ""
        try:
            self._found = _latest_in(self.dir) if resume else None
            if self._found is not None:
                self._verify_own_file(comm.world_size)
        except (CheckpointError, ConfigError, OSError) as err:
            problem = f"rank {self.rank}: {err}"
        import torch

        encoded = problem.encode()[:_MESSAGE_BYTES].ljust(_MESSAGE_BYTES, b"\0")
        gathered = comm.allgather(torch.tensor(list(encoded), dtype=torch.uint8, device=comm.device))
        problems = [bytes(row.cpu().tolist()).rstrip(b"\0").decode(errors="replace") for row in gathered]
        problems = [p for p in problems if p]
        if problems:
            raise CheckpointError("cannot resume: " + "; ".join(problems))
        return self._found is not None

    def _verify_own_file(self, world_size: int) -> None:
        folder, manifest = self._found
        if manifest["world_size"] != world_size:
            raise CheckpointError(
                f"checkpoint {folder.name} was written by {manifest['world_size']} ranks, "
                f"this run has {world_size}"
            )
        if _written_identity(manifest) != resume_hash(self.raw):
            raise CheckpointError(
                f"checkpoint {folder.name} was written with another configuration "
                f"(resume hash {_written_identity(manifest)}, this run {resume_hash(self.raw)})"
            )
        name = f"rank{self.rank}.pt"
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path} is missing" + _older_hint(folder))
        digest = _sha256(path)
        if digest != manifest["files"].get(name):
            raise CheckpointError(
                f"{path} is damaged: its sha256 {digest[:12]}... differs from the manifest's "
                f"{str(manifest['files'].get(name))[:12]}..." + _older_hint(folder)
            )

    def load(self, model, algo) -> dict:
        import torch

        folder, _ = self._found
        # our own files, verified against the manifest's checksum: full unpickling is safe here
        saved = torch.load(folder / f"rank{self.rank}.pt", map_location=algo.comm.device, weights_only=False)
        model.load_state_dict(saved["model"])
        algo.load_state_dict(algorithm_state(saved))
        torch.set_rng_state(saved["rng"])
        return saved

    def discard_earlier_attempt(self) -> None:
        """A fresh start (rank 0, before any rank saves): drop the sets of an earlier attempt (where this run
        puts them, and where it had put them), so that no later resume can mix them with this attempt's logs;
        then record where this attempt's go."""
        for folder in {self.dir, recorded_folder(self.run_dir)}:
            (folder / LATEST).unlink(missing_ok=True)
            for p in folder.glob("round-*"):
                shutil.rmtree(p, ignore_errors=True)
        record_folder(self.run_dir, self.dir)

    # --- size ----------------------------------------------------------------------------------------
    def size_line(self, model, algo, state: dict, clock, every_s: float) -> str:
        """Rank 0, at the start (before the first step, when the algorithm has nothing in flight): what one
        checkpoint of this run writes, for sizing a scratch file system (:func:`file_bytes`)."""
        per_rank = file_bytes(payload(model, algo, state, clock, largest=True), algo.local_optimizer)
        world = algo.comm.world_size
        when = "at every control exchange" if every_s == 0 else f"every {every_s:g} s of training"
        return (
            f"checkpoints: {human_size(per_rank)} ({per_rank} bytes) per rank x {world} ranks = "
            f"{human_size(per_rank * world)} per checkpoint, {when} and at a preemption, in {self.dir}; the "
            f"last {KEEP} are kept, {KEEP + 1} while one is written: "
            f"{human_size(per_rank * world * (KEEP + 1))} at most"
        )

    # --- save --------------------------------------------------------------------------------------
    def save(self, model, algo, state: dict, clock) -> None:
        """Write this rank's file; rank 0 then writes the manifest and moves ``latest`` (collective)."""
        import torch

        comm = algo.comm
        # a link planted at the folder mid-run: named, with the key that chooses the folder
        folder = run_subdir(run_subdir(self.dir, CHECKPOINT_HINT) / _set_name(algo.round), CHECKPOINT_HINT)
        buf = io.BytesIO()
        torch.save(payload(model, algo, state, clock), buf)
        data = buf.getvalue()
        _write_atomic(folder / f"rank{self.rank}.pt", data)
        digest = bytes.fromhex(hashlib.sha256(data).hexdigest())
        # the allgather is also the barrier: every rank's file is on disk before the manifest exists
        digests = comm.allgather(torch.tensor(list(digest), dtype=torch.uint8, device=comm.device))
        if self.rank != 0:
            return
        files = {f"rank{r}.pt": bytes(row.cpu().tolist()).hex() for r, row in enumerate(digests)}
        write_json_atomic(
            folder / MANIFEST,
            {
                "round": algo.round,
                "world_size": comm.world_size,
                "resume_hash": resume_hash(self.raw),
                "config": identity(self.raw),
                "files": files,
            },
        )
        _write_atomic(self.dir / LATEST, (folder.name + "\n").encode())
        self._prune(folder)

    def _prune(self, newest: Path) -> None:
        """Keep the last KEEP complete sets; drop older ones and any incomplete leftover of a crash. The
        folder is opened once without following a link (O_NOFOLLOW) and every name is removed relative to
        it: a link planted at the folder while this runs is neither listed nor removed through (the next
        save refuses it, naming it)."""
        try:
            fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:  # a link planted since the save (or the folder gone): nothing to prune here
            return
        try:
            sets = [n for n in os.listdir(fd) if n.startswith("round-")]
            complete = sorted(
                (n for n in sets if n[6:].isdigit() and _exists(f"{n}/{MANIFEST}", fd)),
                key=lambda n: int(n[6:]),
            )
            keep = set(complete[-KEEP:]) | {newest.name}
            for name in sets:
                if name not in keep:
                    shutil.rmtree(name, ignore_errors=True, dir_fd=fd)
        finally:
            os.close(fd)
