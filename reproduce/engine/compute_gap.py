"""WAGMA-SGD's compute per step against Allreduce-SGD's, without injected delay, and where the CPU went.

WAGMA-SGD averages models in its progress thread while the compute thread works: it saves waiting, not CPU
work. Where every core is busy (4 ranks on 2 cores) that work is taken from the computation; with a core per
rank it is not. So each workload runs at 4 ranks and at 2 (one per core), Allreduce-SGD and WAGMA-SGD
alternating, ``--repeats`` times each:

    .venv/bin/python reproduce/engine/compute_gap.py [--repeats 2] [--steps 132] [--out runs/compute-gap]
    .venv/bin/python reproduce/engine/compute_gap.py --table reproduce/engine/results-....json

Per run, from the step logs (every rank, the first ``WARMUP`` steps left out): the median compute time per
step (batch, forward, backward) on the wall clock and in the compute thread's CPU (the difference is time the
thread waited for a core), the median communication time per step (what the optimizer's step waited),
and from ``summary.json`` the throughput (tokens/s for the Transformer, images/s for ResNet) and rank 0's CPU
seconds by thread (``threads_cpu_s``), per step. The figures are medians over the repeats. Run it on an idle
machine (``flock /tmp/wagma-measure.lock``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from wagma_bench.record.events import current_summary
from wagma_bench.record.steps import read_step_records

BIN = Path(sys.executable).parent / "wagma-bench"
WARMUP = 10
WORKLOADS = {"transformer": ["workload=transformer"], "resnet": ["workload=resnet", "imbalance=none"]}
OPTIMIZERS = ("allreduce", "wagma")
COMMON = ["eval.target=null", "eval.every_rounds=100000", "logger.progress=off", "checkpoint.every_s=1e9"]


def one_run(run_dir: Path, workload: str, optimizer: str, nproc: int, steps: int) -> dict:
    shutil.rmtree(run_dir, ignore_errors=True)
    subprocess.run(
        [
            str(BIN),
            "run",
            *WORKLOADS[workload],
            f"optimizer={optimizer}",
            f"launcher.nproc={nproc}",
            f"train.max_rounds={steps}",
            *COMMON,
            f"hydra.run.dir={run_dir}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    summary = current_summary(json.loads((run_dir / "summary.json").read_text()))
    records = [r for recs in read_step_records(run_dir).values() for r in recs]
    kept = [r for r in records if r.local_step > WARMUP]
    per_step = {
        name: round(seconds / summary["rounds"] * 1e3, 3)
        for name, seconds in (summary.get("threads_cpu_s") or {}).items()
    }
    tokens = sum(r.tokens or 0 for r in records)
    return {
        "compute_ms": 1e3 * statistics.median(r.compute_s for r in kept),
        "compute_cpu_ms": 1e3 * statistics.median(r.compute_cpu_s for r in kept),
        "comm_ms": 1e3 * statistics.median(r.comm_s for r in kept),
        "throughput": (tokens if tokens else summary["samples"]) / summary["train_s"],
        "unit": "tokens/s" if tokens else "samples/s",
        "thread_cpu_ms_per_step": per_step,
        "engine": summary.get("engine"),
    }


def measure(repeats: int, steps: int, out: Path, workloads: list[str], nprocs: list[int]) -> list[dict]:
    rows = []
    for workload in workloads:
        for nproc in nprocs:
            runs = {opt: [] for opt in OPTIMIZERS}
            for i in range(repeats):  # alternated: a change of the machine's load falls on both
                for opt in OPTIMIZERS:
                    runs[opt].append(
                        one_run(out / f"{workload}-{nproc}-{opt}-{i}", workload, opt, nproc, steps)
                    )
                    print(f"{workload} x{nproc} {opt} #{i + 1}: {runs[opt][-1]}", flush=True)
            row = {"workload": workload, "nproc": nproc, "steps": steps, "repeats": repeats, "runs": runs}
            for opt in OPTIMIZERS:
                for key in ("compute_ms", "compute_cpu_ms", "comm_ms", "throughput"):
                    row[f"{opt}_{key}"] = round(statistics.median(r[key] for r in runs[opt]), 3)
                threads = runs[opt][0]["thread_cpu_ms_per_step"].keys()
                row[f"{opt}_thread_cpu_ms_per_step"] = {
                    t: round(statistics.median(r["thread_cpu_ms_per_step"].get(t, 0.0) for r in runs[opt]), 3)
                    for t in threads
                }
            row["unit"] = runs["allreduce"][0]["unit"]
            engines = [r["engine"] for r in runs["wagma"] if r["engine"]]
            row["wagma_progress_cpu_ms_per_round"] = (
                {
                    k: round(statistics.median(e["progress_cpu_ms_per_round"][k] for e in engines), 4)
                    for k in engines[0]["progress_cpu_ms_per_round"]
                }
                if engines
                else None
            )
            row["wagma_snapshot_share"] = (
                round(statistics.median(e["snapshots"] / max(1, e["rounds"]) for e in engines), 3)
                if engines
                else None
            )
            row["compute_ratio"] = round(row["wagma_compute_ms"] / row["allreduce_compute_ms"], 3)
            row["throughput_ratio"] = round(row["wagma_throughput"] / row["allreduce_throughput"], 3)
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    """The Markdown table of a committed result."""
    lines = [
        (
            "| workload | ranks on 2 cores | compute/step (ms): Allreduce-SGD, WAGMA-SGD | WAGMA/Allreduce "
            "compute | the compute thread's CPU/step (ms): Allreduce-SGD, WAGMA-SGD | comm/step (ms): "
            "Allreduce-SGD, WAGMA-SGD | throughput: Allreduce-SGD, WAGMA-SGD | WAGMA/Allreduce throughput | "
            "rank 0's CPU per step in WAGMA-SGD's threads (ms): progress, listener, native | its progress "
            "thread's CPU per round (ms): waiting, start, communication | rounds on a snapshot |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cpu = r["wagma_thread_cpu_ms_per_step"]
        lines.append(
            f"| {r['workload']} | {r['nproc']} | {r['allreduce_compute_ms']:.1f}, "
            f"{r['wagma_compute_ms']:.1f} | {r['compute_ratio']:.3f} | {r['allreduce_compute_cpu_ms']:.1f}, "
            f"{r['wagma_compute_cpu_ms']:.1f} | {r['allreduce_comm_ms']:.1f}, {r['wagma_comm_ms']:.1f} | "
            f"{r['allreduce_throughput']:.0f}, {r['wagma_throughput']:.0f} {r['unit']} | "
            f"{r['throughput_ratio']:.3f} | {cpu.get('wagma-progress', 0):.2f}, "
            f"{cpu.get('wagma-listener', 0):.2f}, {cpu.get('native', 0):.2f} | "
            f"{_split(r.get('wagma_progress_cpu_ms_per_round'))} | {_share(r.get('wagma_snapshot_share'))} |"
        )
    return "\n".join(lines)


def _split(cpu: dict | None) -> str:
    return ", ".join(f"{cpu[k]:.3f}" for k in ("waiting", "start", "communication")) if cpu else "-"


def _share(share: float | None) -> str:
    return f"{100 * share:.0f}%" if share is not None else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--steps", type=int, default=132, help="steps per run (a multiple of WAGMA-SGD's tau+1=11)"
    )
    ap.add_argument("--workloads", default="transformer,resnet")
    ap.add_argument("--nprocs", default="4,2")
    ap.add_argument("--out", type=Path, default=Path("runs/compute-gap"))
    ap.add_argument("--table", type=Path, help="print the table of a finished result, run nothing")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())["rows"]))
        return
    rows = measure(
        args.repeats,
        args.steps,
        args.out,
        args.workloads.split(","),
        [int(n) for n in args.nprocs.split(",")],
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(
        json.dumps({"machine": f"{os.cpu_count()} cores", "rows": rows}, indent=2)
    )
    print(table(rows))


if __name__ == "__main__":
    main()
