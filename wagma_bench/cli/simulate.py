"""``wagma-bench simulate``: predicted throughput and time-to-target of every optimizer against world size.

    wagma-bench simulate cluster=daint gpus=8,16,32,64,128,256,512,1024 \\
        'optimizer=glob(*)' experiment=paper_resnet50_stragglers [optimizer.tau=10 seed=1 ...] \\
        [cluster.network.inter.alpha_s=2e-6 ...] \\
        [train.max_rounds=500 control_every=10] [step_s=0.32 train.batch_size=128 params=25.6e6 sigma=0.02] \\
        [samples_to_target=N] [--convergence RUN_DIR|TUNE_DIR...] [--out DIR]
        [--compute-from RUN_DIR|TUNE_DIR...] [compute=persistent] [--measured FILE] [--interval N [--jobs N]]
    wagma-bench simulate --calibrate RUN_DIR... [COMM_BENCH.json...] [--out DIR]     (validation)

One configuration for every subcommand: the overrides are `wagma-bench run`'s (``workload=``, ``data=``,
``optimizer=``, ``optimizer.KEY=``, ``imbalance=``, ``seed=``, anything else `run` takes), composed from
``conf/`` with Hydra and checked by the same :func:`wagma_bench.config.schema.validate`, so a value `run`
refuses is refused here with the same message; each optimizer model gets its optimizer's typed ``Settings``.
The cluster is read as `sweep` reads it (``cluster=NAME``, ``cluster.KEY=VALUE``, e.g.
``cluster.network.inter.alpha_s=2e-6``). Arguments use Hydra's override grammar; ``gpus`` and
``optimizer`` take several values (``a,b``, ``'gpus=range(8,1025,8)'``, ``'optimizer=glob(*)'``); an
``optimizer.KEY`` applies to the selected optimizers that have that setting. `run`'s keys the simulation
reads: ``train.max_rounds`` (the rounds simulated; default 500) and ``train.batch_size`` (the cost model's
batch per rank, given with its ``step_s``); ``train.epochs`` is refused (the model counts rounds); the others
are checked and do not change a prediction. Simulate's own keys: ``gpus``, ``control_every``,
``samples_to_target`` and the workload's cost model (``step_s``, ``params``, ``compute``, ``sigma``,
``overhead_s``, ``backward_fraction``, ``bytes_per_param``: the preset's numbers, :mod:`.presets`; AD-PSGD's
``gossip_cost``, ``adpsgd_averaging`` = per_step | none and ``averaging_s_per_param``, by default the figures
measured here, :mod:`wagma_bench.simulate.gossip_inputs`).
Defaults where they differ from `run`'s: every optimizer that runs on the workload (DropCompute where batches
split), ``cluster=daint`` (``local`` with ``--calibrate``), and ``workload=resnet data=imagenet`` (the paper's
ResNet-50 set-up) when neither a workload nor an ``experiment`` is given; a data path `run` would need
(``data.root``) is not needed.

``--calibrate``: fits each run's compute-time distribution and overhead, and alpha/beta from comm-bench
JSON (or takes the cluster profile's network), then simulates every calibrated run's own configuration and
prints predicted against measured throughput, twice: with compute times resampled i.i.d. from the run's
pooled measurements (``compute=empirical``, the default; ``compute=lognormal`` fits a lognormal instead), as
predictions at other scales use them, and trace-driven (each rank's recorded compute times replayed step by
step, which tests the communication and waiting model alone). Given ``gpus=`` too, it also predicts that
sweep with the workload pooled from the calibrated runs.

``control_every``: the trainer's control allreduce (a global barrier) every that many rounds, rounded up
to the optimizer's sync period, as ``wagma-bench run`` does (default 10,
:data:`wagma_bench.config.schedules.CONTROL_EVERY`: the rule and the constant the trainer imports);
``control_every=0`` leaves only the optimizers' own synchronisation -- the paper's implementations, which
have no such barrier.

Convergence model (time-to-target): samples to the target per optimizer, from real runs that reached it
(``--convergence RUN_DIR...``: the ``samples`` of the first evaluation at or above the target, median over
runs, taken at the smallest world size measured; a ``wagma-bench tune`` directory counts as its winning
trials, one per tuned combination) or one value for all (``samples_to_target=N``). It is
held constant in P -- the linear-scaling regime of large-batch SGD (Goyal et al. 2017), where epochs to a
target do not change with the global batch; beyond the critical batch size this is optimistic, for every
optimizer alike. time_to_target(P) = samples_to_target / predicted throughput(P).

``--compute-from RUN_DIR...``: each rank's compute time per step is drawn from the given runs' measured
compute times, each run's divided by its own median and scaled to the workload's ``step_s`` (the preset's or
the one given): the spread of real runs (their natural imbalance) at the modelled machine's speed, in place of
the preset's assumed distribution (:func:`measured_spread`). With ``compute=persistent`` it fits instead a
rank offset plus AR(1) per-step noise from the runs' ranks (:mod:`wagma_bench.simulate.spread`): a slow rank
stays slow.

``--measured FILE``: measured model inputs (:mod:`wagma_bench.simulate.measured`;
``reproduce/scaling/measure_inputs.py`` and ``make gpu-check`` write them): AD-PSGD's exchange cost
``gossip_cost`` (the seconds of compute each second of its thread's exchange takes, 0-1; a file that says it
is unmeasured leaves the default), the intra-node link,
the persistent spread; the command line wins over the file. ``--interval N``: also N predictions with their
inputs resampled and the prediction with one assumption moved at a time
(:mod:`wagma_bench.simulate.uncertainty`), written to ``interval.json``, from which ``wagma-bench claims``
takes each prediction's 95% interval and the assumption that flips it; ``--jobs N`` runs its simulations in N
processes (default: the CPUs this process may use; :mod:`wagma_bench.simulate.pool`), each once, the results
the same for any N.

The table's columns (docs/simulator.md, "Outputs"): samples/s, the predicted throughput; vs allreduce, over
Allreduce-SGD's at the same P; efficiency, samples/s over P x batch / ``step_s`` (ranks that never
communicate, wait or sleep); wait share, a rank's mean share of time spent waiting; staleness, in rounds, the
mean largest age of a rank's contributions to the rounds that answer it (WAGMA-SGD, eager-SGD; at most ``tau``
for WAGMA-SGD) or the mean step lag of AD-PSGD's exchanging pairs; time to target (s), samples to the target
over samples/s.

Outputs in ``--out`` (default ``sim/``): ``predictions.csv|json``, ``throughput.png``
(``plots.plot_throughput``, the report's figure, predictions dashed), ``time_to_target.png``, and with
``--calibrate`` ``validation.csv|json``, ``validation.png`` and ``calibration.json``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from wagma_bench import exits
from wagma_bench.campaign.sweep import parse_overrides
from wagma_bench.cli.text import plain
from wagma_bench.errors import ConfigError
from wagma_bench.simulate import request  # the simulator itself is imported in _simulate, once this passes


def main(argv: list[str]) -> int:
    # a value the model cannot take (a ValueError: --measured's file, the calibrated runs), a file that is not
    # there: refused, exit 2
    refused = {ValueError: ConfigError, FileNotFoundError: ConfigError}
    return exits.run_body("simulate", lambda: exits.typed(refused, lambda: _simulate(argv)))


def parse(argv: list[str]) -> tuple[request.Request, argparse.Namespace]:
    ap = argparse.ArgumentParser(
        prog="wagma-bench simulate",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    request.add_options(ap)
    ns = ap.parse_args(argv)
    request.take_paths(ns)
    req = request.sort_overrides(parse_overrides(ns.overrides))
    req.calibrate, req.convergence, req.compute_from = ns.calibrate, ns.convergence, ns.compute_from
    req.measured, req.interval, req.jobs, req.out = ns.measured, ns.interval, ns.jobs, Path(ns.out)
    return req, ns


def _simulate(argv: list[str]) -> int:
    started = time.perf_counter()
    req, ns = parse(argv)
    request.check_work(req)  # before the simulator, scipy and matplotlib are imported: refused at once
    from wagma_bench.simulate.compare import compare_with_runs
    from wagma_bench.simulate.configure import check_worlds, compose_runs, composed, model_inputs
    from wagma_bench.simulate.outputs import staged_prediction
    from wagma_bench.simulate.predict import predict

    out = Path(ns.out)
    runs = compose_runs(req)
    check_worlds(runs, req.gpus or ([] if req.calibrate else list(request.DEFAULT_GPUS)))
    if ns.cfg == "job" and not req.calibrate:  # prints what it would simulate: --out untouched
        workload, network = model_inputs(req, runs)
        print(composed(req, runs, network, workload))
        return exits.OK
    # --out written whole at the end (a full disk leaves it as it was), then --interval's resume file removed
    with staged_prediction(out) as stage:
        pooled = network = None
        if req.calibrate:
            _, pooled, network = compare_with_runs(req, stage)
            if req.gpus is None:
                return exits.OK
        workload, network = model_inputs(req, runs, pooled, network)
        if ns.cfg == "job":
            print(composed(req, runs, network, workload))
            return exits.OK
        predict(req, runs, network, workload, stage, started)
    print(f"wrote {out}/predictions.csv, predictions.json, throughput.png")
    return exits.OK
