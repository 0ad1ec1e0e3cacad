"""AD-PSGD's measured model inputs, the simulator's defaults (``sim_adpsgd``), each the figure of a committed
measurement here (``tests/test_simulate_adpsgd.py`` reads the files and fails when a number below differs):

- ``MEASURED_GOSSIP_COST``: c, the seconds of compute one second of the gossip thread's exchange takes,
  measured directly (``reproduce/scaling/adpsgd_cost/measure_c.py``: two gloo ranks, a 102 MB model, paced
  exchanges, blocks with the thread on and off interleaved);
- ``MEASURED_AVERAGING_S_PER_PARAM``: the seconds per parameter of the authors' per-step averaging of the
  model with the shared buffer (``reproduce/scaling/adpsgd_cost/averaging.py``, one CPU thread);
- ``MEASURED_MIXING``: AD-PSGD's samples to the target at fewer exchanges per step, relative to one exchange
  per step (``reproduce/scaling/adpsgd_convergence/measure.py``: the suite's AD-PSGD exchanging every k = 1,
  2, 4, 8 steps on the embedded ResNet-20), which time to target reads (:func:`mixing_factor`).

All three were measured on this 2-core CPU machine while other work ran (the files say the load); a GPU's c
and averaging cost would come from ``make gpu-check``.
"""

from __future__ import annotations

import math

import numpy as np

C_FILE = "reproduce/scaling/adpsgd_cost/c-2core-20261207.json"
AVERAGING_FILE = "reproduce/scaling/adpsgd_cost/averaging-2core-20261207.json"
MIXING_FILE = "reproduce/scaling/adpsgd_convergence/mixing-2core-20261207.json"

MEASURED_GOSSIP_COST = 0.364
MEASURED_AVERAGING_S_PER_PARAM = 2.95e-9
# (exchanges per local step, samples to target relative to one exchange per step)
MEASURED_MIXING: tuple[tuple[float, float], ...] = ((1.0, 1.0), (0.5, 0.76), (0.25, 0.972), (0.125, 1.06))


def mixing_factor(exchanges_per_step: float, table=MEASURED_MIXING) -> float:
    """How many times the samples to target measured with one exchange per step AD-PSGD needs at this rate of
    exchanges: piecewise linear in log2 of the rate between the measured points; 1 at one exchange per step
    or more (more mixing than measured is not credited); below the smallest measured rate, the last segment's
    line carried on. The measured factors are held non-decreasing as the rate falls (a noisier seed does not
    make less mixing converge faster)."""
    rates = np.array([r for r, _ in table], dtype=float)
    factor = np.maximum.accumulate(np.array([f for _, f in table], dtype=float))  # rates fall along the table
    if not exchanges_per_step > 0:
        return math.inf  # never an exchange: the models never mix
    x = math.log2(min(1.0, exchanges_per_step))
    xs = np.log2(rates)
    if x >= xs[-1]:
        return float(np.interp(x, xs[::-1], factor[::-1]))
    slope = (factor[-1] - factor[-2]) / (xs[-1] - xs[-2])
    return float(factor[-1] + slope * (x - xs[-1]))


def mixed_samples_to_target(row: dict, samples_to_target: float | None) -> tuple[float | None, float]:
    """(AD-PSGD's samples to target at its simulated exchanges per step, the factor applied); other
    optimizers' unchanged (factor 1)."""
    rate = row.get("exchanges_per_step")
    if samples_to_target is None or row.get("optimizer") != "adpsgd" or rate is None or row["world_size"] < 2:
        return samples_to_target, 1.0
    factor = mixing_factor(float(rate))
    return samples_to_target * factor, factor
