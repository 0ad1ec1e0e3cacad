"""Whether the simulator's AD-PSGD model gives the same outputs, to the bit, as the code of another revision:
every figure of its result (throughput, end, staleness, exchanges a step, the cost shares, the fixed point's
rounds) for a set of cases chosen to reach every path of the model (odd worlds, a rank without a partner,
queues at a slow link, exchange_every > 1, the trainer's barrier, c = 0 and c = 1, the averaging in or out,
each imbalance kind), each case run in a subprocess of each tree.

    BEFORE=REV .venv/bin/python reproduce/scaling/same_outputs.py [--up-to 8192]

The tree of REV is a detached worktree at /tmp/wagma-bench-before-REV (as bench_simulator.py makes it).
Prints one line a case and exits 1 when any figure differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

RUN = """
import dataclasses, json, sys
from wagma_bench.imbalance import IMBALANCES, make_imbalance
from wagma_bench.optim.specs import OPTIMIZER_SPECS
from wagma_bench.simulate.configure import load_network
from wagma_bench.simulate.des import SimConfig, simulate
from wagma_bench.simulate.presets import preset
case = json.loads(sys.argv[1])
workload = dataclasses.replace(preset(case["preset"]), **case["workload"])
kind, settings = case["imbalance"]
imbalance = make_imbalance(IMBALANCES[kind].Settings(**settings), 1)
opt = OPTIMIZER_SPECS["adpsgd"].Settings(**case["optimizer"])
net = load_network("daint", case["network"])
cfg = SimConfig("adpsgd", case["world"], workload, net, imbalance, opt, steps=case["rounds"],
                seed=case["seed"], control_every=case["control_every"])
print(json.dumps({k: repr(v) for k, v in simulate(cfg).row().items()}))
"""

SLOW = ["network.inter.bandwidth_GBps=0.1", "network.intra.bandwidth_GBps=0.2"]


def case(world: int, **kw) -> dict:
    base = {
        "world": world,
        "preset": "rl",
        "workload": {"gossip_cost": 0.364},
        "imbalance": ["lognormal", {"sigma": 0.5}],
        "optimizer": {},
        "network": [],
        "rounds": 200,
        "seed": 1,
        "control_every": 0,
    }
    return base | kw


CASES = [
    case(2),
    case(3, rounds=60),
    case(7, network=SLOW, seed=3),
    case(64),
    case(64, network=SLOW, control_every=10),
    case(64, workload={"gossip_cost": 1.0}, network=SLOW),
    case(64, workload={"gossip_cost": 0.0, "adpsgd_averaging": "none"}),
    case(130, optimizer={"exchange_every": 2}, network=SLOW),
    case(257, optimizer={"exchange_every": 3, "sync_period": 7}, control_every=10, seed=5),
    case(64, preset="resnet50", imbalance=["independent", {}], control_every=10),
    case(96, preset="resnet50", imbalance=["shared_draw", {"num_slow": 2, "delay_s": 0.32}]),
    case(1024, rounds=500),
    case(1024, network=SLOW, rounds=100),
    case(8192, rounds=100),
]


def outputs(root: Path, c: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(c)],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        sys.exit(f"{root}: case {json.dumps(c)} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--up-to", type=int, default=8192, help="the largest world to compare")
    ns = ap.parse_args(argv)
    rev = os.environ.get("BEFORE")
    if not rev:
        sys.exit("BEFORE=REV is required: the revision to compare with")
    root = Path(__file__).resolve().parents[2]
    before = Path(f"/tmp/wagma-bench-before-{rev}")
    if not before.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(before), rev], cwd=root, check=True)
    differ = 0
    for c in (c for c in CASES if c["world"] <= ns.up_to):
        now, then = outputs(root, c), outputs(before, c)
        diff = {k: (then.get(k), v) for k, v in now.items() if then.get(k) != v}
        differ += bool(diff)
        print(("DIFFERS " + json.dumps(diff) if diff else "same") + f": {json.dumps(c)}", flush=True)
    print(f"{len([c for c in CASES if c['world'] <= ns.up_to]) - differ} cases the same, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
