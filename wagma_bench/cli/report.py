"""``wagma-bench report DIR... [--out DIR] [--wandb] [--wandb-report] [--mllog]``, ``wagma-bench report
--wandb-publish SPEC``: time-to-accuracy tables and figures over run or
sweep directories (:mod:`wagma_bench.analysis.report` does the work)."""

from __future__ import annotations

import argparse
from pathlib import Path

from wagma_bench import exits
from wagma_bench.analysis import report as reporting
from wagma_bench.analysis import wandb_panels
from wagma_bench.analysis.wandb_report import log_to_wandb, runs_target
from wagma_bench.errors import ConfigError


def main(argv: list[str]) -> int:
    # a directory that is not there is bad input (exit 2), as a planted link is; another OSError (a full or
    # read-only disk) an operational failure (exit 1): nothing half-written is left (files.atomic_write)
    missing = {FileNotFoundError: ConfigError}
    return exits.run_body("report", lambda: exits.typed(missing, lambda: _report(argv)))


def _report(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.wandb_publish is not None:
        return _publish(args.wandb_publish)
    if not args.dirs:
        parser.error("the following arguments are required: dirs (or --wandb-publish SPEC)")
    if args.wandb_report:  # a missing extra, or nothing logged to W&B, is said before anything is written
        wandb_panels.load_api()
        _refuse_without_wandb(args.dirs)
    report, groups, tuned = reporting.make_report(args.dirs, args.out, args.reference)
    if args.mllog:
        from wagma_bench.record.mlperf import write_mllog

        written = [p for p in (write_mllog(r.path) for g in groups for r in g.runs) if p]
        print(f"wagma-bench report: wrote {len(written)} MLPerf log(s) (RUN_DIR/mllog.txt)")
    n_runs = sum(len(g.runs) for g in groups)
    marked = sum(r.partial for g in groups for r in g.runs)
    print(
        f"wagma-bench report: {n_runs} run(s) in {len(groups)} group(s)"
        + (f", {marked} half-written (marked)" if marked else "")
        + (f", {len(tuned.rows)} tuned combination(s)" if tuned else "")
        + f"; wrote {report}"
    )
    if args.wandb:
        project, entity, group, said = runs_target(
            [r for g in groups for r in g.runs], args.wandb_project, args.wandb_entity, args.wandb_group
        )
        print(f"wagma-bench report: logging to {said}", flush=True)
        log_to_wandb(args.out, groups, project, entity, group, args.wandb_mode, tuned)
    if args.wandb_report:
        _wandb_report(args, groups, tuned)
    return exits.OK


def _parser() -> argparse.ArgumentParser:
    """``wagma-bench report``'s arguments and their ``--help``."""
    parser = argparse.ArgumentParser(
        prog="wagma-bench report",
        description="Time-to-accuracy tables and figures over run or sweep directories.",
    )
    parser.add_argument(
        "dirs",
        nargs="*",
        type=Path,
        help="run directories, sweep or tuning directories (searched recursively)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("report"), help="output directory (default: ./report)"
    )
    parser.add_argument(
        "--reference",
        default=None,
        metavar="OPTIMIZER",
        help="the optimizer speed-ups are against (default: allreduce where it ran, else each group's first "
        "series; the report says which)",
    )
    parser.add_argument("--wandb", action="store_true", help="also log the tables and figures as a W&B run")
    parser.add_argument(
        "--mllog",
        action="store_true",
        help="also (re)write each run's MLPerf log RUN_DIR/mllog.txt from its events.jsonl",
    )
    parser.add_argument(
        "--wandb-report",
        action="store_true",
        help="also build a W&B Report and a saved workspace over the runs' W&B runs (wandb-workspaces): "
        "saved with an API key, else their spec written to OUT/wandb-report.json",
    )
    parser.add_argument(
        "--wandb-publish",
        type=Path,
        default=None,
        metavar="SPEC",
        help="save a spec that --wandb-report wrote without a key (OUT/wandb-report.json); no DIRs",
    )
    parser.add_argument(
        "--wandb-project",
        default=None,
        help="default: the project the runs logged into, where they share one, else wagma-bench",
    )
    parser.add_argument(
        "--wandb-entity", default=None, help="default: the runs' entity, where they share one"
    )
    parser.add_argument(
        "--wandb-group",
        default=None,
        help="default: the runs' group (logger.wandb.group, else their sweep's), where they share one",
    )
    parser.add_argument(
        "--wandb-mode",
        default="auto",
        choices=("auto", "offline", "online"),
        help="auto: online with an API key, else offline",
    )
    return parser


def _wandb_report(args, groups, tuned) -> None:
    """The W&B Report and workspace over the runs (and tunings) reported: saved
    with a key, else their spec."""
    from wagma_bench.analysis.tuning import PLAN
    from wagma_bench.record.loggers import resolve_mode

    project, entity, _, said = runs_target(
        [r for g in groups for r in g.runs], args.wandb_project, args.wandb_entity, args.wandb_group
    )
    online = resolve_mode(args.wandb_mode) == "online"
    wr, _, _ = wandb_panels.load_api()
    tune_dirs = [d for d in args.dirs if (d / PLAN).exists()]
    sections = wandb_panels.report_sections(wr, groups, tune_dirs, tuned.rows if tuned else [])
    if not sections:  # logged runs, but none compared (still running): no panel either
        _refuse_without_wandb([])
    title = "wagma-bench report: " + ", ".join(d.name for d in args.dirs)
    report, workspace = wandb_panels.build(
        sections,
        project,
        entity or "",
        title,
        online,
        description=f"Generated by wagma-bench report ({said}).",
    )
    for line in wandb_panels.deliver(args.out, report, workspace, online):
        print(f"wagma-bench report: {line}", flush=True)


def _refuse_without_wandb(dirs: list[Path]) -> None:
    """``--wandb-report`` over runs none of which logged to W&B (``logger=wandb`` or ``wandb-import``) would
    have no panels: refused in one line naming the command that logs them (a ConfigError: exit 2)."""
    from wagma_bench.analysis.run_records import find_runs
    from wagma_bench.errors import ConfigError

    if dirs and any(wandb_panels.logged_to_wandb(d) for d in find_runs(dirs)):
        return
    raise ConfigError(
        "--wandb-report: no run here logged to W&B, so the report would have no panels; log them first "
        f"with: wagma-bench wandb-import {' '.join(map(str, dirs)) or 'DIR...'} (or run with logger=wandb)"
    )


def _publish(spec: Path) -> int:
    from wagma_bench.errors import ConfigError
    from wagma_bench.record.loggers import has_api_key

    if not has_api_key():
        raise ConfigError(
            f"--wandb-publish {spec} needs a W&B API key: set WANDB_API_KEY or run `wandb login`"
        )
    if not spec.is_file():
        raise ConfigError(
            f"--wandb-publish {spec}: no such file (wagma-bench report --wandb-report writes "
            f"OUT/{wandb_panels.SPEC})"
        )
    url, view = wandb_panels.publish(spec)
    print(f"wagma-bench report: W&B report: {url}\nwagma-bench report: W&B workspace: {view}", flush=True)
    return exits.OK
