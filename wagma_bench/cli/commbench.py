"""``wagma-bench comm-bench [--nproc N] [--sizes 4K,1M,100M] [--repeats R] [--out FILE.json]``: the data
plane's collectives timed, on local ranks or a launcher's (srun, torchrun, mpiexec) across hosts
(:mod:`wagma_bench.campaign.commbench` does the work; its docstring says what is measured)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from wagma_bench import exits
from wagma_bench.campaign import commbench
from wagma_bench.record.files import OUTPUT_HINT, refuse_link

DESCRIPTION = "Time our communication backend against the raw library calls, on the same buffers."
EPILOG = """\
across hosts (the network that `wagma-bench simulate` models):
  srun -N 2 --ntasks-per-node 8 wagma-bench comm-bench --out cb.json
    (or torchrun --nnodes 2 ... on each node)
  joins the launcher's world, gathers each rank's host, and times and fits two links apart: intra-node
  (the ranks of one host) and inter-node (one rank a host); rank 0 prints alpha and beta of each and writes
  --out, which `wagma-bench simulate cluster=NAME --calibrate cb.json ...` reads in place of the profile's
  network. One rank a host measures the inter-node link only; a run on one host, the intra-node link only."""


def main(argv: list[str]) -> int:
    return exits.run_body("comm-bench", lambda: _bench(argv))


def _bench(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="wagma-bench comm-bench",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=4,
        help="local ranks to fork (default 4); under srun, torchrun or mpiexec the launcher's ranks "
        "are the world and this is not used",
    )
    parser.add_argument(
        "--sizes",
        type=commbench.parse_sizes,
        default=commbench.DEFAULT_SIZES,
        help=f"message sizes (default {commbench.DEFAULT_SIZES})",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement (default 5)")
    parser.add_argument("--comm", choices=("torch", "mpi"), default="torch")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the buffers live")
    parser.add_argument("--out", type=Path, default=Path("comm-bench.json"), help="JSON output file")
    args = parser.parse_args(argv)
    if args.nproc < 1 or args.repeats < 1:
        parser.error("--nproc and --repeats must be >= 1")
    if args.device == "cuda" and (args.comm == "mpi" or not torch.cuda.is_available()):
        parser.error("--device cuda needs CUDA and --comm torch (the mpich wheel is not CUDA-aware)")
    _check_fits(args)  # before any process starts: 64 ranks on a 24 GiB machine printed nothing for minutes
    if (
        args.out.is_symlink()
    ):  # refused before any rank starts; the write itself refuses it too (atomic_write)
        raise refuse_link(args.out, OUTPUT_HINT)
    return commbench.bench(args.nproc, args.sizes, args.repeats, args.comm, args.device, args.out, argv)


def _check_fits(args: argparse.Namespace) -> None:
    """`run`'s rule for local ranks (:func:`~wagma_bench.config.schema.check_ranks_fit`) with a comm-bench
    rank's measured memory (a ConfigError where they do not fit); not where a launcher (mpiexec, srun,
    torchrun) placed this process: the cluster places the ranks then."""
    from wagma_bench.config.schema import check_ranks_fit
    from wagma_bench.runtime.world import detect_world

    if detect_world() is not None:
        return
    largest = commbench.human(max(args.sizes))  # argparse parses the default --sizes too
    check_ranks_fit(
        "--nproc",
        args.nproc,
        commbench.rank_memory_mb(args.sizes),
        f"comm-bench with messages up to {largest}, measured",
    )
