"""Allreduce-SGD's step time against torch's DistributedDataParallel, the same model, data and world.

Allreduce-SGD (wagma_bench/optim/allreduce.py) reduces gradient buckets from backward's hooks as DDP does;
it must cost no more than DDP per step, or every comparison against it starts from a handicap. Each world
size is a torchrun world (``--standalone``, gloo, a thread per rank, as `run` sets); its ranks train the
resnet workload's default model (ResNet-20, 28x28 one-channel images, 10 classes, 32 images a rank) with
both, block by block, the order swapped every block (ABBA) so that the machine's drift falls on both:

    .venv/bin/python reproduce/engine/ddp_step.py [--nproc 2,4] [--blocks 12] [--steps 20] --out FILE
    .venv/bin/python reproduce/engine/ddp_step.py --table FILE [FILE ...]

A block runs ``WARMUP`` untimed steps, then ``--steps`` timed ones (zero_grad, forward, loss, backward, the
optimizer's step: DDP waits for its reduction at the end of backward, Allreduce-SGD in its step). A block's
step time is the mean over ranks of each rank's median step; its ratio is Allreduce-SGD's over DDP's of the
same block pair. The figure is the median of the block ratios, with the exact percentile bootstrap interval
of that median over blocks (:func:`wagma_bench.analysis.intervals.median_of_draws`: no random draws). Both
use the same bucket size (Allreduce-SGD's default, 25 MB) and the same local SGD (momentum 0.9, Nesterov,
weight decay 5e-4). Run it on an idle machine: it records the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WARMUP = 3
BUCKET_MB = 25.0
BATCH = 32
KINDS = ("allreduce", "ddp")


def summarize(ratios: list[float]) -> dict:
    """The median of the block ratios and its exact 95% percentile bootstrap interval over blocks."""
    from wagma_bench.analysis.intervals import interval, median_of_draws, mixture

    law = median_of_draws(mixture([{r: 1.0} for r in ratios]), len(ratios))
    low, high = interval(law)
    return {"ratio": statistics.median(ratios), "low": low, "high": high, "blocks": len(ratios)}


def _sgd(params):
    import torch

    return torch.optim.SGD(params, lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)


def _model():
    import torch

    from wagma_bench.workloads.resnet import CifarResNet

    torch.manual_seed(0)
    return CifarResNet(20, 1, 10)


def _block(kind: str, trainers: dict, batch, steps: int) -> float:
    """This rank's median step time over ``steps`` timed steps of ``kind``, after ``WARMUP`` untimed ones."""
    import torch.distributed as dist
    import torch.nn.functional as F

    model, step, zero = trainers[kind]
    x, y = batch
    times = []
    dist.barrier()
    for i in range(WARMUP + steps):
        t0 = time.perf_counter()
        zero()
        F.cross_entropy(model(x), y).backward()
        step()
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _trainers(comm) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    from wagma_bench.optim.allreduce import AllreduceSGD

    ours = _model()
    algo = AllreduceSGD(AllreduceSGD.Settings(bucket_mb=BUCKET_MB), ours, _sgd, comm)
    ddp = DistributedDataParallel(_model(), bucket_cap_mb=BUCKET_MB)
    opt = _sgd(ddp.parameters())
    return {
        "allreduce": (ours, algo.step, algo.zero_grad),
        "ddp": (ddp, opt.step, lambda: opt.zero_grad(set_to_none=True)),
    }


def rank_main(blocks: int, steps: int, out: Path) -> None:
    """One rank of torchrun's world: every block pair, then rank 0 writes the per-block figures."""
    import torch
    import torch.distributed as dist

    from wagma_bench.runtime.launch import join_world, run_identity
    from wagma_bench.runtime.world import detect_world

    torch.set_num_threads(1)
    world = detect_world()
    comm = join_world(world, None, "gloo", torch.device("cpu"), 120.0, 120.0, run_identity(f"ddp-step {out}"))
    try:
        g = torch.Generator().manual_seed(100 + comm.rank)
        batch = (torch.randn(BATCH, 1, 28, 28, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
        trainers = _trainers(comm)
        rows = []
        for b in range(blocks):
            order = KINDS if b % 2 == 0 else KINDS[::-1]
            mine = {kind: _block(kind, trainers, batch, steps) for kind in order}
            every = [None] * comm.world_size
            dist.all_gather_object(every, mine)
            rows.append({k: statistics.fmean(r[k] for r in every) for k in KINDS} | {"first": order[0]})
        if comm.rank == 0:
            from wagma_bench.record.files import write_json_atomic

            write_json_atomic(out, rows)
    finally:
        comm.close()


def one_world(nproc: int, blocks: int, steps: int) -> dict:
    torchrun = Path(sys.executable).parent / "torchrun"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "blocks.json"
        cmd = [str(torchrun), "--standalone", f"--nproc-per-node={nproc}", __file__, "--rank-out", str(out)]
        cmd += ["--blocks", str(blocks), "--steps", str(steps)]
        subprocess.run(cmd, check=True, env=os.environ | {"OMP_NUM_THREADS": "1"})
        rows = json.loads(out.read_text())
    ratios = [r["allreduce"] / r["ddp"] for r in rows]
    return {"nproc": nproc, "per_block": rows, **summarize(ratios)}


def table(result: dict) -> str:
    """The Markdown table of a committed result."""
    lines = [
        "| ranks on 2 cores | Allreduce-SGD step (ms, median of blocks) | DDP step (ms) "
        + "| Allreduce-SGD / DDP [95% interval] | blocks |",
        "|---|---|---|---|---|",
    ]
    for w in result["worlds"]:
        ours = statistics.median(r["allreduce"] for r in w["per_block"]) * 1e3
        theirs = statistics.median(r["ddp"] for r in w["per_block"]) * 1e3
        lines.append(
            f"| {w['nproc']} | {ours:.1f} | {theirs:.1f} | {w['ratio']:.2f}x [{w['low']:.2f}x, "
            f"{w['high']:.2f}x] | {w['blocks']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", default="2,4", help="world sizes, comma-separated")
    ap.add_argument(
        "--blocks", type=int, default=12, help="block pairs per world (even: as many of each order)"
    )
    ap.add_argument("--steps", type=int, default=20, help="timed steps per block")
    ap.add_argument("--out", type=Path, help="the result's JSON file")
    ap.add_argument("--table", type=Path, nargs="+", help="print the table of committed results")
    ap.add_argument("--rank-out", type=Path, help=argparse.SUPPRESS)  # set for torchrun's ranks
    args = ap.parse_args()
    if args.rank_out:
        rank_main(args.blocks, args.steps, args.rank_out)
        return
    if args.table:
        for path in args.table:
            print(table(json.loads(path.read_text())))
        return
    if args.out is None or args.blocks < 2 or args.steps < 1:
        ap.error("give --out FILE, --blocks of at least 2 and --steps of at least 1 (or --table FILE)")
    import torch

    from wagma_bench.record.files import write_json_atomic
    from wagma_bench.record.provenance import cpu_identity

    before = os.getloadavg()
    worlds = [one_world(int(n), args.blocks, args.steps) for n in args.nproc.split(",")]
    result = {
        "command": " ".join(["reproduce/engine/ddp_step.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_sha": subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=False,
        ).stdout.strip(),
        "torch": torch.__version__,
        "cpu": cpu_identity(),
        "cores": len(os.sched_getaffinity(0)),
        "loadavg_before_after": [before, os.getloadavg()],
        "worlds": worlds,
    }
    write_json_atomic(args.out, result)
    print(table(result))


if __name__ == "__main__":
    main()
