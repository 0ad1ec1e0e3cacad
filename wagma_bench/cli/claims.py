"""``wagma-bench claims DIR... --out DIR [--claims FILE] [--readme FILE] [--allow-missing]``: the papers'
claims, measured here with intervals, predicted at scale, and a verdict (:mod:`wagma_bench.analysis.claims`
does the work)."""

from __future__ import annotations

import argparse
from pathlib import Path

from wagma_bench import exits
from wagma_bench.analysis import claims


def main(argv: list[str]) -> int:
    # bad input (a source or claims file that is not there, too): exit 2, as in every command; a full or
    # read-only disk: an operational failure, exit 1 (files.atomic_write left no half file)
    return exits.run_body("claims", lambda: _claims(argv), also=((FileNotFoundError, exits.REFUSED),))


def _claims(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="wagma-bench claims", fromfile_prefix_chars="@",
        description="The papers' claims: measured here with intervals, predicted at scale, and a verdict.")
    parser.add_argument("dirs", nargs="+", type=Path,
                        help="tuning directories, simulator outputs, or folders holding them (@FILE: one per line)")
    parser.add_argument("--out", type=Path, required=True, help="where claims.md and claims.json go")
    parser.add_argument("--claims", type=Path, default=claims.CLAIMS_FILE, help="the claims file (reproduce/claims.yaml)")
    parser.add_argument("--readme", type=Path, default=None,
                        help="also put the summary table between the <!-- claims:begin/end --> lines of this file")
    parser.add_argument(
        "--allow-missing",
        action="store_true",
        help="measure a source some of whose planned trials did not finish (refused otherwise); the tables "
        "then say how many trials each optimizer has",
    )
    args = parser.parse_args(argv)
    # the README and the sources are checked before anything is written (analysis.claims.make_claims)
    results = claims.make_claims(args.dirs, args.out, args.claims, args.readme, args.allow_missing)
    counts = ", ".join(f"{sum(r['verdict'] == v for r in results)} {v}" for v in claims.VERDICTS)
    print(f"wagma-bench claims: {len(results)} claims ({counts}); wrote {args.out}/claims.md, claims.json")
    return 0
