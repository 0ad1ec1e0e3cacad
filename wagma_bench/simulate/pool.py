"""The simulations of ``simulate --interval``: each run once, in ``jobs`` processes.

Every prediction of an interval (its replicates, sensitivity points, structures and flip search) simulates
every optimizer at every world size, and many of those simulations repeat another's: a sensitivity point at
the base value is the base prediction, and AD-PSGD's exchange cost and per-step averaging (the
``gossip_cost`` points and their flip search, and the structures of c and of the averaging) leave every other
optimizer's simulation as it was. A simulation is a pure function of its configuration (its seed is in it),
so each is memoised by exactly the inputs it reads (:func:`sim_key`) and run once, in one of ``jobs`` worker
processes (forked from this one: the command has no thread of its own when the first is made), in the order of
:mod:`~wagma_bench.simulate.feed` (what something waits for first, the longest expected first); a prediction
gathers its simulations in its own order, so what it returns does not depend on the number of processes, on
the order they were handed out or on which finished first (``tests/test_interval_pool.py`` compares 1 and 2
processes and the unmemoised predictions to the bit).

A worker's error reaches the command as it would have in one process (a ValueError a refusal, a defect its
traceback); a worker that dies, or no simulation finishing for :data:`STALL_S`, ends the command with one line
naming the stage; either way no worker is left running."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Self

import numpy as np

from wagma_bench.config.schema import RunConfig
from wagma_bench.errors import OperationFailed
from wagma_bench.simulate.configure import sim_config
from wagma_bench.simulate.des import simulate
from wagma_bench.simulate.feed import LATER, URGENT, Feed, expected_cost
from wagma_bench.simulate.gossip_inputs import mixed_samples_to_target
from wagma_bench.simulate.progress import Ticker
from wagma_bench.simulate.resume import SAVE_EVERY_S, key_digest, load, save
from wagma_bench.simulate.threads import set_threads

# the workload's keys that only AD-PSGD's model reads (des.sim_adpsgd): left out of every other optimizer's
# key, so that moving them leaves those simulations memoised (tests/test_interval_pool.py checks that every
# other optimizer's result is the same to the bit when they move)
ADPSGD_ONLY = ("gossip_cost", "adpsgd_averaging", "averaging_s_per_param")
# no simulation finished for this long while some were pending: a worker is taken to hang and the command
# ends (AD-PSGD at 65,536 ranks, the longest simulation, took 400 s on a loaded 2-core machine). A module
# constant so that a test can shorten it.
STALL_S = 3600.0
_POLL_S = 0.5  # how often a wait looks at the clock and at the workers

Prediction = dict[int, dict[str, dict[str, float | None]]]  # {P: {optimizer: {metric: value}}}


def frozen(x: Any, skip: tuple[str, ...] = ()) -> Any:
    """``x`` as a hashable value that is equal only for inputs a simulation cannot tell apart: floats by
    their bits and type (0.0 and -0.0 differ), arrays by dtype, shape and bytes, dataclasses field by field
    (``skip``'s fields and caches, named ``_...``, left out), other objects by their attributes. A type it
    does not know is refused, never guessed."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        fields = [f.name for f in dataclasses.fields(x) if f.name not in skip and not f.name.startswith("_")]
        return (type(x).__qualname__, tuple((name, frozen(getattr(x, name))) for name in fields))
    if isinstance(x, float):
        return (type(x).__name__, float(x).hex())
    if x is None or isinstance(x, (bool, int, str)):
        return (type(x).__name__, x)
    if isinstance(x, (np.ndarray, np.generic)):
        return ("numpy", x.dtype.str, np.shape(x), _digest(np.ascontiguousarray(x).tobytes()))
    if isinstance(x, (tuple, list)):
        if x and all(type(v) is float for v in x):  # measured samples: up to 156,304 floats (ResNet's)
            return (type(x).__name__, "floats", len(x), _digest(np.asarray(x, dtype=np.float64).tobytes()))
        return (type(x).__name__, tuple(frozen(v) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple((frozen(k), frozen(v)) for k, v in x.items()))
    if hasattr(x, "__dict__") and not callable(x):  # an Imbalance: its settings and seed
        return (type(x).__qualname__, frozen(vars(x)))
    raise TypeError(f"simulate --interval: no memo key for a {type(x).__name__}")


def _digest(data: bytes) -> str:
    """Many bytes as a short key (SHA-256): a key holding ResNet's 1.25 MB of samples made every memo lookup
    and the resume file's digests cost milliseconds (41 CPU s of an interval that simulates in 19)."""
    return hashlib.sha256(data).hexdigest()


def sim_key(name: str, world: int, inputs: Any, workload: Any | None = None) -> tuple:
    """What optimizer ``name``'s simulation at ``world`` ranks reads of a prediction's ``inputs`` (a
    :class:`~wagma_bench.simulate.uncertainty.Inputs`; its samples to target are applied afterwards, not
    simulated), as a key (``workload``: ``frozen(inputs.workload)``, made once per prediction)."""
    wl = frozen(inputs.workload) if workload is None else workload
    if name != "adpsgd":
        wl = (wl[0], tuple(item for item in wl[1] if item[0] not in ADPSGD_ONLY))
    return (
        name,
        world,
        wl,
        frozen(inputs.network.as_costed()),  # (hierarchical is the ring with one rank a node)
        frozen(inputs.imbalance),
        frozen(inputs.control_every),
        frozen(inputs.seed),
    )


def _simulate_row(run: RunConfig, world: int, inputs: Any, steps: int, ticker: Ticker) -> dict:
    """One simulation's result row (:meth:`~wagma_bench.simulate.des.SimResult.row`)."""
    res = simulate(
        sim_config(
            run,
            world,
            inputs.workload,
            inputs.network,
            inputs.imbalance,
            steps,
            inputs.control_every,
            inputs.seed,
            ticker.simulation(f"{run.optimizer.name} at P={world}"),
        )
    )
    return res.row()


_WORKER: dict[str, Any] = {}  # a worker process's runs, rounds and progress lines (set once, at its start)


def _start_worker(runs: dict[str, RunConfig], steps: int, start: float, parent: int) -> None:
    """A worker's start: it ends with the command, whatever ends that (SIGKILL included), and leaves Ctrl-C
    to the command, which stops it (one line, not a traceback per process); its simulations in one thread
    each (the workers already fill the CPUs: simulate/threads.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _end_with_parent(parent)
    set_threads(1)
    _WORKER.update(runs=runs, steps=steps, ticker=Ticker(0, "simulate --interval", start))


def _end_with_parent(parent: int) -> None:
    """Linux: SIGTERM to this process when its parent dies (prctl's PR_SET_PDEATHSIG), so that a worker never
    outlives a command killed before it could stop its workers; elsewhere a worker ends when its queue
    closes."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl: nobody will send it, so send it ourselves
        os.kill(os.getpid(), signal.SIGTERM)


def _shipped(inputs: Any, samples: np.ndarray | None) -> Any:
    """``inputs`` as a worker gets them: the workload's measured samples (``samples``, when they are all
    Python floats) as one array, whose bytes pickle at once (a tuple of ResNet's 156,304 floats took 11 ms a
    simulation to pickle and unpickle); :func:`_unshipped` makes them the same tuple again."""
    if samples is None:
        return inputs
    return dataclasses.replace(inputs, workload=dataclasses.replace(inputs.workload, samples=samples))


def _unshipped(inputs: Any) -> Any:
    samples = inputs.workload.samples
    if not isinstance(samples, np.ndarray):
        return inputs
    workload = dataclasses.replace(inputs.workload, samples=tuple(samples.tolist()))  # the same floats
    return dataclasses.replace(inputs, workload=workload)


def _simulate_in_worker(name: str, world: int, inputs: Any) -> dict:
    inputs = _unshipped(inputs)
    _WORKER["ticker"].hush()
    return _simulate_row(_WORKER["runs"][name], world, inputs, _WORKER["steps"], _WORKER["ticker"])


class SimulationPool:
    """Every simulation the predictions of an interval ask for, run once (memoised by :func:`sim_key`), in
    ``jobs`` worker processes (1: in this process). A context manager: leaving it stops the workers, at once
    when it is left by an error. ``stage``: what the command is doing, named when a worker fails.
    ``resume``: the file (:mod:`wagma_bench.simulate.resume`) that keeps the simulations done, every
    ``SAVE_EVERY_S`` and on an error, under ``command``'s fingerprint; those it already holds are not run
    again."""

    def __init__(
        self,
        runs: dict[str, RunConfig],
        gpus: list[int],
        steps: int,
        jobs: int,
        ticker: Ticker,
        resume: Path | None = None,
        command: str = "",
    ):
        self.runs, self.gpus, self.steps, self.jobs, self.ticker = runs, gpus, steps, jobs, ticker
        self.stage = "the first prediction"
        self._memo: dict[tuple, Future] = {}
        self.asked = 0  # simulations asked for (the memo holds those run)
        self._resume, self._command = resume, command
        self._before = load(resume, command) if resume is not None else {}  # digest -> row, done before
        self.resumed = 0  # simulations taken from the file
        self._digests: dict[tuple, str] = {}
        self._workloads: dict[int, tuple] = {}  # id -> (workload, frozen(workload))
        self._last_save = time.monotonic()
        self._failure: BaseException | None = None  # the first, which every other wait raises at once
        self._lock = threading.Lock()  # the flip search asks from several threads
        self._last_done = time.monotonic()
        self._executor, self._processes, self._queue = None, [], None
        if jobs > 1:
            self._executor = ProcessPoolExecutor(
                jobs,
                mp_context=multiprocessing.get_context("fork"),
                initializer=_start_worker,
                initargs=(runs, steps, ticker.start, os.getpid()),
            )
            # the workers forked now, from this thread: the first simulation may be asked for by a thread of
            # the flip search (a rerun that read every earlier one back), and forking beside threads can
            # deadlock the child on a lock one of them held
            self._executor.submit(os.getpid)
            # its processes, to stop them on an error (3.11 has no terminate_workers(); a broken pool's own
            # thread forgets them before they have ended)
            self._processes = list(self._executor._processes.values())
            self._queue = Feed(self._executor, jobs, _simulate_in_worker, self._done)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind, err, tb) -> None:
        self.close(failed=kind is not None)

    def close(self, failed: bool = False) -> None:
        """Stop the workers: after the last result, or at once (``failed``: what is done kept first, pending
        simulations dropped)."""
        if failed:
            self._save(force=True)
        if self._executor is None:
            return
        executor, self._executor = self._executor, None
        self._queue.close()  # (every simulation it still holds cancelled)
        if not failed:
            executor.shutdown(wait=True)
            return
        processes = self._processes
        executor.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            proc.terminate()
        for proc in processes:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()

    @property
    def simulated(self) -> int:
        """Simulations run (or read back): the memo's size."""
        return len(self._memo)

    # --- predictions ----------------------------------------------------------------------------------------

    def predict(self, inputs: Any) -> Prediction:
        """Every optimizer at every world size with ``inputs``: ``{P: {optimizer: {metric: value}}}``; its
        simulations go to the workers before every one queued by :meth:`predict_many` ``(later=True)``."""
        return self._gather(inputs, self._submit(inputs, URGENT))

    def predict_many(self, many: Iterable[Any], later: bool = False) -> Iterator[Prediction]:
        """:meth:`predict` of each of ``many``, in order. Every simulation is queued now, so that the
        processes stay busy across predictions; the predictions are gathered as the iterator is read (one
        not read stays memoised: a later :meth:`predict` of the same inputs waits for it). ``later``: the
        bulk (the replicates), simulated once nothing else waits, so that a search that waits for its
        points (the flip search) goes on beside it."""
        with self._batch():  # queued whole, then handed out in the queue's order
            pending = [(inputs, self._submit(inputs, LATER if later else URGENT)) for inputs in many]
        return (self._gather(inputs, futures) for inputs, futures in pending)

    def _batch(self) -> contextlib.AbstractContextManager:
        return self._queue.held() if self._queue is not None else contextlib.nullcontext()

    def _submit(self, inputs: Any, rank: int) -> list[tuple[int, str, Future]]:
        workload = self._frozen_workload(inputs.workload)
        out = []
        with self._batch():
            for p in self.gpus:
                for name in self.runs:
                    key = sim_key(name, p, inputs, workload)
                    out.append((p, name, self._simulation(name, p, inputs, key, rank)))
        return out

    def _frozen_workload(self, workload: Any) -> tuple:
        """``frozen(workload)``, once per workload object (most predictions share their base's: its samples
        are read once, not once a prediction)."""
        return self._known(workload)[1]

    def _known(self, workload: Any) -> tuple:
        """(workload, its frozen key part, its samples as an array or None), made once per object."""
        with self._lock:
            known = self._workloads.get(id(workload))
        if known is None or known[0] is not workload:
            key = frozen(workload)
            floats = len(workload.samples) > 0 and all(type(v) is float for v in workload.samples)
            array = np.asarray(workload.samples, dtype=np.float64) if floats else None
            known = (workload, key, array)  # the object kept: its id is not reused while it is here
            with self._lock:
                self._workloads[id(workload)] = known
        return known

    def _simulation(self, name: str, world: int, inputs: Any, key: tuple, rank: int = URGENT) -> Future:
        with self._lock:
            self.asked += 1
            future = self._memo.get(key)
            if future is not None:
                if self._queue is not None:  # (one still queued for later goes now, if this one is urgent)
                    self._queue.hurry(future, rank)
                return future
            if self._resume is not None:
                self._digests[key] = key_digest(key)
            row = self._before.get(self._digests.get(key, ""))
            if row is not None:  # done by an earlier run of the command
                future = Future()
                future.set_result(row)
                self.resumed += 1
            elif self._executor is None:  # one process: simulated here and now, an error raised as it is
                future = Future()
                future.set_result(_simulate_row(self.runs[name], world, inputs, self.steps, self.ticker))
            else:  # queued: the workers take the most urgent, longest expected first (feed.py)
                shipped = _shipped(inputs, self._workloads[id(inputs.workload)][2])
                future = self._queue.put(rank, expected_cost(name, world, inputs), name, world, shipped)
            self._memo[key] = future
            return future

    def _done(self) -> None:
        self._last_done = time.monotonic()

    def _gather(self, inputs: Any, futures: list[tuple[int, str, Future]]) -> Prediction:
        out: Prediction = {}
        for p, name, future in futures:
            row = self._result(future)
            stt, _ = mixed_samples_to_target(row, inputs.samples_to_target.get(name))
            out.setdefault(p, {})[name] = {
                "throughput": row["throughput"],
                "time_to_target_s": stt / row["throughput"] if stt else None,
            }
        return out

    def _result(self, future: Future) -> dict:
        """The simulation's row; a worker that died or no simulation finishing for :data:`STALL_S` ends the
        command (:class:`~wagma_bench.errors.OperationFailed`, one line naming the stage). A failure in one
        thread of the flip search ends every other's wait too, with the same error."""
        try:
            row = self._wait(future)
        except BaseException as err:
            self._failure = self._failure or err
            raise
        self._save()
        return row

    def _wait(self, future: Future) -> dict:
        while True:
            if self._failure is not None:
                raise self._failure
            try:
                return future.result(timeout=_POLL_S)
            except TimeoutError:
                if time.monotonic() - self._last_done > STALL_S:
                    raise OperationFailed(
                        f"simulate --interval: no simulation finished in {STALL_S:g} s during {self.stage} "
                        f"(a worker hangs?); its {self.jobs} worker processes were stopped"
                    ) from None
            except BrokenProcessPool:
                raise OperationFailed(
                    f"simulate --interval: a worker process died during {self.stage} (killed, or out of "
                    f"memory?); the other worker processes were stopped"
                ) from None

    def _save(self, force: bool = False) -> None:
        """Keep the simulations done (the resume file), at most every ``SAVE_EVERY_S`` unless ``force``."""
        if self._resume is None or (not force and time.monotonic() - self._last_save < SAVE_EVERY_S):
            return
        with self._lock:
            done = {
                self._digests[key]: future.result()
                for key, future in self._memo.items()
                if future.done() and not future.cancelled() and future.exception() is None
            }
            try:
                save(self._resume, self._command, done)
            except OSError as err:  # a full disk: the command goes on (or fails as it was failing)
                print(
                    f"simulate --interval: could not keep its simulations in {self._resume}: {err}",
                    file=sys.stderr,
                )
            self._last_save = time.monotonic()
        self._failure: BaseException | None = None  # the first, which every other wait raises at once
