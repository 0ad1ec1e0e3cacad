"""Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512): local SGD's outer step taken fragment by
fragment, in turn, each fragment's communication overlapped with ``fragment_delay`` inner steps. The same
meaning as torchft's ``DiLoCo(..., sync_every=H, fragment_sync_delay=tau, fragment_update_alpha=alpha)``
(``torchft/local_sgd.py``), which ``tests/test_streaming.py`` drives beside this module as the oracle.

With H the period (local SGD's ``period``), F fragments and S = H / F: the k-th fragment sync (k = 1, 2, ...)
is of fragment (k - 1) mod F; it is *prepared* after inner step k S - tau: the pseudo-gradient of that
fragment, its global parameters at its previous sync minus the current local ones, goes into an average over
the ranks that runs while the rank takes tau more inner steps; it is *performed* after inner step k S: the
outer optimizer (one state per fragment) steps from the previous global parameters with the averaged
pseudo-gradient, which gives the new global ones, and the local parameters become
``(1 - alpha) global + alpha local`` (alpha 0: the global ones; the tau steps since the preparation survive
only through alpha). Every fragment is synced every H steps, staggered by S. The inner optimizer's state is
never touched.

Fragments are contiguous runs of the model's parameter tensors, in their order, balanced by element count
(each tensor in the fragment its middle falls in); torchft takes the fragments as modules from its user (the
paper recommends strided layers), so the oracle hands it the same runs.
"""

from __future__ import annotations

import torch

from wagma_bench.comm.base import Comm, Handle
from wagma_bench.errors import ConfigError
from wagma_bench.optim.outer import OuterStep
from wagma_bench.optim.rules import sync_at  # the schedule, shared with the simulator (no torch there)


def fragments_of(sizes: list[int], count: int) -> list[list[int]]:
    """Indices of the parameter tensors (of ``sizes`` elements) in each of ``count`` fragments."""
    total, start, out = sum(sizes), 0, [[] for _ in range(count)]
    for i, n in enumerate(sizes):
        out[min(count - 1, int(count * (start + n / 2) / max(total, 1)))].append(i)
        start += n
    return out


class StreamingOuter:
    """Each fragment's global parameters and outer state, and the one pseudo-gradient average in flight."""

    def __init__(self, settings, params: list[torch.Tensor], comm: Comm):
        if settings.fragments > len(
            params
        ):  # a fragment is whole tensors: more fragments than tensors are empty
            raise ConfigError(
                f"optimizer.fragments={settings.fragments} is not allowed for this model: it has "
                f"{len(params)} parameter tensors, and a fragment is one or more whole tensors; "
                f"choose at most {len(params)}"
            )
        self.settings, self.comm = settings, comm
        self.fragments = [
            [params[i] for i in idx] for idx in fragments_of([p.numel() for p in params], settings.fragments)
        ]
        self.outer = [
            OuterStep(settings, frag) for frag in self.fragments
        ]  # prev: the fragment's global params
        self.pending: tuple[int, torch.Tensor, Handle] | None = None

    def restart(self) -> None:
        for outer, frag in zip(self.outer, self.fragments):
            outer.restart(frag)

    def after_step(self, step: int, inner_lr: float) -> None:
        s = self.settings
        event = sync_at(step, s.sync_period, s.fragments, s.fragment_delay)
        if event is None:
            return
        what, f = event
        if what == "prepare" or s.fragment_delay == 0:
            self._prepare(f)
        if what == "perform":
            self._perform(f, inner_lr)

    def _prepare(self, f: int) -> None:
        frag, prev = self.fragments[f], self.outer[f].prev
        if not frag:
            return
        delta = torch.cat([(p - x).reshape(-1) for p, x in zip(prev, frag)])  # global - local
        self.pending = (f, delta, self.comm.allreduce(delta, op="mean", async_op=True))

    def _perform(self, f: int, inner_lr: float) -> None:
        frag, outer, alpha = self.fragments[f], self.outer[f], self.settings.fragment_alpha
        if not frag:
            return
        pending_f, delta, handle = self.pending
        assert pending_f == f, f"fragment {f} performed while fragment {pending_f} was prepared"
        handle.wait()
        self.pending = None
        saved = [x.clone() for x in frag] if alpha else []  # the local parameters, the delayed steps included
        offset = 0
        for x, p in zip(
            frag, outer.prev
        ):  # the average the outer step starts from: global - mean(global - local)
            x.copy_(p - delta[offset : offset + x.numel()].view_as(x))
            offset += x.numel()
        outer.step(frag, inner_lr)  # the new global parameters, in frag and in outer.prev
        for x, local in zip(frag, saved):
            x.lerp_(local, alpha)

    def finish(self) -> None:
        """The run's last round (local SGD then averages the whole model): a fragment's average still in
        flight is completed and dropped, since the whole model's average replaces its fragment."""
        if self.pending is not None:
            self.pending[2].wait()
            self.pending = None

    def state_dict(self) -> dict:
        assert self.pending is None, "a checkpoint is taken only between syncs"
        return {"outer": [o.state_dict() for o in self.outer]}

    def load_state_dict(self, state: dict) -> None:
        for o, saved in zip(self.outer, state["outer"]):
            o.load_state_dict(saved)
