"""What came after WAGMA-SGD, tuned beside it: per workload, who wins among Allreduce-SGD, WAGMA-SGD,
DropCompute and streaming DiLoCo, with intervals, and the figures that explain it.

    .venv/bin/python reproduce/tuning/after_wagma.py          # the tables of the committed tunings (markdown)

Each method's row is its tuning (``wagma-bench tune``, AlgoPerf's external tuning, S studies x O trials) read
the way ``wagma-bench claims`` reads one (:func:`wagma_bench.analysis.claims.measure`): the score is the
median over studies of each study's fastest time to the target, with the exact two-stage bootstrap interval.
"Against the best of the others" is that method as a claim's subject against the other methods of its workload
(:func:`wagma_bench.analysis.claims.speedup`: > 1 favours the method, the best of the others chosen inside
each resample); a method **wins** when the whole interval of that ratio is above 1. Beside it, what explains
the result: DropCompute's drop rate (the share of micro-batches not computed, median over its trials), the
time a step waited in communication (median over each trial's steps on every rank, then over the trials), and
how much the method reduces per step, in models (the winning trial's settings: a gradient or a model each step
for Allreduce-SGD, DropCompute and WAGMA-SGD, one fragment of 1/F every H/F steps for streaming DiLoCo, 1/H).
Where the simulator was run (``PREDICTED``: ``wagma-bench simulate --out`` folders, their commands and
assumptions in the tuning's README), a second table gives each method's predicted throughput and time to the
target against Allreduce-SGD's at the same P (> 1 favours the method), its wait share and DropCompute's
predicted drop rate.

A workload's methods come from tunings of one campaign or of one machine and day (each tuning's README says
when and where it ran): time to target is compared within a machine, never across machines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from wagma_bench.analysis.claims import measure, num, speedup, times
from wagma_bench.analysis.tables import markdown_table
from wagma_bench.analysis.tuning import load_trials, trial_finished
from wagma_bench.record.steps import read_step_records
from wagma_bench.record.summary import RunSummary

ROOT = Path(__file__).resolve().parents[2]
T = Path("reproduce/tuning")
Methods = list[tuple[str, Path, str]]  # (method, tuning or simulation directory, the optimizer it holds)


def _tuned(where: Path, name: str) -> Methods:
    """One campaign's four tunings: ``where/name_pair`` (Allreduce-SGD and WAGMA-SGD, tuned together),
    ``where/name_dropcompute`` and ``where/name_streaming``."""
    return [
        ("Allreduce-SGD", where / f"{name}_pair", "allreduce"),
        ("WAGMA-SGD", where / f"{name}_pair", "wagma"),
        ("DropCompute", where / f"{name}_dropcompute", "dropcompute"),
        ("streaming DiLoCo", where / f"{name}_streaming", "local_sgd"),
    ]


def _simulated(where: Path, name: str) -> Methods:
    """The four methods' rows in ``where/name`` (Allreduce-SGD, WAGMA-SGD, DropCompute) and
    ``where/name_streaming`` (streaming DiLoCo, simulated apart at its winning H)."""
    return [
        ("Allreduce-SGD", where / name, "allreduce"),
        ("WAGMA-SGD", where / name, "wagma"),
        ("DropCompute", where / name, "dropcompute"),
        ("streaming DiLoCo", where / f"{name}_streaming", "local_sgd"),
    ]


def _no_dropcompute(methods: Methods) -> Methods:
    """DD-PPO's methods: DropCompute does not apply (a rollout and its PPO updates do not split into
    micro-batches)."""
    return [m for m in methods if m[0] != "DropCompute"]


WORKLOADS: dict[str, Methods] = {
    "ResNet-20 on the embedded MNIST subset, `imbalance=shared_draw` (named `paper` when these runs were "
    "made; 2 of 4 ranks sleep 0.3 s per step)": _tuned(T / "results-2core-20261203d", "resnet_paper"),
    "ResNet-20 on the embedded MNIST subset, `imbalance=lognormal` (every rank's step drawn x "
    "LogNormal(0, 0.5), truncated at 1)": _tuned(T / "results-2core-20261203e", "resnet_lognormal"),
    "the embedded Transformer, token batches (natural imbalance only)": [
        ("Allreduce-SGD", T / "results-2core-20261202/transformer", "allreduce"),
        ("WAGMA-SGD", T / "results-2core-20261202/transformer", "wagma"),
        ("DropCompute", T / "results-2core-20261202b/transformer_dropcompute", "dropcompute"),
        ("streaming DiLoCo", T / "results-2core-20261202b/transformer_streaming", "local_sgd"),
    ],
    "DD-PPO on the embedded MiniWorld rooms (the rollouts' natural imbalance; no DropCompute: a rollout "
    "does not split into micro-batches)": _no_dropcompute(_tuned(T / "results-2core-20261203e", "ddppo")),
}

RESNET_PAPER, RESNET_LOGNORMAL, _, DDPPO = WORKLOADS
SIM = T / "results-2core-20261203d/paper-scale"
SIM_E = T / "results-2core-20261203e/paper-scale"
# per workload: the simulator's outputs (wagma-bench simulate --out) at the paper's scale, each method's row
# there
PREDICTED: dict[str, Methods] = {
    RESNET_PAPER: _simulated(SIM, "resnet50"),
    RESNET_LOGNORMAL: _simulated(SIM_E, "resnet50_lognormal"),
    DDPPO: _no_dropcompute(_simulated(SIM_E, "rl")),
}


def _finished(tune_dir: Path, optimizer: str) -> list[tuple[Path, RunSummary]]:
    """The finished trials of ``optimizer`` in a tuning directory: (run directory, summary)."""
    _, combos, summaries = load_trials(tune_dir)
    return [
        (tune_dir / "trials" / t.name, summaries[t.name])
        for trials in combos.values()
        for t in trials
        if trial_finished(summaries[t.name]) and summaries[t.name].optimizer == optimizer
    ]


def _comm_ms(run_dir: Path) -> float:
    waits = [rec.comm_s for recs in read_step_records(run_dir).values() for rec in recs]
    return 1e3 * statistics.median(waits)


def _reductions(tune_dir: Path, optimizer: str) -> str:
    """Models reduced per step under the winning trial's settings (the tuning's ``tuning.json``)."""
    if optimizer != "local_sgd":
        return "1"
    scored = json.loads((tune_dir / "tuning.json").read_text())
    win = next(e["winner"] for e in scored["results"] if e.get("optimizer") == optimizer)
    params = (win or {}).get("params", {})
    # named optimizer.period before 2026-12-06
    period = params.get("optimizer.sync_period", params.get("optimizer.period"))
    return "—" if period is None else f"1/{period}"


def rows_of(methods: Methods, root: Path = ROOT) -> list[dict]:
    by_dir = {d: measure(root / d, "time_to_target") for d in dict.fromkeys(d for _, d, _ in methods)}
    measured = {name: by_dir[d][opt] for name, d, opt in methods}
    rows = []
    for name, d, opt in methods:
        m = measured[name]
        sp = speedup(m, {k: v for k, v in measured.items() if k != name}, lower_is_better=True)
        trials = _finished(root / d, opt)
        drops = [s.dropcompute["drop_rate"] for _, s in trials if s.dropcompute]
        lo, hi = sp.interval
        rows.append(
            {
                "method": name,
                "score": f"{num(m.value)} [{num(m.interval[0])}, {num(m.interval[1])}]",
                "reached": f"{m.reached}/{m.finished}",
                "against": f"{times(sp.value)} [{times(lo)}, {times(hi)}]" + (" **wins**" if lo > 1 else ""),
                "drop": f"{100 * statistics.median(drops):.1f}%" if drops else "—",
                "comm": f"{statistics.median(_comm_ms(r) for r, _ in trials):.1f}",
                "reductions": _reductions(root / d, opt),
                "imbalance": num(m.compute_imbalance),
                "tuning": f"`{d.parent.name}/{d.name}`",
            }
        )
    return rows


COLUMNS = [
    ("method", "method", ""),
    ("score", "time to target (s) [95%]", ""),
    ("reached", "trials reached", ""),
    ("against", "against the best of the others [95%]", ""),
    ("drop", "drop rate", ""),
    ("comm", "comm wait per step (ms)", ""),
    ("reductions", "models reduced per step", ""),
    ("imbalance", "compute imbalance", ""),
    ("tuning", "tuning", ""),
]


def predicted_rows(methods: Methods, root: Path = ROOT) -> list[dict]:
    """The simulator's rows of each method at every world size it predicted, against Allreduce-SGD's there."""
    found = {
        name: [r for r in json.loads((root / d / "predictions.json").read_text()) if r["optimizer"] == opt]
        for name, d, opt in methods
    }
    reference = {r["world_size"]: r for r in found.get("Allreduce-SGD", [])}
    rows = []
    for p in sorted({r["world_size"] for rs in found.values() for r in rs}):
        ref = reference.get(p, {})
        for name, _, _ in methods:
            for r in (r for r in found[name] if r["world_size"] == p):
                rows.append(
                    {
                        "method": name,
                        "P": f"{p:,}",
                        "throughput": f"{r['throughput']:,.0f}",
                        "vs": _ratio(r["throughput"], ref.get("throughput")),
                        "wait": f"{100 * r['wait_frac']:.0f}%",
                        "drop": f"{100 * r['drop_rate']:.1f}%" if r.get("drop_rate") is not None else "—",
                        "ttt": _ratio(ref.get("time_to_target_s"), r.get("time_to_target_s")),
                    }
                )
    return rows


def _ratio(a: float | None, b: float | None) -> str:
    return times(a / b) if a and b else "—"


PREDICTED_COLUMNS = [
    ("method", "method", ""),
    ("P", "P", ""),
    ("throughput", "samples/s", ""),
    ("vs", "throughput against Allreduce-SGD", ""),
    ("wait", "wait share", ""),
    ("drop", "drop rate", ""),
    ("ttt", "time to target against Allreduce-SGD", ""),
]


def tables(
    workloads: dict[str, Methods] = WORKLOADS, predicted: dict[str, Methods] = PREDICTED, root: Path = ROOT
) -> str:
    parts = []
    for title, methods in workloads.items():
        parts += [f"**{title}**", "", markdown_table(rows_of(methods, root), COLUMNS), ""]
        if title in predicted:
            where = predicted[title][0][1].parent.relative_to(T)
            parts += [
                f"Predicted at the paper's scale (`wagma-bench simulate`, `{where}`):",
                "",
                markdown_table(predicted_rows(predicted[title], root), PREDICTED_COLUMNS),
                "",
            ]
    return "\n".join(parts).rstrip()


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    print(tables())
    return 0


if __name__ == "__main__":
    sys.exit(main())
