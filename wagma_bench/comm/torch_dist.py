"""torch.distributed implementation of :class:`~wagma_bench.comm.base.Comm` (gloo on CPU, nccl on GPU)."""

from __future__ import annotations

import datetime
import gc
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist

from wagma_bench.comm.base import Capabilities, Comm, CommError, Done, Handle, Ranks

NCCL_LIKE = Capabilities(any_source=False, tags=False)
EMULATIONS = ("nccl",)


class _Mean:
    """Completes an async SUM allreduce by dividing by the group size (gloo has no AVG)."""

    def __init__(self, work, tensor: torch.Tensor, size: int):
        self.work, self.tensor, self.size = work, tensor, size

    def wait(self) -> None:
        try:
            self.work.wait()
        except RuntimeError as err:  # gloo/nccl report dead or hung peers as RuntimeError
            raise CommError(f"allreduce failed: {err}") from err
        self.tensor.div_(self.size)


class _Checked:
    def __init__(self, work, what: str):
        self.work, self.what = work, what

    def wait(self) -> None:
        try:
            self.work.wait()
        except RuntimeError as err:
            raise CommError(f"{self.what} failed: {err}") from err


class TorchComm(Comm):
    """One rank of a torch.distributed world. ``TorchComm.init`` creates the default process group.

    ``emulate="nccl"`` (``comm.emulate=nccl``): on a gloo world, refuse exactly what NCCL refuses on the data
    plane (any-source receives, tags), so that every CI run checks that algorithms keep those on the
    control plane (:meth:`fork_control`, always gloo on the CPU)."""

    def __init__(self, world_pg, timeout_s: float, device: torch.device, emulate: str | None = None):
        if emulate not in (None, *EMULATIONS):
            raise ValueError(f"emulate must be null or one of {', '.join(EMULATIONS)}, got {emulate!r}")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.device = device
        self.backend_name = dist.get_backend(world_pg)
        self.emulate = emulate
        if self.backend_name == "nccl" or emulate == "nccl":
            self.capabilities = NCCL_LIKE
        self.averages_in_collective = self.backend_name == "nccl"  # not the emulation: gloo has no AVG
        self._world = world_pg
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        self._groups: dict[Ranks, object] = {tuple(range(self.world_size)): world_pg}

    @classmethod
    def init(
        cls,
        backend: str,
        rank: int,
        world_size: int,
        store,
        timeout_s: float,
        device: torch.device,
        emulate: str | None = None,
    ) -> TorchComm:
        timeout = datetime.timedelta(seconds=timeout_s)
        if store is None:  # env:// (MASTER_ADDR/MASTER_PORT, or torchrun's agent store)
            dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
        else:
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        return cls(dist.group.WORLD, timeout_s, device, emulate)

    def _refuse(self, what: str) -> None:
        name = "nccl (emulated: comm.emulate=nccl)" if self.emulate else self.backend_name
        raise CommError(f"{name} cannot {what} on the data plane; use the control plane (fork_control())")

    def store_add(self, key: str, amount: int) -> int:
        # The rendezvous TCPStore of the default group: its add() is an atomic fetch-and-add on the server.
        store = dist.distributed_c10d._get_default_store()
        try:
            return int(store.add(f"wagma/{key}", int(amount)))
        except RuntimeError as err:
            raise CommError(f"store_add({key!r}) failed: {err}") from err

    def _pg(self, group: Ranks | None):
        if group is None:
            return self._world
        try:
            return self._groups[tuple(group)]
        except KeyError:
            raise CommError(f"group {group} was not created with new_groups()") from None

    def allreduce(self, tensor, op="mean", group=None, async_op=False) -> Handle:
        pg = self._pg(group)
        size = len(group) if group is not None else self.world_size
        fused = op == "mean" and self.averages_in_collective
        try:
            work = dist.all_reduce(
                tensor, op=dist.ReduceOp.AVG if fused else dist.ReduceOp.SUM, group=pg, async_op=True
            )
        except RuntimeError as err:
            raise CommError(f"allreduce failed: {err}") from err
        handle = _Mean(work, tensor, size) if op == "mean" and not fused else _Checked(work, "allreduce")
        if not async_op:
            handle.wait()
            return Done()
        return handle

    def broadcast(self, tensor, src, group=None) -> None:
        _Checked(dist.broadcast(tensor, src=src, group=self._pg(group), async_op=True), "broadcast").wait()

    def allgather(self, tensor):
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        _Checked(dist.all_gather(out, tensor, group=self._world, async_op=True), "allgather").wait()
        return torch.stack(out)

    def barrier(self) -> None:
        # A tiny allreduce instead of dist.barrier(): it honours the group timeout on every backend.
        self.allreduce(torch.zeros(1, device=self.device), op="sum")

    def isend(self, tensor, dst, tag=0) -> Handle:
        if tag and not self.capabilities.tags:
            self._refuse(f"match messages by tag (send to rank {dst} with tag {tag})")
        return _Checked(self._world.send([tensor], dst, tag), f"send to rank {dst}")

    def irecv(self, tensor, src, tag=0) -> Handle:
        if tag and not self.capabilities.tags:
            self._refuse(f"match messages by tag (receive from rank {src} with tag {tag})")
        return _Checked(self._world.recv([tensor], src, tag), f"receive from rank {src}")

    def recv_any(self, tensor, tag) -> int:
        if not self.capabilities.any_source:
            self._refuse("receive from any rank")
        work = self._world.recv_anysource([tensor], tag)
        _Checked(work, "receive").wait()
        return work._source_rank() if hasattr(work, "_source_rank") else -1

    def new_groups(self, groups: Iterable[Sequence[int]]) -> None:
        for ranks in groups:
            key = tuple(sorted(ranks))
            if key in self._groups or len(key) < 2:
                continue
            self._groups[key] = dist.new_group(list(key), timeout=self._timeout)

    def fork(self, timeout_s: float | None = None) -> TorchComm:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        pg = dist.new_group(list(range(self.world_size)), timeout=datetime.timedelta(seconds=timeout_s))
        return TorchComm(pg, timeout_s, self.device, self.emulate)

    def fork_control(self, timeout_s: float | None = None) -> TorchComm:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        pg = dist.new_group(
            list(range(self.world_size)), timeout=datetime.timedelta(seconds=timeout_s), backend="gloo"
        )
        return TorchComm(pg, timeout_s, torch.device("cpu"))

    def close(self) -> None:
        """Destroy every process group (the forked planes too) while the interpreter is fully alive, and drop
        the finished work objects: gloo's threads holding work whose tensors refer to Python objects, torn
        down during the interpreter's finalization instead, abort the process (SIGABRT) after a run that
        completed."""
        if self._world is dist.group.WORLD and dist.is_initialized():
            dist.destroy_process_group()
            gc.collect()
