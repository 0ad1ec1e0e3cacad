"""Discrete-event simulation of the training loop of every optimizer in the suite.

Every optimizer runs exactly ``steps`` rounds, its last a synchronisation point (as in a run:
``Algorithm.end_at``). P workers run the trainer's loop (:mod:`wagma_bench.train.trainer`): per local step,
compute (forward + backward, drawn from the workload's distribution), the injected delay of the imbalance
model (the same objects as the real runs, :mod:`wagma_bench.imbalance`, asked with the same
``(rank, world, local step, compute time)``), then the optimizer's communication, then the update; every
``control_every`` rounds (rounded up to the optimizer's sync period, as the trainer does) all ranks meet in
the trainer's small control allreduce. Communication costs come from
:class:`~wagma_bench.simulate.costs.Network`.

Events are processed round by round. Every interaction the optimizers have is ordered by rounds (a
collective of round r needs round r-1 done on each member; a gossip of step t follows step t-1), so
processing rounds in order visits events in causal order, and all ranks of a round are handled at once
with numpy. Only AD-PSGD's gossip thread, whose exchanges are not tied to rounds, runs as an event simulation,
served in batches of the requests no later event can precede.

What each optimizer's model is (from the real modules in :mod:`wagma_bench.optim`; the simulator reads only
their torch-free specs, :mod:`wagma_bench.optim.specs`, and shared rules, :mod:`wagma_bench.optim.rules`):

- ``allreduce``: gradient buckets are launched as backward fills them (the injected delay comes before
  the computation, as in the trainer); bucket b's allreduce starts once every rank has launched it and
  bucket b-1 is done; a rank waits for the last bucket, then steps.
- ``local_sgd``: local steps; after every round that is a multiple of ``sync_period``, and after the last
  round, a blocking global allreduce of the model (all ranks wait for the slowest); warm-up steps are blocking
  gradient allreduces.
- ``dpsgd``: each step a synchronous exchange with both ring neighbours
  (:func:`~wagma_bench.comm.topology.ring_neighbours`): a rank waits for its neighbours to arrive.
- ``sgp``: push-sum to one exponential-graph peer per step
  (:func:`~wagma_bench.comm.topology.exponential_peer`); without overlap a rank waits for its in-peer's and
  out-peer's messages; with ``overlap`` the message pushed at step t is waited for at step t+1.
- ``adpsgd``: as its authors run it. The compute thread never waits for a peer (only at the trainer's sync
  points); the gossip thread of each even (active) rank exchanges with its partner in
  :func:`~wagma_bench.comm.topology.random_matching` after each local step (each ``exchange_every``-th), odd
  (passive) ranks serve requests one at a time, first come first served; each second of exchange takes
  ``gossip_cost`` seconds from the rank's compute (default the c measured here), and each step pays the
  averaging of the model with the shared buffer (``adpsgd_averaging``); see :func:`sim_adpsgd`.
- ``wagma``: the wait-avoiding group allreduce of :mod:`wagma_bench.comm.wait_avoiding` over
  :func:`~wagma_bench.comm.topology.butterfly_stage` groups, with its exact protocol: a group round starts
  on a rank when its progress thread is free and either its compute thread asked for it or an activation
  arrived over the hypercube of the whole world
  (:func:`~wagma_bench.comm.topology.world_hypercube_neighbours`, one control latency per hop); the round
  ends when every member of the rank's group has started, plus the group allreduce's cost. With
  ``catch_up=replay`` (default) a rank asks for its next round in order (a round its progress thread
  completed passively answers at once); with ``catch_up=skip`` it is answered by the round in flight that
  started after its post, else by the next round, which it activates (so it skips the rounds it joined
  passively). Every ``tau + 1``-th round, and the last, is a synchronous global allreduce that waits for every
  rank.
- ``eager``: eager-SGD's partial gradient allreduce (:mod:`wagma_bench.optim.eager`) through the same
  engine with one group of all ranks, in order: a rank posts its gradient and asks for its next round (one
  round per local step; a round completed passively answers at once); ``solo`` -- any rank's request
  activates a round; ``majority`` -- only :func:`~wagma_bench.comm.topology.random_initiator`'s request
  does; every ``sync_period``-th round, and the last, is synchronous.

Outer optimizers (``optimizer.outer``, :mod:`wagma_bench.optim.outer`): the base's communication as above,
plus, every outer period, the outer step's update (``OUTER_PASSES`` model-sized tensors through memory at the
workload's ``memory_GBps``) and, for the bases without a global average of their own (D-PSGD, SGP), the global
model allreduce the outer layer takes first; the ranks leave that round together.

Time that is neither compute, injected delay nor waiting (the optimizer update, data loading, logging) is
the workload's ``overhead_s``, charged after the communication of each step (for the wait-avoiding
engine: between the answer and the post, where the real update happens).
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from wagma_bench.comm.topology import (
    FixedSchedule,
    RoundSchedule,
    WagmaSchedule,
    exponential_peers,
    matching_partners,
    random_initiator,
    ring_neighbours,
)
from wagma_bench.config.schedules import CONTROL_EVERY, control_period
from wagma_bench.config.schema import check_choices
from wagma_bench.imbalance import Imbalance, NoImbalance
from wagma_bench.optim.rules import best_threshold, local_average_at, sync_at
from wagma_bench.optim.specs import (
    OPTIMIZER_SPECS,
    AlgorithmSpec,
    OuterSettings,
    parse_threshold,
)
from wagma_bench.simulate.busy import SEARCH_BLOCK, busy_between, row_major, search_right
from wagma_bench.simulate.costs import Network
from wagma_bench.simulate.exchanges import Exchanges
from wagma_bench.simulate.gossip_inputs import MEASURED_AVERAGING_S_PER_PARAM, MEASURED_GOSSIP_COST
from wagma_bench.simulate.spread import draw_persistent
from wagma_bench.simulate.threads import in_blocks, split

DELAY_BLOCK = 1 << 18  # rank-steps of injected delays drawn at once (delay_matrix)
CONTROL_BYTES = 7 * 8  # the trainer's control tensor: ControlFlags' seven fields as float64 (a test checks)
COMPUTE_MODELS = ("constant", "lognormal", "empirical", "trace", "persistent")
# AD-PSGD's per-step averaging with the shared buffer (sim_adpsgd): charged each step as the authors' code
# runs it, or left out (the suite's AD-PSGD adds one pending correction instead); a structure the model cannot

ADPSGD_AVERAGING = ("per_step", "none")


# the cost model's numbers a user may set that have a range (simulate's `KEY=VALUE`): (low, high, allowed)
WORKLOAD_RANGES = {
    "gossip_cost": (0.0, 1.0, "a number from 0 to 1"),
    "averaging_s_per_param": (0.0, 1e-6, "a number of seconds per parameter from 0 to 1e-6"),
    "sigma": (0.0, math.inf, "a number >= 0"),
    "sigma_rank": (0.0, math.inf, "a number >= 0"),
    "rho": (-0.99, 0.99, "a number between -0.99 and 0.99"),
}


@dataclass
class Workload:
    """What one rank's step costs: compute-time distribution, model size, batch."""

    name: str = "custom"
    step_s: float = 0.3  # median compute time (forward + backward) of one step on one rank
    batch: int = 128  # samples per rank and step
    params: float = 25.6e6  # model parameters (gradients and models travel as float32)
    bytes_per_param: int = 4
    compute: str = "lognormal"  # constant | lognormal | empirical | trace | persistent
    sigma: float = 0.0  # lognormal: spread of log(compute time); persistent: of its per-step noise
    sigma_rank: float = 0.0  # persistent: spread of the ranks' lasting offsets (log scale; simulate.spread)
    rho: float = 0.0  # persistent: lag-1 autocorrelation of the per-step noise
    samples: tuple = ()  # empirical: measured compute times to resample (from --calibrate)
    trace: tuple = ()  # trace: per rank, its measured compute times in step order (--calibrate)
    overhead_s: float = 0.0  # per-step time outside compute, delay and communication
    backward_fraction: float = 2 / 3  # share of the compute spent in backward (allreduce overlaps it)
    memory_GBps: float = 20.0  # memory bandwidth of a rank's elementwise updates (the outer step's cost)
    # AD-PSGD (sim_adpsgd): seconds of compute lost per second its thread exchanges, 0-1; default the figure
    # measured here (simulate/gossip_inputs.py), 0 only when asked (gossip_cost=0)
    gossip_cost: float = MEASURED_GOSSIP_COST
    # AD-PSGD: per_step (default, the authors' code: every step the compute thread averages every layer with
    # the shared buffer, at averaging_s_per_param seconds per parameter) | none (not charged)
    adpsgd_averaging: str = "per_step"
    averaging_s_per_param: float = MEASURED_AVERAGING_S_PER_PARAM
    source: str = "preset"  # where the numbers come from (preset | calibrated from RUN_DIR)

    @property
    def model_bytes(self) -> float:
        return float(self.params) * self.bytes_per_param

    def draw(self, rng: np.random.Generator, world_size: int, steps: int) -> np.ndarray:
        """Compute times ``[rank, local step]``."""
        shape = (world_size, steps)
        if self.compute == "constant" or (self.compute == "lognormal" and self.sigma == 0):
            return np.full(shape, float(self.step_s))
        if self.compute == "lognormal":
            return self.step_s * np.exp(self.sigma * rng.standard_normal(shape))
        if self.compute == "empirical":
            if not len(self.samples):
                raise ValueError(
                    "compute=empirical needs measured samples (wagma-bench simulate --calibrate RUN_DIR)"
                )
            return rng.choice(np.asarray(self.samples, dtype=float), size=shape)
        if self.compute == "trace":
            return self._replay(world_size, steps)
        if self.compute == "persistent":
            return draw_persistent(rng, world_size, steps, self.step_s, self.sigma_rank, self.sigma, self.rho)
        raise ValueError(f"workload.compute={self.compute!r}; choose one of: {', '.join(COMPUTE_MODELS)}")

    def _replay(self, world_size: int, steps: int) -> np.ndarray:
        """Each rank's recorded compute times, step by step (repeated from the start if the simulation runs
        longer): a trace-driven simulation, which keeps whatever the per-step times depended on in the real
        run (contention between ranks that share cores, data-dependent work) and tests only the model of
        communication and waiting."""
        if len(self.trace) != world_size:
            raise ValueError(
                f"compute=trace needs one recorded sequence per rank: have {len(self.trace)}, "
                f"world size {world_size}"
            )
        if not all(len(seq) for seq in self.trace):
            raise ValueError("compute=trace: a rank has no recorded compute times")
        return np.stack([np.resize(np.asarray(seq, dtype=float), steps) for seq in self.trace])


