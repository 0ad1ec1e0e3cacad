"""DropCompute (Giladi, Hoffer, Soudry & Levy, NeurIPS 2023, arXiv 2306.10598): Allreduce-SGD that drops
straggling compute instead of waiting for it.

Each rank splits its batch into ``micro_batches`` parts and computes them one after another, accumulating
their gradients; once its step's compute time passes the threshold ``threshold_s`` it stops and joins the
allreduce with what it has. Every rank then applies the same averaged gradient to the same weights, so the
models stay identical (Allreduce-SGD's single model; WAGMA-SGD gives up global consistency instead).

Readings, next to what the authors do (their ``deepspeed-bert/run_pretraining.py`` and ``compute_timer.py``):

- *When a rank stops.* The clock starts with the step (the batch's loading included, as the trainer's
  ``compute_s``). Before each micro-batch but the first, a rank that is past the threshold stops; a
  micro-batch once started is finished. The authors check before each forward and again between forward and
  backward; we check once, so a step can overrun the threshold by one micro-batch rather than by one backward
  pass. The first micro-batch is always computed (the authors' smallest threshold candidate lies after half of
  them, so theirs is too in practice).
- *Normalisation* (``normalize``). ``nominal`` (default, the authors'): the gradient is the sum over the
  computed micro-batches of their mean-loss gradients divided by the nominal count, world size x
  ``micro_batches``; a dropped micro-batch counts as zero. ``computed``: every computed sample weighs the
  same, the gradient is the sum of the computed samples' loss gradients over the samples computed in the world
  (one more allreduce of a count, which ``nominal`` makes anyway for the drop rate). Either way every computed
  sample is counted once.
- *Injected stragglers.* The trainer spreads a rank's injected delay evenly over its micro-batches (one M-th
  before each): a slow rank is slow in every micro-batch, and what it drops it does not sleep either.
- *The automatic threshold* (``threshold_s: auto``): for ``calibrate_steps`` steps nothing is dropped and
  every rank records when each of its micro-batches ended; the records are gathered (every rank gets the
  same), and :func:`~wagma_bench.optim.rules.best_threshold` (NumPy, shared with the simulator) picks, as the
  authors' ``get_best_threshold``, the threshold among 200 evenly spaced candidates, from the earliest end of
  a micro-batch past half of them to the latest end of a step, that maximises the effective speed-up
  ``mean_s[(1 - d_s)(C_s + O) / (C_s(tau) + O)] - 1``: ``C_s`` the slowest rank's compute in step s,
  ``C_s(tau)`` the latest end of a micro-batch before tau, ``d_s`` the fraction of micro-batches that end at
  or after tau, ``O`` the steps' mean time beyond their slowest compute (communication and the update). The
  authors skip 5 steps and calibrate on the next 44, once; we calibrate on the first ``calibrate_steps`` (the
  embedded runs are short), once, and never drop when no candidate beats 0.
"""

from __future__ import annotations

import math
import time

import torch

from wagma_bench.optim.base import Algorithm, StepInfo
from wagma_bench.optim.rules import best_threshold
from wagma_bench.optim.specs import DropComputeSpec, parse_threshold


