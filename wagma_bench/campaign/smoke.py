"""``wagma-bench sweep --smoke cluster=NAME``: the small 2-node job to run before a real sweep (docs/slurm.md,
first day). One job on 2 nodes (``2 x cluster.gpus_per_node`` ranks) runs every optimizer in turn with
``experiment=smoke`` (50 rounds on synthetic data; NCCL on GPUs, gloo on CPU), then ``wagma-bench comm-bench``
across the two nodes, which writes ``commbench.json`` into the sweep directory: the file ``wagma-bench
simulate --calibrate`` reads. The directory is a sweep like any other (``sweep submit|status|wait|cancel``,
``report``); its manifest says ``"smoke": {"commbench": "commbench.json"}``.

The dry run of a real sweep looks for a finished smoke sweep of the same cluster beside it (in the folder
that holds its ``--out``, or the one above) and says in one line when there is none (:func:`beside_line`).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from wagma_bench.campaign import nodefit, nodepaths, prequeue
from wagma_bench.campaign.sweep import (
    MANIFEST,
    SweepSpec,
    check_run_configs,
    expand,
    job_shape,
    manifest_of,
    parse_spec,
    sbatch_lines,
    setup_lines,
    slurm_check_line,
    venv_prefix,
)
from wagma_bench.config import readback
from wagma_bench.config.paths import CONF_DIR, SLURM_DIR
from wagma_bench.errors import ConfigError
from wagma_bench.record.files import OUTPUT_HINT, run_subdir, write_json_atomic, write_text_atomic

TEMPLATE = SLURM_DIR / "smoke.sbatch"
NODES = 2
COMMBENCH = "commbench.json"
EXPERIMENT = "experiment=smoke"
TIME = "01:00:00"  # the job's limit unless cluster.time= is given: minutes of work, a short queue


def optimizers() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "optimizer").glob("*.yaml"))


def smoke_spec(args: list[str]) -> SweepSpec:
    """The smoke sweep of ``args`` (``cluster=NAME``, ``cluster.KEY=VALUE``, run overrides): 2 whole nodes,
    every optimizer unless ``optimizer=`` narrows it, ``experiment=smoke`` unless another is given, an hour's
    ``cluster.time`` unless one is given."""
    if any(a.split("=", 1)[0] in ("gpus", "seeds", "seed") for a in args):
        raise ConfigError("--smoke runs 2 nodes, one seed: leave gpus=, seeds= and seed= out")
    given_time = any(a.startswith("cluster.time=") for a in args)
    spec = parse_spec([*args, "gpus=1"] + ([] if given_time else [f"cluster.time={TIME}"]))
    spec.gpus = [NODES * spec.cluster.gpus_per_node]
    nodefit.check_fits(spec.cluster, [job_shape(spec.cluster, spec.gpus[0])["ntasks_per_node"]])
    given = [c for c in spec.common if c.startswith("optimizer=")]
    spec.common = [c for c in spec.common if not c.startswith("optimizer=")]
    if "optimizer" not in spec.axes:
        spec.axes = {"optimizer": [g.split("=", 1)[1] for g in given] or optimizers(), **spec.axes}
    if not any(c.startswith("experiment=") for c in spec.common):
        spec.common.insert(0, EXPERIMENT)
    return spec


def commbench_command(spec: SweepSpec, extra: tuple[str, ...]) -> str:
    device = ("--device", "cuda") if spec.cluster.gres else ()  # GPUs: NCCL's buffers on the device
    return " ".join(shlex.quote(a) for a in (*device, *extra))


def run_lines(spec: SweepSpec, runs, launcher: str) -> str:
    common = " ".join(shlex.quote(o) for o in spec.common + spec.cluster.run_overrides)
    lines = []
    for run in runs:
        overrides = " ".join(shlex.quote(o) for o in run.overrides)
        lines += [
            f'echo "wagma-bench smoke: {run.name}"',
            f"mkdir -p {shlex.quote(run.run_dir)}",
            (
                f"{launcher} wagma-bench run {common} {overrides} hydra.run.dir={shlex.quote(run.run_dir)} "
                f"|| FAILED+=({shlex.quote(run.name)})"
            ),
        ]
    return "\n".join(lines)


def render(
    spec: SweepSpec,
    out: Path,
    command: list[str] | None = None,
    commbench_args: tuple[str, ...] = (),
    slurm_check: bool = False,
) -> dict:
    """Validate every run, then write ``out/jobs/smoke.sbatch`` (one job, every run and comm-bench) and the
    manifest; returns the manifest. ``commbench_args``: further ``comm-bench`` options (``--sizes``);
    ``slurm_check``: SLURM's answer on the script first (``sweep --check``)."""
    runs = expand(spec)
    configs = check_run_configs(spec, runs)
    gpus = spec.gpus[0]
    checks = {
        "data": prequeue.check_data(configs.values()),
        "gpu_hours": prequeue.gpu_hours(
            spec.cluster, [(r.gpus, configs[r.name]) for r in runs], one_job=True
        ),
        "node": nodefit.request_line(spec.cluster, [job_shape(spec.cluster, gpus)["ntasks_per_node"]]),
    }
    checks["paths"] = nodepaths.warning_line({"--out": str(out), "venv": venv_prefix(spec.cluster)})
    out = out.resolve()
    if (out / MANIFEST).exists():
        raise ConfigError(f"{out} already holds a sweep ({MANIFEST}); choose another --out")
    for run in runs:
        run.run_dir, run.job = str(out / "runs" / run.name), 0
    script = out / "jobs" / "smoke.sbatch"
    text = script_text(spec, runs, script, commbench_args)
    if slurm_check:  # before anything is written
        checks["slurm"] = slurm_check_line(spec, (script, runs, text))
    for folder in ("jobs", "logs", "runs"):
        run_subdir(out / folder, OUTPUT_HINT)
    write_text_atomic(script, text)
    script.chmod(0o755)
    job = {"script": "jobs/smoke.sbatch", "gpus": gpus, "array": False, "runs": len(runs)}
    manifest = manifest_of(spec, out, command, [{**job, "job_id": None, "submitted": None}], checks, runs)
    manifest["smoke"] = {"commbench": COMMBENCH}
    write_json_atomic(out / MANIFEST, manifest)
    return manifest


