"""The machine's speed, measured: a fixed CPU workload timed before and after each tuning trial.

This machine's speed drifts (another job, the host's load, its clock): the same trial can take a third longer
an hour later. A tuning runs its optimizers' trials interleaved (:func:`wagma_bench.campaign.tune.run_order`),
so drift spreads over every optimizer; the reference says how much there was. ``tune`` times
:func:`reference_s` just before a trial starts and just after it ends, and adds ``reference_s`` (the mean of
the two) and ``reference_before_after_s`` to the trial's ``summary.json``; ``report``, ``tune`` and ``claims``
then show each figure raw and scaled by its trial's reference over the tuning's median reference
(:mod:`wagma_bench.analysis.drift`).

The workload is the same code at the same size everywhere (a convolution's forward and backward pass and a
matrix product, in torch, on one thread, from fixed inputs): what the trials spend their time on. It is timed
on the wall clock, so that a process competing for the cores slows it as it slows a trial. Each reading is the
median of :data:`REPEATS` repeats of about 0.1 s on this 2-core machine; a change to the workload changes
:data:`VERSION` (each trial records it as ``reference_version``), so readings of two versions can be told
apart.
"""

from __future__ import annotations

import statistics
import time

VERSION = 1
REPEATS = 5
ITERATIONS = 40  # per repeat: about 0.1 s here


def reference_s() -> float:
    """One reading: the median wall time (seconds) of :data:`REPEATS` repeats of the fixed workload."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # as each rank runs (OMP_NUM_THREADS=1): the reading does not depend on the cores
    try:
        gen = torch.Generator().manual_seed(0)
        images = torch.randn(8, 16, 32, 32, generator=gen)
        kernel = torch.randn(16, 16, 3, 3, generator=gen, requires_grad=True)
        a, b = torch.randn(256, 256, generator=gen), torch.randn(256, 256, generator=gen)
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            for _ in range(ITERATIONS):
                out = torch.nn.functional.conv2d(images, kernel, padding=1)
                out.square().mean().backward()
                kernel.grad = None
                a = torch.tanh(a @ b)
            times.append(time.perf_counter() - start)
        return float(statistics.median(times))
    finally:
        torch.set_num_threads(threads)
