"""The size of a checkpoint file, counted before one is written: rank 0 says at a run's start what one
checkpoint takes (:meth:`wagma_bench.record.checkpoint.Checkpointer.size_line`), so that a cluster user can
size scratch.

The count serialises the state a checkpoint saves (:func:`wagma_bench.record.checkpoint.payload`) into a sink
that keeps nothing, so storage sharing, pickle and zip records are all in; what exists only once training
runs is added as the code that creates it would create it (the local optimizer's state, made by its own step
on meta-device copies of the parameters; an algorithm's message in flight, its ``largest_state_dict``). torch
is imported inside the functions: the launching process imports this module without it.
"""

from __future__ import annotations


class _Counter:
    """A file that counts what is written to it and keeps nothing."""

    def __init__(self):
        self.n = 0

    def write(self, data) -> int:
        self.n += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def file_bytes(saved: dict, optimizer=None) -> int:
    """The size of the file ``torch.save`` writes for ``saved`` (a fresh checkpoint payload), counted as it
    serialises, so storage sharing, pickle and zip records are all in. Where ``optimizer`` (the local one) has
    no state yet (a fresh start: SGD's momentum and Adam's moments appear at its first step), the state its
    first step creates is counted as that optimizer creates it (:func:`_first_step_state`, on the meta
    device): each such tensor serialised as a 1-element stand-in (its record) plus the rest of its bytes,
    exact within 63 bytes of alignment per tensor."""
    import torch

    extra = 0
    saved_optimizer = saved["algo"].get("local_optimizer")
    lazy = optimizer is not None and saved_optimizer is not None and not saved_optimizer.get("state")
    state = _first_step_state(optimizer) if lazy else {}
    for entry in state.values():
        for key, t in entry.items():
            if (
                isinstance(t, torch.Tensor) and t.device.type == "meta"
            ):  # a 1-element stand-in writes its record
                entry[key] = torch.zeros(1, dtype=t.dtype)
                extra += (t.numel() - 1) * t.element_size()
    if state:
        saved_optimizer["state"] = state
    counter = _Counter()
    torch.save(saved, counter)
    return counter.n + extra


def _first_step_state(optimizer) -> dict:
    """The state (by parameter index) that one step of ``optimizer`` creates, made by a copy of it over
    meta-device copies of its parameters (no memory, no data): the optimizer's own code decides what it keeps.
    Both local optimizers of the suite (SGD, AdamW) step there; one that cannot is counted without it."""
    try:
        return _step_on_meta(optimizer)
    except (RuntimeError, NotImplementedError, TypeError):
        return {}


def _step_on_meta(optimizer) -> dict:
    import torch

    groups = []
    for g in optimizer.param_groups:
        params = [torch.empty_like(p, device="meta").requires_grad_(True) for p in g["params"]]
        for p in params:
            p.grad = torch.zeros_like(p)
        hyper = {k: v for k, v in g.items() if k != "params"}
        if "foreach" in hyper:  # the multi-tensor kernels are for real devices
            hyper["foreach"] = False
        groups.append({**hyper, "params": params})
    mirror = type(optimizer)(groups)
    mirror.step()
    return mirror.state_dict()["state"]


def human_size(n: int) -> str:
    """Bytes in kB, MB, GB (powers of ten, as file systems' quotas are mostly given), three digits."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"
