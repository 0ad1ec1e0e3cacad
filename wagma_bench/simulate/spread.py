"""Compute-time spread with persistence: a rank that is slow stays slow.

The i.i.d. draws (``compute=lognormal``, ``compute=empirical``) give each rank and step an independent time,
so over many steps every rank averages out and a slow rank exists only for a step. On real machines some ranks
are slower for the whole run (a slower GPU or node, a noisy neighbour, a larger share of long sentences), and
a barrier pays the slowest rank's *offset* every time. The model here (``compute=persistent``) draws

    log t[r, k] = log step_s + a[r] + e[r, k],   a[r] ~ N(0, sigma_rank^2),
    e[r, k] = rho e[r, k-1] + sqrt(1 - rho^2) sigma z[r, k]   (stationary AR(1), marginal spread sigma)

and :func:`fit_spread` estimates ``(sigma_rank, sigma, rho)`` from runs' step records (``--compute-from``):
within each run, the ranks' mean log time less the run's mean (the offsets), and each rank's deviations from
its own mean (the noise, its lag-1 autocorrelation). The offsets' spread is corrected for the noise that
survives in a mean of T autocorrelated steps, ``sigma^2 / T * (1 + rho) / (1 - rho)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class SpreadFit:
    sigma_rank: float  # spread of the ranks' persistent offsets (log scale)
    sigma: float  # spread of the per-step noise around a rank's offset (log scale)
    rho: float  # lag-1 autocorrelation of that noise
    runs: int
    ranks: int  # (run, rank) sequences used
    steps: int  # steps used, all sequences together

    def row(self) -> dict:
        return asdict(self)


def draw_persistent(
    rng: np.random.Generator,
    world_size: int,
    steps: int,
    step_s: float,
    sigma_rank: float,
    sigma: float,
    rho: float,
) -> np.ndarray:
    """Compute times ``[rank, step]`` of the model above (vectorised over ranks)."""
    offsets = sigma_rank * rng.standard_normal(world_size)
    shocks = rng.standard_normal((world_size, steps))
    noise = np.empty((world_size, steps))
    noise[:, 0] = sigma * shocks[:, 0]
    scale = sigma * math.sqrt(max(0.0, 1.0 - rho * rho))
    for k in range(1, steps):  # steps are few (hundreds); ranks are many: the loop is over steps
        noise[:, k] = rho * noise[:, k - 1] + scale * shocks[:, k]
    return step_s * np.exp(offsets[:, None] + noise)


def fit_spread(runs: Iterable[Sequence[Sequence[float]]]) -> SpreadFit:
    """``(sigma_rank, sigma, rho)`` from runs, each given as its ranks' compute times in step order."""
    offsets, resid_sq, lag_products, lag_squares, lengths, noise_n = [], 0.0, 0.0, 0.0, [], 0
    n_runs = 0
    for ranks in runs:
        logs = [np.log(np.asarray(seq, dtype=float)) for seq in ranks if len(seq) >= 3 and min(seq) > 0]
        if len(logs) < 2:  # one rank says nothing about the ranks' spread
            continue
        n_runs += 1
        means = np.array([x.mean() for x in logs])
        offsets += list(means - means.mean())
        for x, m in zip(logs, means):
            d = x - m
            resid_sq += float((d * d).sum())
            noise_n += len(d) - 1  # one degree of freedom spent on the rank's mean
            lag_products += float((d[1:] * d[:-1]).sum())
            lag_squares += float((d * d).sum())
            lengths.append(len(d))
    if not n_runs:
        raise ValueError("no run with at least two ranks of three or more positive compute times")
    sigma = math.sqrt(resid_sq / max(1, noise_n))
    rho = min(0.99, max(-0.99, lag_products / lag_squares)) if lag_squares > 0 else 0.0
    t = float(np.mean(lengths))
    noise_in_means = sigma * sigma / t * (1 + rho) / (1 - rho)
    # E[sum over a run's R ranks of (mean_r - run mean)^2] = (R - 1) (sigma_rank^2 + noise_in_means)
    between = float(np.sum(np.square(offsets))) / max(1, len(offsets) - n_runs)
    sigma_rank = math.sqrt(max(0.0, between - noise_in_means))
    return SpreadFit(sigma_rank, sigma, rho, n_runs, len(offsets), int(sum(lengths)))
