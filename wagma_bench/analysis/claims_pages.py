"""The pages ``wagma-bench claims --readme FILE`` fills: each FILE's generated blocks, found by their
markers.

- ``<!-- claims:begin -->`` ... ``<!-- claims:end -->``: the verdicts in a few lines
  (:func:`verdict_summary`), for a front page (the README);
- ``<!-- claims_table:begin -->`` ... ``<!-- claims_table:end -->``: the whole summary table, one row a claim
  (docs/claims.md).

A page must hold at least one of them, and is checked before anything is written (:func:`check_page`). The
summary shows what the claims carry and nothing more: a claim whose ``robustness`` says it is ``fragile`` is
marked so, and one read with the ``old`` ruler (``"ruler": "old"``) is listed apart; a claim without those
fields shows neither.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from wagma_bench.errors import ConfigError
from wagma_bench.record.files import atomic_write, refuse_link

SUMMARY, TABLE = "claims", "claims_table"


def block(name: str) -> re.Pattern[str]:
    """A block's markers and what lies between them (nothing, in a page not filled yet)."""
    return re.compile(rf"(<!-- {name}:begin -->\n)(?:.*?\n)??(<!-- {name}:end -->)", re.DOTALL)


BLOCKS = {SUMMARY: block(SUMMARY), TABLE: block(TABLE)}
README_BLOCK = BLOCKS[SUMMARY]
PAGE_HINT = "wagma-bench never writes through a link: remove it, or give --readme the file itself"
# the verdicts in the order the summary says them, each with its heading
WIDTH = 110  # the pages' prose width: a long list of claims wraps, indented under its bullet
HEADINGS = {"holds": "Holds", "does not hold": "Does not hold", "inconclusive": "Inconclusive"}


def check_page(path: Path) -> str:
    """The page's text, refused (before anything is written) when it has no block to fill, or is a link
    (read through it, it used to be refused only at its write, after claims.json and claims.md)."""
    if path.is_symlink():
        raise refuse_link(path, PAGE_HINT)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"--readme {path}: cannot read it ({err.strerror})") from None
    if not any(pattern.search(text) for pattern in BLOCKS.values()):
        raise ConfigError(
            f"--readme {path} has no block to fill: <!-- claims:begin --> ... <!-- claims:end --> (the "
            "verdicts) or <!-- claims_table:begin --> ... <!-- claims_table:end --> (the table)"
        )
    return text


def fill_page(path: Path, contents: dict[str, str]) -> None:
    """Replace each block ``path`` holds with its content (``contents``: block name -> text)."""
    text = check_page(path)
    for name, pattern in BLOCKS.items():
        text = pattern.sub(
            lambda m, body=contents[name]: m.group(1) + body.strip("\n") + "\n" + m.group(2), text
        )
    atomic_write(path, lambda f: f.write(text))


def verdict_summary(results: list[dict]) -> str:
    """One line per verdict, naming its claims: ``- **Inconclusive** (3 of 4): `a`, `b` (fragile) (old ruler:
    `c`).`` A claim marked fragile (``robustness.fragile``) says so; those read with the old ruler are listed
    apart."""
    lines = []
    for verdict, heading in HEADINGS.items():
        mine = [r for r in results if r["verdict"] == verdict]
        current = [named(r) for r in mine if r.get("ruler") != "old"]
        old = [named(r) for r in mine if r.get("ruler") == "old"]
        said = ", ".join(current)
        if old:
            said += f" (old ruler: {', '.join(old)})" if current else f"old ruler: {', '.join(old)}"
        line = f"- **{heading}** ({len(mine)} of {len(results)}): {said or 'none'}."
        lines.append(textwrap.fill(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False))
    return "\n".join(lines)


def named(r: dict) -> str:
    fragile = (r.get("robustness") or {}).get("fragile")
    return f"`{r['id']}`" + (" (fragile)" if fragile else "")
