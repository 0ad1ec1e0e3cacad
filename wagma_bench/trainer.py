"""The one training loop, shared by every workload and optimizer.

Per step: next batch, forward/backward, injected straggler delay, ``algo.step()`` (combine across ranks
and apply the local update). Evaluation, checkpoints, stop decisions and the exchange of control flags
happen only at synchronisation points (rounds that are multiples of ``algo.sync_period``), where every
rank is known to be at the same round. The clock that every reported time is read from excludes
evaluation and checkpointing (and, after a requeue, the time spent in the queue).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from wagma_bench import __version__
from wagma_bench.checkpoint import Checkpointer
from wagma_bench.comm.base import Comm
from wagma_bench.config import RunConfig
from wagma_bench.events import SUMMARY, StepLog, read_jsonl, summarize, write_json_atomic
from wagma_bench.imbalance import make_imbalance
from wagma_bench.loggers import event_log_for_run
from wagma_bench.mlperf import try_write_mllog
from wagma_bench.optim import get_optimizer
from wagma_bench.progress import Progress
from wagma_bench.schedules import control_period, lr_at, peak_lr, round_up
from wagma_bench.slurm_util import EXIT_SIGNALS, REQUEUE_SIGNALS, requeue_job
from wagma_bench.workloads import get_workload


@dataclass
class Clock:
    """Training time: wall time minus paused spans (evaluation, checkpoints)."""

    train_s: float = 0.0
    eval_s: float = 0.0
    wall_s: float = 0.0
    _mark: float = field(default_factory=time.perf_counter)
    _wall_mark: float = field(default_factory=time.perf_counter)

    def start(self) -> None:
        """(Re)start measuring from now; spans before (set-up, time in a queue) are not counted."""
        self._mark = self._wall_mark = time.perf_counter()

    def tick(self) -> None:
        now = time.perf_counter()
        self.train_s += now - self._mark
        self.wall_s += now - self._wall_mark
        self._mark = self._wall_mark = now

    def paused(self, into: str | None = None):
        clock = self

        class _Pause:
            def __enter__(self):
                clock.tick()

            def __exit__(self, *exc):
                now = time.perf_counter()
                if into == "eval":
                    clock.eval_s += now - clock._mark
                clock.wall_s += now - clock._wall_mark
                clock._mark = clock._wall_mark = now

        return _Pause()


def make_local_optimizer(train):
    """Factory of the rank-local update rule. ``train.grad_clip`` clips the gradient norm right before
    every local step, i.e. after the algorithm combined gradients (the averaged gradient for
    Allreduce-SGD, as DD-PPO does; the local gradient for model-averaging algorithms)."""

    def build(params):
        params = list(params)
        if train.local_optimizer == "sgd":
            opt = torch.optim.SGD(params, lr=train.lr, momentum=train.momentum, nesterov=train.nesterov,
                                  weight_decay=train.weight_decay)
        else:
            opt = torch.optim.AdamW(params, lr=train.lr, betas=tuple(train.adam_betas),
                                    weight_decay=train.weight_decay)
        if train.grad_clip:
            def clip(*_):
                torch.nn.utils.clip_grad_norm_(params, train.grad_clip)

            opt.register_step_pre_hook(clip)
        return opt

    return build


def config_hash(raw: dict) -> str:
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()[:12]


def git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5, check=False)
        sha = out.stdout.strip()
        return sha if out.returncode == 0 and sha else None
    except (OSError, subprocess.SubprocessError):
        return None


def versions(comm: Comm) -> dict:
    out = {"wagma_bench": __version__, "torch": torch.__version__, "comm": comm.backend_name}
    if comm.backend_name == "nccl":
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    elif comm.backend_name == "mpi":
        from mpi4py import MPI

        out["mpi"] = MPI.Get_library_version().splitlines()[0].strip()
        out["mpi4py"] = __import__("mpi4py").__version__
    return out


class EvalModel:
    """Builds the model that evaluation sees: rank 0's local model, or the global average."""

    def __init__(self, model, mode: str, models_identical: bool, comm: Comm):
        # Buffers (BatchNorm statistics) are each rank's own under every optimizer: a model with float
        # buffers is evaluated through rank 0's broadcast state even when the parameters are identical.
        identical = models_identical and not any(b.is_floating_point() for b in model.buffers())
        self.model, self.mode, self.identical, self.comm = model, mode, identical, comm
        self._copy = None

    def get(self):
        if self.identical:  # rank 0's model is every rank's, and so is their average: no copy, no collective
            return self.model
        if self._copy is None:
            self._copy = copy.deepcopy(self.model)
        state = self.model.state_dict()
        floats = [k for k, v in state.items() if v.is_floating_point()]
        flat = torch.cat([state[k].reshape(-1) for k in floats])
        if self.mode == "average":
            self.comm.allreduce(flat, op="mean")
        else:
            self.comm.broadcast(flat, src=0)
        offset, target = 0, self._copy.state_dict()
        for k in floats:
            n = target[k].numel()
            target[k].copy_(flat[offset:offset + n].view_as(target[k]))
            offset += n
        return self._copy


