"""The progress lines of long predictions (``simulate``, ``simulate --interval``), on stderr."""

from __future__ import annotations

import sys
import time

from wagma_bench.simulate.des import Progress

# once the predictions have taken this long, a progress line at least this often: a line per simulation, and
# lines from inside a long one (each says where it is as it goes: des.Progress). A module constant so that a
# test can shorten it.
PROGRESS_EVERY_S = 5.0


class Ticker:
    """The progress lines of long predictions, on stderr: quiet for the first ``PROGRESS_EVERY_S``, then a
    line at least that often -- one per finished simulation, and, inside a long one, where it is (its phase,
    how far, and how long the phase has left at its pace so far). Lines used to come only between simulations:
    at 65,536 GPUs AD-PSGD's alone takes most of a minute, and a loaded machine saw one line after 6 s, then
    none for 294 s."""

    def __init__(self, total: int, label: str = "simulate", start: float | None = None):
        self.total, self.label, self.every_s = total, label, PROGRESS_EVERY_S
        # from the command's start (composing eight optimizers' configs took 7 s on a loaded machine)
        self.start = self.last = time.perf_counter() if start is None else start
        self.current, self.what, self.phase, self.phase_at = 0, "", "", (0.0, 0.0)
        # ``simulate --interval``: the last stage its caller finished (``replicate 37/100``), said on every
        # line, which its simulations' own lines would otherwise crowd out
        self.stage = ""

    def simulation(self, what: str) -> Progress:
        """The next simulation (``what``: its optimizer and world): the hook to give it."""
        self.current, self.what, self.phase = self.current + 1, what, ""
        return self.tick

    def hush(self) -> None:
        """No line for ``PROGRESS_EVERY_S`` from now: a worker process of ``simulate --interval`` before each
        simulation, so that only a long one says where it is (the command's own lines say the stages)."""
        self.last = time.perf_counter()

    def tick(self, phase: str, fraction: float) -> None:
        now = time.perf_counter()
        if phase != self.phase:  # a phase's pace is measured from its start
            self.phase, self.phase_at = phase, (now, fraction)
        if now - self.last < self.every_s:
            return
        t0, f0 = self.phase_at
        # the phase's pace so far, once it has gone far enough to have one
        left = (
            f", about {(now - t0) / (fraction - f0) * (1 - fraction):.0f} s more"
            if fraction > f0 + 0.02
            else ""
        )
        self._say(f"{self.what}: {phase} {100 * fraction:.0f}%{left}", now)

    def note(self, text: str) -> None:
        """A stage finished (``text``): said now unless a line was said within ``PROGRESS_EVERY_S``, and on
        every line after it until the next."""
        self.stage = text
        now = time.perf_counter()
        if now - self.last >= self.every_s:
            self._say(text, now)

    def done(self, took: str) -> None:
        """The simulation ended (``took``: how long it took, said)."""
        now = time.perf_counter()
        if now - self.start > self.every_s:
            self._say(f"{self.what}: {took}", now)

    def _say(self, text: str, now: float) -> None:
        self.last = now
        count = f" {self.current}/{self.total}" if self.total else ""
        done = f" (done: {self.stage})" if self.stage and text != self.stage else ""
        print(f"[{self.label}{count} {now - self.start:.0f} s] {text}{done}", file=sys.stderr, flush=True)
