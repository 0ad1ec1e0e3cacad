"""DD-PPO's straggler preemption (Wijmans et al., ICLR 2020, Sec. 4).

Every rank collects a rollout of ``num_steps`` steps. Once a fraction ``sync_frac`` of the ranks have
finished their rollout, the others stop collecting early, provided they have at least a quarter of theirs
(``SHORT_ROLLOUT_THRESHOLD``); they then learn from the shorter rollout. The count of finished ranks lives
in a counter shared by all ranks (habitat-baselines uses the process group's TCPStore; here
:meth:`Comm.store_add`), so checking it costs one store round trip and no collective.

Counter keys: a run may do far more rollouts than a store should hold keys (the MPI store has a fixed
number of slots), so rollout ``k`` uses slot ``k % SLOTS``. Every rank adds exactly 1 to a slot per use,
so once the ranks are done with a slot's previous use it holds a multiple of the world size ``W``; while
rollout ``k`` is under way it holds that multiple plus the ranks done with ``k``. A rank still collecting
``k`` reads that count as ``value % W`` (it is below ``W``, the reader not being done); ``finish`` reads
``(value - 1) % W + 1``. Neither depends on how many uses the slot had, so the counter is right on a fresh
store whatever the rollout index: a resumed run starts with a new rendezvous store at rollout ``k`` (it
once subtracted ``(k // SLOTS) * W``, which on a fresh store past rollout 64 read -1 with 3 of 4 ranks
done, and preemption never fired again). This holds while no rank runs ``SLOTS`` rollouts ahead of
another, which the trainer's synchronisation points (at least every few rounds) guarantee.
"""

from __future__ import annotations

from wagma_bench.comm.base import Comm

SHORT_ROLLOUT_THRESHOLD = 0.25
SLOTS = 64


def should_stop_early(step: int, num_steps: int, num_done: int, world_size: int, sync_frac: float) -> bool:
    """Whether a rank that has collected ``step`` steps stops, given ``num_done`` ranks have finished."""
    return step >= num_steps * SHORT_ROLLOUT_THRESHOLD and num_done >= sync_frac * world_size


class RolloutCounter:
    """The shared count of ranks that finished rollout ``k`` (one instance per rank)."""

    def __init__(self, comm: Comm | None, world_size: int, prefix: str = "ddppo/done"):
        self.comm, self.world_size, self.prefix = comm, world_size, prefix

    def _key(self, k: int) -> str:
        return f"{self.prefix}/{k % SLOTS}"

    def done(self, k: int) -> int:
        """Ranks that have finished rollout ``k`` so far."""
        if self.comm is None:
            return 0
        return self.comm.store_add(self._key(k), 0) % self.world_size

    def finish(self, k: int) -> int:
        """Mark this rank as done with rollout ``k``; returns the count including it."""
        if self.comm is None:
            return 1
        return (self.comm.store_add(self._key(k), 1) - 1) % self.world_size + 1