class Preemption:
    """SIGUSR1 / SIGUSR2 / SIGTERM set a flag; the loop saves a checkpoint at the next synchronisation point.

    After a requeue signal (USR1: our sbatch scripts' warning before the time limit; USR2: submitit's) rank 0
    then requeues the job; after TERM the run just ends (see :mod:`wagma_bench.slurm_util` for which signal
    reaches whom).
    """

    def __init__(self):
        self.signal: int | None = None
        for sig in (*REQUEUE_SIGNALS, *EXIT_SIGNALS):
            try:
                signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (tests)
                pass

    def _handle(self, signum, frame):
        self.signal = signum

    @property
    def requeue(self) -> bool:
        return self.signal in REQUEUE_SIGNALS


def run_start_fields(cfg: RunConfig, comm: Comm, workload, algo, model: torch.nn.Module, **derived) -> dict:
    """The ``run_start`` event's metadata: what ran, where, and every value derived from the config that a
    reader would otherwise recompute (``derived``: the trainer's schedule, as it computed it).

    Collective (the host names are gathered): every rank calls it, rank 0 logs it. Readers take these
    through :class:`wagma_bench.events.RunStart`, which also reads runs logged before a field existed."""
    world = comm.world_size
    hosts = sorted(set(_hostnames(comm)))
    return dict(
        workload=cfg.workload.name, data=cfg.data.name, optimizer=algo.name, imbalance=cfg.imbalance.name,
        world_size=world, seed=cfg.seed, metric=workload.metric_name, target=cfg.eval.target,
        global_batch_size=cfg.train.batch_size * world, train_samples=workload.train_size,
        eval_samples=workload.eval_size, sync_period=algo.sync_period,
        # only group-averaging optimizers (WAGMA) have a group size: the effective one, after the default rule
        group_size=getattr(algo, "group_size", None),
        model_params=sum(p.numel() for p in model.parameters()), nodes=len(hosts),
        ranks_per_node=math.ceil(world / len(hosts)), **derived, config_hash=config_hash(cfg.raw),
        git_sha=git_sha(), versions=versions(comm), hosts=hosts, config=cfg.raw)


