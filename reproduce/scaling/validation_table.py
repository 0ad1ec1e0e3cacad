"""The simulator's validation table: predicted against measured throughput of every committed validation run.

    .venv/bin/python reproduce/scaling/validation_table.py RESULTS_DIR            # recompute, write, print
    .venv/bin/python reproduce/scaling/validation_table.py --table RESULTS_DIR    # print the committed table
    .venv/bin/python reproduce/scaling/validation_table.py --delayed RUN_DIR...   # delayed ranks' compute
    .venv/bin/python reproduce/scaling/validation_table.py --comm \\
        COMM_BENCH RUN_DIR...                                                     # recorded vs modelled wait

RESULTS_DIR holds the compact runs of `reproduce/scaling/validate.sh` (`runs/<label>_<imbalance>_p<P>/`:
summary, events and the step table) and its `comm_bench.json`. The first form runs `wagma-bench simulate
cluster=local --calibrate RESULTS_DIR/runs RESULTS_DIR/comm_bench.json --out RESULTS_DIR/sim` (each run's own
configuration simulated twice: its compute times resampled i.i.d., and its ranks' recorded compute times and
delays replayed in order) and writes `RESULTS_DIR/validation.json`, one row per run with the label of its
folder (streaming DiLoCo is a variant of local SGD). The bar: trace within 5% and resampled within 15% of the
measured throughput; a row outside it is bold.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from wagma_bench.record.files import write_text_atomic

TRACE_BAR, RESAMPLED_BAR = 0.05, 0.15
RUN = re.compile(r"(?P<label>.+)_(?P<imbalance>none|independent|lognormal|shared_draw)_p(?P<world>\d+)")
ORDER = (
    "allreduce",
    "wagma",
    "local_sgd",
    "dpsgd",
    "adpsgd",
    "sgp",
    "eager",
    "dropcompute",
    "diloco_streaming",
)
IMBALANCE_ORDER = ("none", "independent", "lognormal", "shared_draw")


def rows_of(sim_rows: list[dict]) -> list[dict]:
    out = []
    for r in sim_rows:
        m = RUN.fullmatch(Path(r["run"]).name)
        if not m:
            continue
        out.append(
            {
                "label": m["label"],
                "imbalance": m["imbalance"],
                "world_size": int(m["world"]),
                "measured": r["measured"],
                "resampled": r["predicted"],
                "ratio": r["ratio"],
                "trace": r["predicted_trace"],
                "ratio_trace": r["ratio_trace"],
            }
        )
    rank = {n: i for i, n in enumerate(ORDER)}
    return sorted(
        out,
        key=lambda r: (
            rank.get(r["label"], len(ORDER)),
            IMBALANCE_ORDER.index(r["imbalance"]),
            r["world_size"],
        ),
    )


def misses(rows: list[dict]) -> tuple[int, int]:
    trace = sum(abs(r["ratio_trace"] - 1) > TRACE_BAR for r in rows)
    resampled = sum(abs(r["ratio"] - 1) > RESAMPLED_BAR for r in rows)
    return trace, resampled


def table(rows: list[dict]) -> str:
    def ratio(v: float, bar: float) -> str:
        return f"**{v:.2f}**" if abs(v - 1) > bar else f"{v:.2f}"

    lines = [
        "| optimizer | imbalance | P | measured (samples/s) | resampled | ratio | trace | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['imbalance']} | {r['world_size']} | {r['measured']:,.0f} | "
            f"{r['resampled']:,.0f} | {ratio(r['ratio'], RESAMPLED_BAR)} | {r['trace']:,.0f} | "
            f"{ratio(r['ratio_trace'], TRACE_BAR)} |"
        )
    trace, resampled = misses(rows)
    n = len(rows)
    lines += ["", f"Trace within 5%: {n - trace} of {n}; resampled within 15%: {n - resampled} of {n}."]
    return "\n".join(lines)


def delayed_compute(run: Path) -> tuple[float, float]:
    """(median compute time of each step's most-delayed rank, median of the other ranks'): on 2 shared cores a
    rank that computes while the others wait for it runs faster, which a resampled draw does not keep."""
    from wagma_bench.record.steps import read_step_records

    by_step: dict[int, list[tuple[float, float]]] = {}
    records = read_step_records(run)
    for rank_records in records.values():
        for r in rank_records[4:]:  # the calibration's warm-up left out
            by_step.setdefault(r.local_step, []).append((r.delay_s or 0.0, r.compute_s))
    most, others = [], []
    for step in by_step.values():
        if len(step) == len(records):
            step.sort()
            most.append(step[-1][1])
            others += [c for _, c in step[:-1]]
    return statistics.median(most), statistics.median(others)


def comm_gap(run: Path, comm_bench: Path) -> tuple[float, float]:
    """(the seconds per step the run's ranks recorded waiting in communication, the seconds per step the trace
    replay of the run waits): comm-bench times its collectives with the ranks otherwise idle."""
    import dataclasses

    from wagma_bench.simulate.calibrate import fit_network, fit_run
    from wagma_bench.simulate.compare import replay_run
    from wagma_bench.simulate.des import SimResult

    fit = fit_run(run)
    network, _ = fit_network([json.loads(comm_bench.read_text())])
    replayed: list[SimResult] = []
    replay_run(fit, dataclasses.replace(fit.to_workload(), compute="trace"), network, keep=replayed)
    res = replayed[0]
    return fit.comm_s_mean, res.wait_frac * res.time_s / res.rounds


def main(argv: list[str]) -> int:
    if argv[:1] == ["--comm"]:  # --comm COMM_BENCH RUN_DIR...
        for run in argv[2:]:
            recorded, modelled = comm_gap(Path(run), Path(argv[1]))
            print(
                f"{Path(run).name}: {1e3 * recorded:.0f} ms a step recorded in communication, "
                f"{1e3 * modelled:.0f} ms modelled"
            )
        return 0
    if argv[:1] == ["--delayed"]:  # --delayed RUN_DIR...
        for run in argv[1:]:
            most, others = delayed_compute(Path(run))
            print(
                f"{Path(run).name}: each step's most-delayed rank computes in {most:.3f} s (median), the "
                f"others in {others:.3f} s"
            )
        return 0
    if argv[:1] == ["--table"]:
        print(table(json.loads((Path(argv[1]) / "validation.json").read_text())))
        return 0
    results = Path(argv[0])
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as sim:
        subprocess.run(
            [
                str(root / ".venv" / "bin" / "wagma-bench"),
                "simulate",
                "cluster=local",
                "--calibrate",
                str(results / "runs"),
                str(results / "comm_bench.json"),
                "--out",
                sim,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        rows = rows_of(json.loads((Path(sim) / "validation.json").read_text()))
    write_text_atomic(results / "validation.json", json.dumps(rows, indent=1) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
