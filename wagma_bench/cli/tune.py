"""``wagma-bench tune``: tuned comparisons by AlgoPerf's external tuning ruleset
(:mod:`wagma_bench.campaign.tune` plans and runs the trials, :mod:`wagma_bench.analysis.tuning` scores them;
the usage is that module's)."""

from __future__ import annotations

from pathlib import Path

from wagma_bench import exits
from wagma_bench.analysis.tuning import TRIALS, TUNING, Trial, fairness_line, format_scores, write_scores
from wagma_bench.campaign import tune
from wagma_bench.errors import ConfigError, OperationFailed


def main(argv: list[str]) -> int:
    # Ctrl-C in a trial: the trial stopped at a checkpoint (TuneInterrupted names it); between trials: one
    # line; SLURM refusing a command (cluster mode) is an operational failure (OperationFailed), exit 1
    return exits.run_body(
        "tune",
        lambda: exits.typed({RuntimeError: OperationFailed}, lambda: _main(argv)),
        interrupted="wagma-bench tune: interrupted; run the same command again to go on",
    )


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(tune.USAGE)
        return exits.OK
    if argv[0] == "score":
        if len(argv) != 2:
            raise ConfigError("usage: wagma-bench tune score DIR")
        result = write_scores(Path(argv[1]))
        print(f"{format_scores(result)}\n{fairness_line(Path(argv[1]))}\nwrote {Path(argv[1]) / TUNING}")
        return exits.OK
    args = tune.parse_args(argv)
    spec, trials, configs = tune.make_plan(args)
    if args.cluster:  # before tune.json: a tuning refused for its data is not half-made in --out
        tune.check_data(configs, on_nodes="--data-on-nodes" in args.flags)
    tune.write_plan(args, spec, trials, ["wagma-bench", "tune", *argv])
    if args.cluster:
        return _render(args, spec, trials, argv)
    tune.run_local(args, spec, trials, configs)
    result = write_scores(args.out)
    print(
        f"{format_scores(result)}\n{fairness_line(args.out)}\nwrote {args.out / TUNING}; tables and figures: "
        f"wagma-bench report {args.out}"
    )
    return exits.OK


def _render(args: tune.TuneArgs, spec, trials: list[Trial], argv: list[str]) -> int:
    """Cluster mode: the trials as a sweep (``sweep``'s scripts and manifest), submitted with --submit."""
    from wagma_bench.campaign import prequeue, sweep, sweep_jobs

    runs = [sweep.SweepRun(t.name, t.gpus, t.overrides) for t in tune.run_order(trials, args.seed)]
    manifest = sweep.render(
        spec,
        args.out,
        array="--no-array" not in args.flags,
        command=["wagma-bench", "tune", *argv],
        runs=runs,
        runs_dir=TRIALS,
        data_on_nodes="--data-on-nodes" in args.flags,
        step_times=args.step_times,
    )
    print(
        f"wagma-bench tune: {len(manifest['runs'])} trials in {len(manifest['jobs'])} jobs rendered: "
        f"{args.out}"
    )
    print(prequeue.summary(manifest))
    if "--submit" in args.flags:
        ids = sweep_jobs.submit(args.out)
        print(
            f"submitted {len(ids)} jobs: {' '.join(ids)}\nfollow: wagma-bench sweep wait {args.out}; "
            f"then: wagma-bench tune score {args.out}"
        )
    else:
        print(f"submit: wagma-bench sweep submit {args.out}; then wagma-bench tune score {args.out}")
    return exits.OK