def train(cfg: RunConfig, comm: Comm, run_dir: Path) -> dict | None:
    """Run one rank of a training run; rank 0 returns the summary."""
    rank, world = comm.rank, comm.world_size
    preempt = Preemption()  # first: a USR1/TERM during set-up must not kill the rank
    init_time_ms = round(time.time() * 1000, 3)  # MLPerf's init_start: set-up time is logged, not trained
    torch.manual_seed(cfg.seed)
    workload = get_workload(cfg.workload.name)(cfg, rank, world, comm.device)
    workload.attach(comm)
    model = workload.build_model().to(comm.device)
    algo_cls = get_optimizer(cfg.optimizer.name)
    algo = algo_cls(cfg.optimizer, model, make_local_optimizer(cfg.train), comm, seed=cfg.seed)
    imbalance = make_imbalance(cfg.imbalance, cfg.seed)
    eval_mode = algo.default_eval_model if cfg.eval.model == "auto" else cfg.eval.model
    evaluator = EvalModel(model, eval_mode, algo.models_identical, comm)

    sync = algo.sync_period
    spe = workload.steps_per_epoch()
    total = round_up(min(cfg.train.max_steps or 10**12, math.ceil(cfg.train.epochs * spe)), sync)
    eval_every = round_up(cfg.eval.every_steps or max(1, round(cfg.eval.every_epochs * spe)), sync)
    control_every = control_period(sync)
    peak = peak_lr(cfg.train.lr, cfg.train.batch_size, world, cfg.train.lr_reference_batch)
    warmup_start = cfg.train.lr if cfg.train.warmup_start_lr is None else cfg.train.warmup_start_lr
    schedule = {"peak": peak, "start": warmup_start, "warmup_epochs": cfg.train.warmup_epochs,
                "schedule": cfg.train.schedule, "epochs": cfg.train.epochs,
                "milestones": cfg.train.milestones, "decay": cfg.train.decay}

    clock = Clock()
    ckpt = Checkpointer(run_dir, rank, cfg.raw)
    state = {"local_step": 0, "samples_local": 0, "next_eval": eval_every, "best": None}
    resumed = ckpt.agree(comm, cfg.checkpoint.resume)  # verified set, same decision on every rank
    if resumed:
        saved = ckpt.load(model, algo)
        state.update(saved["state"])
        clock.train_s, clock.eval_s, clock.wall_s = saved["clock"]
    else:
        algo.broadcast_initial_model()
        if rank == 0:  # an earlier attempt's summary and checkpoints must not stand for this one
            (run_dir / SUMMARY).unlink(missing_ok=True)
            ckpt.discard_earlier_attempt()
    # Fresh: new logs; resumed: the logs cut back to the checkpoint (no step or event twice).
    events = event_log_for_run(cfg, run_dir, rank, resume_step=algo.round if resumed else None)
    steps = StepLog(run_dir, rank, resume_step=state["local_step"] if resumed else None)
    comm.barrier()
    clock.start()
    if resumed:
        events.emit("run_resume", None, step=algo.round, epoch=round(algo.round / spe, 4), train_s=clock.train_s,
                    init_time_ms=init_time_ms)
    else:
        events.emit("run_start", None, **run_start_fields(
            cfg, comm, workload, algo, model, eval_model=eval_mode, init_time_ms=init_time_ms, steps_total=total,
            steps_per_epoch=spe, eval_every=eval_every, control_every=control_every, base_lr=peak))
    if rank == 0 and comm.backend_name == "mpi":  # on a cluster: is it the system MPI, not a pip wheel?
        print(f"wagma-bench: MPI library: {versions(comm)['mpi']}", flush=True)

    progress = Progress(cfg.logger.progress if rank == 0 else "off", total, cfg.logger.log_every_s,
                        f"{cfg.workload.name}/{algo.name} x{world}")
    batches = workload.batches(state["local_step"])
    # bf16: the forward (and so its backward) in bfloat16 where autocast deems it safe; weights, the update
    # and the communicated models/gradients stay fp32
    autocast = torch.autocast(comm.device.type, dtype=torch.bfloat16, enabled=cfg.train.precision == "bf16")
    diverged, status, last_ckpt, last_progress = False, None, clock.train_s, 0.0
    requeue = False
    last_compute_s = None

    def straggle(compute_s: float) -> float:
        """Sleep this step's injected delay (the imbalance model, given a compute time); return it."""
        delay_s = imbalance.delay(rank, world, state["local_step"], compute_s)
        if delay_s > 0:
            time.sleep(delay_s)
        return delay_s

    try:
        while status is None:
            # Each rank follows the schedule by its own data consumption (local steps): identical to the
            # round count for synchronous optimizers; wait-avoiding ranks may skip rounds.
            algo.set_lr(lr_at(state["local_step"] / spe, **schedule))
            # A straggler is late with its gradient: the injected delay comes before the computation (after
            # backward it would hide behind the gradient buckets already in flight). Models relative to the
            # compute time use the previous step's; the first step, which has none, sleeps after its own.
            first = last_compute_s is None
            delay_s = 0.0 if first else straggle(last_compute_s)
            t0 = time.perf_counter()  # step time includes loading the batch (or an RL rollout)
            batch = next(batches)
            algo.zero_grad()
            with autocast:
                loss, n = workload.forward(model, batch)
            loss.backward()
            compute_s = last_compute_s = time.perf_counter() - t0
            if first:
                delay_s = straggle(compute_s)
            info = algo.step()
            loss_value = float(loss.detach())
            diverged = diverged or not math.isfinite(loss_value)
            state["local_step"] += 1
            state["samples_local"] += n
            clock.tick()
            steps.record(step=state["local_step"], round=info.round, t=round(clock.train_s, 4),
                         compute_s=round(compute_s, 5), delay_s=round(delay_s, 5), comm_s=round(info.comm_s, 5),
                         samples=n, loss=round(loss_value, 5), staleness=info.staleness, **workload.step_stats())
            r = info.round
            if r % sync or (r % control_every and r < state["next_eval"] and r < total):
                continue
            # --- synchronisation point: every rank is at round r ---------------------------------
            steps.flush()
            want_ckpt = rank == 0 and clock.train_s - last_ckpt >= cfg.checkpoint.every_s
            over_time = rank == 0 and cfg.train.time_limit_s is not None and clock.train_s >= cfg.train.time_limit_s
            ctrl = torch.tensor([float(diverged), float(preempt.signal is not None), float(state["samples_local"]),
                                 float(want_ckpt), float(over_time), float(preempt.requeue)], dtype=torch.float64,
                                device=comm.device)
            comm.allreduce(ctrl, op="sum")
            ctrl = ctrl.cpu().tolist()
            samples = int(ctrl[2])
            meta = {"step": r, "epoch": round(r / spe, 4), "samples": samples,
                    "train_s": round(clock.train_s, 4)}
            if ctrl[0] > 0:
                status = "diverged"
                break
            if r >= state["next_eval"] or r >= total:
                with clock.paused("eval"):
                    t_eval = time.perf_counter()
                    metric = workload.evaluate(evaluator.get(), comm)
                    eval_took = time.perf_counter() - t_eval
                state["next_eval"] = r + eval_every
                state["best"] = metric if state["best"] is None else max(state["best"], metric)
                events.emit("eval_accuracy", metric, **meta, wall_s=round(clock.wall_s, 4),
                            eval_s=round(clock.eval_s, 4), eval_took_s=round(eval_took, 4), lr=algo_lr(algo),
                            **workload.eval_metadata())
                progress.update(r, f"{workload.metric_name}={metric:.4f} loss={loss_value:.3f}", force=True)
                if cfg.eval.target is not None and metric >= cfg.eval.target and cfg.eval.stop_at_target:
                    status = "completed"
            elif rank == 0 and clock.wall_s - last_progress >= cfg.logger.log_every_s:
                events.emit("progress", None, **meta, wall_s=round(clock.wall_s, 4), eval_s=round(clock.eval_s, 4))
                last_progress = clock.wall_s
                progress.update(r, f"loss={loss_value:.3f}")
            if status is None and r >= total:
                status = "completed"
            if status is None and ctrl[4] > 0:
                status = "time_limit"
            if ctrl[1] > 0 or ctrl[3] > 0:
                with clock.paused():
                    ckpt.save(model, algo, state, clock)
                last_ckpt = clock.train_s
                events.emit("checkpoint", None, **meta)
                if ctrl[1] > 0 and status is None:
                    status = "preempted"
                    requeue = ctrl[5] > 0
        final = {"step": algo.round, "samples": _global_samples(comm, state), "train_s": round(clock.train_s, 4),
                 "wall_s": round(clock.wall_s, 4), "eval_s": round(clock.eval_s, 4)}
        algo.close()
    except BaseException as err:
        if rank == 0:
            events.emit("run_stop", None, status="failed", error=f"{type(err).__name__}: {err}",
                        step=algo.round, train_s=round(clock.train_s, 4), wall_s=round(clock.wall_s, 4),
                        eval_s=round(clock.eval_s, 4), samples=state["samples_local"] * world)
            write_json_atomic(run_dir / SUMMARY, summarize(read_jsonl(events.path)))
            try_write_mllog(run_dir)
        events.close()
        raise
    finally:
        progress.close()
        steps.close()
    # A preempted run is suspended, to be resumed: only the real end writes the (one) run_stop.
    events.emit("run_suspend" if status == "preempted" else "run_stop", None, status=status, **final)
    summary = None
    if rank == 0:
        summary = summarize(read_jsonl(run_dir / "events.jsonl"))
        write_json_atomic(run_dir / SUMMARY, summary)
        try_write_mllog(run_dir, echo=cfg.logger.mllog)
    events.close()  # after the derived files: the W&B mirror logs them as an artifact
    if rank != 0:
        return None
    if requeue and not requeue_job():  # after the summary: the requeue ends this job's steps
        print(f"wagma-bench: preempted at step {final['step']} outside SLURM: checkpoint saved, no job to "
              f"requeue; run the same command again to resume from {run_dir}", flush=True)
    return summary


def algo_lr(algo) -> float:
    return float(algo.optimizer.param_groups[0]["lr"])


def _global_samples(comm: Comm, state: dict) -> int:
    t = torch.tensor([float(state["samples_local"])], dtype=torch.float64, device=comm.device)
    comm.allreduce(t, op="sum")
    return int(t.item())


def _hostnames(comm: Comm) -> list[str]:
    name = socket.gethostname().encode()[:64].ljust(64, b"\0")
    gathered = comm.allgather(torch.tensor(list(name), dtype=torch.uint8, device=comm.device))
    return [bytes(row.cpu().tolist()).rstrip(b"\0").decode(errors="replace") for row in gathered]
