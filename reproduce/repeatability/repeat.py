"""Run-to-run repeatability: one committed tuning trial per workload run N times on one commit, its claim
metrics' spread between those runs set beside the spread between the trials of the committed tuning.

    PYTHONPATH=$PWD .venv/bin/python reproduce/repeatability/repeat.py run [WORKLOAD ...] [--runs 3] --out DIR
    .venv/bin/python reproduce/repeatability/repeat.py summary DIR      (DIR/repeatability.json, and the
                                                                          docs' block printed)

``run`` reruns the trial of :data:`TRIALS` (a committed trial of each claim's source: the subject's study 1,
trial 1 for ResNet; for DD-PPO and the Transformer the trials an audit repeated by hand) with that source's
setup (reproduce/tuning/mini.sh) and the trial's recorded overrides and seed, N times one after another, and
keeps each run's compact record (summary, events, the per-rank step table) under DIR/WORKLOAD/runN; the load
of the machine (``/proc/loadavg``) before and after each run goes into DIR/WORKLOAD/runN/load.json.
``summary`` reads them back; README.md next to this script says what they show."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from wagma_bench.analysis.tuning import TRIALS as TUNE_TRIALS
from wagma_bench.analysis.tuning import load_trials, trial_finished
from wagma_bench.record.events import EVENTS, EVENTS_XZ, SUMMARY, RunEvents, compact_events
from wagma_bench.record.files import OUTPUT_HINT, atomic_write, run_subdir, write_json_atomic
from wagma_bench.record.steps import STEP_TABLE, read_step_records, write_step_table

ROOT = Path(__file__).resolve().parents[2]
RESULTS = "repeatability.json"
PER_SECOND = ("throughput_samples_per_s", "time_to_target_s")  # timed: the machine's load is in them
LOAD = "load.json"
# workload -> (the committed tuning it reruns a trial of; that trial, WAGMA-SGD's (the claims' subject): for
# DD-PPO and the Transformer the trials an audit repeated by hand (01ff221d), for ResNet its first; the
# tuning's setup in mini.sh; the claim metrics read of each run: summary key -> what it is)
TRIALS = {
    "ddppo": (
        "reproduce/tuning/results-2core-20261206/ddppo_budget",
        "wagma_study5_trial3",
        ["workload=ddppo", "train.max_rounds=130", "eval.target=null"],
        {
            "best_metric": "best success",
            "final_metric": "final success",
            "throughput_samples_per_s": "frames/s",
        },
    ),
    "transformer": (
        "reproduce/tuning/results-2core-20261206/transformer_budget",
        "wagma_study2_trial3",
        ["workload=transformer", "train.max_rounds=300", "eval.target=null", "eval.every_rounds=50"],
        {"best_metric": "best BLEU", "final_metric": "final BLEU", "throughput_samples_per_s": "tokens/s"},
    ),
    # DD-PPO with the straggler preemption off, on Allreduce-SGD (synchronous: no timing of its own), the
    # trial that decides rl-final-quality: whatever still differs between its runs is not the preemption's
    "ddppo_no_preemption": (
        "reproduce/tuning/results-2core-20261206/ddppo_budget",
        "allreduce_study2_trial1",
        ["workload=ddppo", "train.max_rounds=130", "eval.target=null", "workload.preemption=false"],
        {"best_metric": "best success", "final_metric": "final success"},
    ),
    "resnet": (
        "reproduce/tuning/results-2core-20261205/resnet_independent",
        "wagma_study1_trial1",
        ["workload=resnet", "imbalance=independent"],
        {
            "rounds_to_target": "rounds to top-1 0.97",
            "time_to_target_s": "s to top-1 0.97",
            "throughput_samples_per_s": "samples/s",
        },
    ),
}


# The tuning's cap on a trial's training time (train.time_limit_s, tune.max_runtime_s) is lifted: on a loaded
# machine a run would hit it before its target, and what repeats or not is the run, not the cap. A run past
# the committed cap is reported as it is, beside the committed trial's time.
LIFTED = ("train.time_limit_s",)


def trial_overrides(workload: str) -> list[str]:
    source, name, setup, _ = TRIALS[workload]
    plan = json.loads((ROOT / source / "tune.json").read_text())
    trial = next(t for t in plan["trials"] if t["name"] == name)
    kept = [o for o in trial["overrides"] if o.split("=", 1)[0] not in LIFTED]
    return [*setup, *kept, "logger.progress=off"]


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def run(workloads: list[str], runs: int, out: Path, raw_root: Path, bin_: str) -> None:
    for w in workloads:
        for i in range(1, runs + 1):
            dest = out / w / f"run{i}"
            if (dest / SUMMARY).is_file():
                print(f"{dest}: done, skipped", flush=True)
                continue
            raw = raw_root / w / f"run{i}"
            shutil.rmtree(raw, ignore_errors=True)
            before, t0 = loadavg(), time.time()
            cmd = [bin_, "run", *trial_overrides(w), f"hydra.run.dir={raw}"]
            print(" ".join(cmd), flush=True)
            code = subprocess.run(cmd, check=False).returncode
            load = {"before": before, "after": loadavg(), "wall_s": round(time.time() - t0, 1), "exit": code}
            run_subdir(dest, OUTPUT_HINT)
            if (raw / SUMMARY).is_file():
                data = (raw / SUMMARY).read_bytes()
                atomic_write(dest / SUMMARY, lambda fh, data=data: fh.write(data), binary=True)
            if (raw / EVENTS).is_file():
                compact_events(raw, dest / EVENTS_XZ)
            if read_step_records(raw):
                write_step_table(raw, dest / STEP_TABLE)
            write_json_atomic(dest / LOAD, load)
            print(f"{dest}: exit {code}, {load}", flush=True)


def spread(values: list[float]) -> dict:
    """Median, range and standard deviation of the finite values (inf: a missed target, counted apart)."""
    values = [v for v in values if v is not None]  # not recorded
    finite = [v for v in values if math.isfinite(v)]
    return {
        "n": len(values),
        "finite": len(finite),
        "median": statistics.median(finite) if finite else None,
        "min": min(finite, default=None),
        "max": max(finite, default=None),
        "sd": statistics.stdev(finite) if len(finite) > 1 else None,
    }


def summarize(out: Path) -> dict:
    """Per workload: each run's claim metrics, preempted rollouts, CPU and load; their spread; the committed
    trial's values; the spread over the committed tuning's trials of the same optimizer."""
    result: dict = {"workloads": {}}
    for w, (source, name, _, metrics) in TRIALS.items():
        runs = sorted((out / w).glob("run*/" + SUMMARY)) if (out / w).is_dir() else []
        if not runs:
            continue
        summaries = [json.loads(p.read_text()) for p in runs]
        loads = [json.loads((p.parent / LOAD).read_text()) for p in runs]
        # the committed trials' summaries as written (under today's names), as the runs' own are read above
        committed = {n: s and s.to_json() for n, s in load_trials(ROOT / source)[2].items()}
        mine = committed[name]
        same = {
            n: s for n, s in committed.items() if trial_finished(s) and s["optimizer"] == mine["optimizer"]
        }
        trial_dir = ROOT / source / TUNE_TRIALS
        result["workloads"][w] = {
            "source": source,
            "trial": name,
            "optimizer": mine["optimizer"],
            "committed_git_sha": mine.get("git_sha"),
            # each trial one run (a resumed trial would be two runs' noise in one value): what the bootstrap's
            # trial level resamples is then each run's own noise with the rest of the trial's spread
            "committed_trials": len(same),
            "committed_trials_resumed": sum(bool(s.get("restarts")) for s in same.values()),
            "committed_config_hash": mine.get("config_hash"),
            "runs": [
                {
                    "run": p.parent.name,
                    "status": s.get("status"),
                    "git_sha": s.get("git_sha"),
                    "config_hash": s.get("config_hash"),
                    "cpu": s.get("cpu"),
                    "hosts": s.get("hosts"),
                    "preempted_rollouts": s.get("preempted_rollouts"),
                    "load": load,
                    **{k: s.get(k) for k in metrics},
                }
                for p, s, load in zip(runs, summaries, loads, strict=True)
            ],
            "metrics": {
                k: {
                    "what": what,
                    "committed": _value(mine, k, trial_dir / name),
                    "runs": spread([_value(s, k, p.parent) for p, s in zip(runs, summaries, strict=True)]),
                    "between_trials": spread([_value(s, k, trial_dir / n) for n, s in same.items()]),
                }
                for k, what in metrics.items()
            },
        }
    return result


def _value(summary: dict, key: str, run_dir: Path) -> float | None:
    """A claim metric of one run: inf for a time or rounds to a target it missed; the rounds to the target
    read from the evaluations where the summary predates that field; None where nothing recorded it."""
    if key in ("time_to_target_s", "rounds_to_target") and not summary.get("reached"):
        return math.inf
    v = summary.get(key)
    if v is None and key == "rounds_to_target":
        v = _rounds_to_target(run_dir)
    return None if v is None else float(v)


def _rounds_to_target(run_dir: Path) -> int | None:
    record = RunEvents.read(run_dir)
    target = record.start.get("target") if record.start else None
    for e in record.events:
        meta = e.get("metadata") or {}
        if e["key"] == "eval_accuracy" and target is not None and (e.get("value") or 0) >= target:
            return meta.get("round", meta.get("step"))  # ``step`` before the key was renamed
    return None


def fmt(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) < 1 else f"{v:.1f}"


def render(result: dict) -> str:
    """The block docs/claims.md quotes (the generated-figures test checks it against the committed file)."""
    lines = [
        (
            "| workload (trial) | metric | committed | N runs: median [min, max] | run-to-run sd | "
            "between trials: sd (n) | rollouts cut by preemption |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for w, x in result["workloads"].items():
        cut = [r["preempted_rollouts"] for r in x["runs"]]
        cut_text = ", ".join(f"{c['cut']}/{c['rollouts']}" if c else "—" for c in cut)
        for k, m in x["metrics"].items():
            r, b = m["runs"], m["between_trials"]
            lines.append(
                f"| {w} (`{x['trial']}`) | {m['what']} | {fmt(m['committed'])} | {fmt(r['median'])} "
                f"[{fmt(r['min'])}, {fmt(r['max'])}] ({r['finite']} of {r['n']}) | {fmt(r['sd'])} | "
                f"{fmt(b['sd'])} ({b['finite']}) | {cut_text if k == next(iter(x['metrics'])) else ''} |"
            )
    for w, x in result["workloads"].items():
        lines.append("")
        for m in x["metrics"].values():
            lines.append(f"- {w}, {m['what']}: {_compared(m)}.")
        if any(k in PER_SECOND for k in x["metrics"]):
            lines.append(
                f"- {w}: {', '.join(m['what'] for k, m in x['metrics'].items() if k in PER_SECOND)}: "
                "this load's, not comparable with the committed trials' (README.md beside the runs)."
            )
        resumed = x["committed_trials_resumed"]
        lines.append(
            f"- {w}: {x['committed_trials'] - resumed} of the {x['committed_trials']} committed "
            f"{x['optimizer']} trials ran once, from start to end (no resume)."
        )
    return "\n".join(lines)


def _compared(m: dict) -> str:
    """One metric's run-to-run spread against the committed trials' spread, in words."""
    r, b = m["runs"], m["between_trials"]
    values = {r["min"], r["max"]}
    if r["finite"] < r["n"]:
        same = f"{r['n'] - r['finite']} of {r['n']} runs missed the target"
    elif len(values) == 1:
        same = f"the {r['n']} runs gave one value"
    else:
        same = f"the {r['n']} runs spread over {fmt(r['max'] - r['min'])}"
    if r["sd"] is None or b["sd"] is None:
        return same
    side = "below" if r["sd"] < b["sd"] else "not below"
    return f"{same}; their sd {fmt(r['sd'])} is {side} the committed trials' {fmt(b['sd'])}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("workloads", nargs="*", help=f"of {', '.join(TRIALS)} (default: all)")
    r.add_argument("--runs", type=int, default=3)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--raw", type=Path, default=Path("/tmp/wagma-repeatability"), help="the runs' own folders")
    r.add_argument("--bin", default=str(ROOT / ".venv" / "bin" / "wagma-bench"))
    s = sub.add_parser("summary")
    s.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "run":
        unknown = [w for w in args.workloads if w not in TRIALS]
        if unknown:
            parser.error(f"workload {unknown[0]!r} is not one of {', '.join(TRIALS)}")
        run(args.workloads or list(TRIALS), args.runs, args.out, args.raw, args.bin)
        return 0
    write_json_atomic(args.out / RESULTS, summarize(args.out))
    print(render(json.loads((args.out / RESULTS).read_text())))  # as read back: what the docs' test renders
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
