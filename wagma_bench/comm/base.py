"""The one communication interface every algorithm uses.

Algorithms talk to a :class:`Comm`, never to torch.distributed or MPI. Two implementations share it:
:mod:`.torch_dist` (gloo on CPU, nccl on GPU) and :mod:`.mpi` (mpi4py). Groups are addressed by the
sorted tuple of their world ranks; every group an algorithm will use is created once, collectively, with
:meth:`Comm.new_groups` (a process-group or communicator creation is a collective over the world).

A progress thread must not share process groups with the main thread (gloo aborts with "collective
mismatch"): :meth:`Comm.fork` returns a communicator with its own groups for that thread.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

Ranks = tuple[int, ...]


class Handle(Protocol):
    """An operation in flight; ``wait()`` returns once its result is in the tensor."""

    def wait(self) -> None: ...


class Done:
    """Handle of an operation that completed at call time."""

    def wait(self) -> None:
        return None


class CommError(RuntimeError):
    """A collective failed: a peer died, hung past the timeout, or the world is misconfigured."""


@dataclass(frozen=True)
class Capabilities:
    """What a communicator's point-to-point operations can do. NCCL (every GPU cluster) can do neither:
    algorithms keep any-source receives and tagged messages on :meth:`Comm.fork_control`."""

    any_source: bool  # recv_any: receive from whichever rank sends first
    tags: bool  # messages are matched by tag (without: only by sender and order)


class Comm(abc.ABC):
    """Point-to-point and collective operations over one world of ranks."""

    rank: int
    world_size: int
    device: torch.device
    backend_name: str  # "gloo", "nccl" or "mpi"
    timeout_s: float  # no operation waits longer; a dead or hung peer fails the run after this long
    capabilities: Capabilities = Capabilities(any_source=True, tags=True)
    #: abort() ends every rank of the job at once, rank 0 included (so a failing rank records the failure
    #: itself first); False: it does nothing and the launcher ends the world when a rank exits with an error
    abort_ends_job: bool = False
    #: a mean is part of the collective (NCCL's ReduceOp.AVG); False: the sum is divided afterwards, one more
    #: pass over the buffer (gloo and MPI have no average)
    averages_in_collective: bool = False

    # --- collectives over the world or a created group ------------------------------------------
    @abc.abstractmethod
    def allreduce(
        self, tensor: torch.Tensor, op: str = "mean", group: Ranks | None = None, async_op: bool = False
    ) -> Handle:
        """In-place sum or mean of ``tensor`` over ``group`` (the world when None)."""

    @abc.abstractmethod
    def broadcast(self, tensor: torch.Tensor, src: int, group: Ranks | None = None) -> None:
        """In-place broadcast from world rank ``src``."""

    @abc.abstractmethod
    def allgather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack of every rank's ``tensor`` (shape ``[world_size, *tensor.shape]``)."""

    @abc.abstractmethod
    def barrier(self) -> None: ...

    # --- a counter shared by all ranks --------------------------------------------------------------
    @abc.abstractmethod
    def store_add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the named counter shared by all ranks (created at 0) and return
        its new value. Not a collective: any rank may call it at any time (DD-PPO counts the ranks that
        finished their rollout with it). Use a new key for every use; keys are never deleted."""

    # --- point to point -------------------------------------------------------------------------
    @abc.abstractmethod
    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Handle: ...

    @abc.abstractmethod
    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Handle: ...

    @abc.abstractmethod
    def recv_any(self, tensor: torch.Tensor, tag: int) -> int:
        """Blocking receive from any rank with ``tag``; returns the sender's rank."""

    # --- groups and threads ---------------------------------------------------------------------
    @abc.abstractmethod
    def new_groups(self, groups: Iterable[Sequence[int]]) -> None:
        """Create the given groups (collective: every rank passes the same list in the same order)."""

    @abc.abstractmethod
    def fork(self, timeout_s: float | None = None) -> Comm:
        """A communicator over the same world with its own groups, for another thread (collective).

        ``timeout_s`` overrides the operation timeout (a listener that idles between messages needs a
        long one; failures of peers are then detected by the other threads)."""

    def fork_control(self, timeout_s: float | None = None) -> Comm:
        """A communicator for control messages (activations, headers, any-source receives, tags), always on
        the CPU, for another thread (collective). NCCL cannot receive from any rank nor match tags, so
        control traffic never travels on the data plane; by default it is a fork of this communicator."""
        return self.fork(timeout_s)

    @abc.abstractmethod
    def close(self) -> None: ...

    def abort(self, code: int = 1) -> None:
        """After this rank failed: end the whole job now rather than let the peers wait out ``timeout_s``.
        torch.distributed needs nothing here (see :attr:`abort_ends_job`)."""

    # --- helpers shared by the implementations --------------------------------------------------
    def group_allreduce(self, tensor: torch.Tensor, groups: Sequence[Ranks], op: str = "mean") -> None:
        """Allreduce within this rank's group of a partition (``groups`` is one schedule stage)."""
        mine = next(g for g in groups if self.rank in g)
        if len(mine) > 1:
            self.allreduce(tensor, op=op, group=mine)

    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        self.isend(tensor, dst, tag).wait()

    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> None:
        self.irecv(tensor, src, tag).wait()
