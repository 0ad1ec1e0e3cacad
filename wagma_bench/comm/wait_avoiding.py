"""The wait-avoiding group allreduce of WAGMA-SGD (Li et al., TPDS 2020, Sec. III-B) and eager-SGD.

Rounds are numbered 1, 2, 3, ...; a :class:`~wagma_bench.comm.topology.RoundSchedule` says, for each
round, with whom a rank reduces (a butterfly stage, or the whole world) and whether the round is
*synchronous* (every ``period``-th round: the staleness limiter).

Each rank runs a communication **progress thread** that takes part in every round, in order, with the
rank's *send buffer*:

- **Activation over the whole world.** A group round starts on every rank as soon as any rank's compute
  thread asks for it (is *ready*): the progress thread that starts a round sends one activation message
  to each of its neighbours on the hypercube over the whole world, so the activation reaches every rank
  within log2(P) hops, as the authors' activation schedule does. A rank that is still computing takes
  part through its progress thread, whichever ranks are slow: a ready rank never waits for another
  rank's computation at a group round, only for communication (a group whose members are all slow still
  runs its round, so the next stage does not wait for it).
- **A synchronous round cannot be joined passively**: it starts when this rank's compute thread asks for
  it, and completes when every rank's has. It is the only place where a fast rank waits for a slow one.

Every rank sends exactly one activation per group round to each hypercube neighbour, so every rank
knows how many to expect and none is left unmatched. A separate **listener thread** blocks on "receive
from any rank" for them (gloo cannot poll a pending receive). Activations and every other any-source or
tagged message travel on the *control plane* (``comm.fork_control()``, gloo or MPI on the CPU); the
reduction of the send buffer on the *data plane* (``comm.fork()``, NCCL on GPUs).

What the send buffer holds, and what a round does with it (``contribution``):

- ``"model"`` (WAGMA-SGD): the rank's model as the communication side knows it. The compute thread adds
  its local change to it (:meth:`post` adds ``x - (the model it was last handed)``). A round reduces a
  snapshot and puts back ``mean + (whatever was added while the round ran)``. Each group average then
  keeps the sum of the models over the group, and every local update stays in the model exactly once,
  however late the rank is: a late rank's updates since the snapshot it contributed are kept on top of
  the group mean (``result + (current - contributed)``). :meth:`request` hands the current model.
- ``"gradient"`` (eager-SGD): gradients not yet reduced. :meth:`post` adds the fresh gradient; a round
  reduces what was there and removes it from the buffer, so every gradient is reduced in exactly one
  round (the authors zero the send buffer once a round has used it) and a passive round of a rank with
  nothing new contributes zeros. Results are kept per round and handed out in order, so every rank
  applies the same sequence of results (identical models).

Which round a :meth:`request` waits for (``in_order``): ``True``, the next round in order, possibly one
the progress thread already completed (then it answers at once); ``False`` (WAGMA's ``catch_up=skip``),
the round in flight if it includes the latest post, else the next round, which it activates: the rounds
the progress thread completed passively are skipped (with model contributions their results are already
in the model handed out).

``activator`` (eager-SGD's majority mode) restricts who may start a round: ``activator(r)`` is the one
rank whose readiness activates round ``r``; other ready ranks wait for its activation.

Staleness: the *age* of a rank's contribution to round ``r`` is how many rounds behind ``r`` the newest
post it contains is (0: the rank posted after completing round ``r - 1``, as an on-time rank does).
:meth:`request` reports the largest age among the rounds whose results it hands over.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from wagma_bench.comm.base import Comm, CommError
from wagma_bench.comm.topology import RoundSchedule, world_hypercube_neighbours

STOP = -1
# The listener may idle between activations for as long as a step or an evaluation takes; a dead peer
# is detected by the progress thread's collectives, which keep the normal timeout.
LISTENER_TIMEOUT_S = 7 * 24 * 3600.0
CONTRIBUTIONS = ("model", "gradient")


@dataclass
class RoundResult:
    round: int               # the round this rank has reached
    result: torch.Tensor     # model: the current model; gradient: the round's mean. Valid until the next request()
    staleness: int           # largest age of this rank's contributions to the rounds handed over
    wait_s: float            # time the caller waited


def _tag(r: int) -> int:
    # MPI only guarantees tags up to 32767; rounds that far apart are never in flight together.
    return 1 + r % 32000


class WaitAvoidingAllreduce:
    """Wait-avoiding allreduce of one flat buffer over the rounds of ``schedule``; see the module docstring."""

    def __init__(self, comm: Comm, like: torch.Tensor, schedule: RoundSchedule, contribution: str = "model",
                 in_order: bool = True, timeout_s: float = 300.0, start_round: int = 0,
                 activator: Callable[[int], int] | None = None):
        if contribution not in CONTRIBUTIONS:
            raise ValueError(f"contribution must be one of {', '.join(CONTRIBUTIONS)}, got {contribution!r}")
        if contribution == "gradient" and not in_order:
            raise ValueError("gradient contributions are handed out in order (in_order=True)")
        self.rank, self.world_size = comm.rank, comm.world_size
        self.schedule, self.contribution, self.in_order = schedule, contribution, in_order
        self.timeout_s, self.activator = timeout_s, activator
        self._neighbours = world_hypercube_neighbours(self.rank, self.world_size)
        # activations are sent for group rounds only: none when every round is synchronous
        self._activates = bool(self._neighbours) and schedule.period != 1
        # Both forks are collective. The progress thread owns its data-plane groups, the listener its
        # control channel (gloo aborts when two threads share a process group).
        self._data = comm.fork()
        self._data.new_groups(schedule.all_groups())
        self._control = comm.fork_control(timeout_s=LISTENER_TIMEOUT_S)
        model = contribution == "model"
        self._send = like.detach().clone() if model else torch.zeros_like(like)
        self._work = torch.empty_like(self._send)  # the snapshot a round reduces in place
        self._added = torch.zeros_like(self._send) if model else None  # model: posts while a round runs
        self._added_dirty = False
        self._free: list[torch.Tensor] = []        # recycled result buffers (a fresh one costs page faults)
        self._lent: torch.Tensor | None = None     # the result the caller holds until its next request()
        # model: what the caller's model was last set from; post() adds the caller's change relative to it
        self._base: torch.Tensor | None = self._send.clone() if model else None
        self._kept: deque[tuple[int, torch.Tensor, int]] = deque()  # gradient: (round, mean, age), in order
        self._cv = threading.Condition()
        self._streams = _Streams(self._send.device)
        self._started = self._done = self._ready = self._answered = start_round
        self._activated = start_round               # highest round an activation message announced
        self._in_flight = False
        self._post_round = start_round + 1          # first round that includes the latest post
        self._send_q = start_round    # model: the answered round at the newest post in the send buffer
        self._added_q = start_round   # model: the same for posts made while a round ran
        self._oldest_q: int | None = None           # gradient: answered round at the oldest unreduced post
        self._staleness = 0
        self._error: BaseException | None = None
        self._closing = False
        self._threads = [threading.Thread(target=self._guard(loop), daemon=True, name=f"wagma-{what}-{self.rank}")
                         for what, loop in (("progress", self._progress_loop), ("listener", self._listen_loop))]
        for t in self._threads:
            t.start()

    # --- compute-thread API -----------------------------------------------------------------------
    def post(self, tensor: torch.Tensor) -> None:
        """model: ``tensor`` is the rank's model after its local update (the change since the model last
        handed out is added to the send buffer); gradient: ``tensor`` is a fresh gradient to reduce once."""
        with self._cv:
            self._streams.compute_waits_for_rounds()
            if self.contribution == "gradient":
                self._send.add_(tensor)
                if self._oldest_q is None:
                    self._oldest_q = self._answered
            else:
                if self._base is None:
                    raise RuntimeError("post() the model once after each request() (its change is counted once)")
                target = self._added if self._in_flight else self._send
                target.add_(tensor).sub_(self._base)
                self._base = None
                if self._in_flight:
                    self._added_dirty, self._added_q = True, self._answered
                else:
                    self._send_q = self._answered
            self._post_round = self._started + 1
            self._streams.posted()

    def request(self) -> RoundResult:
        """Wait for this rank's next round (see ``in_order``) and hand over its result."""
        t0 = time.perf_counter()
        with self._cv:
            self._raise_if_failed()
            if self._lent is not None:  # the caller is done with the previous result
                self._free.append(self._lent)
                self._lent = None
            target = self._target()
            self._ready = max(self._ready, target)
            self._cv.notify_all()
            self._wait_for(target)
            out = self._hand_over(target)
        out.wait_s = time.perf_counter() - t0
        return out

    def _target(self) -> int:
        if self.in_order:
            return self._answered + 1
        # skip: the round in flight if it includes the latest post, else the next one (activate it); the
        # rounds the progress thread completed while this rank computed are already in its model
        running = self._started > self._done and self._post_round <= self._started
        return self._started if running else self._started + 1

    def _wait_for(self, target: int) -> None:
        deadline = time.monotonic() + 2 * self.timeout_s
        while self._done < target:
            self._raise_if_failed()
            if not self._cv.wait(timeout=1.0) and time.monotonic() > deadline:
                raise CommError(f"rank {self.rank}: round {target} did not complete within "
                                f"{2 * self.timeout_s:.0f} s")
        self._raise_if_failed()

    def _hand_over(self, target: int) -> RoundResult:
        self._streams.compute_waits_for_rounds()
        if self.contribution == "gradient":
            r, result, age = self._kept.popleft()
            assert r == target, (r, target)
        else:
            result = self._free.pop() if self._free else torch.empty_like(self._send)
            result.copy_(self._send)
            if self._added_dirty:  # posts made while the round now in flight runs
                result.add_(self._added)
            age, self._staleness = self._staleness, 0
        self._answered = target
        self._lent = result
        if self.contribution == "model":
            self._base = result
        return RoundResult(target, result, age, 0.0)

    def close(self) -> None:
        """Stop both threads. Every rank calls this after the same completed synchronous round."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
            failed = self._error is not None
            last = self._answered
        self._threads[0].join(timeout=self.timeout_s)
        if not failed and self._activates:
            # Every listener waits for the first group round after `last`: send each neighbour its STOP there.
            r = last + 1
            while self.schedule.is_sync(r):
                r += 1
            stop = torch.tensor([STOP], dtype=torch.int64)
            for nb in self._neighbours:
                self._control.send(stop, nb, _tag(r))
            self._threads[1].join(timeout=self.timeout_s)

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

    def _may_start(self, r: int) -> bool:
        """Called with the lock held: round ``r`` can start on this rank now."""
        asked = self._ready >= r
        if self.schedule.is_sync(r):
            return asked
        if self.activator is not None and asked:
            asked = self.activator(r) == self.rank
        return asked or self._activated >= r

    def _progress_loop(self) -> None:
        with self._streams.progress():
            self._progress_rounds()

    def _progress_rounds(self) -> None:
        r = self._started + 1
        while True:
            with self._cv:
                while not (self._may_start(r) or self._closing):
                    self._cv.wait()
                if not self._may_start(r):
                    return  # closing, and nobody asked for round r
                age = self._start_round(r)
            if not self.schedule.is_sync(r):  # (then self._activates)
                signal = torch.tensor([r], dtype=torch.int64)
                for nb in self._neighbours:
                    self._control.send(signal, nb, _tag(r))
            group = self.schedule.group(self.rank, r)
            if len(group) > 1:
                self._data.allreduce(self._work, op="mean", group=None if len(group) == self.world_size else group)
            with self._cv:
                self._finish_round(r, age)
                self._cv.notify_all()
            r += 1

    def _start_round(self, r: int) -> int:
        """Take the snapshot round ``r`` reduces (lock held); returns the age of this rank's contribution."""
        self._started, self._in_flight = r, True
        self._streams.progress_waits_for_posts()
        if self.contribution == "model":
            self._work.copy_(self._send)
            return r - 1 - self._send_q
        # gradient: the unreduced gradients go into the round; the send buffer starts empty again
        self._work, self._send = self._send, self._work
        self._send.zero_()
        age = 0 if self._oldest_q is None else r - 1 - self._oldest_q
        self._oldest_q = None
        return age

    def _finish_round(self, r: int, age: int) -> None:
        """Put round ``r``'s result where the compute thread finds it (lock held)."""
        self._streams.progress_waits_for_posts()  # posts made while the round ran are folded in below
        if self.contribution == "model":
            # mean + whatever was posted while the round ran: the snapshot is replaced, nothing else
            self._work, self._send = self._send, self._work
            if self._added_dirty:
                self._send.add_(self._added)
                self._added.zero_()
                self._added_dirty = False
                self._send_q = max(self._send_q, self._added_q)
            self._staleness = max(self._staleness, age)
        else:
            self._kept.append((r, self._work, age))
            self._work = self._free.pop() if self._free else torch.empty_like(self._send)
        self._done, self._in_flight = r, False
        self._streams.round_done()

    def _listen_loop(self) -> None:
        buf = torch.zeros(1, dtype=torch.int64)
        r = self._done + 1
        if not self._activates:
            return  # nobody sends activations (a world of one, or synchronous rounds only)
        while True:
            if not self.schedule.is_sync(r):
                for i in range(len(self._neighbours)):
                    self._control.recv_any(buf, _tag(r))
                    if int(buf[0]) == STOP:
                        if i == len(self._neighbours) - 1:
                            return
                        continue
                    if i == 0:
                        with self._cv:
                            self._activated = max(self._activated, r)
                            self._cv.notify_all()
            r += 1


class _Streams:
    """CUDA ordering between the compute thread and the progress thread (no-ops on the CPU).

    The progress thread issues its copies and its NCCL collective on a stream of its own, so that a round
    overlaps the computation. Every hand-over goes through an event: the progress stream waits for the
    compute stream's last post before it takes a snapshot, and the compute stream waits for the last
    round's completion before it reads a result or adds to the send buffer. Events are recorded and
    waited for under the engine's lock, so their order is the order of the protocol."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.stream = torch.cuda.Stream(device=device)
            self._posted, self._round = torch.cuda.Event(), torch.cuda.Event()

    def progress(self):
        return torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()

    def posted(self) -> None:
        if self.cuda:
            self._posted.record(torch.cuda.current_stream())

    def round_done(self) -> None:
        if self.cuda:
            self._round.record(self.stream)

    def progress_waits_for_posts(self) -> None:
        if self.cuda:
            self.stream.wait_event(self._posted)

    def compute_waits_for_rounds(self) -> None:
        if self.cuda:
            torch.cuda.current_stream().wait_event(self._round)
