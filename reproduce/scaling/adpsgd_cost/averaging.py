"""The per-parameter cost of AD-PSGD's per-step averaging with the shared buffer, as the authors' code runs it
(each step the compute thread averages every layer with the buffer the exchange thread fills): the simulator's
``averaging_s_per_param`` (wagma_bench/simulate/des.py ``sim_adpsgd``, ``adpsgd_averaging=per_step``).

    .venv/bin/python reproduce/scaling/adpsgd_cost/averaging.py --out FILE [--repeats 7]
    .venv/bin/python reproduce/scaling/adpsgd_cost/averaging.py --show FILE

One compute thread (``torch.set_num_threads(1)``, as a rank's compute thread here) averages a float32 model of
N parameters with a buffer of the same size, layer by layer in ResNet-50's layer sizes scaled to N
(``w.add_(buf).mul_(0.5)``: read both, write the model), for N = 1.6, 6.4 and 25.6 million, the sizes
interleaved in every repeat so that the machine's load moves them alike. The cost per parameter is the slope
of a least-squares line through the median time at each N (what does not grow with N, the per-layer calls, is
its intercept); the spread is the slopes of the fastest and slowest repeats. The load (``/proc/loadavg``) is
written before and after. This measures this machine's CPU; a GPU's figure would come from ``make gpu-check``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

FORMAT = "wagma-bench adpsgd averaging 1"
SIZES = (1_600_000, 6_400_000, 25_600_000)
LAYER_PARAMS = 161  # parameter tensors of torchvision's ResNet-50: the averaging goes one tensor at a time


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def layers(n: int, count: int = LAYER_PARAMS) -> list[int]:
    """N parameters in ``count`` layers whose sizes grow geometrically (a ResNet's are small first)."""
    weights = np.geomspace(1.0, 1000.0, count)
    sizes = np.maximum(1, np.floor(weights / weights.sum() * n)).astype(int)
    sizes[-1] += n - int(sizes.sum())
    return [int(s) for s in sizes]


def time_pass(n: int) -> float:
    import torch

    model = [torch.randn(s) for s in layers(n)]
    buf = [torch.randn(s) for s in layers(n)]
    for w, b in zip(model, buf):  # warm: pages touched, caches as in a step
        w.add_(b).mul_(0.5)
    t0 = time.perf_counter()
    for w, b in zip(model, buf):
        w.add_(b).mul_(0.5)
    return time.perf_counter() - t0


def measure(repeats: int) -> dict:
    import torch

    torch.set_num_threads(1)
    load = [loadavg()]
    times = {n: [] for n in SIZES}
    for _ in range(repeats):
        for n in SIZES:
            times[n].append(time_pass(n))
    load.append(loadavg())
    x = np.array(SIZES, dtype=float)
    med = np.array([np.median(times[n]) for n in SIZES])
    slope, intercept = np.polyfit(x, med, 1)
    fast = np.polyfit(x, [min(times[n]) for n in SIZES], 1)[0]
    slow = np.polyfit(x, [max(times[n]) for n in SIZES], 1)[0]
    return {
        "format": FORMAT,
        "source": f"reproduce/scaling/adpsgd_cost/averaging.py --repeats {repeats}: one thread, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}",
        "measured_on": "cpu",
        "loadavg": {"before": load[0], "after": load[1]},
        "s_per_param": float(slope),
        "s_per_param_range": [float(fast), float(slow)],
        "intercept_s": float(intercept),
        "times_s": {str(n): times[n] for n in SIZES},
    }


def show(data: dict) -> str:
    lo, hi = data["s_per_param_range"]
    per = data["s_per_param"]
    return (
        f"{data['source']}\nload before/after: {data['loadavg']['before']} / {data['loadavg']['after']}\n"
        f"averaging: {per * 1e9:.2f} ns per parameter (fastest to slowest repeat {lo * 1e9:.2f} to "
        f"{hi * 1e9:.2f}); 25.6M parameters: {per * 25.6e6 * 1e3:.0f} ms a step"
    )


def main(argv: list[str] | None = None) -> int:
    from wagma_bench.record.files import write_text_atomic

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--show", type=Path, metavar="FILE")
    ap.add_argument("--repeats", type=int, default=7)
    ns = ap.parse_args(argv)
    if ns.show:
        print(show(json.loads(ns.show.read_text())))
        return 0
    if not ns.out or ns.repeats < 1:
        ap.error("--out FILE is needed, with --repeats >= 1 (or --show FILE)")
    data = measure(ns.repeats)
    write_text_atomic(ns.out, json.dumps(data, indent=1) + "\n")
    print(show(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
