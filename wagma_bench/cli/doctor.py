"""``wagma-bench doctor``: one table of what this Python has for the three workloads and the cluster (torch
and CUDA, NCCL, MPI, fairseq, MiniWorld's EGL, wandb), with the exact command for each missing piece. Run it
on a login node after ``make setup-user`` (docs/slurm.md, "Installing without root"); it starts no rank and
needs no GPU (a login node usually has none: a CUDA build of torch is what counts there).

Exit 0 whatever is missing: the table is the answer (a login node without a GPU is normal)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from wagma_bench import exits
from wagma_bench.errors import ConfigError

FAIRSEQ = "fairseq-fixed==0.12.3.1"
CUDA_TORCH = (
    "pip install --force-reinstall torch torchvision --index-url https://download.pytorch.org/whl/cu124"
)
CUDA_NOTE = "  # cu124: your site's CUDA module (cuda/12.4); cu121, cu126, ... for others"
FAIRSEQ_CMD = f"pip install cython setuptools wheel numpy && pip install --no-build-isolation {FAIRSEQ}"
MPI4PY_CMD = (
    'module load <your MPI> && MPICC="$(which mpicc)" pip install --no-binary mpi4py --no-cache-dir mpi4py'
)

USAGE = """usage: wagma-bench doctor
One table of what this Python has for the three workloads and the cluster: torch with CUDA, NCCL, gloo, MPI
(mpi4py), fairseq and fairseq-preprocess, sacrebleu, MiniWorld and EGL, wandb, wagma-bench itself; the exact
command for each missing piece. Starts no rank, needs no GPU; exit 0 whatever is missing."""

Row = tuple[str, bool, str, str]  # piece, present, what was found, the command when missing


def version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def venv_script(name: str) -> str | None:
    """A console script of this Python's prefix (found without an activated venv), else on PATH."""
    own = Path(sys.prefix) / "bin" / name
    return str(own) if own.exists() else shutil.which(name)


def torch_rows() -> list[Row]:
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return [("torch", False, "not importable", "make setup-user (or: pip install torch torchvision)")]
    cuda = torch.version.cuda
    gpus = torch.cuda.device_count() if cuda else 0
    seen = f"{gpus} GPU(s) visible" if gpus else "no GPU visible here (a login node's usual state)"
    rows: list[Row] = [
        (
            "torch with CUDA",
            cuda is not None,
            f"torch {torch.__version__}, CUDA {cuda} build, {seen}"
            if cuda
            else f"torch {torch.__version__}: CPU only",
            CUDA_TORCH + CUDA_NOTE,
        )
    ]
    nccl = dist.is_available() and dist.is_nccl_available()
    nccl_version = ".".join(map(str, torch.cuda.nccl.version())) if nccl else None
    rows.append(("NCCL", nccl, f"NCCL {nccl_version} (torch's)" if nccl else "not in this torch", CUDA_TORCH))
    rows.append(
        ("gloo (CPU)", dist.is_available() and dist.is_gloo_available(), "torch's", "pip install torch")
    )
    return rows


def mpi_row() -> Row:
    if not has_module("mpi4py"):
        return ("MPI (mpi4py)", False, "mpi4py not installed (comm=mpi only)", MPI4PY_CMD)
    try:
        from mpi4py import MPI

        library = MPI.Get_library_version().splitlines()[0].strip()
    except (ImportError, RuntimeError, OSError) as err:  # a broken MPI library: what it says
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return ("MPI (mpi4py)", False, f"mpi4py does not load: {first}", MPI4PY_CMD)
    return ("MPI (mpi4py)", True, f"mpi4py {version_of('mpi4py')}: {library}", MPI4PY_CMD)


def fairseq_rows() -> list[Row]:
    version = version_of("fairseq-fixed") or version_of("fairseq")
    preprocess = venv_script("fairseq-preprocess")
    return [
        (
            "fairseq (Transformer)",
            version is not None,
            f"fairseq {version}" if version else "missing",
            FAIRSEQ_CMD,
        ),
        (
            "fairseq-preprocess (WMT)",
            preprocess is not None,
            preprocess or f"not in {Path(sys.prefix) / 'bin'} nor on PATH",
            FAIRSEQ_CMD,
        ),
        (
            "sacrebleu (BLEU)",
            has_module("sacrebleu"),
            version_of("sacrebleu") or "missing",
            "pip install 'sacrebleu>=2.0' sacremoses",
        ),
    ]


def egl_found() -> str | None:
    import ctypes.util

    return ctypes.util.find_library("EGL")


def miniworld_rows() -> list[Row]:
    egl = egl_found()
    return [
        (
            "MiniWorld (DD-PPO)",
            has_module("miniworld"),
            version_of("miniworld") or "missing",
            "pip install miniworld==2.1.0",
        ),
        (
            "EGL (headless MiniWorld)",
            egl is not None,
            egl or "libEGL.so.1 not found",
            "module load mesa  # else ask your admins for Mesa's EGL (Debian: libegl1 libegl-mesa0)",
        ),
    ]


def wandb_row() -> Row:
    version = version_of("wandb")
    return (
        "wandb (logger=wandb)",
        version is not None,
        version or "missing",
        "pip install wandb wandb-workspaces",
    )


def self_row() -> Row:
    script = venv_script("wagma-bench")
    return (
        "wagma-bench on the nodes",
        script is not None,
        f"{script}; rendered scripts put {Path(sys.prefix) / 'bin'} on PATH (venv: auto)"
        if script
        else "missing",
        f"pip install -e . (in the repository, with {Path(sys.prefix) / 'bin' / 'python'})",
    )


CHECKS: list[Callable[[], list[Row] | Row]] = [
    torch_rows,
    mpi_row,
    fairseq_rows,
    miniworld_rows,
    wandb_row,
    self_row,
]


def rows() -> list[Row]:
    out: list[Row] = []
    for check in CHECKS:
        got = check()
        out += got if isinstance(got, list) else [got]
    return out


def table(found: list[Row]) -> str:
    width = max(len(r[0]) for r in found)
    lines = [f"wagma-bench doctor: {sys.executable} (Python {sys.version.split()[0]})"]
    for piece, present, what, command in found:
        lines.append(f"{piece:<{width}}  {'ok     ' if present else 'MISSING'}  {what}")
        if not present:
            lines.append(f"{'':<{width}}           -> {command}")
    missing = sum(not r[1] for r in found)
    lines.append(f"{missing} missing" + (": run the commands above in this venv" if missing else ""))
    return "\n".join(lines)


def _doctor(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return exits.OK
    if argv:
        raise ConfigError(f"doctor takes no arguments; got {' '.join(argv)} (--help for what it checks)")
    print(table(rows()))
    return exits.OK


def main(argv: list[str]) -> int:
    return exits.run_body("doctor", lambda: _doctor(argv))
