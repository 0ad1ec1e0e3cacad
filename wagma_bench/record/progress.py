"""Progress display on rank 0: a rich bar on a terminal, plain log lines otherwise."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, mode: str, total: int, every_s: float, label: str):
        if mode == "auto":
            mode = "bar" if sys.stdout.isatty() else "lines"
        self.mode, self.total, self.every_s, self.label = mode, total, every_s, label
        self._last = 0.0
        self._bar = None
        if mode == "bar":
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} {task.fields[info]}"),
                TimeElapsedColumn(),
            )
            self._task = self._bar.add_task(label, total=total, info="")
            self._bar.start()

    def update(self, r: int, info: str, force: bool = False) -> None:
        """Round ``r`` of ``total`` (a line says ``round r/total``: the budget counts rounds)."""
        if self._bar is not None:
            self._bar.update(self._task, completed=min(r, self.total), info=info)
        elif self.mode == "lines":
            now = time.monotonic()
            if force or now - self._last >= self.every_s:
                self._last = now
                print(f"[{self.label}] round {r}/{self.total} {info}", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
