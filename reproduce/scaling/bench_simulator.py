"""The simulator's cost per rank-round at P = 1,024, 8,192 and 65,536: each optimizer's model simulated once
per world size, CPU seconds of its process (``time.process_time``: all its threads, simulate/threads.py) over
ranks x rounds; each row also keeps the wall seconds and the peak memory of that process.

    .venv/bin/python reproduce/scaling/bench_simulator.py \\
        --out reproduce/scaling/bench-simulator-2core-DATE.json
    .venv/bin/python reproduce/scaling/bench_simulator.py --table FILE.json  # the Markdown table of a result
    BEFORE=REV .venv/bin/python reproduce/scaling/bench_simulator.py ...  # also the code of REV, interleaved
    .venv/bin/python reproduce/scaling/bench_simulator.py --worlds '' --interval 50  # only the interval case

The set-up of the RL claim's prediction: Piz Daint's network (conf/cluster/daint.yaml), the ``rl`` preset (28M
parameters, 1 s steps), ``imbalance=lognormal`` with sigma 0.5, no barrier but the optimizers' own
(``control_every=0``), 500 rounds, AD-PSGD with the exchange cost k = 0.1 (its cost model iterates).
DropCompute is timed like the others. With ``BEFORE=REV`` a worktree of that revision is timed in a subprocess
right after each measurement here (same optimizer, same P; up to ``--before-up-to`` ranks): the machine's
speed drifts.

``--interval N`` also times one prediction with its interval (``wagma-bench simulate ... --interval N``) at
``--interval-world`` ranks (default 1,024): the RL claim's (reproduce/claims/paper-scale/README.md: DD-PPO's
preset on Daint, every optimizer but DropCompute, the compute spread of the committed tuned runs, AD-PSGD's
measured inputs), CPU seconds of the command (its process and children: the processes of its ``--jobs``, by
default the CPUs it may use, ``jobs`` in the row) and wall seconds; ``--interval-out DIR`` keeps its outputs
(``DIR/now``, ``DIR/before``) to compare them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from wagma_bench.record.files import write_text_atomic

WORLDS = (1024, 8192, 65536)
ROUNDS = 500

TIME_ONE = """
import json, resource, sys, time
from wagma_bench.simulate.configure import load_network
from wagma_bench.imbalance import IMBALANCES, make_imbalance
from wagma_bench.simulate.des import SimConfig, Workload, simulate
from wagma_bench.simulate.presets import preset
import dataclasses
name, world, rounds, c = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
workload = preset("rl")
if "gossip_cost" in {f.name for f in dataclasses.fields(Workload)}:
    workload = dataclasses.replace(workload, gossip_cost=c)
imbalance = make_imbalance(IMBALANCES["lognormal"].Settings(sigma=0.5), 1)
cfg = SimConfig(name, world, workload, load_network("daint", []), imbalance, None, steps=rounds, seed=1,
                control_every=0)
t, wall = time.process_time(), time.perf_counter()
res = simulate(cfg)
cpu, wall = time.process_time() - t, time.perf_counter() - wall
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux gives KiB)
print(json.dumps({"cpu_s": cpu, "wall_s": wall, "max_rss_mb": peak, "throughput": res.throughput,
                  "rounds": res.rounds}))
"""


def time_one(root: Path, name: str, world: int, rounds: int, gossip_cost: float = 0.1) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", TIME_ONE, name, str(world), str(rounds), str(gossip_cost)],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


# the RL claim's prediction with its interval (reproduce/claims/paper-scale/README.md, `rl`), at one world
INTERVAL_COMMAND = [
    "simulate",
    "cluster=daint",
    "workload=ddppo",
    "optimizer=glob(*,exclude=dropcompute)",
    "imbalance=none",
    "train.max_rounds=500",
    "control_every=0",
    "--measured",
    "reproduce/scaling/results-2core-20261206/measured-cpu.json",
    "--compute-from",
    "reproduce/tuning/results-2core-20261205/ddppo_throughput",
]


def time_interval(root: Path, world: int, replicates: int, out: Path) -> dict:
    """CPU seconds (the command's process and its children) and wall seconds of one `simulate --interval`."""
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    argv = [*INTERVAL_COMMAND, f"gpus={world}", "--interval", str(replicates), "--out", str(out)]
    before, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "wagma_bench", *argv],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - wall
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": cpu, "wall_s": wall, "command": "wagma-bench " + " ".join(argv)}


def interval_line(result: dict) -> str:
    """The interval case of a result, in one sentence (empty when it has none)."""
    out = []
    for r in result["rows"]:
        if r.get("case") != "interval":
            continue
        line = (
            f"`--interval {r['replicates']}` at P={r['world_size']:,}: {r['cpu_s']:.1f} CPU s "
            f"({r['wall_s']:.1f} s wall)"
        )
        if r.get("before_cpu_s") is not None:
            line += f"; before {r['before_cpu_s']:.1f} CPU s"
        out.append(line)
    return "\n".join(out)


