"""How a rank of a completed run ends matters: a gloo rank that reaches the interpreter's finalization with
its process groups alive can die by SIGABRT (``terminate called without an active exception``), after its last
collective succeeded. This is the abort once seen at the end of completed runs, reproduced outside the
product.

Each try starts two ranks (plain torch.distributed, gloo, a TCPStore on rank 0) that make a subgroup, run
three allreduces of 4 MB on the world and the subgroup, and then end in one of three ways:

- ``finalize``: return with the groups alive; the interpreter's finalization tears them down;
- ``destroy``: ``destroy_process_group()`` first (every group shut down), then return normally;
- ``exit``: ``destroy_process_group()``, then ``os._exit`` (no finalization): what a local rank of
  ``wagma-bench run`` does since the ordered shutdown (``launch._exit_now``).

It prints, per ending, how many tries had a rank end by a signal, and the first line of that rank's stderr::

    .venv/bin/python reproduce/teardown/finalize.py --tries 20
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import subprocess
import sys

ENDINGS = ("finalize", "destroy", "exit")


def rank_main(rank: int, port: int, ending: str) -> None:
    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60)
    )
    sub = dist.new_group([0, 1])
    buf = torch.ones(1 << 20)
    for _ in range(3):
        dist.all_reduce(buf)
        dist.all_reduce(buf, group=sub)
    if ending in ("destroy", "exit"):
        dist.destroy_process_group()
    if ending == "exit":
        sys.stdout.flush()
        os._exit(0)


def one_try(ending: str) -> str | None:
    """Run the two ranks once; a description of a rank that ended by a signal (or failed), else None."""
    from wagma_bench.runtime.launch import (
        free_port,  # here, not at the top: the ranks run no wagma-bench code
    )

    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank", str(r), "--port", str(port), "--ending", ending],
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outcome = None
    for r, p in enumerate(procs):
        _, err = p.communicate(timeout=120)
        if p.returncode != 0 and outcome is None:
            how = (
                f"signal {signal.Signals(-p.returncode).name}" if p.returncode < 0 else f"exit {p.returncode}"
            )
            first = next((line for line in err.splitlines() if "Warning" not in line), "")
            outcome = f"rank {r}: {how}: {first.strip()}"
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=20, help="tries per ending (default 20)")
    parser.add_argument(
        "--endings", default=",".join(ENDINGS), help=f"comma-separated, of {', '.join(ENDINGS)}"
    )
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ending", choices=ENDINGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.port, args.ending)
        return 0
    for ending in args.endings.split(","):
        bad = [o for o in (one_try(ending) for _ in range(args.tries)) if o]
        print(
            f"{ending:9s} {len(bad)} of {args.tries} tries had a rank end abnormally"
            + (f"; first: {bad[0]}" if bad else ""),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
