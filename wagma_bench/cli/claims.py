"""``wagma-bench claims DIR... --out DIR [--claims FILE] [--readme FILE]... [--allow-missing]
[--wandb-report]``: the papers' claims, measured here with intervals, predicted at scale, and a verdict
(:mod:`wagma_bench.analysis.claims` does the work)."""

from __future__ import annotations

import argparse
from pathlib import Path

from wagma_bench import exits
from wagma_bench.analysis import claims, wandb_panels
from wagma_bench.errors import ConfigError


def main(argv: list[str]) -> int:
    # bad input (a source or claims file that is not there, too): exit 2, as in every command; a full or
    # read-only disk: an operational failure, exit 1 (files.atomic_write left no half file)
    missing = {FileNotFoundError: ConfigError}
    return exits.run_body("claims", lambda: exits.typed(missing, lambda: _claims(argv)))


def _claims(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="wagma-bench claims",
        fromfile_prefix_chars="@",
        description="The papers' claims: measured here with intervals, predicted at scale, and a verdict.",
    )
    parser.add_argument(
        "dirs",
        nargs="+",
        type=Path,
        help="tuning directories, simulator outputs, or folders holding them (@FILE: one per line)",
    )
    parser.add_argument("--out", type=Path, required=True, help="where claims.md and claims.json go")
    parser.add_argument(
        "--claims", type=Path, default=claims.CLAIMS_FILE, help="the claims file (reproduce/claims.yaml)"
    )
    parser.add_argument(
        "--readme",
        type=Path,
        action="append",
        default=[],
        help="also fill this page's generated blocks (repeatable): the verdicts between its <!-- "
        "claims:begin/end --> lines, the table between its <!-- claims_table:begin/end --> lines",
    )
    parser.add_argument(
        "--allow-missing",
        action="store_true",
        help="measure a source some of whose planned trials did not finish (refused otherwise); the tables "
        "then say how many trials each optimizer has",
    )
    parser.add_argument(
        "--wandb-report",
        action="store_true",
        help="also a W&B Report of the claims table and each claim's interval (wandb-workspaces): "
        "saved with an API key, else its spec written to OUT/wandb-report.json",
    )
    parser.add_argument(
        "--wandb-project", default="wagma-bench", help="the report's W&B project (default: wagma-bench)"
    )
    parser.add_argument("--wandb-entity", default=None, help="the report's W&B entity (default: the key's)")
    args = parser.parse_args(argv)
    if args.wandb_report:  # a missing extra is said before anything is written
        wandb_panels.load_api()
    # the README and the sources are checked before anything is written (analysis.claims.make_claims)
    results = claims.make_claims(args.dirs, args.out, args.claims, args.readme, args.allow_missing)
    counts = ", ".join(f"{sum(r['verdict'] == v for r in results)} {v}" for v in claims.VERDICTS)
    print(f"wagma-bench claims: {len(results)} claims ({counts}); wrote {args.out}/claims.md, claims.json")
    if args.wandb_report:
        _wandb_report(args, results)
    return exits.OK


def _wandb_report(args, results: list[dict]) -> None:
    """The claims as a W&B Report, with a section per tuning directory among the sources (their trials'
    parallel coordinates)."""
    from wagma_bench.record.loggers import resolve_mode

    online = resolve_mode("auto") == "online"
    wr, _, _ = wandb_panels.load_api()
    sections = wandb_panels.tuning_sections(wr, list(claims.find_sources(args.dirs).tunings.values()), [])
    head = wandb_panels.claims_blocks(wr, results, claims.summary_table(results))
    report, workspace = wandb_panels.build(
        sections, args.wandb_project, args.wandb_entity or "", "wagma-bench claims", online, head=head
    )
    for line in wandb_panels.deliver(args.out, report, workspace, online):
        print(f"wagma-bench claims: {line}", flush=True)