class DropCompute(DropComputeSpec, Algorithm):
    paper = "DropCompute, Giladi et al., NeurIPS 2023"
    models_identical = True  # every rank applies the same averaged gradient
    default_eval_model = "local"

    def __init__(self, settings, model, local_opt_factory, comm, seed=0):
        # Allreduce-SGD's buckets: with one micro-batch and nothing dropped the same reductions, bit for bit
        super().__init__(settings, model, local_opt_factory, comm, seed, bucket_mb=settings.bucket_mb)
        self.threshold_s = parse_threshold(settings.threshold_s)  # None until calibrated
        self.calibration: list[list[float]] = []  # per calibration step: this rank's micro-batch end times
        self.step_walls: list[float] = []
        self._ends: list[float] = []
        self._samples = 0
        self._step_start: float | None = None
        self.dropped = self.computed = 0  # micro-batches over the world, since the start
        self.predicted_gain: float | None = None

    @property
    def micro_batches(self) -> int:
        return self.settings.micro_batches

    def start_micro_batch(self, elapsed_s: float) -> bool:
        return self.threshold_s is None or elapsed_s <= self.threshold_s

    def end_micro_batch(self, elapsed_s: float) -> None:
        if not self._ends:  # the step's start as the trainer's clock has it (the batch's loading included)
            self._step_start = time.perf_counter() - elapsed_s
        self._ends.append(elapsed_s)

    def loss_weight(self, samples: int) -> float:
        self._samples += samples
        return 1.0 / self.micro_batches if self.settings.normalize == "nominal" else float(samples)

    def zero_grad(self) -> None:
        super().zero_grad()
        self._step_start = (
            time.perf_counter()
        )  # until the first micro-batch says better (a gradient set directly)

    def step(self) -> StepInfo:
        t0 = time.perf_counter()
        if (
            not self._ends
        ):  # a gradient set without the trainer's micro-batch calls: all M parts, evenly spread
            elapsed = t0 - (self._step_start or t0)
            self._ends = [elapsed * (k + 1) / self.micro_batches for k in range(self.micro_batches)]
        mine = len(self._ends)
        counts = torch.tensor(
            [float(mine), float(self._samples)], dtype=torch.float64, device=self.comm.device
        )
        self.comm.allreduce(counts, op="sum")
        computed, samples = int(counts[0]), float(counts[1])
        for b in self.buckets:
            if self.settings.normalize == "nominal":
                self.comm.allreduce(b.grad, op="mean")
            else:
                self.comm.allreduce(b.grad, op="sum")
                b.grad.div_(max(samples, 1.0))
        comm_s = time.perf_counter() - t0
        self.local_optimizer.step()
        self.round += 1
        nominal = self.comm.world_size * self.micro_batches
        self.computed += computed
        self.dropped += nominal - computed
        if self.threshold_s is None:
            self._calibrate()
        extra = {"micro_batches": mine, "drop_rate": round(1.0 - computed / nominal, 5)}
        self._ends, self._samples = [], 0
        return StepInfo(round=self.round, comm_s=comm_s, extra=extra)

    def _calibrate(self) -> None:
        """Record this calibration step; after the last one, pick the threshold from every rank's records."""
        self.calibration.append(list(self._ends))
        self.step_walls.append(time.perf_counter() - self._step_start)
        if len(self.calibration) < self.settings.calibrate_steps:
            return
        mine = torch.tensor(self.calibration, dtype=torch.float64, device=self.comm.device)
        ends = self.comm.allgather(mine).cpu().numpy()  # [ranks, steps, micro-batches]
        walls = torch.tensor(
            [sum(self.step_walls) / len(self.step_walls)], dtype=torch.float64, device=self.comm.device
        )
        self.comm.allreduce(walls, op="mean")
        self.threshold_s, self.predicted_gain = best_threshold(ends, float(walls))
        if self.comm.rank == 0:
            chosen = "never drop" if math.isinf(self.threshold_s) else f"{self.threshold_s:.4f} s"
            print(
                f"wagma-bench: dropcompute threshold {chosen} (auto, from {len(self.calibration)} steps of "
                f"{self.comm.world_size} ranks; predicted effective speed-up {self.predicted_gain:+.1%})",
                flush=True,
            )

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "threshold_s": self.threshold_s,
            "calibration": self.calibration,
            "step_walls": self.step_walls,
            "dropped": self.dropped,
            "computed": self.computed,
            "predicted_gain": self.predicted_gain,
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for key in ("threshold_s", "calibration", "step_walls", "dropped", "computed", "predicted_gain"):
            setattr(self, key, state[key])

    def report(self) -> dict:
        total = self.dropped + self.computed
        never = self.threshold_s is not None and math.isinf(self.threshold_s)  # strict JSON has no inf
        return {
            "dropcompute": {
                "threshold_s": None if never else self.threshold_s,
                "never_drops": never,
                "predicted_gain": self.predicted_gain,
                "drop_rate": round(self.dropped / total, 5) if total else None,
                "dropped_micro_batches": self.dropped,
                "micro_batches": total,
            }
        }
