"""The one training loop, shared by every workload and optimizer.

Per step: next batch, forward/backward (in micro-batches for an algorithm that computes in parts:
DropCompute), injected straggler delay, ``algo.step()`` (combine across ranks and apply the local update).
Evaluation, checkpoints, stop decisions and the exchange of control flags happen only at synchronisation
points (rounds that are multiples of ``algo.sync_period``, and the run's last round, ``algo.end_at``), where
every rank is known to be at the same round.
The clock that every reported time is read from excludes evaluation and checkpointing (and, after a requeue,
the time spent in the queue).

:meth:`Trainer.train` tells a run in one screen: start or resume, then ``train_step`` until a
synchronisation point, where the ranks exchange :class:`~wagma_bench.train.state.ControlFlags` in one
allreduce and decide to evaluate, checkpoint or stop; :meth:`Trainer.finalize` writes the last event and the
summary, for every end. What a checkpoint carries besides the model and the algorithm is a
:class:`~wagma_bench.train.state.TrainState`; the loop's other parts live in their layers: the plan
(:mod:`wagma_bench.config.plan`), signals (:mod:`wagma_bench.runtime.preemption`), the run's provenance
(:mod:`wagma_bench.record.provenance`).
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import torch

from wagma_bench.comm.base import Comm
from wagma_bench.config.plan import RunPlan
from wagma_bench.config.schedules import lr_at
from wagma_bench.config.schema import RunConfig, as_recorded
from wagma_bench.imbalance import make_imbalance
from wagma_bench.metric import metric
from wagma_bench.optim import get_optimizer
from wagma_bench.record.checkpoint import Checkpointer
from wagma_bench.record.cpu import thread_cpu_s
from wagma_bench.record.events import SUMMARY
from wagma_bench.record.loggers import event_log_for_run
from wagma_bench.record.progress import Progress
from wagma_bench.record.provenance import run_start_fields, versions
from wagma_bench.record.rundir import cancel_note
from wagma_bench.record.rundir import finalize as write_summary
from wagma_bench.record.steps import StepLog
from wagma_bench.runtime import partition, startup
from wagma_bench.runtime.preemption import Preemption
from wagma_bench.runtime.slurm import requeue_job
from wagma_bench.runtime.supervise import LAUNCHER_DIR_ENV, TERM_GRACE_S, lost_ranks
from wagma_bench.train.state import Clock, ControlFlags, EvalModel, TrainState, make_local_optimizer
from wagma_bench.workloads import get_workload


def train(cfg: RunConfig, comm: Comm, run_dir: Path, local_rank: int | None = None) -> dict | None:
    """Run one rank of a training run; rank 0 returns the summary. ``local_rank``: the rank's index on its
    host, as its launcher numbers it (None: the ranks of one host, numbered like the world)."""
    return Trainer(cfg, comm, run_dir, local_rank).train()


class Trainer:
    """One rank of a training run: set up here, then :meth:`train` runs it to its end."""

    def __init__(self, cfg: RunConfig, comm: Comm, run_dir: Path, local_rank: int | None = None):
        self.cfg, self.comm, self.run_dir = cfg, comm, run_dir
        self.rank, self.world = comm.rank, comm.world_size
        self.local_rank = self.rank if local_rank is None else local_rank
        self.preemption = Preemption()  # first: a USR1/TERM during set-up must not kill the rank
        self.init_time_ms = round(
            time.time() * 1000, 3
        )  # MLPerf's init_start: set-up time is logged, not trained
        torch.manual_seed(cfg.seed)
        self.workload = get_workload(cfg.workload.name)(cfg, self.rank, self.world, comm.device)
        self.goal = metric(self.workload.metric_name, cfg.eval.target)  # which way is better; reached
        startup.mark("data")
        self.workload.attach(comm)
        self.model = self.workload.build_model().to(comm.device)
        self.algo = get_optimizer(cfg.optimizer.name)(
            cfg.optimizer, self.model, make_local_optimizer(cfg.train), comm, seed=cfg.seed
        )
        self.imbalance = make_imbalance(cfg.imbalance, cfg.seed)
        self.eval_mode = self.algo.default_eval_model if cfg.eval.model == "auto" else cfg.eval.model
        self.evaluator = EvalModel(self.model, self.eval_mode, self.algo.models_identical, comm)
        # snapshots taken at grid rounds between synchronisation points are averaged (their models differ
        # there) unless the models are identical at every round or eval.model names a mode
        self.snapshot_mode = (
            cfg.eval.model
            if cfg.eval.model != "auto"
            else ("local" if self.algo.models_identical_every_round else "average")
        )
        # (grid round, model, samples, train_s, lr) of this rank at each grid round not yet evaluated
        self.snapshots: list[tuple[int, torch.Tensor, int, float, float]] = []
        self.plan = RunPlan.of(cfg, self.algo.sync_period, self.workload.steps_per_epoch(), self.world)
        self.algo.end_at(self.plan.total)  # its budget, a synchronisation point whatever the sync period
        self.clock = Clock()
        self.checkpointer = Checkpointer(run_dir, self.rank, as_recorded(cfg))
        self.state = TrainState(next_eval=self.plan.eval_every)
        # bf16: the forward (and so its backward) in bfloat16 where autocast deems it safe; weights, the
        # update and the communicated models/gradients stay fp32
        self.autocast = torch.autocast(
            comm.device.type, dtype=torch.bfloat16, enabled=cfg.train.precision == "bf16"
        )
        self.status: str | None = (
            None  # why the run ends: completed, diverged, time_limit, preempted, interrupted
        )
        self.requeue = False
        self.diverged = False  # this rank saw a non-finite loss (shared at the next control exchange)
        self.diverged_at: tuple[int, float] | None = (
            None  # (local step, loss) of this rank's first non-finite loss
        )
        self.stop_detail: str | None = None  # where and why a diverged run stopped (run_stop's error)
        self.loss = math.nan  # the last step's loss
        self.last_compute_s: float | None = None
        self.last_checkpoint_s = self.last_progress_s = 0.0
        self.startup_logged = False
        self.stop_reach_said = False  # whether a stop signal's reach was judged (say_if_stop_out_of_reach)

    def train(self) -> dict | None:
        """The story of a run: start or resume, then steps until a synchronisation point decides to stop."""
        resumed = self.start_or_resume()
        self.open_logs(resumed)
        batches = self.workload.batches(self.state.local_step)
        startup.mark("ready")
        try:
            self.stop_before_training()
            while self.status is None:
                r = self.train_step(batches)
                if self.rank == 0 and not self.startup_logged:
                    self.log_startup()
                if self.preemption.signal is not None and not self.stop_reach_said:
                    self.say_if_stop_out_of_reach(r)
                if not self.at_control_point(r):
                    self.snapshot_if_due(r)  # an evaluation grid round between synchronisation points
                    continue
                # --- synchronisation point: every rank is at round r ---------------------------------
                self.steps.flush()
                flags = self.control_flags().exchange(self.comm)
                if flags.diverged:
                    self.status, self.stop_detail = "diverged", self.where_diverged()
                    break
                meta = self.round_meta(r, flags)
                if self.should_evaluate(r):
                    self.evaluate(r, meta)
                elif self.should_report_progress():
                    self.report_progress(r, meta)
                self.status = self.status or self.stop_reason(r, flags)
                if self.should_checkpoint(flags):
                    self.checkpoint(meta)
                    if flags.preempted and self.status is None:  # stop after the checkpoint, to be resumed
                        self.status = "interrupted" if flags.interrupted else "preempted"
                        self.requeue = flags.requeue and not flags.interrupted
            counts = self.close_algorithm()
        except BaseException as err:  # a second Ctrl-C ends the run as interrupted, anything else as failed
            lost = lost_ranks(self.run_dir, self.rank, self.world, err)  # which hosts went, where it can tell
            self.finalize(
                "interrupted" if isinstance(err, KeyboardInterrupt) else "failed",
                self.counts_at_failure(),
                error=lost or err,
            )
            if lost is not None:
                raise lost from err
            raise
        finally:
            self.progress.close()
            self.steps.close()
        summary = self.finalize(self.status, counts, reason=self.stop_detail)
        if self.requeue and self.rank == 0:
            self.requeue_or_explain(counts["round"])
        return summary

    # --- start ---------------------------------------------------------------------------------------
    def start_or_resume(self) -> bool:
        """Load the latest verified checkpoint set (the same decision on every rank) or start fresh."""
        resumed = self.checkpointer.agree(self.comm, self.cfg.checkpoint.resume)
        if resumed:
            saved = self.checkpointer.load(self.model, self.algo)
            self.state = TrainState.from_dict({**self.state.to_dict(), **saved["state"]})
            self.clock.train_s, self.clock.eval_s, self.clock.wall_s = saved["clock"]
            self.last_checkpoint_s = self.clock.train_s  # checkpoint.every_s counts from the resumed one
        else:
            self.algo.broadcast_initial_model()
            if self.rank == 0:  # an earlier attempt's summary and checkpoints must not stand for this one
                (self.run_dir / SUMMARY).unlink(missing_ok=True)
                self.checkpointer.discard_earlier_attempt()
        return resumed

    def open_logs(self, resumed: bool) -> None:
        """Open the event and step logs, start the clock, log run_start (or run_resume), show progress."""
        cfg, algo = self.cfg, self.algo
        # Fresh: new logs; resumed: the logs cut back to the checkpoint (no step or event twice).
        self.events = event_log_for_run(
            cfg, self.run_dir, self.rank, resume_step=algo.round if resumed else None
        )
        self.steps = StepLog(self.run_dir, self.rank, resume_step=self.state.local_step if resumed else None)
        self.comm.barrier()
        self.clock.start()
        if resumed:
            self.events.emit(
                "run_resume",
                None,
                round=algo.round,
                epoch=self.epoch(algo.round),
                train_s=self.clock.train_s,
                init_time_ms=self.init_time_ms,
            )
        else:
            plan = self.plan
            self.events.emit(
                "run_start",
                None,
                **run_start_fields(
                    cfg,
                    self.comm,
                    self.workload,
                    algo,
                    self.model,
                    local_rank=self.local_rank,
                    eval_model=self.eval_mode,
                    init_time_ms=self.init_time_ms,
                    steps_total=plan.total,
                    steps_per_epoch=plan.steps_per_epoch,
                    eval_every=plan.eval_every,
                    control_every=plan.control_every,
                    base_lr=plan.lr_schedule["peak"],
                    ends_by=plan.ends_by,
                ),
            )
        if self.rank == 0:
            print(f"wagma-bench: {self.plan.budget_line(cfg)}", flush=True)
            print(
                "wagma-bench: "
                + self.checkpointer.size_line(
                    self.model, algo, self.state.to_dict(), self.clock, cfg.checkpoint.every_s
                ),
                flush=True,
            )
        if (
            self.rank == 0 and self.comm.backend_name == "mpi"
        ):  # on a cluster: the system MPI, not a pip wheel?
            print(f"wagma-bench: MPI library: {versions(self.comm)['mpi']}", flush=True)
        self.progress = Progress(
            cfg.logger.progress if self.rank == 0 else "off",
            self.plan.total,
            cfg.logger.log_every_s,
            f"{cfg.workload.name}/{algo.name} x{self.world}",
        )

    def stop_before_training(self) -> None:
        """A Ctrl-C or a preemption signal that reached any rank while the ranks started (collective): the
        run stops before its first step, with nothing to checkpoint (a resume would start where it stands)."""
        flags = self.control_flags().exchange(self.comm)
        if flags.preempted:
            self.status = "interrupted" if flags.interrupted else "preempted"
            self.requeue = flags.requeue and not flags.interrupted

    def say_if_stop_out_of_reach(self, r: int) -> None:
        """Rank 0 of a local launcher's run, once a stop signal came: where the next synchronisation point is
        further away than the launcher's grace (its ranks are killed then, without a checkpoint), say so now
        rather than leave its promise of a checkpoint standing."""
        self.stop_reach_said = True
        if self.rank != 0 or r == 0 or not os.environ.get(LAUNCHER_DIR_ENV):
            return
        at = self.plan.next_control_after(r, self.state.next_eval)
        eta_s = (at - r) * self.clock.train_s / r
        if eta_s > TERM_GRACE_S:
            print(
                f"wagma-bench: no synchronisation point within the grace: the next is at step {at}, about "
                f"{eta_s:.0f} s away, and ranks still running {TERM_GRACE_S:g} s after the signal are "
                "killed; the run will stop without a checkpoint",
                file=sys.stderr,
                flush=True,
            )

    def log_startup(self) -> None:
        """Where this attempt's start went (:mod:`wagma_bench.runtime.startup`),
        once its first step is done."""
        startup.mark("first_step")
        self.events.emit("startup", None, **startup.phases())
        self.startup_logged = True

    # --- the step ------------------------------------------------------------------------------------
    def train_step(self, batches) -> int:
        """One local step (learning rate, straggler delay, batch, forward/backward, the algorithm's step),
        logged to the step log; returns the round this rank has completed."""
        state = self.state
        # Each rank follows the schedule by its own data consumption (local steps): identical to the round
        # count for synchronous optimizers; wait-avoiding ranks may skip rounds.
        self.algo.set_lr(lr_at(state.local_step / self.plan.steps_per_epoch, **self.plan.lr_schedule))
        # A straggler is late with its gradient: the injected delay comes before the computation (after
        # backward it would hide behind the gradient buckets already in flight), or, for an algorithm that
        # computes in micro-batches, is spread over them (see compute). Models relative to the compute time
        # use the previous step's; the first step, which has none, sleeps after its own.
        first = self.last_compute_s is None
        delay_s = (
            0.0
            if first
            else self.imbalance.delay(self.rank, self.world, state.local_step, self.last_compute_s)
        )
        spread = self.algo.computes_in_parts
        if delay_s > 0 and not spread:
            time.sleep(delay_s)
        t0 = time.perf_counter()  # step time includes loading the batch (or an RL rollout)
        cpu0 = time.thread_time()  # this thread's CPU: compute_s minus it is time it waited for a core
        batch = next(batches)
        self.algo.zero_grad()
        loss, n, stats, slept_s = self.compute(batch, delay_s if spread else 0.0, t0)
        compute_s = self.last_compute_s = time.perf_counter() - t0 - slept_s
        compute_cpu_s = time.thread_time() - cpu0
        if spread:
            delay_s = slept_s  # what a rank that stopped early did not sleep was never spent
        if first:
            delay_s = self.straggle(compute_s)
        info = self.algo.step()
        self.loss = float(loss.detach())
        state.local_step += 1
        if not math.isfinite(self.loss) and self.diverged_at is None:
            self.diverged, self.diverged_at = True, (state.local_step, self.loss)
        state.samples_local += n
        self.clock.tick()
        partition.stepped()  # the network carried this step's collectives (a multi-host job's watch)
        self.steps.record(
            local_step=state.local_step,
            round=info.round,
            t=round(self.clock.train_s, 4),
            compute_s=round(compute_s, 5),
            compute_cpu_s=round(compute_cpu_s, 5),
            delay_s=round(delay_s, 5),
            comm_s=round(info.comm_s, 5),
            samples=n,
            loss=round(self.loss, 5),
            staleness=info.staleness,
            **stats,
            **info.extra,
        )
        return info.round

    def compute(self, batch, delay_s: float, t0: float) -> tuple[torch.Tensor, int, dict, float]:
        """Forward and backward of ``batch``: the loss, its samples, the workload's step statistics and the
        seconds slept. For an algorithm that ``computes_in_parts``: of its M parts one after another as long
        as the algorithm asks for them (DropCompute stops at its threshold), the injected ``delay_s`` slept in
        M equal parts, one before each computed part: a straggler is slow in every micro-batch, so what it
        does not compute it does not sleep either, as with real slow compute. The loss is the sample-weighted
        mean over the computed parts."""
        if not self.algo.computes_in_parts:
            with self.autocast:
                loss, n = self.workload.forward(self.model, batch)
            loss.backward()
            return loss, n, self.workload.step_stats(), 0.0
        parts, total, n, stats, slept_s = self.algo.micro_batches, 0.0, 0, {}, 0.0
        for i, part in enumerate(self.workload.split(batch, parts)):
            if i and not self.algo.start_micro_batch(
                time.perf_counter() - t0
            ):  # the first part is always computed
                break
            if delay_s > 0:
                time.sleep(delay_s / parts)
                slept_s += delay_s / parts
            with self.autocast:
                loss, samples = self.workload.forward(self.model, part)
            (loss * self.algo.loss_weight(samples)).backward()
            self.algo.end_micro_batch(time.perf_counter() - t0)
            total, n = total + float(loss.detach()) * samples, n + samples
            for key, value in self.workload.step_stats().items():
                stats[key] = stats.get(key, 0) + value
        return torch.tensor(total / max(n, 1)), n, stats, slept_s

    def straggle(self, compute_s: float) -> float:
        """Sleep this step's injected delay (the imbalance model, given a compute time); return it."""
        delay_s = self.imbalance.delay(self.rank, self.world, self.state.local_step, compute_s)
        if delay_s > 0:
            time.sleep(delay_s)
        return delay_s

    # --- synchronisation points ----------------------------------------------------------------------
    def at_control_point(self, r: int) -> bool:
        """Round r is a synchronisation point where the ranks exchange control flags (the plan's rule)."""
        return self.plan.is_control(r, self.state.next_eval)

    def control_flags(self) -> ControlFlags:
        """This rank's flags (the time-based ones are rank 0's: its clock decides for all)."""
        clock, limit = self.clock, self.cfg.train.time_limit_s
        return ControlFlags(
            diverged=self.diverged,
            preempted=self.preemption.signal is not None,
            samples=self.state.samples_local,
            checkpoint_due=self.rank == 0
            and clock.train_s - self.last_checkpoint_s >= self.cfg.checkpoint.every_s,
            over_time=self.rank == 0 and limit is not None and clock.train_s >= limit,
            requeue=self.preemption.requeue,
            interrupted=self.preemption.interrupts > 0,
        )

    def where_diverged(self) -> str:
        """Where the run diverged, the same text on every rank (collective): the rank whose loss became
        non-finite at the earliest local step (the lowest such rank on a tie)."""
        step, loss = self.diverged_at or (math.inf, math.nan)
        rows = self.comm.allgather(
            torch.tensor([float(step), loss], dtype=torch.float64, device=self.comm.device)
        )
        rows = rows.cpu().tolist()
        rank = min(range(len(rows)), key=lambda i: (rows[i][0], i))
        step, loss = rows[rank]
        return (
            f"diverged: the training loss became {loss} on rank {rank} at step {int(step)} (a non-finite "
            "loss; lower train.lr, or set train.grad_clip)"
        )

    def should_evaluate(self, r: int) -> bool:
        return r >= self.state.next_eval or r >= self.plan.total

    def snapshot_if_due(self, r: int) -> None:
        """After round r, not a synchronisation point: for each grid round up to r not yet held, keep this
        rank's model (a local copy, off the clock), its samples and its training time; they are evaluated at
        the next synchronisation point, dated at the grid round. No communication, no barrier: what is
        measured is unchanged. (A rank that skipped rounds, WAGMA-SGD's catch_up=skip, keeps its first model
        past the grid round.)"""
        start = self.snapshots[-1][0] + self.plan.eval_every if self.snapshots else self.state.next_eval
        due = range(start, r + 1, self.plan.eval_every)
        if not due:
            return
        with self.clock.paused("eval"):
            model = self.evaluator.snapshot()
            train_s = self.clock.train_s  # when this rank finished round r
            for i, g in enumerate(due):
                self.snapshots.append(
                    (
                        g,
                        model if i == 0 else model.clone(),
                        self.state.samples_local,
                        train_s,
                        algo_lr(self.algo),
                    )
                )

    def evaluate(self, r: int, meta: dict) -> None:
        """At synchronisation point r: evaluate every grid round since the last evaluation (snapshots, each
        dated at its grid round: its samples, and the training time at which the last rank finished it), then
        round r itself when it is a grid round or the run's end. Off the training clock; reaching the target
        ends the run (at its first evaluation that reaches it)."""
        held = {g: rest for g, *rest in self.snapshots}
        self.snapshots = []
        points = list(range(self.state.next_eval, r + 1, self.plan.eval_every))
        if r >= self.plan.total and (not points or points[-1] != r):
            points.append(r)
        now = (None, self.state.samples_local, self.clock.train_s, algo_lr(self.algo))
        mine = [held.get(g, now) for g in points]  # a grid round this rank skipped: its model at r
        stamps = self.grid_stamps([(samples, train_s) for _, samples, train_s, _ in mine])
        self.state.next_eval = self.plan.next_eval_after(r)
        for g, (model, _, _, lr), (samples, train_s) in zip(points, mine, stamps, strict=True):
            if g < r and model is None:
                model = self.evaluator.snapshot()
            self.evaluate_one(
                g,
                model,
                {
                    **meta,
                    "round": g,
                    "epoch": self.epoch(g),
                    "samples": samples,
                    "train_s": train_s,
                    "lr": lr,
                },
            )
            if self.status is not None:
                break

    def grid_stamps(self, mine: list[tuple[int, float]]) -> list[tuple[int, float]]:
        """Per evaluated round, from every rank's (samples, training time) there: the samples of all ranks and
        the latest training time (when the last rank finished that round). A collective."""
        local = torch.tensor(mine, dtype=torch.float64, device=self.comm.device).reshape(-1)
        rows = self.comm.allgather(local).cpu().reshape(self.world, len(mine), 2)
        return [
            (int(s), round(float(t), 4))
            for s, t in zip(rows[:, :, 0].sum(0).tolist(), rows[:, :, 1].max(0).values.tolist(), strict=True)
        ]

    def evaluate_one(self, g: int, snapshot: torch.Tensor | None, meta: dict) -> None:
        """Evaluate the model of round g (this rank's ``snapshot`` of it, or the current model), log
        eval_accuracy; reaching the target ends the run."""
        with self.clock.paused("eval"):
            t_eval = time.perf_counter()
            model = (
                self.evaluator.get() if snapshot is None else self.evaluator.get(snapshot, self.snapshot_mode)
            )
            metric = self.workload.evaluate(model, self.comm)
            eval_took = time.perf_counter() - t_eval
        state, cfg = self.state, self.cfg
        if self.goal.better(metric, state.best):
            state.best = metric
        self.events.emit(
            "eval_accuracy",
            metric,
            **meta,
            wall_s=round(self.clock.wall_s, 4),
            eval_s=round(self.clock.eval_s, 4),
            eval_took_s=round(eval_took, 4),
            **self.workload.eval_metadata(),
        )
        self.progress.update(g, f"{self.workload.metric_name}={metric:.4f} loss={self.loss:.3f}", force=True)
        if cfg.eval.stop_at_target and self.goal.reached(metric, meta.get("train_s"), cfg.train.time_limit_s):
            self.status = "completed"

    def should_report_progress(self) -> bool:
        return self.rank == 0 and self.clock.wall_s - self.last_progress_s >= self.cfg.logger.log_every_s

    def report_progress(self, r: int, meta: dict) -> None:
        self.events.emit(
            "progress", None, **meta, wall_s=round(self.clock.wall_s, 4), eval_s=round(self.clock.eval_s, 4)
        )
        self.last_progress_s = self.clock.wall_s
        self.progress.update(r, f"loss={self.loss:.3f}")

    def stop_reason(self, r: int, flags: ControlFlags) -> str | None:
        """Why the run ends at round r when nothing ended it before: its length, or rank 0's time limit."""
        if r >= self.plan.total:
            return "completed"
        return "time_limit" if flags.over_time else None

    @staticmethod
    def should_checkpoint(flags: ControlFlags) -> bool:
        """A checkpoint is due (rank 0's clock) or a preemption signal asks for one before the run stops."""
        return flags.preempted or flags.checkpoint_due

    def checkpoint(self, meta: dict) -> None:
        """Save every rank's state (off the training clock) as one verified set; log it."""
        with self.clock.paused():
            self.checkpointer.save(self.model, self.algo, self.state.to_dict(), self.clock)
        self.last_checkpoint_s = self.clock.train_s
        self.events.emit("checkpoint", None, **meta)

    def epoch(self, r: int) -> float:
        return round(r / self.plan.steps_per_epoch, 4)

    def round_meta(self, r: int, flags: ControlFlags) -> dict:
        """Where the run stands at the synchronisation point of round ``r``, for its events and checkpoint."""
        return {
            "round": r,
            "epoch": self.epoch(r),
            "samples": flags.samples,
            "train_s": round(self.clock.train_s, 4),
        }

    # --- end -----------------------------------------------------------------------------------------
    def close_algorithm(self) -> dict:
        """Close the algorithm on every rank, in order; returns the run's totals for its last event."""
        # before close(): the engine's threads end there (what rank 0's threads used, for the summary)
        counts = {
            **self.final_counts(),
            **({"threads_cpu_s": thread_cpu_s(), **self.algo.report()} if self.rank == 0 else {}),
        }
        self.algo.close()
        # Ordered shutdown: every rank has closed its algorithm (progress threads joined, nothing in flight
        # on any group) before any rank tears its groups down; a rank that left first would fail a late
        # peer's last collective, or be torn down under it.
        self.comm.barrier()
        return counts

    def final_counts(self) -> dict:
        """The run's totals for its last event (collective: the samples of all ranks)."""
        return {
            "round": self.algo.round,
            "samples": _global_samples(self.comm, self.state.samples_local),
            **self.clock.totals(),
        }

    def counts_at_failure(self) -> dict:
        """The totals without a collective (the other ranks may be gone): samples
        as if all ranks were alike."""
        return {
            "round": self.algo.round,
            **self.clock.totals(),
            "samples": self.state.samples_local * self.world,
        }

    def finalize(
        self, status: str, counts: dict, error: BaseException | None = None, reason: str | None = None
    ) -> dict | None:
        """The one end of every run: its last event, then (rank 0) summary.json and the MLPerf log.

        A preempted or interrupted run with its checkpoint is suspended, to be resumed: only the real end
        writes the (one) run_stop. (A second Ctrl-C, before the checkpoint, writes a run_stop: a resume cuts
        it.) ``reason``: why a run that ended by its own rules is no success (a divergence), logged as its
        error.
        """
        detail = {} if error is None else {"error": f"{type(error).__name__}: {error}"}
        if reason is not None:
            detail["error"] = reason
        suspended = status in ("preempted", "interrupted") and error is None
        self.events.emit("run_suspend" if suspended else "run_stop", None, status=status, **detail, **counts)
        summary = None
        if self.rank == 0:  # the same writer the launcher uses after a crash
            summary = write_summary(self.run_dir, echo_mllog=self.cfg.logger.mllog and error is None)
        self.events.close()  # after the derived files: the W&B mirror logs them as an artifact
        return summary

    def requeue_or_explain(self, step: int) -> None:
        """Rank 0, after the summary (the requeue ends this job's steps). Not where `wagma-bench sweep cancel`
        noted the run cancelled: a requeue would undo the cancel (SLURM requeues even a cancelled job); the
        cancel also forbids the job's requeue (Requeue=0), for a note this node does not see yet."""
        if cancel_note(self.run_dir) is None:
            try:
                if not requeue_job():
                    print(
                        f"wagma-bench: preempted at step {step} outside SLURM: checkpoint saved, no job to "
                        f"requeue; run the same command again to resume from {self.run_dir}",
                        flush=True,
                    )
                return
            except RuntimeError:  # refused: by the cancel's Requeue=0 when its note is here now
                if cancel_note(self.run_dir) is None:
                    raise
        print(
            f"wagma-bench: cancelled (wagma-bench sweep cancel) at step {step}: checkpoint saved, not "
            f"requeued; wagma-bench sweep submit resumes it in {self.run_dir}",
            flush=True,
        )


def algo_lr(algo) -> float:
    return float(algo.local_optimizer.param_groups[0]["lr"])


def _global_samples(comm: Comm, samples_local: int) -> int:
    t = torch.tensor([float(samples_local)], dtype=torch.float64, device=comm.device)
    comm.allreduce(t, op="sum")
    return int(t.item())
