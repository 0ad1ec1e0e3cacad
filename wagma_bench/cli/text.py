"""Docstrings as terminal text: a command's ``--help`` prints its module's docstring, written for Sphinx-style
readers of the code; the terminal gets it without the reStructuredText markup."""

from __future__ import annotations

import re

# :func:`~wagma_bench.x.f` -> `f` (the tilde: the last name only, as Sphinx shows it); :mod:`a.b` -> `a.b`
_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc):`(~?)([^`]+)`")


def plain(doc: str) -> str:
    """``doc`` with its roles and double backquotes rendered as one pair of backquotes, as the other commands'
    help texts quote code."""
    doc = _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", doc)
    return doc.replace("``", "`")