#: what a simulation tells its caller as it goes: (phase, fraction of that phase done, 0 to 1), often (every
#: round, every batch of exchanges, every chunk of a whole-run step), so that a caller can say where a long
#: one is
Progress = Callable[[str, float], None]


def _silent(phase: str, fraction: float) -> None:
    """The default :data:`Progress`: nobody listens."""


@dataclass
class SimConfig:
    optimizer: str
    world_size: int
    workload: Workload
    network: Network
    imbalance: Imbalance = field(default_factory=lambda: NoImbalance(None, 0))
    settings: Any = None  # the optimizer's typed Settings (OPTIMIZER_SPECS[name].Settings); None: defaults
    steps: int = 1000  # rounds to simulate, exactly (the last a synchronisation point, as in a run)
    seed: int = 1
    control_every: int = CONTROL_EVERY  # the trainer's control allreduce period; 0: only at the end
    local_state: int = 1  # model-sized tensors of the local optimizer's state (local_state_tensors)
    # told where the simulation is (`wagma-bench simulate` prints a line every few seconds of a long one)
    progress: Progress | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        spec = OPTIMIZER_SPECS.get(self.optimizer)
        if spec not in SIMULATIONS:
            raise ValueError(
                f"unknown optimizer {self.optimizer!r}; available: {', '.join(simulated_optimizers())}"
            )
        if self.settings is None:
            self.settings = spec.Settings()
        elif not isinstance(self.settings, spec.Settings):
            raise TypeError(
                f"optimizer {self.optimizer}: settings must be {spec.__name__}.Settings, "
                f"got {type(self.settings).__name__}"
            )
        # the check `run` makes of the same settings (one place for the allowed values: the schema's CHOICES)
        check_choices("optimizer", spec.Settings, OmegaConf.structured(self.settings))


def sync_period(cfg: SimConfig) -> int:
    """Rounds between the points where all ranks meet: the optimizer's own rule, which its algorithm and the
    trainer's plan read too (``AlgorithmSpec.sync_period_of``)."""
    return OPTIMIZER_SPECS[cfg.optimizer].sync_period_of(cfg.settings)


def local_state_tensors(local_optimizer: str, momentum: float) -> int:
    """Model-sized tensors the rank-local optimizer keeps (``train.state.make_local_optimizer``): SGD one
    momentum buffer (none without momentum), AdamW two moments. Local SGD's ``average_momentum`` sends them
    too."""
    if local_optimizer == "adam":
        return 2
    return 1 if momentum else 0


@dataclass
class SimResult:
    optimizer: str
    world_size: int
    rounds: int
    local_steps: float  # mean local steps per rank (< rounds when ranks skip rounds)
    time_s: float  # simulated training clock at the end
    samples: int
    throughput: float  # samples / s
    wait_frac: float  # mean share of a rank's time spent waiting on communication
    staleness: float = 0.0  # mean staleness (rounds) of the contributions a rank got answered
    extra: dict = field(default_factory=dict)

    def row(self) -> dict:
        out = asdict(self)
        out.update(out.pop("extra"))
        return out


# --- shared pieces -------------------------------------------------------------------------------------