def table(result: dict) -> str:
    rows = [r for r in result["rows"] if r.get("case") != "interval"]
    worlds = sorted({r["world_size"] for r in rows})
    names = list(dict.fromkeys(r["optimizer"] for r in rows))
    before = any("before_cpu_s" in r for r in rows)
    head = (
        "| optimizer | "
        + " | ".join(f"P={p:,}: s (µs per rank-round)" for p in worlds)
        + " | largest / smallest |"
    )
    lines = [head, "|" + "---|" * (len(worlds) + 2)]
    for name in names:
        by = {r["world_size"]: r for r in rows if r["optimizer"] == name}
        cells = []
        for p in worlds:
            r = by.get(p)
            if r is None:
                cells.append("—")
                continue
            cell = f"{r['cpu_s']:.2f} ({r['us_per_rank_round']:.2f})"
            if before and r.get("before_cpu_s") is not None:
                cell += f"; before {r['before_cpu_s']:.2f}"
            cells.append(cell)
        have = [by[p]["us_per_rank_round"] for p in worlds if p in by]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {have[-1] / have[0]:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--table", type=Path, help="print the table of a result file and exit")
    ap.add_argument("--optimizers", default="allreduce,wagma,local_sgd,dpsgd,adpsgd,sgp,eager,dropcompute")
    ap.add_argument("--worlds", default=",".join(map(str, WORLDS)))
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--gossip-cost", type=float, default=0.1, help="AD-PSGD's c (its cost model iterates)")
    ap.add_argument("--interval", type=int, default=0, help="also time simulate --interval N (0: not)")
    ap.add_argument("--interval-world", type=int, default=1024, help="the world of the interval case")
    ap.add_argument(
        "--interval-out",
        type=Path,
        help="keep the interval case's outputs in DIR/now (and DIR/before) to compare (default: not kept)",
    )
    ap.add_argument(
        "--before-up-to",
        type=int,
        default=8192,
        help="time BEFORE's code only up to this world (the former AD-PSGD took minutes beyond)",
    )
    ns = ap.parse_args(argv)
    if ns.table:
        print(table(json.loads(ns.table.read_text())))
        return 0
    root = Path(__file__).resolve().parents[2]
    before_rev = os.environ.get("BEFORE")
    before_root = None
    if before_rev:
        before_root = Path(f"/tmp/wagma-bench-before-{before_rev}")
        if not before_root.exists():
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(before_root), before_rev],
                cwd=root,
                check=True,
                capture_output=True,
            )
    rows = []
    for world in (int(w) for w in ns.worlds.split(",") if w):
        for name in ns.optimizers.split(","):
            load = loadavg()
            r = time_one(root, name, world, ns.rounds, ns.gossip_cost)
            row = {
                "optimizer": name,
                "world_size": world,
                "rounds": r["rounds"],
                "cpu_s": r["cpu_s"],
                "us_per_rank_round": r["cpu_s"] / (world * r["rounds"]) * 1e6,
                "wall_s": r["wall_s"],
                "max_rss_mb": r["max_rss_mb"],
                "throughput": r["throughput"],
                "loadavg": load,
            }
            if before_root is not None and world <= ns.before_up_to:
                then = time_one(before_root, name, world, ns.rounds, ns.gossip_cost)
                row["before_cpu_s"], row["before_wall_s"] = then["cpu_s"], then["wall_s"]
                row["before_max_rss_mb"], row["before_throughput"] = then["max_rss_mb"], then["throughput"]
            rows.append(row)
            print(json.dumps(row), flush=True)
            if ns.out:  # each row as it comes: a long run stopped keeps what it measured
                write_text_atomic(ns.out, json.dumps(result(ns, argv, before_rev, rows), indent=1) + "\n")
    if ns.interval:
        rows.append(interval_row(ns, root, before_root))
        print(json.dumps(rows[-1]), flush=True)
    if ns.out:
        write_text_atomic(ns.out, json.dumps(result(ns, argv, before_rev, rows), indent=1) + "\n")
    if any(r.get("case") != "interval" for r in rows):
        print(table(result(ns, argv, before_rev, rows)))
    print(interval_line(result(ns, argv, before_rev, rows)))
    return 0


def interval_row(ns: argparse.Namespace, root: Path, before_root: Path | None) -> dict:
    import tempfile

    load = loadavg()
    with tempfile.TemporaryDirectory() as temporary:
        tmp = ns.interval_out or Path(temporary)
        r = time_interval(root, ns.interval_world, ns.interval, Path(tmp) / "now")
        after = loadavg()  # its 1-minute figure covers most of the command
        row = {
            "case": "interval",
            "world_size": ns.interval_world,
            "replicates": ns.interval,
            "cpu_s": r["cpu_s"],
            "wall_s": r["wall_s"],
            "command": r["command"],
            "jobs": len(os.sched_getaffinity(0)),  # the command's default --jobs here
            "loadavg": load,
            "loadavg_after": after,
        }
        if before_root is not None and ns.interval_world <= ns.before_up_to:
            then = time_interval(before_root, ns.interval_world, ns.interval, Path(tmp) / "before")
            row["before_cpu_s"], row["before_wall_s"] = then["cpu_s"], then["wall_s"]
    return row


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def result(ns: argparse.Namespace, argv: list[str] | None, before_rev: str | None, rows: list[dict]) -> dict:
    return {
        "command": "reproduce/scaling/bench_simulator.py " + " ".join(argv or sys.argv[1:]),
        "before": before_rev,
        "machine": f"{platform.node()} {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "gossip_cost": ns.gossip_cost,
        "rows": rows,
    }


if __name__ == "__main__":
    sys.exit(main())
