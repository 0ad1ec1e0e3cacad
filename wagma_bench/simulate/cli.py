"""``wagma-bench simulate``: predicted throughput and time-to-target of every optimizer against world size.

    wagma-bench simulate cluster=daint gpus=8,16,32,64,128,256,512,1024 \\
        optimizer=allreduce,wagma,local_sgd,dpsgd,adpsgd,sgp,eager imbalance=paper imbalance.delay_s=0.32 \\
        workload=resnet data=imagenet [step_s=0.32 batch=128 params=25.6e6 sigma=0.02 overhead_s=0] \\
        [optimizer.tau=10 ...] [steps=500 seed=1 control_every=10] [samples_to_target=N] [--convergence RUN_DIR...] [--out DIR]
    wagma-bench simulate --calibrate RUN_DIR... [COMM_BENCH.json...] [--out DIR]     (validation)

``--calibrate``: fits each run's compute-time distribution and overhead, and alpha/beta from comm-bench
JSON (or takes the cluster profile's network), then simulates every calibrated run's own configuration and
prints predicted against measured throughput, twice: with compute times resampled i.i.d. from the run's
pooled measurements (``compute=empirical``, the default; ``compute=lognormal`` fits a lognormal instead), as
predictions at other scales use them, and trace-driven (each rank's recorded compute times replayed step by
step, which tests the communication and waiting model alone). Given ``gpus=`` too, it also predicts that
sweep with the workload pooled from the calibrated runs.

``control_every``: the trainer's control allreduce (a global barrier) every that many rounds, rounded up
to the optimizer's sync period, as ``wagma-bench run`` does (default 10); ``control_every=0`` leaves only
the optimizers' own synchronisation -- the paper's implementations, which have no such barrier.

Convergence model (time-to-target): samples to the target per optimizer, from real runs that reached it
(``--convergence RUN_DIR...``: the ``samples`` of the first evaluation at or above the target, median over
runs, taken at the smallest world size measured) or one value for all (``samples_to_target=N``). It is
held constant in P -- the linear-scaling regime of large-batch SGD (Goyal et al. 2017), where epochs to a
target do not change with the global batch; beyond the critical batch size this is optimistic, for every
optimizer alike. time_to_target(P) = samples_to_target / predicted throughput(P).

Outputs in ``--out`` (default ``sim/``): ``predictions.csv|json``, ``throughput.png`` (``plots.plot_throughput``,
the report's figure, predictions dashed), ``time_to_target.png``, and with ``--calibrate``
``validation.csv|json``, ``validation.png`` and ``calibration.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from wagma_bench import plots
from wagma_bench.events import RunEvents
from wagma_bench.imbalance import IMBALANCES, Imbalance
from wagma_bench.simulate.costs import Network
from wagma_bench.simulate.des import CONTROL_EVERY, SIMULATORS, SimConfig, SimResult, Workload, simulate
from wagma_bench.simulate.presets import preset_for

ROOT = Path(__file__).resolve().parent.parent.parent
CONF = ROOT / "conf"
DEFAULT_GPUS = (8, 16, 32, 64, 128, 256, 512, 1024)
WORKLOAD_KEYS = {f.name for f in dataclasses.fields(Workload)} - {"name", "samples", "trace", "source"}
KEYS = {"cluster", "gpus", "optimizer", "imbalance", "workload", "data", "steps", "seed", "control_every",
        "samples_to_target"} | WORKLOAD_KEYS
PREFIXES = ("optimizer.", "imbalance.", "network.", "cluster.")
# settings of optimizers that have no conf/optimizer file yet
FALLBACK_SETTINGS = {"eager": {"name": "eager", "mode": "solo", "sync_every": 10}}


class UsageError(ValueError):
    pass


def _value(text: str) -> Any:
    return yaml.safe_load(text) if text != "" else None


def parse(argv: list[str]) -> tuple[dict, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="wagma-bench simulate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE: cluster, gpus, optimizer, imbalance, workload, ...")
    ap.add_argument("--calibrate", nargs="+", default=[], metavar="PATH", help="run directories and comm-bench JSON")
    ap.add_argument("--convergence", nargs="+", default=[], metavar="RUN_DIR", help="runs that reached a target")
    ap.add_argument("--out", default="sim", help="output directory (default: sim)")
    ap.add_argument("--cfg", choices=("job",), help="print what each simulation would use, simulate nothing")
    ns = ap.parse_args(argv)
    # `--calibrate RUN params=N`: nargs="+" also took the KEY=VALUE items that follow the paths
    for opt in ("calibrate", "convergence"):
        items = getattr(ns, opt)
        moved = [i for i in items if "=" in i and not Path(i).exists()]
        setattr(ns, opt, [i for i in items if i not in moved])
        ns.overrides += moved
        if items and not getattr(ns, opt):
            raise UsageError(f"--{opt} needs at least one path")
    from wagma_bench.sweep import parse_overrides  # Hydra's override grammar, as `run -m` and `sweep`

    kv = {}
    for k, values in parse_overrides(ns.overrides):
        if k not in KEYS and not k.startswith(PREFIXES):
            raise UsageError(f"unknown key {k!r}; known: {', '.join(sorted(KEYS))}, and "
                             f"{', '.join(p + 'KEY' for p in PREFIXES)}")
        kv[k] = ",".join(values)  # a list below is comma-separated (gpus, optimizer)
    return kv, ns


def _list(text: str | None, default) -> list:
    if text is None:
        return list(default)
    return [t.strip() for t in str(text).split(",") if t.strip()]


# --- building the pieces from KEY=VALUE -----------------------------------------------------------------

def load_network(cluster: str, overrides: dict) -> tuple[Network, dict]:
    path = CONF / "cluster" / f"{cluster}.yaml"
    if not path.exists():
        names = ", ".join(sorted(p.stem for p in (CONF / "cluster").glob("*.yaml")))
        raise UsageError(f"cluster={cluster!r} is not available; choose one of: {names}")
    prof = yaml.safe_load(path.read_text()) or {}
    net = dict(prof.get("network") or {})
    for k, v in overrides.items():  # network.inter.alpha_s=2e-6
        node = net
        *parents, leaf = k.split(".")[1:]
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = _value(v)
    gpn = int(overrides.get("cluster.gpus_per_node", prof.get("gpus_per_node", 1)))
    return Network.from_profile(net, gpn, f"conf/cluster/{cluster}.yaml network"), net


def optimizer_settings(name: str, overrides: dict) -> dict:
    if name not in SIMULATORS:
        raise UsageError(f"unknown optimizer {name!r}; available: {', '.join(SIMULATORS)}")
    path = CONF / "optimizer" / f"{name}.yaml"
    base = yaml.safe_load(path.read_text()) if path.exists() else dict(FALLBACK_SETTINGS.get(name, {"name": name}))
    for k, v in overrides.items():
        key = k.split(".", 1)[1]
        if key in base:
            base[key] = _value(v)
    return base


def check_optimizer_overrides(names: list[str], overrides: dict) -> None:
    known = set()
    for n in names:
        known |= set(optimizer_settings(n, {}))
    bad = [k for k in overrides if k.split(".", 1)[1] not in known]
    if bad:
        raise UsageError(f"{', '.join(bad)}: no selected optimizer has that setting; known: {', '.join(sorted(known))}")


def make_imbalance(spec: dict | str, overrides: dict, seed: int) -> Imbalance:
    fields = dict(spec) if isinstance(spec, dict) else None
    name = fields["name"] if fields else spec
    if name not in IMBALANCES:
        raise UsageError(f"unknown imbalance {name!r}; choose one of: {', '.join(IMBALANCES)}")
    if fields is None:
        path = CONF / "imbalance" / f"{name}.yaml"
        fields = yaml.safe_load(path.read_text()) if path.exists() else {"name": name}
    for k, v in overrides.items():
        fields[k.split(".", 1)[1]] = _value(v)
    cls = IMBALANCES[name]
    try:
        settings = cls.Settings(**fields)
    except TypeError:
        valid = ", ".join(f.name for f in dataclasses.fields(cls.Settings))
        raise UsageError(f"imbalance {name}: unknown setting in {sorted(fields)}; valid: {valid}") from None
    return cls(settings, seed)


def make_workload(kv: dict) -> Workload:
    wl = dataclasses.replace(preset_for(kv.get("workload", "resnet50"), kv.get("data")))
    for k in WORKLOAD_KEYS & set(kv):
        cur = getattr(wl, k)
        val = _value(kv[k])
        setattr(wl, k, type(cur)(val) if isinstance(cur, (int, float)) and not isinstance(cur, bool) else val)
    if kv.keys() & WORKLOAD_KEYS:
        wl.source = "preset + overrides"
    return wl


# --- convergence model ----------------------------------------------------------------------------------

def samples_to_target(run_dirs: list[str]) -> dict[str, float]:
    """Per optimizer: median global samples at the first evaluation reaching the target, over the runs at
    the smallest world size that reached it."""
    from wagma_bench.report import find_runs

    found: dict[str, dict[int, list[float]]] = {}
    for d in find_runs([Path(p) for p in run_dirs]):
        record = RunEvents.read(d)
        hit = record.first_at_target
        if hit is not None:
            found.setdefault(record.start.optimizer, {}).setdefault(int(record.start.world_size), []).append(
                float(hit.samples))
    return {opt: statistics.median(by_p[min(by_p)]) for opt, by_p in found.items()}


# --- tables, files, plots -------------------------------------------------------------------------------

def fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def markdown(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    out = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(fmt(r.get(k)) for k, _ in cols) + " |" for r in rows]
    return "\n".join(out)


def write_table(rows: list[dict], out: Path, stem: str) -> None:
    import csv

    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(rows, indent=2, default=float) + "\n")
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(out / f"{stem}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)


def plot_time_to_target(rows: list[dict], path: Path, title: str) -> Path:
    plt = plots._plt()
    palette = plots.colors([r["label"] for r in rows])
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label in palette:
        rs = sorted((r for r in rows if r["label"] == label and r.get("time_to_target_s")), key=lambda r: r["world_size"])
        if rs:
            ax.plot([r["world_size"] for r in rs], [r["time_to_target_s"] / 3600 for r in rs], color=palette[label],
                    marker="x", linestyle="--", label=f"{label} (predicted)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    sizes = sorted({r["world_size"] for r in rows})
    ax.set_xticks(sizes, [str(p) for p in sizes])
    ax.set_xlabel("world size P (ranks)")
    ax.set_ylabel("time to target (h, training clock)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return plots._save(fig, path)


# --- the two modes --------------------------------------------------------------------------------------

def predict(kv: dict, ns, network: Network, workload: Workload, out: Path) -> list[dict]:
    gpus = [int(g) for g in _list(kv.get("gpus"), DEFAULT_GPUS)]
    names = _list(kv.get("optimizer"), SIMULATORS)
    opt_over = {k: v for k, v in kv.items() if k.startswith("optimizer.")}
    check_optimizer_overrides(names, opt_over)
    imb_over = {k: v for k, v in kv.items() if k.startswith("imbalance.")}
    seed, steps = int(kv.get("seed", 1)), int(kv.get("steps", 500))
    imbalance = make_imbalance(kv.get("imbalance", "none"), imb_over, seed)
    conv = samples_to_target(ns.convergence) if ns.convergence else {}
    if "samples_to_target" in kv:
        conv = {n: float(_value(kv["samples_to_target"])) for n in names} | conv
    rows = []
    for p in gpus:
        for name in names:
            t0 = time.perf_counter()
            res = simulate(SimConfig(name, p, workload, network, imbalance, optimizer_settings(name, opt_over),
                                     steps, seed, int(kv.get("control_every", CONTROL_EVERY))))
            rows.append(_row(res, imbalance, workload, conv.get(name), time.perf_counter() - t0))
    ref = {r["world_size"]: r["throughput"] for r in rows if r["optimizer"] == "allreduce"}
    for r in rows:
        r["speedup_vs_allreduce"] = r["throughput"] / ref[r["world_size"]] if r["world_size"] in ref else None
    write_table(rows, out, "predictions")
    title = (f"predicted: {workload.name}, imbalance={imbalance.name}, cluster={kv.get('cluster', 'daint')} "
             f"({steps} rounds simulated)")
    plots.plot_throughput([dict(r, kind="predicted") for r in rows], out / "throughput.png", title, ideal=False)
    if any(r.get("time_to_target_s") for r in rows):
        plot_time_to_target(rows, out / "time_to_target.png", title)
    cols = [("optimizer", "optimizer"), ("world_size", "P"), ("throughput", "samples/s"),
            ("speedup_vs_allreduce", "vs allreduce"), ("efficiency", "efficiency"), ("wait_frac", "wait share"),
            ("staleness", "staleness"), ("time_to_target_s", "time to target (s)")]
    print(f"## Predicted throughput ({title})\n\n{markdown(rows, cols)}\n")
    return rows


def composed(kv: dict, network: Network, workload: Workload) -> str:
    """``--cfg job``: the cluster's network, the workload, the imbalance and every optimizer's settings that
    the simulations of these overrides would use, as YAML."""
    from dataclasses import asdict

    names = _list(kv.get("optimizer"), SIMULATORS)
    opt_over = {k: v for k, v in kv.items() if k.startswith("optimizer.")}
    check_optimizer_overrides(names, opt_over)
    imbalance = make_imbalance(kv.get("imbalance", "none"), {k: v for k, v in kv.items() if k.startswith("imbalance.")},
                               int(kv.get("seed", 1)))
    job = {"gpus": [int(g) for g in _list(kv.get("gpus"), DEFAULT_GPUS)], "cluster": kv.get("cluster", "daint"),
           "network": {k: v for k, v in asdict(network).items() if not k.startswith("_")},
           "workload": asdict(workload),
           "imbalance": {"name": imbalance.name, **(asdict(imbalance.s) if hasattr(imbalance, "s") else {})},
           "optimizers": {n: optimizer_settings(n, opt_over) for n in names},
           "steps": int(kv.get("steps", 500)), "seed": int(kv.get("seed", 1)),
           "control_every": int(kv.get("control_every", CONTROL_EVERY))}
    return yaml.safe_dump(job, sort_keys=False)


def _row(res: SimResult, imbalance: Imbalance, wl: Workload, stt: float | None, took: float) -> dict:
    r = res.row()
    r.update(label=res.optimizer, imbalance=imbalance.name, workload=wl.name,
             efficiency=res.throughput * wl.step_s / (res.world_size * wl.batch),
             samples_to_target=stt, time_to_target_s=stt / res.throughput if stt else None, sim_s=round(took, 3))
    return r


def validate_runs(kv: dict, ns, out: Path) -> tuple[list[dict], Workload | None, Network]:
    from wagma_bench.simulate.calibrate import find_inputs, fit_network, fit_run

    runs, benches = find_inputs(ns.calibrate)
    params = float(_value(kv["params"])) if "params" in kv else None
    cal: dict[str, Any] = {"runs": [], "network": None}
    if benches:
        network, report = fit_network(benches)
        cal["network"] = report
        print(f"## Network fitted from comm-bench ({report['rows']} rows): {report['algorithm']} "
              f"alpha={report['alpha_s']:.3g} s, bandwidth={report['bandwidth_GBps']:.3g} GB/s "
              f"(relative RMS error {report['rel_rms']:.2f})\n")
    else:
        network, _ = load_network(kv.get("cluster", "local"), {k: v for k, v in kv.items() if k.startswith("network.")})
    rows, fits = [], []
    compute = kv.get("compute", "empirical")
    for d in runs:
        fit = fit_run(d, params)
        fits.append(fit)
        wl = fit.to_workload(compute=compute)
        measured = fit.measured_throughput
        predicted = _replay_run(fit, wl, network)
        # the trace-driven replay: each rank's own recorded compute times, step by step
        traced = predicted if compute == "trace" else _replay_run(fit, dataclasses.replace(wl, compute="trace"), network)
        ratio = predicted / measured if measured else None
        rows.append({"run": str(d), "optimizer": fit.optimizer, "world_size": fit.world_size,
                     "imbalance": fit.imbalance.get("name"), "rounds": fit.rounds, "compute_median_s": wl.step_s,
                     "compute_sigma": wl.sigma, "overhead_s": wl.overhead_s, "params": wl.params,
                     "measured": measured, "predicted": predicted, "ratio": ratio,
                     "within_15pct": ratio is not None and abs(ratio - 1) <= 0.15,
                     "predicted_trace": traced, "ratio_trace": traced / measured if measured else None})
        cal["runs"].append({k: v for k, v in dataclasses.asdict(fit).items() if k not in ("compute", "trace")}
                           | {"compute_median_s": wl.step_s, "compute_sigma": wl.sigma})
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(cal, indent=2, default=float) + "\n")
    if rows:
        write_table(rows, out, "validation")
        cols = [("optimizer", "optimizer"), ("world_size", "P"), ("imbalance", "imbalance"), ("measured", "measured"),
                ("predicted", f"predicted ({compute})"), ("ratio", "ratio"), ("predicted_trace", "predicted (trace)"),
                ("ratio_trace", "ratio"), ("run", "run")]
        print(f"## Validation: predicted vs measured throughput (samples/s)\n\n{markdown(rows, cols)}\n")
        table = [{"label": f"{r['optimizer']} {r['imbalance']}", "world_size": r["world_size"],
                  "throughput": r["measured"], "kind": "measured"} for r in rows if r["measured"]]
        table += [{"label": f"{r['optimizer']} {r['imbalance']}", "world_size": r["world_size"],
                   "throughput": r["predicted"], "kind": "predicted"} for r in rows]
        plots.plot_throughput(table, out / "validation.png", "measured (solid) vs simulated (dashed)", ideal=False)
    pooled = None
    if fits:
        samples = [c for f in fits for c in f.compute]
        # a sweep over other world sizes has no per-rank trace: resample the pooled compute times instead
        base = fits[-1].to_workload(compute="empirical" if compute == "trace" else compute)
        pooled = dataclasses.replace(base, samples=tuple(samples), source="pooled over the calibrated runs")
    return rows, pooled, network


def _replay_run(fit, workload: Workload, network: Network) -> float:
    """Simulated throughput of a calibrated run's own configuration (optimizer, world, imbalance, rounds, seed)."""
    imbalance = make_imbalance(fit.imbalance, {}, fit.seed)
    return simulate(SimConfig(fit.optimizer, fit.world_size, workload, network, imbalance, fit.settings,
                              fit.rounds, fit.seed)).throughput


def main(argv: list[str] | None = None) -> int:
    try:
        kv, ns = parse(list(sys.argv[1:] if argv is None else argv))
        out = Path(ns.out)
        if ns.calibrate:
            _, pooled, network = validate_runs(kv, ns, out)
            if "gpus" not in kv:
                return 0
            workload = pooled if pooled is not None else make_workload(kv)
        else:
            network, _ = load_network(kv.get("cluster", "daint"), {k: v for k, v in kv.items() if k.startswith("network.")})
            workload = make_workload(kv)
        if ns.cfg == "job":
            print(composed(kv, network, workload))
            return 0
        predict(kv, ns, network, workload, out)
        print(f"wrote {out}/predictions.csv, predictions.json, throughput.png")
        return 0
    except (UsageError, ValueError, FileNotFoundError) as err:
        print(f"wagma-bench simulate: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