def script_text(spec: SweepSpec, runs, script: Path, commbench_args: tuple[str, ...]) -> str:
    """slurm/smoke.sbatch filled in: the profile's request for 2 nodes, every run in turn, comm-bench."""
    profile, gpus, out = spec.cluster, spec.gpus[0], script.parent.parent
    launcher = f'{profile.launcher["torch"]} --cpus-per-task="$SLURM_CPUS_PER_TASK" --kill-on-bad-exit=1'
    values = {
        "title": f"wagma-bench sweep --smoke {out.name}: {len(runs)} runs and comm-bench at {gpus} GPUs",
        "cluster": profile.name,
        "script": str(script),
        "sbatch_lines": "\n".join(
            sbatch_lines(profile, gpus, f"wb-smoke-{profile.name}", str(out / "logs" / "%x_%j.out"), None)
        ),
        "setup_lines": "\n".join(setup_lines(profile)),
        "runs": run_lines(spec, runs, launcher),
        "launcher": launcher,
        "commbench_args": commbench_command(spec, commbench_args),
        "commbench": shlex.quote(str(out / COMMBENCH)),
    }
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], TEMPLATE.read_text())


def _smoke_of(manifest_path: Path) -> dict | None:
    """The ``smoke`` entry and cluster name of a sweep's manifest, read defensively (another sweep's file)."""
    try:
        data = readback.load(manifest_path, readback.SMOKE_MANIFEST)
    except (OSError, ValueError):
        return None
    cluster = data.get("cluster")
    name = cluster.get("name") if isinstance(cluster, dict) else None
    bench = data["smoke"].get("commbench")
    if not isinstance(name, str) or not isinstance(bench, str) or "/" in bench or bench.startswith("."):
        return None
    return {"cluster": name, "commbench": manifest_path.parent / bench}


def beside_line(out: Path, cluster: str) -> str:
    """One line: the finished smoke sweep of ``cluster`` beside ``out`` (in its folder or the one above), or
    that there is none and the command that makes one."""
    given, out = Path(out).parent, out.resolve()
    unfinished = None
    for folder in dict.fromkeys((out.parent, out.parent.parent)):
        for path in sorted(folder.glob(f"*/{MANIFEST}")):
            smoke = _smoke_of(path)
            if smoke is None or smoke["cluster"] != cluster:
                continue
            if smoke["commbench"].is_file():
                return (
                    f"smoke sweep: {path.parent} ran on cluster {cluster}; its comm-bench fit: "
                    f"wagma-bench simulate cluster={cluster} --calibrate {smoke['commbench']} ..."
                )
            unfinished = unfinished or path.parent
    if unfinished:
        return (
            f"smoke sweep {unfinished} has no {COMMBENCH} yet (not run or not finished): "
            f"wagma-bench sweep status {unfinished}"
        )
    return (
        f"no smoke sweep of cluster {cluster} beside this one (in {given}): run one first, "
        f"wagma-bench sweep --smoke cluster={cluster} --out {given / f'smoke_{cluster}'} (docs/slurm.md)"
    )
