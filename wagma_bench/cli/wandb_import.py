"""``wagma-bench wandb-import RUN_DIR... [--project P] [--entity E] [--group G] [--mode MODE]``: log finished
runs to W&B after the fact, as ``logger=wandb`` would have logged them
(:func:`wagma_bench.record.loggers.import_run`): run directories, sweeps, tuning directories and committed
compact results (searched recursively). Offline without an API key: ``wandb sync RUN_DIR/wandb/offline-run-*``
publishes each, and ``report --wandb-report`` counts them as logged."""

from __future__ import annotations

import argparse
from pathlib import Path

from wagma_bench import exits
from wagma_bench.errors import ConfigError


def main(argv: list[str]) -> int:
    # a run directory that is not there is bad input (exit 2), as in report
    missing = {FileNotFoundError: ConfigError}
    return exits.run_body("wandb-import", lambda: exits.typed(missing, lambda: _import(argv)))


def _import(argv: list[str]) -> int:
    from wagma_bench.analysis.run_records import find_runs
    from wagma_bench.record.loggers import import_run, resolve_mode
    from wagma_bench.runtime.extras import require

    args = _parser().parse_args(argv)
    require("wandb", "wandb", "wandb-import")
    mode = resolve_mode(args.mode)  # online without a key: refused here, before any run is logged
    runs = find_runs(args.dirs)
    if not runs:
        raise FileNotFoundError(f"no run found under {', '.join(map(str, args.dirs))}")
    for run_dir in runs:
        where = import_run(run_dir, args.project, args.entity, args.group, mode)
        print(f"wagma-bench wandb-import: {run_dir} -> {where}", flush=True)
    print(f"wagma-bench wandb-import: {len(runs)} run(s) logged ({mode})", flush=True)
    return exits.OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wagma-bench wandb-import",
        description="Log finished runs, tuning trials and committed results to W&B as logger=wandb would "
        "have.",
    )
    parser.add_argument("dirs", nargs="+", type=Path, help="run, sweep or tuning directories (recursive)")
    parser.add_argument("--project", default="wagma-bench", help="W&B project (default: wagma-bench)")
    parser.add_argument("--entity", default=None, help="W&B entity (default: the key's)")
    parser.add_argument(
        "--group", default=None, help="W&B group (default: each run's sweep or tuning, as logger=wandb)"
    )
    parser.add_argument(
        "--mode", default="auto", choices=("auto", "offline", "online"), help="auto: online with an API key"
    )
    return parser
