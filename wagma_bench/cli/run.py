"""``wagma-bench run``: compose the configuration with Hydra, hand each job to
:func:`wagma_bench.runtime.run.launch`, and answer the :class:`~wagma_bench.runtime.run.RunOutcome` it returns
through the one exit table (:mod:`wagma_bench.exits`). Every end of the command goes through
:func:`~wagma_bench.exits.run_body`; inside Hydra's task function, where a raised error would become Hydra's
traceback, an end is raised as :class:`~wagma_bench.exits.Stop`."""

from __future__ import annotations

import sys
from pathlib import Path

from wagma_bench import exits
from wagma_bench.config.paths import CONF_DIR, conf_context

# Config groups that `run` does not read: `sweep` and `simulate` take their cluster profiles from there,
# `tune` its search spaces.
NOT_RUN_GROUPS = ("cluster", "hydra", "search_space")

# what a launcher says of a Ctrl-C or a stop signal before it has ranks to stop (docs/failure-behaviour.md)
CTRL_C_AT_START = "wagma-bench: interrupted before any rank started; nothing ran"
STOPPED_AT_START = "wagma-bench: stopped by {signal} before any rank started; nothing ran"


def main(argv: list[str]) -> int:
    """``wagma-bench run``, its signals taken first (:mod:`wagma_bench.runtime.signals`): a launcher's set-up
    ends in one line on SIGINT, SIGTERM or SIGHUP; a rank of an external world notes them for its trainer (a
    Ctrl-C that reaches a rank is the second, which its trainer recorded and its launcher reports: no
    line)."""
    from wagma_bench.runtime import signals
    from wagma_bench.runtime.world import detect_world  # light: the handlers come first

    rank = detect_world() is not None
    if rank:
        signals.rank_listening_later()
    else:
        signals.starting()
    return exits.run_body(
        "run",
        lambda: _run(argv, rank),
        interrupted=None if rank else CTRL_C_AT_START,
        stopped=STOPPED_AT_START,
    )


def _run(argv: list[str], rank: bool) -> int:
    """The command; a stop signal that a library turned into an error of its own while the launcher set up is
    answered as that signal (a run's end, a signal as its ranks ended included, is its RunOutcome's)."""
    from wagma_bench.runtime import signals

    try:
        return run_command(argv)
    except (Exception, SystemExit) as err:  # a stop signal that a library turned into its own error
        stopped = None if rank or isinstance(err, exits.Stop) else signals.stopped_in_setup()
        if stopped is None:
            raise
        raise exits.Stopped(stopped) from None
    finally:
        if rank:
            signals.rank_done()


def run_command(overrides: list[str]) -> int:
    """Compose the config with Hydra (run dir, multirun, launcher plugins) and run it."""
    from wagma_bench.config.renamed import renamed_overrides
    from wagma_bench.runtime.world import detect_world

    world = detect_world()
    # an old key (train.max_steps=5) under its new name, said once: by the launching process or rank 0
    overrides = renamed_overrides(overrides, quiet=world is not None and world.rank != 0)
    if "--help" in overrides or "-h" in overrides:
        print(run_help([o for o in overrides if o not in ("--help", "-h")]))
        return exits.OK
    import hydra

    from wagma_bench.runtime.run import prepare, run_dirs

    overrides, explicit = prepare(overrides, world)
    sys.argv = [sys.argv[0]] + overrides
    _SWEPT.clear()
    with run_dirs(explicit, world):
        hydra.main(config_path=str(CONF_DIR), config_name="wagma", version_base="1.3")(_run_job)()
    return next(iter(_SWEPT), exits.OK)


def run_help(overrides: list[str]) -> str:
    """Hydra's application help, listing only the groups `run` composes (Hydra's own would list every
    folder of conf/, `cluster` included), with the configuration the overrides compose."""
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    with conf_context():
        cfg = compose(config_name="wagma", overrides=overrides)
        loader = GlobalHydra.instance().config_loader()
        groups = [g for g in sorted(loader.list_groups("")) if g not in NOT_RUN_GROUPS]
        listing = "\n".join(f"{g}: {', '.join(loader.get_group_options(g))}" for g in groups)
    return (
        f"wagma-bench run: train one configuration (Hydra overrides; -m sweeps them locally).\n\n"
        f"== Configuration groups ==\nCompose your configuration from those groups (group=option)\n\n"
        f"{listing}\n\n== Config ==\nOverride anything in the config (foo.bar=value)\n\n"
        f"{OmegaConf.to_yaml(cfg)}\n"
        f"Use --hydra-help to view Hydra's own flags (-m, --cfg job, -cd, ...)."
    )


_SWEPT: list[int] = []  # under -m: the codes of the jobs that failed or diverged, the first is the command's


def _run_job(cfg) -> None:
    """One Hydra job: run it (:func:`wagma_bench.runtime.run.launch`) and answer its outcome. Under ``-m``, a
    job that failed or diverged is said in one line and the sweep goes on, under every launcher; the command
    then ends with the first such job's code. An interruption or a stop signal (one as a job ended included)
    ends the sweep."""
    from hydra.core.hydra_config import HydraConfig

    from wagma_bench.runtime import signals
    from wagma_bench.runtime.run import launch
    from wagma_bench.runtime.world import detect_world
    from wagma_bench.train.rank import train_rank

    world = detect_world()
    if (
        world is None
    ):  # a launcher's set-up again (under -m: a signal while the last job ended stops the sweep)
        signals.starting()
    hydra = HydraConfig.get()
    try:
        outcome = launch(cfg, Path(hydra.runtime.output_dir), world, train_rank, list(hydra.overrides.task))
    except Exception as err:  # Hydra answers an Exception with its traceback: the one table's line instead
        stop = exits.stop_for(err)
        if stop is None:
            raise
        raise stop from None
    if outcome.report:
        print(outcome.report, flush=True)
    if hydra.mode.name == "MULTIRUN" and outcome.status in ("failed", "diverged"):
        print(f"wagma-bench run: error: {outcome.line}", file=sys.stderr, flush=True)
        _SWEPT.append(exits.outcome_code(outcome))
        return
    exits.answer(outcome)
