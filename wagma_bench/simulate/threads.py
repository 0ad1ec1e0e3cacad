"""The simulator's work on disjoint blocks of ranks, in a few threads.

At 65,536 ranks most of AD-PSGD's time outside its gossip is numpy over one block of ranks at a time: the
busy time's searches (:mod:`wagma_bench.simulate.busy`), the exchanges turned rank after rank
(:meth:`~wagma_bench.simulate.exchanges.Exchanges.by_rank`), the step lag's searches, the compute schedule
(its ranks in parts, up to each barrier). numpy releases the GIL in those kernels (``searchsorted``,
``take``, the ufuncs, copies), so threads over disjoint blocks use more than one core where the work is one
process. Each block's arithmetic is its own and is written to its own place: the result is the same to the
bit for any number of threads (``tests/test_simulate_scale.py`` compares 1 and 3).

The number of threads: the CPUs this process may use, at most :data:`MAX_THREADS`; 1 in ``simulate
--interval``'s worker processes, which already fill the CPUs (:func:`set_threads`, from
:mod:`wagma_bench.simulate.pool`); and one thread for work below :data:`THREADED_FROM` elements, where a
thread's start and the GIL's hand-overs cost what the second core saves. A thread pool lives only for one
call, so that a process forked later (``simulate --interval``'s workers) inherits no thread.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

MAX_THREADS = 4
# elements ([rank, step] places, or intervals) of one call's work from which its blocks go to threads: 8,192
# ranks x 500 steps is 4 million; 1,024 ranks x 500 steps (half a million) stays in one thread
THREADED_FROM = 1 << 21

_threads: int | None = None  # None: the CPUs this process may use (at most MAX_THREADS)


def set_threads(n: int | None) -> None:
    """Use ``n`` threads from now on in this process (None: as many as it has CPUs, at most
    :data:`MAX_THREADS`)."""
    global _threads
    if n is not None and n < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    _threads = n


def threads() -> int:
    """The threads a call with enough work uses."""
    if _threads is not None:
        return _threads
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cpus))


def split(n: int, size: int) -> list[slice]:
    """``range(n)`` in as many contiguous parts as :func:`in_blocks` would use threads for work of ``size``
    elements (one part below :data:`THREADED_FROM`)."""
    k = min(n, threads() if size >= THREADED_FROM else 1)
    bounds = [n * j // max(1, k) for j in range(max(1, k) + 1)]
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


def in_blocks(
    work: Callable[[T], object], blocks: Iterable[T], size: int, before: Callable[[T], None] | None = None
) -> list:
    """``[work(b) for b in blocks]``, the blocks in threads when ``size`` (the call's elements) is at least
    :data:`THREADED_FROM`; ``before(b)`` is called in this thread, in the blocks' order, before block ``b``'s
    result is taken (a progress line says where the work is, from one thread). ``work`` must write only its
    own block's places; an error of a block is raised here, once the blocks before it are done."""
    blocks = list(blocks)
    n = threads() if size >= THREADED_FROM else 1
    if n <= 1 or len(blocks) <= 1:
        out = []
        for b in blocks:
            if before is not None:
                before(b)
            out.append(work(b))
        return out
    with ThreadPoolExecutor(min(n, len(blocks))) as pool:
        futures = [pool.submit(work, b) for b in blocks]
        out = []
        try:
            for b, future in zip(blocks, futures, strict=True):
                if before is not None:
                    before(b)
                out.append(future.result())
        except BaseException:
            for future in futures:  # the blocks not begun are not run
                future.cancel()
            raise
        return out
