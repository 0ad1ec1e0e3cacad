"""``wagma-bench sweep``: render, submit and follow SLURM jobs over GPU counts and options
(:mod:`wagma_bench.campaign.sweep` does the work; the usage is that module's)."""

from __future__ import annotations

import datetime as _dt
import shlex
import sys
import time
from pathlib import Path

from wagma_bench import exits
from wagma_bench.campaign import prequeue, smoke, sweep, sweep_jobs
from wagma_bench.config.overrides import CommandParser
from wagma_bench.errors import ConfigError, OperationFailed

USAGE = sweep.__doc__.split("\n\n")[1]


def main(argv: list[str]) -> int:
    # SLURM refusing a command (sbatch, scancel) is an operational failure, exit 1, as a disk's
    return exits.run_body("sweep", lambda: exits.typed({RuntimeError: OperationFailed}, lambda: _main(argv)))


def _wait_command(argv: list[str]) -> int:
    """``sweep wait DIR [--interval S] [--timeout S]``: the progress line on stderr, the table at the end."""
    parser = CommandParser(
        "wagma-bench sweep wait",
        "wagma-bench sweep wait DIR [--interval SECONDS (30)] [--timeout SECONDS (none)]",
    )
    parser.add_argument("dir", type=Path)
    parser.add_argument("--interval", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=None)
    ns = parser.parse_args(argv)
    if not ns.interval > 0:
        raise ConfigError(f"--interval={ns.interval:g} is not allowed; it must be a number of seconds > 0")
    rows = sweep_jobs.wait(ns.dir, timeout_s=ns.timeout, interval_s=ns.interval, out=sys.stderr)
    print(sweep_jobs.format_rows(rows))
    return exits.OK


def _submit(sweep_dir: Path) -> None:
    ids = sweep_jobs.submit(sweep_dir)
    print(
        "\n".join(ids)
        if ids
        else f"nothing to submit: every job of {sweep_dir} was submitted and no run stands cancelled"
    )


def _cancel(sweep_dir: Path) -> None:
    rows = sweep_jobs.cancel(sweep_dir)
    if not rows:
        print(f"nothing to cancel: every submitted job of {sweep_dir} has ended")
        return
    print(
        f"cancelled {len(rows)} runs: {' '.join(r['job'] for r in rows)}; each saves a checkpoint at its "
        "next synchronisation point, if it reaches one before SLURM kills it (KillWait)\n"
        f"follow: wagma-bench sweep wait {sweep_dir}   resume: wagma-bench sweep submit {sweep_dir}"
    )


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return exits.OK
    if argv[0] == "wait":
        return _wait_command(argv[1:])
    if argv[0] in ("submit", "status", "cancel"):
        if len(argv) != 2:
            raise ConfigError(f"usage: wagma-bench sweep {argv[0]} DIR")
        sweep_dir = Path(argv[1])
        if argv[0] == "submit":
            _submit(sweep_dir)
        elif argv[0] == "cancel":
            _cancel(sweep_dir)
        else:
            print(sweep_jobs.format_rows(sweep_jobs.status(sweep_dir)))
        return exits.OK
    parser = CommandParser("wagma-bench sweep", USAGE)
    parser.add_argument("--out")
    parser.add_argument("--cfg", choices=["job"], help="print what each run composes, render nothing")
    for flag in (
        "--dry-run",
        "--submit",
        "--no-array",
        "--submitit",
        "--data-on-nodes",
        "--check",
        "--smoke",
    ):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--step-times", action="append", default=[], metavar="RUN_DIR")
    parser.add_argument("overrides", nargs="*")
    ns = parser.parse_args(argv)
    if ns.dry_run and ns.submit:
        raise ConfigError("--dry-run and --submit exclude each other")
    out, show_cfg = ns.out, ns.cfg is not None
    if ns.smoke:
        return _smoke(ns, argv)
    spec = sweep.parse_spec(ns.overrides)
    if show_cfg:
        sweep.print_configs(spec, sweep.expand(spec))
        return exits.OK
    if ns.submitit:
        configs = sweep.check_run_configs(spec, sweep.expand(spec))
        for line in prequeue.check_data(configs.values(), on_nodes=ns.data_on_nodes):
            print(f"# {line}")
        for gpus in spec.gpus:
            print(shlex.join(sweep.submitit_command(spec, gpus, Path(out or "sweeps/submitit"))))
        return exits.OK
    stamp = _dt.datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
    out_dir = Path(out or f"sweeps/{stamp}_{spec.cluster.name}")
    t0 = time.perf_counter()
    manifest = sweep.render(
        spec,
        out_dir,
        array=not ns.no_array,
        command=["wagma-bench", "sweep", *argv],
        data_on_nodes=ns.data_on_nodes,
        step_times=tuple(ns.step_times),
        slurm_check=ns.check,
    )
    print(
        f"wagma-bench sweep: {len(manifest['runs'])} runs in {len(manifest['jobs'])} jobs rendered and "
        f"validated in {time.perf_counter() - t0:.1f} s: {out_dir.resolve()}"
    )
    print(prequeue.summary(manifest))
    print(smoke.beside_line(out_dir, spec.cluster.name))
    if ns.submit:
        _submit_now(out_dir)
    else:
        print(f"submit: wagma-bench sweep submit {out_dir}   (or sbatch each of {out_dir}/jobs/*.sbatch)")
    return exits.OK


def _smoke(ns, argv: list[str]) -> int:
    """``sweep --smoke``: one 2-node job, every optimizer and comm-bench (campaign/smoke.py)."""
    if ns.submitit or ns.no_array or ns.step_times or ns.cfg:
        raise ConfigError(
            "--smoke renders one 2-node job; it takes --out, --check, --dry-run or --submit only"
        )
    spec = smoke.smoke_spec(ns.overrides)
    out_dir = Path(ns.out or f"sweeps/smoke_{spec.cluster.name}")
    manifest = smoke.render(spec, out_dir, command=["wagma-bench", "sweep", *argv], slurm_check=ns.check)
    print(
        f"wagma-bench sweep --smoke: {len(manifest['runs'])} runs and comm-bench in one job on {smoke.NODES} "
        f"nodes: {out_dir.resolve()}"
    )
    print(prequeue.summary(manifest))
    if ns.submit:
        _submit_now(out_dir)
    else:
        print(f"submit: wagma-bench sweep submit {out_dir}")
    return exits.OK


def _submit_now(out_dir: Path) -> None:
    ids = sweep_jobs.submit(out_dir)
    print(f"submitted {len(ids)} jobs: {' '.join(ids)}\nfollow: wagma-bench sweep status {out_dir}")
