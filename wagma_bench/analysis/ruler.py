"""Which ruler a tuning directory was measured with, read from what its trials recorded.

The trainer once
evaluated a periodic optimizer (local SGD, WAGMA-SGD's synchronous rounds) at its next synchronous round
after an evaluation fell due, up to a sync period late, and let a step budget run on to the next sync; an
optimizer that synchronises every round was evaluated on time. A time-to-target comparison between the two
then favours the one evaluated on time. Since the fix, every evaluation falls on the grid of ``eval_every``
rounds and a run ends at its budget. A source is on the **current** ruler when every finished trial shows
it: each evaluation at a multiple of its ``eval_every`` (or, for a run that missed its target, at the round
where it stopped), and no trial past its ``train.max_rounds``. Otherwise it is on the **old** ruler, and the
counts say how many evaluations were late (a source whose runs did not record ``eval_every`` is old too).

The hosts the trials ran on are read here as well (``run_start``'s host names and, since it was recorded,
rank 0's CPU model and the instruction set torch used: :func:`wagma_bench.record.provenance.cpu_identity`).
"""

from __future__ import annotations

from pathlib import Path

from wagma_bench.analysis.tuning import TRIALS, load_trials, trial_finished
from wagma_bench.config.recorded import setting
from wagma_bench.record.events import RunEvents

RULERS = ("current", "old")


def source_record(tune_dir: Path, loaded: tuple | None = None) -> dict:
    """``{"ruler": "current" | "old", "evaluations": n, "late_evaluations": k, "over_budget": j,
    "unrecorded": u, "hosts": [...]}`` over a tuning directory's finished trials."""
    _, combos, summaries = loaded or load_trials(tune_dir)
    evaluations = late = over = unrecorded = 0
    hosts: dict[tuple, int] = {}
    for trials in combos.values():
        for t in trials:
            if not trial_finished(summaries[t.name]):
                continue
            record = RunEvents.read(Path(tune_dir) / TRIALS / t.name)
            start = record.start
            meta = start.metadata if start else {}
            every = meta.get("eval_every")
            budget = setting(start.config if start else None, "train.max_rounds")  # under today's name
            rounds = [_round(e) for e in record.events if e["key"] == "eval_accuracy"]
            rounds = [r for r in rounds if r is not None]
            last = max(rounds, default=0)
            evaluations += len(rounds)
            if not every:
                unrecorded += 1
            else:
                # a run that missed its target may evaluate once more where it stopped (its budget, or its
                # time limit); a run that reached it stopped at that evaluation, which must be on the grid
                end = last if not summaries[t.name].reached else None
                late += sum(1 for r in rounds if r % every and r != end)
            over += bool(budget) and last > budget
            cpu = meta.get("cpu") or {}
            key = (tuple(meta.get("hosts") or ()), cpu.get("model"), cpu.get("capability"))
            hosts[key] = hosts.get(key, 0) + 1
    return {
        "ruler": "current" if not (late or over or unrecorded) else "old",
        "evaluations": evaluations,
        "late_evaluations": late,
        "over_budget": over,
        "unrecorded": unrecorded,
        "hosts": [
            {"hosts": list(h), "cpu_model": model, "cpu_capability": cap, "trials": n}
            for (h, model, cap), n in sorted(hosts.items(), key=lambda kv: -kv[1])
        ],
    }


def _round(event: dict) -> int | None:
    meta = event.get("metadata") or {}
    value = meta.get("round", meta.get("step"))  # ``step`` before the key was renamed
    return int(value) if value is not None else None


def hosts_text(record: dict) -> str:
    """``vm (AMD EPYC, AVX512; 50 trials)``; "CPU not recorded" for runs from before it was."""
    parts = []
    for h in record["hosts"]:
        names = ", ".join(h["hosts"]) or "host not recorded"
        cpu = (
            f"{h['cpu_model']}, {h['cpu_capability']}"
            if h["cpu_model"] or h["cpu_capability"]
            else "CPU not recorded"
        )
        parts.append(f"{names} ({cpu}; {h['trials']} trials)")
    return "; ".join(parts) or "not recorded"
