"""The report's tables and figures logged as one W&B run (``wagma-bench report --wandb``): apart from building the
report, which needs neither wandb nor a key."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wagma_bench.analysis.report import GroupReport, group_slug
from wagma_bench.analysis.scoring import TunedSection


def log_to_wandb(out: Path, groups: Sequence[GroupReport], project: str, entity: str | None, group: str | None,
                 mode: str, tuned: TunedSection | None = None) -> Path:
    """Log the report's tables and figures as one W&B run (``job_type=report``), offline without a key."""
    import wandb

    from wagma_bench.record.loggers import init_wandb, offline_dir

    run = init_wandb(out, mode, project=project, entity=entity, group=group, job_type="report",
                     name=f"report-{time.strftime('%Y%m%d-%H%M%S')}")
    for g in groups:
        slug = group_slug(g.key)
        for name, rows in (("comparison", g.comparison), ("runs", g.run_table)):
            cols = list(dict.fromkeys(k for r in rows for k in r))
            run.log({f"{slug}/{name}": wandb.Table(columns=cols, data=[[_cell(r.get(c)) for c in cols] for r in rows])})
        run.log({f"{slug}/{name}": wandb.Image(str(path)) for name, path in g.figures.items()})
    if tuned is not None:  # the tuned table and the performance profile, apart from the untuned groups
        cols = list(dict.fromkeys(k for r in tuned.rows for k in r))
        run.log({"tuned/comparison": wandb.Table(columns=cols, data=[[_cell(r.get(c)) for c in cols]
                                                                     for r in tuned.rows])})
        run.log({f"tuned/{name}": wandb.Image(str(path)) for name, path in tuned.figures.items()})
    run.save(str(out / "report.md"), base_path=str(out), policy="now")
    where = offline_dir(run)
    run.finish()
    return where


def _cell(v: Any) -> Any:
    return v if v is None or isinstance(v, (int, float, str, bool)) else str(v)

