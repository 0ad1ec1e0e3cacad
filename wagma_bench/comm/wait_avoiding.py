"""The wait-avoiding group allreduce of WAGMA-SGD (Li et al., TPDS 2020, Sec. III-B) and eager-SGD.

Rounds are numbered 1, 2, 3, ...; a :class:`~wagma_bench.comm.topology.RoundSchedule` says, for each
round, with whom a rank reduces (a butterfly stage, or the whole world) and whether the round is
*synchronous* (every ``period``-th round: the staleness limiter).

Each rank runs a communication **progress thread** that takes part in every round, in order, with the
rank's contribution (its model as last posted, or its unreduced gradients; see below):

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
reduction of the contributions on the *data plane* (``comm.fork()``, NCCL on GPUs).

What a round reduces (``contribution``):

- ``"model"`` (WAGMA-SGD): the rank's model. The engine keeps it in one tensor ``M`` (with ``in_place``, the
  caller's own model, which the engine then updates in place; else a copy of ``like``) and one work tensor
  ``W``: at most two model-sized buffers beyond the caller's model, one with ``in_place``. The caller's
  turns and the rounds take turns on ``M``: :meth:`request` hands ``M`` over when no round is in flight, and
  no round starts while the caller *holds* it (from the hand-over to its :meth:`post`, i.e. during its local
  update), so no post ever lands in a round in flight. A round then reduces, without a copy, ``M`` itself
  when the caller is waiting in :meth:`request` for this round or a later one, or ``W`` when ``W`` already
  holds the rank's newest model (a passive round after a passive round); only a round that starts while
  the caller may be reading ``M`` (computing) reduces a snapshot copy in ``W``, and the hand-over copies
  the result back into ``M``. A rank's model is the group mean of what it contributed plus its own changes
  since: every group round keeps the sum of the models over the group, and every local update stays in
  the model exactly once, however late the rank is. :meth:`post` with ``M`` itself (``in_place``) costs
  nothing; with another tensor it copies it into ``M``.
- ``"gradient"`` (eager-SGD): gradients not yet reduced. :meth:`post` adds the fresh gradient to the send
  buffer (copies it, when the buffer is empty); a round reduces what was there and empties the buffer, so
  every gradient is reduced in exactly one round (the authors zero the send buffer once a round has used
  it) and a passive round of a rank with nothing new contributes zeros. Results are kept per round and
  handed out in order, so every rank applies the same sequence of results (identical models).

Which round a :meth:`request` waits for (``in_order``): ``True``, the next round in order, possibly one
the progress thread already completed (then it answers at once); ``False`` (WAGMA's ``catch_up=skip``),
the round in flight if it includes the latest post, else the next round, which it activates: the rounds
the progress thread completed passively are skipped (with model contributions their results are already
in the model handed out). With model contributions, a request whose round is complete but that finds a
later round in flight waits for that round (communication only: no round waits for a caller's
computation, only for its local update) and is handed the model after it.

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
# Where a round's time goes (seconds summed over rounds, in ``timings``): the activation messages, the
# snapshot copy, the collective (progress thread) and the copy of a result into the caller's model.
PHASES = ("activation", "snapshot", "collective", "hand_over")
# The progress thread's own CPU time (its thread clock), summed over rounds, in ``progress_cpu``: blocked
# until a round may start (it waits on a condition, so this stays near zero), choosing the buffer with its
# snapshot copy, and posting the activations and the collective (gloo's reduction runs in gloo's threads, not
# here).
PROGRESS_CPU = ("waiting", "start", "communication")


@dataclass
class RoundResult:
    round: int  # the round this rank has reached
    result: torch.Tensor  # model: the rank's model, valid until the next post() or request();
    # gradient: the round's mean, valid until the next request()
    staleness: int  # largest age of this rank's contributions to the rounds handed over
    wait_s: float  # time the caller waited


def _tag(r: int) -> int:
    # MPI only guarantees tags up to 32767; rounds that far apart are never in flight together.
    return 1 + r % 32000


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype


class WaitAvoidingAllreduce:
    """Wait-avoiding allreduce of one flat buffer over the rounds of ``schedule``; see the module docstring.

    ``in_place`` (model contributions): ``like`` is the caller's model; requests update it in place and
    hand it back, and posting it costs nothing."""

    def __init__(
        self,
        comm: Comm,
        like: torch.Tensor,
        schedule: RoundSchedule,
        contribution: str = "model",
        in_order: bool = True,
        timeout_s: float = 300.0,
        start_round: int = 0,
        activator: Callable[[int], int] | None = None,
        in_place: bool = False,
    ):
        if contribution not in CONTRIBUTIONS:
            raise ValueError(f"contribution must be one of {', '.join(CONTRIBUTIONS)}, got {contribution!r}")
        if contribution == "gradient" and (not in_order or in_place):
            raise ValueError(
                "gradient contributions are handed out in order (in_order=True), from the engine's "
                "own buffers (in_place=False)"
            )
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
        self._like = like.detach()
        self._init_buffers(in_place)
        self._cv = threading.Condition()
        self._streams = _Streams(like.device)
        self._started = self._done = self._ready = self._answered = start_round
        self._activated = start_round  # highest round an activation message announced
        # The listener's first round is fixed here, not read when its thread first runs: by then the progress
        # thread may have completed round start_round + 1, and a listener that began after it would never
        # take that round's activations (its neighbours' sends would never complete: a hang).
        self._listen_from = start_round + 1
        self._in_flight = False
        self._asking, self._target_r = False, start_round  # the caller waits in request() for round _target_r
        self._post_round = start_round + 1  # first round that includes the latest post
        self._send_q = start_round  # model: the answered round at the newest post in the model
        self._oldest_q: int | None = None  # gradient: answered round at the oldest unreduced post
        self._staleness = 0
        self.timings = dict.fromkeys(PHASES, 0.0)
        self.progress_cpu = dict.fromkeys(PROGRESS_CPU, 0.0)
        self.rounds = 0  # rounds this rank took part in (the timings' count)
        self.snapshots = 0  # of which started while the caller computed (a copy)
        self._error: BaseException | None = None
        self._closing = False
        self._threads = [
            threading.Thread(target=self._guard(loop), daemon=True, name=f"wagma-{what}-{self.rank}")
            for what, loop in (("progress", self._progress_loop), ("listener", self._listen_loop))
        ]
        for t in self._threads:
            t.start()

    def _init_buffers(self, in_place: bool) -> None:
        self._in_place = in_place
        self._model: torch.Tensor | None = None  # model: M, the rank's model (see the module docstring)
        self._work: torch.Tensor | None = None  # model: W, made at the first snapshot; gradient: in flight
        self._pending = False  # model: W, not M, holds the rank's newest model (M gets it at the hand-over)
        self._holding = True  # model: the caller may change M (until its post); no round starts meanwhile
        self._send: torch.Tensor | None = None  # gradient: the unreduced gradients
        self._send_empty = True  # gradient: the send buffer holds nothing yet
        self._free: list[torch.Tensor] = []  # gradient: recycled result buffers (fresh ones page-fault)
        self._lent: torch.Tensor | None = (
            None  # gradient: the result the caller holds until its next request()
        )
        self._kept: deque[tuple[int, torch.Tensor, int]] = deque()  # gradient: (round, mean, age), in order
        if self.contribution == "model":
            self._model = self._like if in_place else self._like.clone()
        else:
            self._send, self._work = torch.empty_like(self._like), torch.empty_like(self._like)

    def report(self) -> dict:
        """Per round this rank took part in, in ms: where its time went (wall clock, :data:`PHASES`) and the
        progress thread's CPU (:data:`PROGRESS_CPU`); and how many rounds ran on a snapshot (passive
        rounds)."""
        per = 1e3 / max(1, self.rounds)
        return {
            "rounds": self.rounds,
            "snapshots": self.snapshots,
            "wall_ms_per_round": {k: round(v * per, 4) for k, v in self.timings.items()},
            "progress_cpu_ms_per_round": {k: round(v * per, 4) for k, v in self.progress_cpu.items()},
        }

    def extra_buffers(self) -> tuple[int, int]:
        """Model-sized buffers the engine holds beyond the caller's model (``in_place``): count and bytes."""
        held = [self._model, self._work, self._send, self._lent, *self._free, *(t for _, t, _ in self._kept)]
        mine = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held if t is not None}
        if self._in_place:
            mine.pop(self._like.untyped_storage().data_ptr(), None)
        return len(mine), sum(mine.values())

    # --- compute-thread API -----------------------------------------------------------------------
    def post(self, tensor: torch.Tensor) -> None:
        """model: ``tensor`` is the rank's model after its local update (``M`` itself costs nothing);
        gradient: ``tensor`` is a fresh gradient to reduce once."""
        with self._cv:
            self._streams.compute_waits_for_rounds()
            if self.contribution == "gradient":
                if self._send_empty:
                    self._send.copy_(tensor)
                else:
                    self._send.add_(tensor)
                self._send_empty = False
                if self._oldest_q is None:
                    self._oldest_q = self._answered
            else:
                if not self._holding:
                    raise RuntimeError(
                        "post() the model once after each request() (its change is counted once)"
                    )
                if not _same_storage(tensor, self._model):
                    self._model.copy_(tensor)
                self._holding, self._send_q = False, self._answered
                self._cv.notify_all()  # rounds may start again
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
            self._holding, self._asking, self._target_r = False, True, target
            self._streams.posted()  # the caller's queued reads of M come before any round that writes it
            self._cv.notify_all()
            try:
                self._wait_for(target)
                out = self._hand_over(target)
            finally:
                self._asking = False
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
        """Until round ``target`` is done; model: and no round is in flight (none starts once it is done)."""
        deadline = time.monotonic() + 2 * self.timeout_s
        while self._done < target or (self._in_flight and self._model is not None):
            self._raise_if_failed()
            if not self._cv.wait(timeout=1.0) and time.monotonic() > deadline:
                raise CommError(
                    f"rank {self.rank}: round {target} did not complete within {2 * self.timeout_s:.0f} s"
                )
        self._raise_if_failed()

    def _hand_over(self, target: int) -> RoundResult:
        self._streams.compute_waits_for_rounds()
        if self.contribution == "gradient":
            r, result, age = self._kept.popleft()
            assert r == target, (r, target)
            self._lent = result
        else:
            if self._pending:  # the newest rounds ran on W while the caller computed
                t0 = time.perf_counter()
                self._model.copy_(self._work)
                self.timings["hand_over"] += time.perf_counter() - t0
                self._pending = False
                self._streams.posted()  # the next snapshot into W comes after this copy
            result, self._holding = self._model, True
            age, self._staleness = self._staleness, 0
        self._answered = target
        return RoundResult(target, result, age, 0.0)

    def close(self) -> None:
        """Stop both threads. Every rank calls this after the same completed synchronous round."""
        with self._cv:
            self._closing, self._holding = True, False
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
            raise CommError(
                f"rank {self.rank}: wait-avoiding allreduce failed: {self._error}"
            ) from self._error

    def _may_start(self, r: int) -> bool:
        """Called with the lock held: round ``r`` can start on this rank now."""
        if self._model is not None and (self._holding or (self._asking and self._done >= self._target_r)):
            return False  # the caller holds M, or is about to be handed it
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
            group = self.schedule.group(self.rank, r)
            divisor = len(group) if self._divides_first(len(group)) else 1
            c0 = time.thread_time()
            with self._cv:
                while not (self._may_start(r) or self._closing):
                    self._cv.wait()
                if not self._may_start(r):
                    return  # closing, and nobody asked for round r
                c1 = time.thread_time()
                buf, age, divided = self._start_round(r, divisor)
            c2 = time.thread_time()
            t0 = time.perf_counter()
            sent = []  # the activations go out while the collective runs (the group's members need none)
            if not self.schedule.is_sync(r):  # (then self._activates)
                signal = torch.tensor([r], dtype=torch.int64)
                sent = [self._control.isend(signal, nb, _tag(r)) for nb in self._neighbours]
            t1 = time.perf_counter()
            if len(group) > 1:
                if divisor > 1 and not divided:
                    buf.div_(divisor)
                self._data.allreduce(
                    buf,
                    op="sum" if divisor > 1 else "mean",
                    group=None if len(group) == self.world_size else group,
                )
            t2 = time.perf_counter()
            for handle in sent:
                handle.wait()
            with self._cv:
                self.timings["activation"] += t1 - t0 + time.perf_counter() - t2
                self.timings["collective"] += t2 - t1
                c3 = time.thread_time()
                for phase, spent in zip(PROGRESS_CPU, (c1 - c0, c2 - c1, c3 - c2), strict=True):
                    self.progress_cpu[phase] += spent
                self._finish_round(r, age)
                self._cv.notify_all()
            r += 1

    def _divides_first(self, size: int) -> bool:
        """A round over ``size`` ranks divides each model before the sum instead of the sum afterwards.

        Where ``size`` is a power of two and the dtype has float32's exponent range (or more), the sum of
        the divided models is bit for bit the sum divided afterwards (scaling by a power of two commutes with
        rounding; exact for every value above ``size`` times the smallest normal, 1.2e-38 in float32), and a
        snapshot then divides as it copies: a passive round makes one pass over the model instead of two.
        Every member of a group decides alike, so a group never mixes divided and undivided models.
        Gradient contributions and float16 models (smallest normal 6e-5, within real weights) divide after,
        and so does nothing on NCCL, whose average is part of the collective (no pass of its own)."""
        return (
            self.contribution == "model"
            and size > 1
            and size & (size - 1) == 0
            and self._like.dtype in (torch.float32, torch.float64, torch.bfloat16)
            and not self._data.averages_in_collective
        )

    def _start_round(self, r: int, divisor: int) -> tuple[torch.Tensor, int, bool]:
        """Choose (and fill) the buffer round ``r`` reduces, lock held; returns it, this rank's age in it and
        whether it already holds the model divided by ``divisor`` (a snapshot, see _divides_first)."""
        self._started, self._in_flight = r, True
        self.rounds += 1
        self._streams.progress_waits_for_posts()
        if self.contribution == "model":
            age = r - 1 - self._send_q
            if self._pending:  # W holds the model and nobody reads W
                return self._work, age, False
            if self._asking and self._target_r >= r:  # the caller waits for this round: M is the round's
                return self._model, age, False
            t0 = time.perf_counter()  # the caller may be reading M: reduce a snapshot of it
            self.snapshots += 1
            if self._work is None:
                self._work = torch.empty_like(self._model)
            if divisor > 1:
                torch.div(self._model, divisor, out=self._work)
            else:
                self._work.copy_(self._model)
            self.timings["snapshot"] += time.perf_counter() - t0
            self._pending = True
            return self._work, age, divisor > 1
        # gradient: the unreduced gradients go into the round; the send buffer starts empty again
        self._work, self._send = self._send, self._work
        if self._send_empty:  # nothing posted since the last round: contribute zeros
            self._work.zero_()
        self._send_empty = True
        age = 0 if self._oldest_q is None else r - 1 - self._oldest_q
        self._oldest_q = None
        return self._work, age, False

    def _finish_round(self, r: int, age: int) -> None:
        """Put round ``r``'s result where the compute thread finds it (lock held). Model: it is already
        there (in M, or in W until the hand-over): no post lands while a round is in flight."""
        if self.contribution == "model":
            self._staleness = max(self._staleness, age)
        else:
            self._kept.append((r, self._work, age))
            self._work = self._free.pop() if self._free else torch.empty_like(self._send)
        self._done, self._in_flight = r, False
        self._streams.round_done()

    def _listen_loop(self) -> None:
        buf = torch.zeros(1, dtype=torch.int64)
        r = self._listen_from
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
    compute stream's last post, request or hand-over copy before a round reads or reduces the model (or
    W), and the compute stream waits for the last round's completion before it reads a result, copies W
    into the model or adds to the send buffer. Events are recorded and waited for under the engine's
    lock, so their order is the order of the protocol."""

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
