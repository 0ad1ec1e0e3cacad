"""The one writer of tables: Markdown (report, claims, simulate) and CSV, with the
same cell formats everywhere."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wagma_bench.record.files import atomic_write


def fmt(value: Any, kind: str = "") -> str:
    """One table cell. ``kind``: "" (one decimal from 10 up, else two), "x" (a ratio, ``1.23×``), "metric"
    (four decimals), "share" (a fraction as a percentage, ``12.3%``), "sig" (three significant digits,
    thousands grouped; infinite: a blank)."""
    if value is None or (kind == "sig" and isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        if kind == "x":
            return f"{value:.2f}×"
        if kind == "metric":
            return f"{value:.4f}"
        if kind == "share":
            return f"{value:.1%}"
        if kind == "sig":
            return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)


def markdown_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, str]]) -> str:
    """Columns: (key, header, format kind)."""
    head = "| " + " | ".join(h for _, h, _ in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = [
        "| " + " | ".join(fmt(r.get(k), kind).replace("|", "/") for k, _, kind in columns) + " |"
        for r in rows
    ]
    return "\n".join([head, sep, *body])


def write_csv(rows: Sequence[dict], path: Path) -> None:
    if not rows:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))

    def write(f) -> None:
        w = csv.DictWriter(f, fieldnames=keys, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)

    atomic_write(path, write)
