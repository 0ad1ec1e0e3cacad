"""The W&B Report and saved workspace of ``wagma-bench report --wandb-report`` and ``claims --wandb-report``,
built with W&B's own Reports and Workspaces API (``wandb-workspaces``: ``wandb_workspaces.reports.v2`` and
``wandb_workspaces.workspaces``), over the W&B runs that ``logger=wandb`` logged.

Panels read what the runs log (:class:`~wagma_bench.record.loggers.WandbSink`): ``eval/<metric>``,
``train_s``, ``samples`` and ``rank<R>/{compute,delay,comm}_s`` in the history; the run summary
(``time_to_target_s``, ``throughput_samples_per_s``, ``best_metric``); the flat config keys of
:func:`~wagma_bench.record.loggers.grouping_config` (``optimizer``, ``workload``, ``data``, ``world_size``,
``imbalance``, ``tuning_trial``, ``study``, ``trial``, ``tuned_<key>``); and the W&B group (a tuning's).
:func:`named_keys` lists every key a report or workspace names, so a test can check them against what the runs
logged (:func:`unlogged`).

Without an API key nothing is sent: the report's and the workspace's models (their JSON specs) are written to
``OUT/wandb-report.json``, and ``wagma-bench report --wandb-publish OUT/wandb-report.json`` saves them later
(:func:`publish`). A run set of a saved report names its project, which W&B looks up when the model is made:
so the offline spec leaves the run sets' project out and :func:`publish` puts it in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wagma_bench.analysis.report import TUNED_COLUMNS, GroupReport, group_title, varying
from wagma_bench.analysis.run_records import wandb_import_note
from wagma_bench.analysis.tables import markdown_table
from wagma_bench.analysis.tuning import load_trials
from wagma_bench.config import readback
from wagma_bench.config.recorded import setting
from wagma_bench.record.events import RunEvents
from wagma_bench.record.files import write_json_atomic
from wagma_bench.record.loggers import sweep_group, tuned_key
from wagma_bench.runtime.extras import require

SPEC = "wandb-report.json"
SPEC_VERSION = 1
STEP_FIELDS = ("compute_s", "delay_s", "comm_s")  # WandbSink's per-rank step-time components


def load_api():
    """``wandb_workspaces.reports.v2``, ``wandb_workspaces.workspaces`` and ``wandb_workspaces.expr``; a
    missing extra is one line naming its install (a ConfigError: exit 2)."""
    require("wandb", "wandb", "--wandb-report")
    require("wandb_workspaces", "wandb", "--wandb-report")
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    return wr, ws, expr


@dataclass
class Section:
    """One panel grid of the report (and one section of the workspace): its title, the run set's filters as
    (config key, value) pairs plus an optional W&B group, the panels, and Markdown shown under it."""

    title: str
    filters: list[tuple[str, Any]]
    panels: list
    markdown: str = ""
    group: str | None = None
    blocks: list = field(default_factory=list)  # shown above the grid (the tuned table)
    ids: list[str] = field(default_factory=list)  # without a group: its runs' W&B ids, where all are known


# --- the sections -------------------------------------------------------------------------------------


def group_sections(wr, groups: Sequence[GroupReport]) -> list[Section]:
    """Per comparison group (and per world size and imbalance where they vary in it, and per W&B group) one
    section: the metric against training seconds and against samples by optimizer (mean, min-max band),
    time-to-target and throughput bars, the per-rank step-time summaries, and the report's comparison table.
    Its run set filters on the runs' W&B group as well as on their keys, so that another group's runs of the
    same workload (a colleague's, in a shared project) are never shown."""
    sections = []
    for g in groups:
        logged = [r for r in g.runs if r.wandb is not None and not r.running]
        if not logged:
            continue
        workload, data, metric, target = g.key
        split = varying(logged)
        wandb_groups = {r.path: r.wandb.get("group") or sweep_group(r.path) for r in logged}
        several = len(set(wandb_groups.values())) > 1
        for world, imbalance, wandb_group in dict.fromkeys(
            (r.meta.get("world_size"), r.meta.get("imbalance"), wandb_groups[r.path]) for r in logged
        ):
            filters = [("workload", workload), ("data", data), ("tuning_trial", False)]
            title = group_title(g.key)
            if split:
                filters += [("world_size", world), ("imbalance", imbalance)]
                title += f", P={world}, imbalance={imbalance}"
            if several:
                title += f", W&B group {wandb_group}"
            rows = [
                r
                for r in g.comparison
                if not split or (r["world_size"], r["imbalance"]) == (world, imbalance)
            ]
            series = any((r.wandb or {}).get("per_rank_step_times") for r in logged)
            panels = metric_panels(wr, metric, target, g.unit) + [step_summary_panel(wr)]
            panels += [step_time_panel(wr, world)] if series and world else []
            section = Section(title, filters, panels, markdown_table(rows, g.columns), wandb_group)
            if wandb_group is None:  # runs outside any sweep: selected by their own ids, where all are known
                ids = [
                    r.wandb_id for r in logged if wandb_groups[r.path] is None and _here(r, world, imbalance)
                ]
                section.ids = ids if all(ids) else []
            sections.append(section)
    return sections


def _here(run, world, imbalance) -> bool:
    return (run.meta.get("world_size"), run.meta.get("imbalance")) == (world, imbalance)


def metric_panels(wr, metric: str | None, target: float | None, unit: str = "samples/s") -> list:
    """The metric's curves (against ``train_s`` and ``samples``) and the time-to-target and throughput bars,
    each grouped by optimizer: the mean of its runs with a min-max band."""
    by = {"groupby": wr.Config("optimizer"), "groupby_aggfunc": "mean", "groupby_rangefunc": "minmax"}
    y = f"eval/{metric or 'metric'}"
    panels = [
        wr.LinePlot(title=f"{y} against training time", x="train_s", y=[y], title_x="training seconds", **by),
        wr.LinePlot(title=f"{y} against samples", x="samples", y=[y], title_x="samples", **by),
    ]
    if target is not None:
        panels.append(
            wr.BarPlot(
                title=f"time to {metric} ≥ {target} (training s)",
                metrics=[wr.SummaryMetric("time_to_target_s")],
                **by,
            )
        )
    panels.append(
        wr.BarPlot(title=f"throughput ({unit})", metrics=[wr.SummaryMetric("throughput_samples_per_s")], **by)
    )
    return panels


def step_summary_panel(wr):
    """Each component's mean per step over the ranks and on the worst rank, by optimizer: the step-time
    summaries every ``logger=wandb`` run logs (:func:`~wagma_bench.record.loggers.step_time_summaries`), six
    bars whatever the world size."""
    return wr.BarPlot(
        title="step time per component: mean rank and worst rank (s)",
        metrics=[wr.SummaryMetric(f"ranks/{f}_{s}") for f in STEP_FIELDS for s in ("mean", "worst")],
        groupby=wr.Config("optimizer"),
        groupby_aggfunc="mean",
        groupby_rangefunc="minmax",
    )


def step_time_panel(wr, world_size: int):
    """Each rank's mean compute, injected delay and communication per round, against training seconds."""
    return wr.LinePlot(
        title="per-rank step time: compute, delay, communication (s)",
        x="train_s",
        y=[f"rank{r}/{f}" for r in range(int(world_size)) for f in STEP_FIELDS],
    )


def tuning_sections(wr, tune_dirs: Sequence[Path], tuned_rows: Sequence[dict]) -> list[Section]:
    """Per tuning directory one section over its trials (its W&B group): a parallel-coordinates panel over the
    search space (``tuned_<key>``), the study and each trial's score (time to target, else its best metric),
    and the tuned table as Markdown."""
    sections = []
    for tune_dir in tune_dirs:
        plan, combos, summaries = load_trials(tune_dir)
        trials = [t for ts in combos.values() for t in ts]
        if not any(logged_to_wandb(Path(tune_dir) / "trials" / t.name) for t in trials):
            continue
        keys = list(dict.fromkeys(k for t in trials for k in t.params))
        done = [s for s in summaries.values() if s]
        by_time = any(s.target is not None for s in done) or not done
        score = "time_to_target_s" if by_time else "best_metric"
        columns = [wr.ParallelCoordinatesPlotColumn(wr.Config(tuned_key(k)), display_name=k) for k in keys]
        columns += [
            wr.ParallelCoordinatesPlotColumn(wr.Config("study"), display_name="study"),
            wr.ParallelCoordinatesPlotColumn(wr.SummaryMetric(score), display_name=score),
        ]
        panels = [
            wr.ParallelCoordinatesPlot(
                title=f"{tune_dir.name}: search space and scores",
                columns=columns,
                layout=wr.Layout(w=24, h=8),
            ),
            wr.BarPlot(
                title=f"{score} by optimizer",
                metrics=[wr.SummaryMetric(score)],
                groupby=wr.Config("optimizer"),
                groupby_aggfunc="median",
                groupby_rangefunc="minmax",
            ),
        ]
        table = markdown_table(list(tuned_rows), TUNED_COLUMNS) if tuned_rows else ""
        group = sweep_group(Path(tune_dir) / "trials" / trials[0].name)
        sections.append(
            Section(
                f"Tuning {tune_dir.name} ({plan.get('studies')} studies x "
                f"{plan.get('trials_per_study')} trials)",
                [("tuning_trial", True)],
                panels,
                table,
                group,
            )
        )
    return sections


def logged_to_wandb(run_dir: Path) -> bool:
    """The run logged to W&B: by ``logger=wandb``, or by ``wandb-import`` after it."""
    start = RunEvents.read(run_dir).start
    return bool(start and setting(start.config, "logger.wandb")) or wandb_import_note(run_dir) is not None


def claims_blocks(wr, results: Sequence[dict], table: str) -> list:
    """The claims table as Markdown and each claim's interval, one line a claim."""
    lines = []
    for c in results:
        m = c.get("measured") or {}
        lo_hi, value = m.get("interval"), m.get("speedup")
        where = f"[{lo_hi[0]:.3g}, {lo_hi[1]:.3g}]" if lo_hi else "none (no data)"
        said = f"{value:.3g}" if isinstance(value, (int, float)) else "not measured"
        lines.append(
            f"- **{c.get('id')}** ({c.get('verdict')}): speed-up {said}, interval {where}; {c.get('reason')}"
        )
    return [
        wr.H2("Claims"),
        wr.MarkdownBlock(table),
        wr.H3("Each claim's interval"),
        wr.MarkdownBlock("\n".join(lines)),
    ]


def report_sections(
    wr, groups: Sequence[GroupReport], tune_dirs: Sequence[Path], tuned_rows: Sequence[dict]
) -> list[Section]:
    return tuning_sections(wr, tune_dirs, tuned_rows) + group_sections(wr, groups)


def deliver(out: Path, report, workspace, online: bool) -> list[str]:
    """With a key (``online``) save the report and the workspace and say their URLs; without one write the
    spec to ``out`` and say the one command that publishes it."""
    why = "no W&B API key"
    if online:
        try:
            url, view = save(report, workspace)
            return [f"W&B report: {url}", f"W&B workspace: {view}"]
        except Exception as err:  # noqa: BLE001 -- no network, W&B down: the spec is kept for later instead
            first = (str(err).strip().splitlines() or [""])[0]
            why = f"not saved to W&B ({type(err).__name__}: {first})"
    path = write_spec(out, report, workspace)
    return [
        f"{why}: wrote the report's and the workspace's spec to {path}",
        (
            "publish it later (after `wandb sync` of the runs' offline directories) with: "
            f"{publish_command(path)}"
        ),
    ]


# --- the report and the workspace ---------------------------------------------------------------------


def build(
    sections: Sequence[Section],
    project: str,
    entity: str,
    title: str,
    online: bool,
    head: Sequence = (),
    description: str = "",
):
    """The Report (one heading and panel grid per section, its Markdown under it) and the workspace view (one
    section per report section, runs grouped by optimizer). ``online``: the run sets name the project (W&B
    looks it up as the model is made, so only with a key)."""
    wr, ws, expr = load_api()
    if online and not entity:  # the key's own entity (W&B's default for a new report)
        import wandb

        entity = wandb.Api().default_entity
    blocks = list(head)
    for s in sections:
        where = {"entity": entity, "project": project} if online else {}
        filters = [expr.Config(k) == v for k, v in s.filters if v is not None]
        if s.group:
            filters.append(expr.Metric("Group") == s.group)
        elif s.ids:
            filters.append(expr.Metric("ID").isin(s.ids))
        runset = wr.Runset(name=s.title[:60], filters=filters, groupby=["config.optimizer"], **where)
        blocks += [wr.H2(s.title), *s.blocks, wr.PanelGrid(runsets=[runset], panels=list(s.panels))]
        if s.markdown:
            blocks.append(wr.MarkdownBlock(s.markdown))
    report = wr.Report(
        project=project, entity=entity, title=title[:128], description=description, blocks=blocks
    )
    workspace = ws.Workspace(
        entity=entity,
        project=project,
        name=title[:100],
        sections=[
            ws.Section(name=s.title, panels=[_copy(wr, p) for p in s.panels], is_open=True) for s in sections
        ],
        runset_settings=ws.RunsetSettings(groupby=[expr.Config("optimizer")]),
    )
    return report, workspace


def _copy(wr, panel):
    """A panel for the workspace (a panel object belongs to one grid: its id and layout are its own there)."""
    return wr.interface._lookup_panel(panel._to_model())


def spec_of(report, workspace) -> dict:
    """The report's and the workspace's models as JSON (what W&B stores for each)."""
    return {
        "version": SPEC_VERSION,
        "report": report._to_model().model_dump(by_alias=True, exclude_none=True, mode="json"),
        "workspace": workspace._to_model().model_dump(by_alias=True, exclude_none=True, mode="json"),
    }


def from_spec(spec: dict):
    """The Report and Workspace objects of a spec written by :func:`spec_of` (their models read back)."""
    wr, ws, _ = load_api()
    from wandb_workspaces.reports.v2 import internal
    from wandb_workspaces.workspaces import internal as ws_internal

    return (
        wr.Report._from_model(internal.ReportViewspec.model_validate(spec["report"])),
        ws.Workspace._from_model(ws_internal.View.model_validate(spec["workspace"])),
    )


def write_spec(out: Path, report, workspace) -> Path:
    path = Path(out) / SPEC
    write_json_atomic(path, spec_of(report, workspace))
    return path


def publish_command(path: Path) -> str:
    return f"wagma-bench report --wandb-publish {path}"


def save(report, workspace) -> tuple[str, str]:
    """Save both to W&B (needs an API key and the network); their URLs."""
    report.save()
    workspace.save()
    return report.url, workspace.url


def publish(path: Path) -> tuple[str, str]:
    """Save a spec written offline: its run sets get the report's project (and the key's default entity where
    the spec has none), then both are saved; their URLs."""
    spec = readback.load(path, readback.WANDB_SPEC)
    if spec["version"] != SPEC_VERSION:
        from wagma_bench.errors import ConfigError

        raise ConfigError(
            f"{path}: version={spec.get('version')!r} is not allowed; a spec of version "
            f"{SPEC_VERSION} is (written by wagma-bench report --wandb-report)"
        )
    try:
        report, workspace = from_spec(spec)
    except ValueError as err:  # pydantic's ValidationError: sections of the right type, not W&B's models
        said = " ".join(str(err).split())[:200]
        raise readback.ReadBackError(f"{path}: report/workspace are not W&B's models ({said})") from None
    if not report.entity:
        import wandb

        report.entity = workspace.entity = wandb.Api().default_entity
    for block in report.blocks:
        for runset in getattr(block, "runsets", None) or []:
            runset.entity, runset.project = report.entity, report.project
    return save(report, workspace)


# --- the keys a report names, and which of them no run logged -------------------------------------------


def named_keys(spec: dict) -> list[tuple[str, str, str]]:
    """Every (section, key, where) the spec's panels and run sets name: section ``history`` (a line plot's
    axes), ``summary``, ``config`` or ``run`` (a run attribute such as the group)."""
    found: list[tuple[str, str, str]] = []
    for block in spec["report"]["spec"]["blocks"]:
        meta = block.get("metadata") or {}
        for rs in meta.get("runSets", []):
            found += _runset_keys(rs, f"run set {rs.get('name')!r}")
        for p in (meta.get("panelBankSectionConfig") or {}).get("panels", []):
            found += _panel_keys(p)
    section = spec["workspace"]["spec"]["section"]
    for s in section["panelBankConfig"]["sections"]:
        found += [
            (k, n, f"workspace section {s['name']!r}: {w}") for p in s["panels"] for k, n, w in _panel_keys(p)
        ]
    for rs in section.get("runSets", []):
        found += _runset_keys(rs, "the workspace's run set")
    return found


def _runset_keys(rs: dict, where: str) -> list[tuple[str, str, str]]:
    keys = [
        (f["key"]["section"], f["key"]["name"], f"{where} filter") for f in _leaves(rs.get("filters") or {})
    ]
    keys += [
        (g["section"], g["name"].removesuffix(".value"), f"{where} grouping") for g in rs.get("grouping", [])
    ]
    return keys


def _leaves(node: dict) -> list[dict]:
    out = []
    for f in node.get("filters", []):
        out += _leaves(f) if "filters" in f else [f]
    return out


def _panel_keys(panel: dict) -> list[tuple[str, str, str]]:
    c, where = panel.get("config") or {}, f"panel {(panel.get('config') or {}).get('chartTitle')!r}"
    keys = []
    for m in ([c["xAxis"]] if c.get("xAxis") not in (None, "_step") else []) + list(c.get("metrics") or []):
        keys.append(
            ("summary", m.removeprefix("summary_metrics."), where)
            if m.startswith("summary_metrics.")
            else ("history", m, where)
        )
    if c.get("groupBy"):
        keys.append(
            ("config", c["groupBy"].removesuffix(".value"), where)
            if c["groupBy"].endswith(".value")
            else ("run", c["groupBy"], where)
        )
    for col in c.get("columns") or []:
        section, _, name = col["accessor"].partition(":")
        keys.append((section, name.removesuffix(".value"), where))
    return keys


def unlogged(spec: dict, logged: dict[str, set]) -> list[str]:
    """One line for each key the spec names that no run logged (``logged``: section -> the keys the runs'
    W&B records hold: ``history``, ``summary``, ``config`` and ``run``)."""
    return [
        f"{where} names {section} key {key!r}, which no run logged"
        for section, key, where in named_keys(spec)
        if key not in logged.get(section, set())
    ]
