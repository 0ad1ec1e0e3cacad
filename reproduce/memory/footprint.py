"""Peak resident memory of one rank of a workload: the figure behind ``Workload.RANK_MEMORY_MB``.

Runs ``wagma-bench run`` with 2 local ranks and the given overrides and samples, every 0.1 s, the resident set
(VmRSS of /proc/PID/status) of every process below the launcher; prints the peak of the largest rank (a
spawned rank's command line holds ``multiprocessing.spawn``) and of the launcher, as JSON.

    .venv/bin/python reproduce/memory/footprint.py workload=resnet train.max_rounds=20
    .venv/bin/python reproduce/memory/footprint.py workload=transformer train.max_rounds=20
    .venv/bin/python reproduce/memory/footprint.py workload=ddppo train.max_rounds=4
    .venv/bin/python reproduce/memory/footprint.py comm-bench --nproc 2 --sizes 100M --repeats 2

The last measures ``wagma-bench comm-bench`` instead (the figure behind
``campaign.commbench.rank_memory_mb``): its ranks are forked from its fork server, so a rank is a process
whose parent is a child of the command.

RSS counts shared pages (the torch libraries) in every rank, so ranks x the figure over-estimates a world
slightly: the check it feeds (``launch.check_memory``) refuses only worlds that cannot fit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent / "wagma-bench"


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    kids = [int(p) for p in out]
    return kids + [g for k in kids for g in descendants(k)]


def is_rank(pid: int) -> bool:
    try:
        return b"multiprocessing.spawn" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def comm_bench(args: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(BIN), "comm-bench", *args, "--out", f"{tmp}/cb.json"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        peak_rank = peak_launcher = 0.0
        while proc.poll() is None:
            peak_launcher = max(peak_launcher, rss_mb(proc.pid))
            servers = descendants_once(proc.pid)
            peak_rank = max([peak_rank] + [rss_mb(r) for s in servers for r in descendants_once(s)])
            time.sleep(0.1)
        if proc.returncode != 0:
            sys.exit(f"comm-bench failed ({proc.returncode}): {proc.stderr.read()[-2000:]}")
    print(
        json.dumps(
            {
                "comm-bench": args,
                "peak_rank_rss_mb": round(peak_rank, 1),
                "peak_launcher_rss_mb": round(peak_launcher, 1),
            }
        )
    )


def descendants_once(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    return [int(p) for p in out]


def main() -> None:
    if sys.argv[1:2] == ["comm-bench"]:
        comm_bench(sys.argv[2:])
        return
    overrides = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            str(BIN),
            "run",
            "launcher.nproc=2",
            "logger.progress=off",
            *overrides,
            f"hydra.run.dir={tmp}/run",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        peak_rank = peak_launcher = 0.0
        while proc.poll() is None:
            peak_launcher = max(peak_launcher, rss_mb(proc.pid))
            ranks = [p for p in descendants(proc.pid) if is_rank(p)]
            peak_rank = max([peak_rank] + [rss_mb(p) for p in ranks])
            time.sleep(0.1)
        if proc.returncode != 0:
            sys.exit(f"run failed ({proc.returncode}): {proc.stderr.read()[-2000:]}")
    print(
        json.dumps(
            {
                "overrides": overrides,
                "peak_rank_rss_mb": round(peak_rank, 1),
                "peak_launcher_rss_mb": round(peak_launcher, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
