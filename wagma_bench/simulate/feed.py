"""The order in which ``simulate --interval``'s simulations go to its worker processes
(:class:`~wagma_bench.simulate.pool.SimulationPool`): only the order, never a result.

Two things decide the wall time of an interval on a few processes besides its CPU time. The flip search
(:func:`~wagma_bench.simulate.uncertainty.find_flips`) is a chain of predictions, each waiting for the one
before (Brent's method), and its points on a slow network are AD-PSGD's longest simulations (tens of fixed
point rounds): run after every other simulation, the chain left one process idle for the last fifth of the
RL claim's interval. And a batch handed out in the order it was asked for ends with whatever long simulation
came last. So the simulations wait in one queue and a process that frees takes the next by

- its rank: :data:`URGENT` (a prediction something waits for: the sensitivity points, the flip search's)
  before :data:`LATER` (the replicates and structures, the bulk that fills the time the searches wait);
- then the longest expected first (:func:`expected_cost`: the longest-processing-time-first rule, so that
  the processes end together);
- then the order asked.

At most one simulation more than there are processes is handed out at a time (as the executor itself
queues): a process that frees takes the next at once, and an urgent one waits for one queued simulation at
most."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

URGENT, LATER = 0, 1

# CPU seconds of one simulation at 1,024 ranks and 500 rounds, the RL claim's interval (2026-12-07, the
# mean of each optimizer's simulations in `simulate --interval 50`, one process under load): only their
# order matters
COST_AT_1024 = {
    "adpsgd": 0.6,
    "wagma": 0.11,
    "eager": 0.11,
    "dpsgd": 0.035,
    "allreduce": 0.028,
    "sgp": 0.022,
    "local_sgd": 0.01,
}


def expected_cost(name: str, world: int, inputs: Any) -> float:
    """A simulation's expected CPU seconds, roughly (proportional to the world). AD-PSGD's fixed point takes
    more rounds the longer an exchange takes against a step (3 rounds at Piz Daint's bandwidth, up to 66 on
    the slower networks of the same interval's bandwidth points), so its cost grows with that ratio."""
    cost = COST_AT_1024.get(name, 0.1) * world / 1024
    if name == "adpsgd":
        net, wl = inputs.network, inputs.workload
        exchange_s = 2 * net.inter.p2p(wl.model_bytes)
        cost *= 1.0 + 10.0 * exchange_s / max(wl.step_s, 1e-9)
    return cost


class Feed:
    """The queue of simulations not yet handed to ``executor`` (``work(name, world, inputs)`` in a worker),
    fed to it by one thread, at most ``jobs + 1`` at a time (see the module). ``on_done`` is called as each
    finishes."""

    def __init__(self, executor: Executor, jobs: int, work: Callable, on_done: Callable[[], None]):
        self._executor, self._jobs, self._work, self._on_done = executor, jobs, work, on_done
        self._heap: list[tuple[int, float, int, int]] = []  # (rank, -cost, order, id of the item's future)
        self._items: dict[int, tuple] = {}  # id(future) -> (name, world, inputs, future, cost), while queued
        self._order = itertools.count()
        self._in_flight, self._held, self._closed = 0, 0, False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="simulate-interval-feed", daemon=True)
        self._thread.start()

    def put(self, rank: int, cost: float, name: str, world: int, inputs: Any) -> Future:
        """Queue one simulation; its future."""
        future: Future = Future()
        with self._cond:
            self._items[id(future)] = (name, world, inputs, future, cost)
            heapq.heappush(self._heap, (rank, -cost, next(self._order), id(future)))
            self._cond.notify()
        return future

    def hurry(self, future: Future, rank: int) -> None:
        """``future``'s simulation, if still queued, at ``rank`` now if that comes sooner."""
        with self._cond:
            item = self._items.get(id(future))
            if item is not None and item[3] is future and rank == URGENT:
                heapq.heappush(self._heap, (rank, -item[4], next(self._order), id(future)))

    def held(self) -> _Held:
        """A context in which nothing is handed out: a batch queued whole, then handed out in its order."""
        return _Held(self)

    def close(self) -> None:
        """Hand nothing more out; what is still queued is cancelled."""
        with self._cond:
            self._closed = True
            for *_, future, _ in self._items.values():
                future.cancel()
            self._items.clear()
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._held or self._in_flight > self._jobs or not self._heap):
                    self._cond.wait()
                if self._closed:
                    return
                item = self._items.pop(heapq.heappop(self._heap)[3], None)
                if item is None:  # (handed out under an earlier entry: hurry)
                    continue
                self._in_flight += 1
            name, world, inputs, future, _ = item
            try:
                done = self._executor.submit(self._work, name, world, inputs)
            except (BrokenProcessPool, RuntimeError) as err:  # a worker died, or shut down: the wait says so
                self._finished(future, None, err)
                continue
            done.add_done_callback(lambda done, future=future: self._finished(future, done))

    def _finished(self, future: Future, done: Future | None, err: BaseException | None = None) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify()
        self._on_done()
        if done is not None and done.cancelled():
            future.cancel()
            return
        err = err if done is None else done.exception()
        if err is not None:
            future.set_exception(err)
        else:
            future.set_result(done.result())


class _Held:
    def __init__(self, feed: Feed):
        self.feed = feed

    def __enter__(self) -> None:
        with self.feed._cond:
            self.feed._held += 1

    def __exit__(self, *_: object) -> None:
        with self.feed._cond:
            self.feed._held -= 1
            self.feed._cond.notify()
