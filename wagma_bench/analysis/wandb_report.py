"""The report's tables and figures logged as one W&B run (``wagma-bench report --wandb``): apart from building
the report, which needs neither wandb nor a key."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wagma_bench.analysis.report import GroupReport, group_slug
from wagma_bench.analysis.run_records import RunRecord
from wagma_bench.analysis.scoring import TunedSection


def log_to_wandb(
    out: Path,
    groups: Sequence[GroupReport],
    project: str,
    entity: str | None,
    group: str | None,
    mode: str,
    tuned: TunedSection | None = None,
) -> Path:
    """Log the report's tables and figures as one W&B run (``job_type=report``), offline without a key."""
    import wandb

    from wagma_bench.record.loggers import init_wandb, offline_dir

    run = init_wandb(
        out,
        mode,
        project=project,
        entity=entity,
        group=group,
        job_type="report",
        name=f"report-{time.strftime('%Y%m%d-%H%M%S')}",
    )
    for g in groups:
        slug = group_slug(g.key)
        for name, rows in (("comparison", g.comparison), ("runs", g.run_table)):
            cols = list(dict.fromkeys(k for r in rows for k in r))
            run.log(
                {
                    f"{slug}/{name}": wandb.Table(
                        columns=cols, data=[[_cell(r.get(c)) for c in cols] for r in rows]
                    )
                }
            )
        run.log({f"{slug}/{name}": wandb.Image(str(path)) for name, path in g.figures.items()})
    if tuned is not None:  # the tuned table and the performance profile, apart from the untuned groups
        cols = list(dict.fromkeys(k for r in tuned.rows for k in r))
        run.log(
            {
                "tuned/comparison": wandb.Table(
                    columns=cols, data=[[_cell(r.get(c)) for c in cols] for r in tuned.rows]
                )
            }
        )
        run.log({f"tuned/{name}": wandb.Image(str(path)) for name, path in tuned.figures.items()})
    run.save(str(out / "report.md"), base_path=str(out), policy="now")
    where = offline_dir(run)
    run.finish()
    return where


DEFAULT_PROJECT = "wagma-bench"  # logger.wandb.project's default


def runs_target(
    runs: Sequence[RunRecord], project: str | None, entity: str | None, group: str | None
) -> tuple[str, str | None, str | None, str]:
    """The W&B project, entity and group of the report's run, and a line saying whence: each one given on the
    command line; else the runs' own where they share it: the project and entity they logged into (runs that
    did not log to W&B have no say), the group they logged into (``logger.wandb.group``, else their sweep's,
    :func:`~wagma_bench.record.loggers.sweep_group`, which runs without W&B would have had too). Runs that
    disagree: the default project, no entity (W&B's default), no group, and the line says so."""
    from wagma_bench.record.loggers import sweep_group

    logged = [r.wandb for r in runs if r.wandb]
    notes = []

    def common(given, values: set, what: str, default):
        if given is not None:
            return given
        values.discard(None)
        if len(values) > 1:
            notes.append(
                f"the runs are in {len(values)} W&B {what}s ({', '.join(sorted(values))}), so the report's "
                f"run is in {default or 'none'} (choose with --wandb-{what})"
            )
        return next(iter(values)) if len(values) == 1 else default

    project = common(project, {w.get("project") for w in logged}, "project", DEFAULT_PROJECT)
    entity = common(entity, {w.get("entity") for w in logged}, "entity", None)
    group = common(group, {(r.wandb or {}).get("group") or sweep_group(r.path) for r in runs}, "group", None)
    where = (
        f"W&B project {project}"
        + (f", entity {entity}" if entity else "")
        + (f", group {group}" if group else ", no group")
    )
    return project, entity, group, "; ".join([where, *notes])


def _cell(v: Any) -> Any:
    return v if v is None or isinstance(v, (int, float, str, bool)) else str(v)