def delay_matrix(
    imbalance: Imbalance, world_size: int, steps: int, compute: np.ndarray, tick: Progress = _silent
) -> np.ndarray:
    """Injected delays ``[rank, local step]``, asked of the real imbalance object as the trainer does
    (before the step's computation, relative models seeing the previous step's compute time; the first
    step uses its own), for every rank and step at once (:meth:`~wagma_bench.imbalance.Imbalance.delays`)."""
    compute = np.concatenate([compute[:, :1], compute[:, :-1]], axis=1)[:, :steps]
    # a few steps at a time, so that the draws' temporaries stay in the caches at any world size
    block = max(1, DELAY_BLOCK // max(1, world_size))
    parts = []
    for k in range(0, max(1, steps), block):
        tick("injected delays", k / max(1, steps))
        parts.append(imbalance.delays(world_size, compute[:, k : k + block], first_step=k))
    return np.concatenate(parts, axis=1)


def run_rounds(cfg: SimConfig) -> int:
    """The rounds a simulation runs: its budget exactly, as a run does (``RunPlan.total``): the last round is
    a synchronisation point of every optimizer, whatever its sync period (``Algorithm.end_at``)."""
    return max(1, cfg.steps)


class SimState:
    """Per-simulation arrays and bookkeeping shared by the optimizer models."""

    def __init__(self, cfg: SimConfig, sync_period: int):
        if cfg.world_size < 1:
            raise ValueError(f"world size must be >= 1, got {cfg.world_size}")
        self.cfg, self.P = cfg, cfg.world_size
        self.sync_period = max(1, sync_period)
        self.rounds = run_rounds(cfg)
        # 0: no control points but the last round (the paper's implementations have no periodic barrier)
        self.control = control_period(self.sync_period, cfg.control_every) if cfg.control_every > 0 else 0
        self.tick = cfg.progress or _silent
        rng = np.random.default_rng(cfg.seed)
        cols = self.rounds + 1
        self.tick("compute times", 0.0)
        # [rank, local step], stored column by column: every model reads one step of all ranks at a time, and
        # a column of a row-major array is a cache miss per rank once the world outgrows the caches
        self.compute = np.asfortranarray(cfg.workload.draw(rng, self.P, cols))
        self.delay = np.asfortranarray(delay_matrix(cfg.imbalance, self.P, cols, self.compute, self.tick))
        self.ctrl_cost = cfg.network.world_allreduce(self.P, CONTROL_BYTES)
        self.overhead = float(cfg.workload.overhead_s)
        self.nbytes = cfg.workload.model_bytes
        self.wait = np.zeros(self.P)

    def is_control(self, r: int) -> bool:
        return (self.control > 0 and r % self.control == 0) or r == self.rounds

    def barrier(self, t: np.ndarray) -> np.ndarray:
        """The trainer's control allreduce: everyone leaves at the last arrival plus its cost."""
        return np.full(self.P, t.max() + self.ctrl_cost)

    def result(self, end: float, steps_done: np.ndarray, staleness: float = 0.0, **extra: Any) -> SimResult:
        samples = int(steps_done.sum()) * int(self.cfg.workload.batch)
        return SimResult(
            self.cfg.optimizer,
            self.P,
            self.rounds,
            float(steps_done.mean()),
            float(end),
            samples,
            samples / end if end > 0 else math.inf,
            float(self.wait.mean() / end) if end > 0 else 0.0,
            float(staleness),
            extra,
        )


# model-sized tensors the outer step reads or writes (optim/outer.py, in place: d = x_prev - x, x += (1 - a)
# d, x += c u, u = b u + d, x_prev = x: 3 + 3 + 3 + 3 + 2 passes)
OUTER_PASSES = 14


def outer_cost(cfg: SimConfig) -> tuple[int, float]:
    """(rounds between outer steps, seconds of each) of the configured outer
    optimizer; (0, 0.0) without one."""
    settings = cfg.settings
    if not isinstance(settings, OuterSettings) or settings.outer == "none":
        return 0, 0.0
    seconds = OUTER_PASSES * cfg.workload.model_bytes / (cfg.workload.memory_GBps * 1e9)
    if (
        OPTIMIZER_SPECS[cfg.optimizer].outer_at == "exact"
    ):  # the outer layer's own global average of the models
        seconds += cfg.network.world_allreduce(cfg.world_size, cfg.workload.model_bytes)
    return settings.effective_outer_period(), seconds


def _lockstep(
    cfg: SimConfig, sync_period: int, comm: Callable[[SimState, int, np.ndarray], np.ndarray]
) -> SimResult:
    """Optimizers whose ranks advance one round per step: ``comm(run, r, ready)`` turns the times the ranks
    are ready to communicate in round ``r`` into the times their step's communication is done; an outer
    optimizer's round adds its cost after the slowest rank's where the outer layer averages the models itself,
    else after each rank's own average."""
    run = SimState(cfg, sync_period)
    outer_every, outer_s = outer_cost(cfg)
    # the outer layer's own global average (D-PSGD, SGP) makes its round a barrier; after the base's average
    # (local SGD, streaming DiLoCo's fragments) each rank steps its outer optimizer when its average is done
    outer_barrier = OPTIMIZER_SPECS[cfg.optimizer].outer_at == "exact"
    start = np.zeros(run.P)
    for r in range(1, run.rounds + 1):
        run.tick("rounds", (r - 1) / run.rounds)
        ready = start + run.compute[:, r - 1] + run.delay[:, r - 1]
        done = comm(run, r, ready) if run.P > 1 else ready
        if outer_every and r % outer_every == 0:
            done = np.full(run.P, done.max() + outer_s) if outer_barrier else done + outer_s
        run.wait += done - ready
        start = done + run.overhead
        if run.is_control(r) and run.P > 1:
            start = run.barrier(start)
    return run.result(start.max(), np.full(run.P, run.rounds))


# --- synchronous optimizers ----------------------------------------------------------------------------


def bucket_sizes(nbytes: float, bucket_mb: float) -> list[float]:
    size = bucket_mb * 2**20
    if not size or size <= 0 or size >= nbytes or math.isinf(size):
        return [nbytes]
    full = int(nbytes // size)
    return [size] * full + ([nbytes - full * size] if nbytes - full * size > 0 else [])


_MODELS: dict[str, Callable[[SimConfig], SimResult]] = {}


def simulates(name: str) -> Callable:
    """Register the decorated function as the model of optimizer ``name`` (``optimizer=NAME``); a name that is
    not in OPTIMIZER_SPECS fails here, as the module is imported, naming it."""
    if name not in OPTIMIZER_SPECS:
        raise ImportError(
            f"@simulates({name!r}): no optimizer {name!r} in OPTIMIZER_SPECS ({', '.join(OPTIMIZER_SPECS)})"
        )

    def register(model: Callable[[SimConfig], SimResult]) -> Callable[[SimConfig], SimResult]:
        _MODELS[name] = model
        return model

    return register


@simulates("allreduce")
def sim_allreduce(cfg: SimConfig) -> SimResult:
    """Allreduce-SGD: bucketed gradient allreduce overlapped with backward."""
    sizes = bucket_sizes(cfg.workload.model_bytes, cfg.settings.bucket_mb)
    costs = [cfg.network.world_allreduce(cfg.world_size, b) for b in sizes]
    frac = np.cumsum(sizes) / sum(sizes)  # share of backward done when each bucket is full
    bf = cfg.workload.backward_fraction

    def comm(run: SimState, r: int, ready: np.ndarray) -> np.ndarray:
        c = run.compute[:, r - 1]
        start = ready - c - run.delay[:, r - 1]
        launch = (start + run.delay[:, r - 1] + c * (1 - bf))[:, None] + (c * bf)[:, None] * frac[None, :]
        end = -math.inf
        for b, cost in enumerate(costs):  # in order: every rank issues the same sequence
            end = max(end, launch[:, b].max()) + cost
        return np.maximum(ready, end)

    return _lockstep(cfg, 1, comm)


@simulates("dropcompute")
def sim_dropcompute(cfg: SimConfig) -> SimResult:
    """DropCompute: each rank's step (compute plus its injected delay, as the trainer spreads it) in M equal
    micro-batches; past the threshold a rank stops after the micro-batch that crossed it.
    ``threshold_s: auto`` is the optimizer's own rule (:func:`~wagma_bench.optim.rules.best_threshold`) over
    the first ``calibrate_steps`` rounds, which drop nothing. Then one allreduce of the model, not overlapped
    (the gradients are complete only after the last micro-batch). Throughput counts the computed samples
    only."""
    s, M = cfg.settings, cfg.settings.micro_batches
    cost = sum(
        cfg.network.world_allreduce(cfg.world_size, b)
        for b in bucket_sizes(cfg.workload.model_bytes, s.bucket_mb)
    )
    run = SimState(cfg, 1)
    threshold = parse_threshold(s.threshold_s)
    calibration: list[np.ndarray] = []
    start, computed = np.zeros(run.P), 0.0
    parts = np.arange(1, M + 1) / M
    for r in range(1, run.rounds + 1):
        run.tick("rounds", (r - 1) / run.rounds)
        step = run.compute[:, r - 1] + run.delay[:, r - 1]
        ends = step[:, None] * parts[None, :]  # [ranks, micro-batches], into the step
        if threshold is None:
            calibration.append(ends)
            done_parts = np.full(run.P, M)
            if len(calibration) == s.calibrate_steps:
                stacked = np.stack(calibration, axis=1)
                threshold = best_threshold(
                    stacked, float(stacked[:, :, -1].max(0).mean()) + cost + run.overhead
                )[0]
        else:  # the first micro-batch always; then each one whose predecessor ended by the threshold
            done_parts = np.minimum(M, 1 + (ends[:, :-1] <= threshold).sum(axis=1))
        computed += float(done_parts.sum())
        ready = start + ends[np.arange(run.P), done_parts - 1]
        done = np.full(run.P, ready.max() + cost) if run.P > 1 else ready
        run.wait += done - ready
        start = done + run.overhead
        if run.is_control(r) and run.P > 1:
            start = run.barrier(start)
    drop_rate = 1.0 - computed / (run.rounds * run.P * M)
    result = run.result(
        start.max(),
        np.full(run.P, run.rounds),
        drop_rate=round(drop_rate, 5),
        threshold_s=None if threshold is None or math.isinf(threshold) else threshold,
    )
    samples = int(result.samples * (1.0 - drop_rate))
    return replace(
        result, samples=samples, throughput=samples / result.time_s if result.time_s > 0 else math.inf
    )


@simulates("local_sgd")
def sim_local_sgd(cfg: SimConfig) -> SimResult:
    """Local SGD / PR-SGD: blocking global model average every ``sync_period`` rounds; streaming DiLoCo
    (fragments): one fragment's average every ``sync_period / fragments`` rounds, started ``fragment_delay``
    rounds before it is needed (:func:`~wagma_bench.optim.rules.sync_at`), so a rank waits only for what the
    delay did not hide."""
    if cfg.settings.streaming():
        return _sim_streaming(cfg)
    period, warmup = sync_period(cfg), cfg.settings.warmup_rounds
    factor = 1 + cfg.local_state if cfg.settings.average_momentum else 1  # the optimizer state travels too
    avg_cost = cfg.network.world_allreduce(cfg.world_size, factor * cfg.workload.model_bytes)
    grad_cost = cfg.network.world_allreduce(cfg.world_size, cfg.workload.model_bytes)

    def comm(run: SimState, r: int, ready: np.ndarray) -> np.ndarray:
        if r <= warmup:
            return np.full(run.P, ready.max() + grad_cost)
        if local_average_at(r, period, warmup, run.rounds):  # the run's rule, the last round included
            return np.full(run.P, ready.max() + avg_cost)
        return ready

    return _lockstep(cfg, period, comm)


def _sim_streaming(cfg: SimConfig) -> SimResult:
    s = cfg.settings
    cost = cfg.network.world_allreduce(cfg.world_size, cfg.workload.model_bytes / s.fragments)
    whole = cfg.network.world_allreduce(cfg.world_size, cfg.workload.model_bytes)  # the last round's average
    started: dict[int, float] = {}  # the round a fragment's average is needed by -> when it started

    def comm(run: SimState, r: int, ready: np.ndarray) -> np.ndarray:
        events = [sync_at(r, s.sync_period, s.fragments, s.fragment_delay)]
        if events[0] and events[0][0] == "perform" and s.fragment_delay == 0:
            events.insert(0, ("prepare", events[0][1]))
        out = ready
        for what, _ in filter(None, events):
            if what == "prepare":  # the collective starts once the last rank has posted its pseudo-gradient
                started[r + s.fragment_delay] = float(ready.max())
            else:
                out = np.maximum(ready, started.pop(r) + cost)
        if (
            r == run.rounds
        ):  # the run ends with the whole model's global average (LocalSGD, StreamingOuter.finish)
            out = np.full(run.P, max([float(out.max()), *started.values()]) + whole)
        return out

    return _lockstep(cfg, s.sync_period, comm)


@simulates("dpsgd")
def sim_dpsgd(cfg: SimConfig) -> SimResult:
    """D-PSGD: synchronous model exchange with both ring neighbours each step."""
    P, net, n = cfg.world_size, cfg.network, cfg.workload.model_bytes
    nbs = [ring_neighbours(i, P) for i in range(P)]
    cols = max((len(x) for x in nbs), default=0)
    idx = np.array([list(x) + [i] * (cols - len(x)) for i, x in enumerate(nbs)], dtype=int).reshape(P, cols)
    # sends to (and receives from) both neighbours at once: one latency, the bytes of every message; the
    # messages that leave one node at once share its injection bandwidth
    src = np.array([i for i, x in enumerate(nbs) for _ in x], dtype=int)
    dst = np.array([j for x in nbs for j in x], dtype=int)
    flows = net.node_flows(src, dst)
    # each message's full cost and its latency alone (no bytes); a rank's cost: its dearest message's, plus
    # the bytes of its other messages at that message's rate
    full, bare = p2p_each(net, src, dst, n, flows), p2p_each(net, src, dst, 0, flows)
    others = np.array([len(x) - 1 for x in nbs], dtype=int)[src]
    cost = np.full(P, -math.inf)
    np.maximum.at(cost, src, full + others * (full - bare))
    cost[cost == -math.inf] = 0.0  # (no neighbour: P = 1)

    def comm(run: SimState, r: int, ready: np.ndarray) -> np.ndarray:
        return np.maximum(ready, ready[idx].max(axis=1)) + cost

    return _lockstep(cfg, 1, comm)


def p2p_each(net: Network, src: np.ndarray, dst: np.ndarray, nbytes: float, flows: np.ndarray) -> np.ndarray:
    """``net.p2p(src[i], dst[i], nbytes, flows[i])`` for every ``i``: a message's cost depends on its ends
    only through whether they share a node, so it is worked out once for each (same node, flows) pair there
    is, the same float for every message that has it (a call a message took a third of SGP's simulation)."""
    same = src // net.gpus_per_node == dst // net.gpus_per_node
    _, first, which = np.unique(np.where(same, -1, flows), return_index=True, return_inverse=True)
    costs = [net.p2p(int(src[k]), int(dst[k]), nbytes, int(flows[k])) for k in first]
    return np.array(costs, dtype=float)[which.reshape(-1)]


@simulates("sgp")
def sim_sgp(cfg: SimConfig) -> SimResult:
    """SGP: push-sum to one exponential-graph peer per step, optionally 1-overlap."""
    P, net, n = cfg.world_size, cfg.network, cfg.workload.model_bytes + 4
    overlap = cfg.settings.overlap
    peers = {}
    hops, tick = (max(1, math.ceil(math.log2(P))) if P > 1 else 1), cfg.progress or _silent
    for t in range(hops):
        tick("exponential graph", t / hops)
        out, inn = exponential_peers(P, t)
        flows = net.node_flows(np.arange(P), out)  # every rank pushes at once: a node's pushes share its NIC
        cost = p2p_each(net, inn, np.arange(P), n, flows[inn])  # from the in-peer
        peers[t] = (out, inn, cost)
    hops = len(peers)
    state = {"arrival": None, "sent_arrival": [None, None]}

    def comm(run: SimState, r: int, ready: np.ndarray) -> np.ndarray:
        t = r - 1
        out, inn, cost = peers[t % hops]
        slot = state["sent_arrival"][t % 2]
        if slot is not None:  # the send buffer of step t-2 must have been received
            ready = np.maximum(ready, slot)
        if not overlap:
            done = np.maximum(np.maximum(ready, ready[inn]), ready[out]) + cost
            state["sent_arrival"][t % 2] = None
            return done
        prev = state["arrival"]
        done = ready if prev is None else np.maximum(ready, prev)
        # this step's message from the in-peer, received once this rank posted its receive (at done)
        arrival = np.maximum(ready[inn], done) + cost
        state["arrival"] = arrival
        sent = np.empty(P)
        sent[inn] = arrival  # my message arrives at my out-peer when its receive completes
        state["sent_arrival"][t % 2] = sent
        return done

    return _lockstep(cfg, 1, comm)


# --- AD-PSGD -------------------------------------------------------------------------------------------

# rounds of (compute schedule -> exchanges -> their cost on the compute) at most; a line says when they were
# not enough (on a link too slow for one exchange per step each round moves the end by about c times the move
# of the round before: 15-20 rounds at c = 0.5)
GOSSIP_ITERATIONS = 100
# ... stopped once a round moves the end of the run by less than this share of the median compute time. The
# end, not each step's charge: at c near 1 on a slow link the charges keep moving between steps (which step an
# exchange falls in) while the end, and every figure the result gives, has settled.
GOSSIP_TOLERANCE = 1e-3


@simulates("adpsgd")
def sim_adpsgd(cfg: SimConfig) -> SimResult:
    """AD-PSGD as its authors run it: compute never waits for a peer (only at sync points); the gossip
    thread's exchanges are served in batches (:func:`_gossip`), at most one per
    ``exchange_every`` local steps.

    What the authors' code (Lian et al.'s AD-PSGD) costs a rank besides its compute: its exchange thread runs
    beside the compute thread, copying each layer through the CPU and spinning on locks, and every step the
    compute thread averages every layer with the buffer that thread shares with it. Two charges model that:

    - the exchanges (``workload.gossip_cost``, c from 0 to 1, default the figure measured here): each second a
      rank's thread spends in an exchange (an active's transfer, or a passive serving one) while the rank
      computes takes c seconds from its compute, so a step lengthens by c times the exchange time inside it
      (c = 1: the compute stops while the thread exchanges; c = 0, only when asked: a free exchange, the
      compute thread's upper bound);
    - the per-step averaging (``adpsgd_averaging=per_step``, the default; ``none`` leaves it out): every step
      of a rank with a peer lengthens by ``params x averaging_s_per_param``, measured here.

    The compute schedule and the exchanges depend on each other (a slower step moves the next exchange), so
    both are recomputed until no step's charge moves by ``GOSSIP_TOLERANCE`` of a median step (at most
    ``GOSSIP_ITERATIONS`` rounds; a line on stderr says when that was not enough). Exchanges that do not keep
    up with the steps are not dropped for free: ``exchanges_per_step`` (below 1 when the network cannot carry
    one exchange per step) is what time to target reads (:func:`~wagma_bench.simulate.gossip_inputs.
    mixing_factor`: the samples to target measured at fewer exchanges per step). docs/simulator.md says what
    was measured and where."""
    run = SimState(cfg, sync_period(cfg))  # the run's barrier: the algorithm's own rule
    wl, cost = cfg.workload, float(cfg.workload.gossip_cost)
    check_choice("adpsgd_averaging", wl.adpsgd_averaging, ADPSGD_AVERAGING)
    averaging = (
        wl.params * wl.averaging_s_per_param if wl.adpsgd_averaging == "per_step" and run.P > 1 else 0.0
    )
    # [rank, step] stored step by step, as the compute schedule reads and writes them (_compute_schedule)
    extra = np.full((run.P, run.rounds), averaging, order="F")
    rounds, converged, settled, last_end = 0, run.P == 1, 0, math.inf
    tolerance = GOSSIP_TOLERANCE * float(np.median(run.compute))
    pairing = _pairing(cfg, run) if run.P > 1 else None
    made = None  # every pass's exchanges, in one store (_gossip)
    while not converged and rounds < GOSSIP_ITERATIONS:
        rounds += 1
        starts, windows, ends, end_time = _compute_schedule(run, extra)  # windows: each step's compute
        moved, last_end = abs(end_time - last_end), end_time
        settled = settled + 1 if moved <= tolerance else 0
        made = _gossip(cfg, run, ends, end_time, pairing, made)
        lag_of = (ends, end_time, made)  # the step lag of the round that is kept, measured once at the end
        run.tick("time in exchanges", 0.0)
        overlap = busy_between(made.by_rank(), run.P, starts, windows, run.tick)
        # a step's compute window lengthened by c times the exchange time inside it, and by the averaging
        new = averaging + cost * overlap
        converged = settled >= 1 or not np.any(new != extra)
        if not converged:
            extra = new
    lag = _step_lag(run, *lag_of) if run.P > 1 else 0.0
    exchanges = made.count if run.P > 1 else 0
    if run.P == 1:
        *_, end_time = _compute_schedule(run, extra)
        exchanges, lag, overlap, windows, starts = 0, 0.0, np.zeros(1), np.ones(1), np.zeros(1)
    elif not converged:
        print(
            f"simulate: adpsgd at P={run.P}: the exchange cost did not settle in {GOSSIP_ITERATIONS} rounds "
            f"(its last round moved the end by {moved:.3g} s); the throughput is that round's",
            file=sys.stderr,
        )
    computed = max(1e-300, float(run.compute[:, : run.rounds].sum()))
    # the sums rank by rank (row-major), as they always were: a sum's rounding depends on its order
    rowwise = row_major
    return run.result(
        end_time,
        np.full(run.P, run.rounds),
        staleness=lag,
        exchanges_per_step=exchanges / max(1, (run.P // 2) * run.rounds),
        gossip_cost_share=float(rowwise(extra - averaging).sum() / computed),
        averaging_share=float(averaging * extra.size / computed),
        # the share of compute time during which the rank's thread exchanges (what c acts on)
        gossip_busy_share=float(rowwise(overlap).sum() / max(1e-300, rowwise(windows - starts).sum())),
        gossip_rounds=rounds,
        gossip_converged=converged,
    )


def check_choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def _compute_schedule(run: SimState, extra: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Start, end of the compute and end of every rank's local steps ``[rank, step]`` when compute never
    waits but at the trainer's sync points, each step's compute lengthened by ``extra`` (before its injected
    delay); and the end of the run. All stored step by step (column by column, as ``extra`` is best given): a
    round writes one step of every rank, and a column of a row-major array is a cache and TLB miss per rank
    (1.0 against 0.17 CPU s a pass at 65,536 ranks, measured alone under load)."""
    start = np.zeros(run.P)
    starts, windows, ends = (np.empty((run.rounds, run.P)) for _ in range(3))
    compute, delay, extra = run.compute.T, run.delay.T, extra.T  # [step, rank] views
    parts = split(run.P, run.P * run.rounds)  # ranks in threads (simulate/threads.py) up to each barrier

    def steps(ranks: slice, first: int, last: int) -> None:  # steps first .. last of some ranks
        at = start[ranks]
        for r in range(first, last + 1):
            if ranks is parts[0]:  # (one thread says where it is, every round)
                run.tick("compute schedule", (r - 1) / run.rounds)
            starts[r - 1, ranks] = at
            np.add(at + compute[r - 1, ranks], extra[r - 1, ranks], out=windows[r - 1, ranks])
            done = windows[r - 1, ranks] + delay[r - 1, ranks]
            ends[r - 1, ranks] = done
            at = done + run.overhead
        start[ranks] = at

    first = 1
    while first <= run.rounds:
        last = first  # up to the next barrier, a few dozen steps at most (saying where it is)
        while last < min(run.rounds, first + 63) and not (run.is_control(last) and run.P > 1):
            last += 1
        in_blocks(lambda ranks, a=first, b=last: steps(ranks, a, b), parts, run.P * run.rounds)
        if run.is_control(last) and run.P > 1:
            start = run.barrier(start)
        first = last + 1
    return starts.T, windows.T, ends.T, float(start.max())


def _gossip(
    cfg: SimConfig,
    run: SimState,
    ends: np.ndarray,
    end_time: float,
    pairing: tuple | None = None,
    made: Exchanges | None = None,
) -> Exchanges:
    """Exchanges of the active ranks' gossip threads: after each exchange a thread waits for a local step that
    ended after it woke and whose count is a multiple of ``exchange_every`` (the step that set its event), so
    one exchange per ``exchange_every`` local steps at most; the ``e``-th exchange of every active goes to
    its partner in the ``e``-th matching (:func:`~wagma_bench.comm.topology.matching_partners`); a passive
    serves one at a time, first come first served (in the order the actives' threads woke), from the header's
    arrival. Returns every exchange, stored by the ranks that made it in ``made`` (cleared) or a new store
    (:class:`~wagma_bench.simulate.exchanges.Exchanges`: each rank's time in exchanges, rank after rank, for
    :func:`busy_between`, and the pairs for :func:`_step_lag`). The lag is measured by the caller once, for
    the fixed point's last round only (a sort of every exchange: a sixth of the time at 8,192 ranks when it
    was measured each round).

    An event simulation that serves many requests at once: each active has one pending request (when its
    thread woke, to whom). No request can come earlier than ``T``, the earliest time any active could wake
    again (after its pending exchange at the least, or its next step's end), so every pending request that
    woke before ``T`` is served now, each passive's in wake order (one sort, a segmented max-plus scan). That
    is the order of an event heap, request by request (a test replays the model on one and compares); a batch
    holds every active whose thread woke before the slowest could wake again. What an active could do next
    depends on its own request only, so it is worked out when the request is made (:class:`_Pending`), and a
    batch costs two passes over the actives (the least ``T``, who woke before it) besides its own requests."""
    P = run.P
    actives = np.arange(0, P, 2)
    rounds = ends.shape[1]
    pairing = pairing or _pairing(cfg, run)
    pending = _Pending(ends, actives, pairing, int(getattr(cfg.settings, "exchange_every", 1)))
    made = made or Exchanges(P, pairing[0])
    made.clear()
    free = np.zeros(P)  # when each passive is free
    wake = ends[actives, min(pending.every, rounds) - 1].copy()  # each active's request: when its thread woke
    everyone = np.arange(len(actives))
    first = np.zeros_like(everyone)
    pending.request(everyone, wake, (wake < end_time) & (pending.every <= rounds), first, first)
    batches = 0
    while pending.alive:
        i = pending.batch()
        t, next_end, latency, swap = pending.floats[:, i]  # (one gather each of the batch's floats and ints)
        p, k, e = pending.ints[:, i]
        if batches % 8 == 0:  # the simulated clock the exchanges have reached (every few batches)
            run.tick("exchanges", float(t.min()) / end_time)
        batches += 1
        done = t.copy()
        q = None  # (every request real but an odd world's last active's: no index array to go through)
        if not pending.all_real:
            real = pending.real[i]
            q = None if real.all() else np.flatnonzero(real)
        if q is None or len(q):
            order, to, begin, finish, position, sizes = _serve(q, p, t, latency, swap, free)
            done[order] = finish
            made.add(i[order], e[order], to, position, begin, finish, sizes)
        wake = np.maximum(done, next_end)
        e += 1
        pending.exchange[i] = e
        # (woken after step k's end, each has ended k + 1 steps at least)
        pending.request(i, wake, (k < rounds) & (wake < end_time), k + 1, e)
    return made


class _Pending:
    """Each active's pending request (:func:`_gossip`): when its thread woke, its exchange's partner, latency
    and swap time, the step whose end sets its next event, and the earliest it could wake again; inf for an
    active that makes no more requests, so that the batch's passes run over plain arrays. The step ends and
    the pairings are read flat (``ends[k * world + a]``, ``partners[e * actives + i]``): a gather of one
    index array, not of two, step by step (a batch's actives are at nearby steps: their ends lie close)."""

    def __init__(self, ends: np.ndarray, actives: np.ndarray, pairing: tuple, every: int):
        n = len(actives)
        self.rounds, self.n, self.actives, self.every = ends.shape[1], n, actives, every
        self.world = ends.shape[0]
        self.ends = np.ravel(ends.T)  # [step, rank]: a view of the compute schedule's (_compute_schedule)
        self.partners, self.latencies, self.swaps = (np.ravel(x) for x in pairing)  # [exchange, active]
        # each active's request, a row a field: a batch gathers each array's columns at once
        self.floats = np.zeros((4, n))
        self.floats[:2] = math.inf
        self.wake, self.next_end, self.latency, self.swap = self.floats  # (views of its rows)
        self.ints = np.zeros((3, n), dtype=int)
        self.p, self.k, self.exchange = self.ints
        self.earliest, self.real = np.full(n, math.inf), np.zeros(n, dtype=bool)
        self.alive = n  # actives still making requests
        # an active is paired in every matching or in none (_pairing): where all are, no request goes nowhere
        self.all_real = bool(np.all(self.partners[:n] != actives))

    def request(
        self, i: np.ndarray, wake: np.ndarray, alive: np.ndarray, ended: np.ndarray, exchange: np.ndarray
    ) -> None:
        """Actives ``i`` woke at ``wake``, having ended at least ``ended`` steps by then, to make their
        ``exchange``-th exchange; those not ``alive`` make no more requests."""
        if not alive.all():  # (most batches: every one of them goes on)
            gone = i[~alive]
            self.alive -= len(gone)
            self.wake[gone] = self.earliest[gone] = math.inf
            i, wake, ended, exchange = i[alive], wake[alive], ended[alive], exchange[alive]
        t, rounds = wake, self.rounds
        a = self.actives[i]
        at = exchange * self.n + i
        p, latency, swap = self.partners.take(at), self.latencies.take(at), self.swaps.take(at)
        ended, end_of = _steps_ended_from(self.ends, rounds, self.world, a, t, ended)
        # the next step that sets the thread's event
        k = ended if self.every == 1 else -(-(ended + 1) // self.every) * self.every - 1
        if self.every > 1:
            end_of = self.ends.take(np.minimum(k, rounds - 1) * self.world + a)
        next_end = np.where(k < rounds, end_of, math.inf)
        self.wake[i], self.k[i], self.next_end[i] = t, k, next_end
        self.p[i], self.latency[i], self.swap[i] = p, latency, swap
        # its next wake, at least
        if self.all_real:
            self.earliest[i] = np.maximum(t + latency + swap, next_end)
        else:
            self.real[i] = real = p != a
            self.earliest[i] = np.maximum(np.where(real, t + latency + swap, t), next_end)

    def batch(self) -> np.ndarray:
        """The requests that woke before any active could wake again (in active order), at least the first."""
        now = np.flatnonzero(self.wake < self.earliest.min())
        return now if len(now) else np.flatnonzero(self.wake == self.wake.min())


def _pairing(cfg: SimConfig, run: SimState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each active's partner in every exchange a run can hold (:func:`_matchings`), the control latency to
    it and the time of their swap (both models, one after the other): ``[exchange, active]`` each, the same
    in every round of the fixed point, so made once."""
    net, actives = cfg.network, np.arange(0, run.P, 2)
    partners = _matchings(cfg, run, run.rounds)
    paired = partners != actives
    if not np.all(paired == paired[:1]):  # (Exchanges stores an active's e-th exchange in its slot e)
        raise AssertionError("an active is paired in some matchings and not in others")
    nbytes = cfg.workload.model_bytes + 16
    swap_intra, swap_inter = 2 * net.intra.p2p(nbytes), 2 * net.inter.p2p(nbytes)
    same_node = actives // net.gpus_per_node == partners // net.gpus_per_node
    latencies = net.control_latencies(np.broadcast_to(actives, partners.shape), partners)
    return partners, latencies, np.where(same_node, swap_intra, swap_inter)


# the last matchings made (_matchings), read only: the simulations of ``simulate --interval`` that share a
# seed (every sensitivity point, structure and flip point) share them; kept up to this many partners (16 MB)
MATCHINGS_KEPT_UP_TO = 1 << 21
_MATCHINGS: dict[tuple[int, int, int], np.ndarray] = {}


def _matchings(cfg: SimConfig, run: SimState, rounds: int) -> np.ndarray:
    """Each active's (even rank's) partner in the ``e``-th matching, for every exchange ``e`` a run can hold:
    [exchange, active], a function of the world, the rounds and the seed only (read only: the last one is
    kept for the next simulation that asks: 501 permutations drawn, about a tenth of an AD-PSGD simulation
    that settles in 3 rounds at 1,024 ranks)."""
    key = (run.P, rounds, cfg.seed)
    kept = _MATCHINGS.get(key)
    if kept is not None:
        return kept
    actives = np.arange(0, run.P, 2)
    partners = np.empty((rounds + 1, len(actives)), dtype=int)
    for e in range(rounds + 1):
        run.tick("matchings", e / (rounds + 1))
        partners[e] = matching_partners(run.P, e, cfg.seed)[actives]
    partners.flags.writeable = False
    _MATCHINGS.clear()
    if partners.size <= MATCHINGS_KEPT_UP_TO:
        _MATCHINGS[key] = partners
    return partners


def _steps_ended_from(
    ends: np.ndarray, rounds: int, world: int, a: np.ndarray, t: np.ndarray, k: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """bisect_right of ``t`` in each active ``a``'s step ends (``ends`` flat, step by step: ``[k * world +
    a]``), from its ``k`` on, where it was (a step or two a batch); and the end of the step found (of the
    last step past the last)."""
    while True:
        end_of = ends.take(np.minimum(k, rounds - 1) * world + a)
        more = (k < rounds) & (end_of <= t)
        if not more.any():
            return k, end_of
        k = k + more


def _step_lag(run: SimState, ends: np.ndarray, end_time: float, made: Exchanges) -> float:
    """Mean step lag between the two ends of the exchanges (``a`` with ``p``, begun at ``b``): how many more
    steps one had ended than the other when the exchange began. Each rank's exchanges are searched in its
    step ends rank after rank (:meth:`~wagma_bench.simulate.exchanges.Exchanges.by_rank`: keys in order, a
    block of them in a short stretch of the axis), then paired (``in_by_rank``)."""
    if not made.count:
        return 0.0
    rounds = ends.shape[1]
    span = 2.0 * max(float(ends.max(initial=0.0)), end_time) + 1.0
    flat = (np.arange(run.P)[:, None] * span + row_major(ends)).ravel()  # every rank's ends on one axis
    counts, both = made.by_rank()
    ranks = np.repeat(np.arange(run.P), counts)
    found = np.empty(len(ranks), dtype=np.intp)

    def search(k: int) -> None:  # a block at a time (in threads: simulate/threads.py)
        mine = slice(k, k + SEARCH_BLOCK)
        found[mine] = search_right(flat, ranks[mine] * span + both[0, mine])

    said = lambda k: run.tick("exchanges' step lag", k / len(ranks))  # where it is
    in_blocks(search, range(0, len(ranks), SEARCH_BLOCK), len(ranks), said)
    ended = found - ranks * rounds  # bisect_right of each begin in its rank's step ends
    active, passive = made.in_by_rank()
    lag = np.abs(ended[active] - ended[passive])
    run.tick("exchanges' step lag", 1.0)
    return float(lag.sum()) / len(lag)


def _serve(
    q: np.ndarray | None,
    p: np.ndarray,
    t: np.ndarray,
    latency: np.ndarray,
    swap: np.ndarray,
    free: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One batch's requests ``q`` (indices into the batch's arrays, in the actives' order; None: all) served
    at their passives, each passive's in the order the actives' threads woke (ties as an event heap pops
    them); ``free`` (when each passive is free) is moved on. Returns (the requests in service order, their
    passives, their begin, their end, their place in their passive's queue, each queue's length): the
    arithmetic of an event heap, ``begin = max(wake + latency, free)``, ``free = end = begin + swap``, one
    place in the queues at a time."""
    # (a batch holds each active once, so its rank breaks every tie, as an event heap's (wake, active,
    # exchange) key does: the exchange count never decides)
    if q is None:
        order, pq, starts, sizes = _service_order(p, t)
    else:
        order, pq, starts, sizes = _service_order(p[q], t[q])
        order = q[order]
    position = np.arange(len(pq)) - np.repeat(starts, sizes)  # (each passive's requests lie together)
    # the requests by their place in their queue (every passive's first, then every second, ...), read once
    by_position = np.argsort(position.astype(np.uint16) if len(pq) <= 1 << 16 else position, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(position))]).tolist()
    served = order[by_position]
    to, arrive, cost = pq[by_position], t[served] + latency[served], swap[served]
    began, ended = np.empty(len(pq)), np.empty(len(pq))
    for lo, hi in itertools.pairwise(bounds):  # a passive's requests one after the other (few a batch)
        np.maximum(arrive[lo:hi], free[to[lo:hi]], out=began[lo:hi])
        np.add(began[lo:hi], cost[lo:hi], out=ended[lo:hi])
        free[to[lo:hi]] = ended[lo:hi]
    begin, finish = np.empty(len(pq)), np.empty(len(pq))
    begin[by_position], finish[by_position] = began, ended  # (in service order again)
    return order, pq, begin, finish, position, sizes


# a batch's requests from which its service order is a radix sort by passive and fixes, not one lexsort
# (_service_order): measured alone, the lexsort took 8 us against 31 at 368 requests, 163 against 100 at 2,800
LEXSORT_UP_TO = 1024


def _service_order(
    p: np.ndarray, t: np.ndarray, a: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``np.lexsort((a, t, p))``: by passive, then wake, then active; with the passives in that order and
    where each passive's requests begin and how many they are. For a batch in the actives' order (as
    :func:`_gossip` makes them; ``a`` None: the caller says so), by passive first (a radix sort
    where the ranks fit 16 bits, stable: each passive's requests in the actives' order), then only where a
    passive has several: two by wake swapped where the second woke first, three or more (a few percent of the
    requests) by wake (stably) and by passive again; a quicksort of every wake took three quarters of the time
    at 22,000 requests a batch. Neither moves a request to another passive's places. Up to
    :data:`LEXSORT_UP_TO` requests (a batch at 1,024 ranks holds some 370) one ``np.lexsort`` by wake and
    passive costs less than the radix sort's two dozen numpy calls (8 against 31 us at 368 requests)."""
    if len(p) < 2:
        order, woke = np.arange(len(p)), None
    elif a is not None and not np.all(a[1:] > a[:-1]):
        order, woke = np.lexsort((a, t, p)), None
    elif len(p) <= LEXSORT_UP_TO:  # (in the actives' order: a stable sort's ties keep it)
        order, woke = np.lexsort((t, p)), None
    else:
        order = _stable_by(p)
        woke = t[order]
    to = p[order]
    edge = np.ones(len(to) + 1, dtype=bool)  # where a passive's queue begins, and the end
    np.not_equal(to[1:], to[:-1], out=edge[1:-1])
    edges = np.flatnonzero(edge)
    starts, sizes = edges[:-1], edges[1:] - edges[:-1]
    if woke is None:
        return order, to, starts, sizes
    two = starts[sizes == 2]
    swap = two[woke[two + 1] < woke[two]]  # (a tie keeps the actives' order)
    order[swap], order[swap + 1] = order[swap + 1], order[swap]
    more = np.flatnonzero(np.repeat(sizes > 2, sizes))  # the places of the passives with three or more
    if len(more):
        queued = order[more]  # by passive, each passive's in the actives' order
        by_wake = queued[np.argsort(t[queued], kind="stable")]
        order[more] = by_wake[_stable_by(p[by_wake])]
    return order, to, starts, sizes


def _stable_by(rank: np.ndarray) -> np.ndarray:
    """``np.argsort(rank, kind="stable")``: a radix sort where the ranks fit 16 bits."""
    return np.argsort(rank.astype(np.uint16) if rank.max() < 1 << 16 else rank, kind="stable")


# --- the wait-avoiding engine (WAGMA, eager-SGD) -------------------------------------------------------


@dataclass
class Plan:
    """One round's partition, prepared for vectorised activation."""

    gid: np.ndarray  # [P] group index of each rank
    order: np.ndarray  # ranks sorted by group
    offsets: np.ndarray  # start of each group in ``order``
    lat: np.ndarray  # [D, 2**D] control latency of the hypercube edge along dimension d (inf where none)
    cost: np.ndarray  # [G] the group allreduce's cost


def hypercube_latencies(world_size: int, net: Network) -> np.ndarray:
    """``lat[d, r]``: the control latency between rank ``r`` and ``r ^ 2**d`` on the hypercube over the whole
    world (:func:`~wagma_bench.comm.topology.world_hypercube_neighbours`), for ranks padded to a power of two;
    inf where either end is outside the world. Depends only on the world and the network: shared by every
    round's plan."""
    dims = (world_size - 1).bit_length() if world_size > 1 else 0
    ranks = np.arange(1 << dims)
    lat = np.full((dims, 1 << dims), math.inf)
    for d in range(dims):
        peer = ranks ^ (1 << d)
        valid = (ranks < world_size) & (peer < world_size)
        lat[d] = np.where(valid, net.control_latencies(ranks, peer), math.inf)
    return lat


def make_plan(groups, net: Network, nbytes: float, lat: np.ndarray | None = None) -> Plan:
    """Activations travel over the hypercube of the whole world whatever the round's groups (the engine's
    activation scope), so a group with no ready member starts its round as soon as an activation reaches
    it; the groups decide only who waits for whom in the reduction."""
    sizes = np.array([len(g) for g in groups])
    P = int(sizes.sum())
    order = np.fromiter((r for g in groups for r in g), dtype=int, count=P)
    gid = np.empty(P, dtype=int)
    gid[order] = np.repeat(np.arange(len(groups)), sizes)
    offsets = np.concatenate([[0], np.cumsum(sizes[:-1])]).astype(int)
    cost = net.groups_allreduce(groups, nbytes)  # the round's groups run at once: they share nodes' NICs
    return Plan(gid, order, offsets, hypercube_latencies(P, net) if lat is None else lat, cost)


def activate(plan: Plan, free: np.ndarray, self_key: np.ndarray) -> np.ndarray:
    """Start times of a group round: ``start_j = max(free_j, min(request_j, first activation at j))``,
    activations travelling one hypercube hop per control latency from each rank that starts.

    The fixed point from above of that equation (a shortest path whose nodes forward only once free), reached
    by relaxing the hypercube's edges one dimension at a time, all ranks at once: along dimension ``d`` a
    rank's neighbour is the rank with bit ``d`` flipped, i.e. the other half of axis 1 of the ranks viewed as
    ``[2**D / 2**(d+1), 2, 2**d]``, so a sweep costs ``D`` vector operations over the ranks and no gather.
    Sweeps repeat until one changes nothing. Every relaxation keeps the iterate at or above the fixed point,
    and a sweep that changes nothing is a fixed point of every edge at once: the result is the one the
    edge-by-edge (Bellman-Ford) iteration reaches, at ``O(P log P)`` per sweep, and usually two sweeps."""
    P = len(self_key)
    dims, size = plan.lat.shape
    if not dims:
        return np.asarray(self_key, dtype=float)
    key = np.full(size, math.inf)
    key[:P] = self_key
    gate = np.zeros(size)
    gate[:P] = free
    via = np.empty(size)
    changed = True
    while changed:
        changed = False
        for d in range(dims):
            # (the neighbour's key plus the edge's latency, written in place: a sweep is numpy calls more
            # than work at 1,024 ranks)
            halves = (-1, 2, 1 << d)
            np.add(key.reshape(halves)[:, ::-1, :], plan.lat[d].reshape(halves), out=via.reshape(halves))
            np.maximum(gate, via, out=via)
            better = via < key
            if better.any():
                key = np.where(better, via, key)
                changed = True
    return key[:P]


def _checked_state(cfg: SimConfig, schedule: RoundSchedule) -> SimState:
    """The run's state for :func:`wait_avoiding`, once the schedule is known to fit the engine and the run."""
    if schedule.period < 1:
        raise ValueError(
            f"the wait-avoiding engine needs synchronous rounds (period >= 1), got {schedule.period}"
        )
    run = SimState(cfg, schedule.period)
    if schedule.last != run.rounds:
        raise ValueError(f"the schedule's last round {schedule.last} is not the simulation's {run.rounds}")
    return run


class _Staleness:
    """The staleness of what each rank contributed to a round (WaitAvoidingAllreduce._staleness): how many
    rounds ago the buffer a round took from it was first used, summed over the answered requests."""

    def __init__(self, world_size: int):
        self.cur = np.ones(world_size, dtype=int)  # first round that uses the posted buffer (0: none yet)
        self.prev = np.ones(world_size, dtype=int)  # ... of the buffer before it
        self.max = np.zeros(world_size, dtype=int)  # the stalest contribution since the rank's last answer
        self.total = 0

    def post(self, idx: np.ndarray) -> None:
        """Ranks ``idx`` (indices or a mask) post a new buffer."""
        # the buffer posted now follows the newest one a round used (a post no round used fresh keeps the
        # one before it: 0 would date it to round 0, an age of r)
        self.prev[idx] = np.where(self.cur[idx] == 0, self.prev[idx], self.cur[idx])
        self.cur[idx] = 0

    def used(self, r: int, fresh: np.ndarray) -> None:
        """Round ``r`` took each rank's posted buffer (``fresh``) or, posted after
        it started, the one before."""
        self.cur[fresh & (self.cur == 0)] = r
        self.max = np.maximum(self.max, r - np.where(fresh, self.cur, self.prev))

    def answered(self, idx: np.ndarray) -> None:
        """Ranks ``idx`` were answered: their stalest contribution since the last answer counts once."""
        self.total += int(self.max[idx].sum())
        self.max[idx] = 0


def wait_avoiding(
    cfg: SimConfig,
    plan_of: Callable[[int], Plan],
    schedule: RoundSchedule,
    world_cost: float,
    initiator: Callable[[int], int] | None = None,
    in_order: bool = False,
    post_at_request: bool = False,
) -> SimResult:
    """The protocol of :class:`wagma_bench.comm.wait_avoiding.WaitAvoidingAllreduce`, round by round.

    ``initiator(r)``: the only rank whose request activates group round ``r`` (None: any member's).
    ``in_order`` (eager-SGD; WAGMA with ``catch_up=replay``): a rank asks for its next round in order -- one
    round per local step, a round its progress thread already completed passively answers at once; without
    it (WAGMA ``catch_up=skip``) a rank is answered by the round in flight that started after its post,
    else by the next round (so it skips rounds it joined passively). ``post_at_request`` (eager): the rank
    posts its fresh gradient right before asking; otherwise (WAGMA) it posts its model after the update.
    """
    run = _checked_state(cfg, schedule)
    P, inf = run.P, math.inf
    outer_every, outer_s = outer_cost(cfg)  # WAGMA-SGD: at (a multiple of) the synchronous rounds
    if P == 1:
        return _lockstep(cfg, run.sync_period, lambda run_, r, ready: ready)
    k = np.zeros(P, dtype=int)  # local step of the pending request
    t_post = np.zeros(P)  # time of the last post
    t_req = run.compute[:, 0] + run.delay[:, 0]
    resume = np.zeros(P)  # when each compute thread continues after its last answer
    done = np.zeros(P)  # progress thread free (round r-1 done)
    stale = _Staleness(P)
    answered = np.zeros(P, dtype=int)
    passive_rounds = 0
    ranks = np.arange(P)
    for r in range(1, run.rounds + 1):
        run.tick("rounds", (r - 1) / run.rounds)
        if post_at_request:  # eager posts its fresh gradient right before asking
            stale.post(t_req > t_post)
            t_post = np.maximum(t_post, t_req)
        if schedule.is_sync(r):  # every period-th round and the last (the engine's rule)
            start = np.maximum(done, t_req)
            end = np.full(
                P, start.max() + world_cost + (outer_s if outer_every and r % outer_every == 0 else 0.0)
            )
            target = np.ones(P, dtype=bool)
        else:
            plan = plan_of(r)
            can = np.ones(P, dtype=bool) if initiator is None else ranks == initiator(r)
            start = activate(plan, done, np.where(can, np.maximum(done, t_req), inf))
            end = (np.maximum.reduceat(start[plan.order], plan.offsets) + plan.cost)[plan.gid]
            active = t_req <= start
            target = (
                np.ones(P, dtype=bool)
                if in_order
                else active | ((start >= t_post) & (start <= t_req) & (t_req < end))
            )
            passive_rounds += int((~active).sum())
        stale.used(r, fresh=start >= t_post)
        done = end
        idx = np.nonzero(target)[0]
        answer = np.maximum(end, t_req)  # (WAGMA's targets never end before their request)
        run.wait[idx] += answer[idx] - t_req[idx]
        answered[idx] += 1
        stale.answered(idx)
        resume[idx] = answer[idx] + run.overhead
        if not post_at_request:  # WAGMA posts its updated model after the update
            t_post[idx] = resume[idx]
            stale.post(idx)
        k[idx] += 1
        if run.is_control(r):  # control rounds are synchronous rounds: every rank was answered
            resume = run.barrier(resume)
            if r == run.rounds:
                break
        kk = np.minimum(k[idx], run.compute.shape[1] - 1)
        t_req[idx] = resume[idx] + run.compute[idx, kk] + run.delay[idx, kk]
    return run.result(
        float(resume.max()),
        answered,
        staleness=stale.total / max(1, answered.sum()),
        passive_share=passive_rounds / max(1, P * run.rounds),
    )


@simulates("wagma")
def sim_wagma(cfg: SimConfig) -> SimResult:
    P = cfg.world_size
    schedule = WagmaSchedule(P, cfg.settings.group_size, cfg.settings.tau, last=run_rounds(cfg))
    lat = hypercube_latencies(P, cfg.network)
    plans = [
        make_plan(schedule.stage(k + 1), cfg.network, cfg.workload.model_bytes, lat)
        for k in range(schedule.stages)
    ]
    catch_up = cfg.settings.catch_up
    res = wait_avoiding(
        cfg,
        lambda r: plans[schedule.stage_index(r)],
        schedule,
        cfg.network.world_allreduce(P, cfg.workload.model_bytes),
        in_order=catch_up == "replay",
    )
    res.extra["group_size"] = schedule.group_size
    return res


@simulates("eager")
def sim_eager(cfg: SimConfig) -> SimResult:
    P = cfg.world_size
    mode, sync_every = cfg.settings.mode, sync_period(cfg)
    plan = make_plan((tuple(range(P)),), cfg.network, cfg.workload.model_bytes)
    initiator = None
    if mode == "majority":

        def initiator(r: int) -> int:
            return random_initiator(P, r, seed=cfg.seed)

    schedule = FixedSchedule(P, period=sync_every, last=run_rounds(cfg))
    res = wait_avoiding(
        cfg,
        lambda r: plan,
        schedule,
        cfg.network.world_allreduce(P, cfg.workload.model_bytes),
        initiator,
        in_order=True,
        post_at_request=True,
    )
    res.extra["mode"] = mode
    return res


# Each optimizer's spec -> the model of its communication (``@simulates``), in OPTIMIZER_SPECS' order, the one
# table of the optimizers. Keyed by the spec, not the algorithm class, so that the simulator imports no torch.
# An optimizer with no model is not simulated (tests/test_conformance.py names what to add).
SIMULATIONS: dict[type[AlgorithmSpec], Callable[[SimConfig], SimResult]] = {
    spec: _MODELS[name] for name, spec in OPTIMIZER_SPECS.items() if name in _MODELS
}


def simulated_optimizers() -> list[str]:
    """The ``optimizer=`` names the simulator models, in the registry's order."""
    return [name for name, spec in OPTIMIZER_SPECS.items() if spec in SIMULATIONS]


def simulate(cfg: SimConfig) -> SimResult:
    """Simulate ``cfg.steps`` rounds of ``cfg.optimizer`` on ``cfg.world_size`` workers."""
    return SIMULATIONS[OPTIMIZER_SPECS[cfg.optimizer]](cfg)
