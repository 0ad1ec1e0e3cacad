"""The wait-avoiding group allreduce of WAGMA-SGD (Li et al., TPDS 2020, Sec. III-B).

Rounds are numbered 1, 2, 3, ...; every rank takes part in every round, in order. Round ``r`` is either a
*group round* (the partition ``schedule(r)``, e.g. a butterfly stage) or, every ``sync_every`` rounds, a
*synchronous round* over the whole world (the staleness limiter).

Each rank runs a communication **progress thread** with its own communicators (``comm.fork()``):

- A group round starts on a rank as soon as either its compute thread asks for it (the rank is *ready*),
  or an *activation* message for that round arrives from a group member: the first member that is ready
  activates the round, and every member that joins forwards the activation to its hypercube neighbours
  inside the group (the activation tree of the paper). A member that is still computing therefore takes
  part through its progress thread, contributing the model in its send buffer, i.e. the model it posted
  at the end of its previous step (stale). Fast members never wait for a slow member's computation, only
  for the group's communication.
- A synchronous round cannot be joined passively: it waits until every rank's compute thread asks for it.
  Between two synchronous rounds a contribution is at most ``sync_every - 1`` rounds stale.

Each rank sends exactly one activation message per group round to each of its hypercube neighbours, so
every rank knows how many to expect and no message is left unmatched. A separate **listener thread**
blocks on "receive from any rank" for those messages (gloo cannot poll a pending receive).

The compute thread's protocol is :meth:`post` (put the current model in the send buffer) and
:meth:`request` (wait for the earliest round that includes the posted buffer and has not completed:
the round in flight if it started after the post, else the next round, which it activates).
A slow rank thus *skips* the rounds its progress thread completed passively while it computed.

``in_order=True`` (eager-SGD) changes what a request returns: the result of every round, in order. The
results of rounds joined passively are kept until the compute thread asks for them, so every rank applies
the same sequence of results (identical models); only contributions are stale.

``activator`` (eager-SGD's majority mode) restricts who may start a round: ``activator(r)`` is the one rank
whose readiness activates round ``r``; other ready ranks wait for its activation.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from wagma_bench.comm.base import Comm, CommError, Ranks
from wagma_bench.comm.topology import hypercube_neighbours

STOP = -1
# The listener may idle between activations for as long as a step or an evaluation takes; a dead peer
# is detected by the progress thread's collectives, which keep the normal timeout.
LISTENER_TIMEOUT_S = 7 * 24 * 3600.0


@dataclass
class RoundResult:
    round: int               # the round whose result this is
    result: torch.Tensor     # the group (or global) mean; valid until the caller's next request()
    staleness: int           # max rounds this rank's contributions were stale since its last request
    wait_s: float            # time the caller waited


def _tag(r: int) -> int:
    # MPI only guarantees tags up to 32767; rounds that far apart are never in flight together.
    return 1 + r % 32000


class WaitAvoidingAllreduce:
    """Wait-avoiding group allreduce of one flat buffer; see the module docstring."""

    def __init__(self, comm: Comm, like: torch.Tensor, schedule: Callable[[int], Sequence[Ranks]],
                 all_groups: Iterable[Ranks], sync_every: int,
                 timeout_s: float = 300.0, op: str = "mean", start_round: int = 0, in_order: bool = False,
                 activator: Callable[[int], int] | None = None):
        if sync_every < 0:
            raise ValueError(f"sync_every must be >= 0 (0: never), got {sync_every}")
        self.rank, self.world_size = comm.rank, comm.world_size
        self.schedule, self.sync_every, self.op = schedule, sync_every, op
        self.timeout_s, self.in_order, self.activator = timeout_s, in_order, activator
        self._kept: deque[tuple[int, torch.Tensor]] = deque()  # in_order: results not yet taken
        # Both forks are collective; the progress thread owns its groups, the listener its channel.
        self._pcomm = comm.fork()
        self._pcomm.new_groups(all_groups)
        self._acomm = comm.fork(timeout_s=LISTENER_TIMEOUT_S)
        self._send = like.detach().clone()
        self._work = torch.empty_like(self._send)
        self._answer = torch.empty_like(self._send)  # result of the round the compute thread asked for
        # Result buffers are recycled, not allocated per round: a fresh model-sized tensor costs page
        # faults (~40 ms per 100 MB here), more than the copy. A result lent by request() comes back to
        # the pool at the next request().
        self._free: list[torch.Tensor] = []
        self._lent: torch.Tensor | None = None
        self._cv = threading.Condition()
        # Rounds continue after start_round (a synchronous round, when resuming from a checkpoint).
        self._posted_round = start_round + 1  # first round that uses the current send buffer
        self._started = start_round           # last round the progress thread started
        self._done = start_round              # last round completed
        self._ready = start_round             # highest round the compute thread asked for
        self._answered = start_round          # round whose result is in _answer
        self._activated: set[int] = set()
        self._staleness = 0
        self._error: BaseException | None = None
        self._closing = False
        self._progress = threading.Thread(target=self._guard(self._progress_loop), daemon=True,
                                          name=f"wagma-progress-{self.rank}")
        self._listener = threading.Thread(target=self._guard(self._listen_loop), daemon=True,
                                          name=f"wagma-listener-{self.rank}")
        self._progress.start()
        self._listener.start()

    # --- schedule helpers -------------------------------------------------------------------------
    def is_sync(self, r: int) -> bool:
        return self.sync_every > 0 and r % self.sync_every == 0

    def group(self, r: int) -> Ranks:
        return self._group_of(self.rank, r)

    def _group_of(self, rank: int, r: int) -> Ranks:
        return next(g for g in self.schedule(r) if rank in g)

    # --- compute-thread API -----------------------------------------------------------------------
    def post(self, tensor: torch.Tensor) -> None:
        """Make ``tensor`` this rank's contribution from the next round the progress thread starts."""
        with self._cv:
            self._send.copy_(tensor)
            self._posted_round = self._started + 1

    def request(self) -> RoundResult:
        """Activate the next round this rank has not started and wait for its result."""
        t0 = time.perf_counter()
        with self._cv:
            self._raise_if_failed()
            if self._lent is not None:  # the caller is done with the previous result
                self._free.append(self._lent)
                self._lent = None
            if self.in_order:
                target = self._answered + 1  # the next round in order, possibly already completed
            else:
                in_flight = self._started > self._done and self._posted_round <= self._started
                # A round already running with the current send buffer serves; else activate the next.
                target = self._started if in_flight else self._started + 1
            self._ready = max(self._ready, target)
            self._cv.notify_all()
            deadline = time.monotonic() + 2 * self.timeout_s
            while not self._has_answer(target):
                self._raise_if_failed()
                if not self._cv.wait(timeout=1.0) and time.monotonic() > deadline:
                    raise CommError(f"rank {self.rank}: round {target} did not complete within "
                                    f"{2 * self.timeout_s:.0f} s")
            self._raise_if_failed()
            if self.in_order:
                r, result = self._kept.popleft()
                self._answered = r
            else:
                result = self._buffer()
                result.copy_(self._answer)
            out = RoundResult(self._answered, result, self._staleness, 0.0)
            self._lent = result
            self._staleness = 0
        out.wait_s = time.perf_counter() - t0
        return out

    def _buffer(self) -> torch.Tensor:
        """A result buffer from the pool (call with the lock held)."""
        return self._free.pop() if self._free else torch.empty_like(self._send)

    def _has_answer(self, target: int) -> bool:
        if self.in_order:
            return bool(self._kept) and self._kept[0][0] >= target
        return self._answered >= target

    def close(self) -> None:
        """Stop both threads. Every rank calls this after the same completed synchronous round."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
            failed = self._error is not None
            last = self._answered
        self._progress.join(timeout=self.timeout_s)
        if not failed:
            self._send_stops(last)
            self._listener.join(timeout=self.timeout_s)

    def _send_stops(self, last: int) -> None:
        """Each listener blocks at its first group round after ``last`` with a partner; every neighbour
        there sends it exactly the number of messages it expects, all STOP."""
        stop = torch.tensor([STOP], dtype=torch.int64)
        horizon = last + 1 + 4 * max(1, self.world_size.bit_length())
        for r in range(last + 1, horizon):
            if self.is_sync(r):
                continue
            group = self.group(r)
            for nb in hypercube_neighbours(self.rank, group) if len(group) > 1 else ():
                if self._first_blocking_round(nb, last) == r:
                    self._acomm.send(stop, nb, _tag(r))

    def _first_blocking_round(self, rank: int, last: int) -> int:
        r = last + 1
        while self.is_sync(r) or len(self._group_of(rank, r)) < 2:
            r += 1
        return r

    # --- threads ------------------------------------------------------------------------------------
    def _guard(self, loop):
        def run():
            try:
                loop()
            except BaseException as err:  # noqa: BLE001 - surfaced to the compute thread by request()
                with self._cv:
                    if not self._closing:
                        self._error = err
                    self._cv.notify_all()
        return run

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise CommError(f"rank {self.rank}: wait-avoiding allreduce failed: {self._error}") from self._error

    def _progress_loop(self) -> None:
        r = self._started + 1
        while True:
            sync = self.is_sync(r)
            group = None if sync else self.group(r)
            with self._cv:
                # A singleton group has nobody to wait for: its round completes at once.
                solo = group is not None and len(group) == 1
                may_start = sync or self.activator is None or self.activator(r) == self.rank
                while not (solo or (self._ready >= r and may_start) or (not sync and r in self._activated)
                           or self._closing):
                    self._cv.wait()
                if self._closing and self._ready < r and r not in self._activated:
                    return
                self._started = r
                self._work.copy_(self._send)
                self._staleness = max(self._staleness, r - self._posted_round)
            if sync:
                self._pcomm.allreduce(self._work, op=self.op)
            elif not solo:
                signal = torch.tensor([r], dtype=torch.int64)
                for nb in hypercube_neighbours(self.rank, group):
                    self._acomm.send(signal, nb, _tag(r))
                self._pcomm.allreduce(self._work, op=self.op, group=group)
            with self._cv:
                if self.in_order:
                    # hand the reduced buffer itself to the compute thread; work on a pooled one next
                    self._kept.append((r, self._work))
                    self._work = self._buffer()
                elif r == self._ready:
                    self._answer.copy_(self._work)
                    self._answered = r
                self._done = r
                self._activated.discard(r)
                self._cv.notify_all()
            r += 1

    def _listen_loop(self) -> None:
        buf = torch.zeros(1, dtype=torch.int64)
        r = self._done + 1
        while True:
            if not self.is_sync(r):
                group = self.group(r)
                expected = len(hypercube_neighbours(self.rank, group)) if len(group) > 1 else 0
                for i in range(expected):
                    self._acomm.recv_any(buf, _tag(r))
                    if int(buf[0]) == STOP:
                        if i == expected - 1:
                            return
                        continue
                    if i == 0:
                        with self._cv:
                            if r > self._started:
                                self._activated.add(r)
                            self._cv.notify_all()
            r += 1
