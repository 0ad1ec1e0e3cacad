"""``wagma-bench`` command line: run | comm-bench | report | sweep | tune | simulate | claims | doctor |
wandb-import.

One module per command, whose ``main(argv)`` runs the command's body through the one exit mapper
(:func:`wagma_bench.exits.run_body`: the exit codes and the one-line errors of every command); each command is
imported only when named, so that ``run`` takes its signals and starts its rank server before anything heavy
is imported. Nothing else in the package imports this layer (the layer contract, ``tests/test_layers.py``)."""

from __future__ import annotations

import gc
import importlib
import sys

from wagma_bench import exits

USAGE = """usage: wagma-bench COMMAND [ARGS]   (wagma-bench --version)

commands:
  run         train one configuration (Hydra overrides, e.g. workload=resnet optimizer=wagma; -m for sweeps)
  comm-bench  time our communication backend against the raw library calls
  report      time-to-accuracy tables and figures over run or sweep directories
  sweep       render/submit/follow SLURM jobs over GPU counts and options (e.g. cluster=daint gpus=8,16)
  tune        tuned comparisons by AlgoPerf's external tuning protocol (studies x trials per optimizer)
  simulate    predict throughput / time-to-target per optimizer from 8 to 1,024 GPUs (discrete-event model)
  claims      the papers' claims: measured here with intervals, predicted at scale, a verdict for each
  doctor      what this Python has for the workloads and the cluster (CUDA, NCCL, MPI, fairseq, EGL, wandb)
  wandb-import  log finished runs, tuning trials and committed results to W&B as logger=wandb would have

`wagma-bench run --help` lists the configuration groups and their options.
"""


# every command: the module whose main(argv) it is, imported only when named
COMMANDS = {
    "run": "wagma_bench.cli.run",
    "comm-bench": "wagma_bench.cli.commbench",
    "sweep": "wagma_bench.cli.sweep",
    "tune": "wagma_bench.cli.tune",
    "report": "wagma_bench.cli.report",
    "simulate": "wagma_bench.cli.simulate",
    "claims": "wagma_bench.cli.claims",
    "doctor": "wagma_bench.cli.doctor",
    "wandb-import": "wagma_bench.cli.wandb_import",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return exits.OK
    if argv[0] in ("-V", "--version"):
        from wagma_bench import __version__

        print(f"wagma-bench {__version__}")
        return exits.OK
    command, rest = argv[0], argv[1:]
    if command in COMMANDS:
        return importlib.import_module(COMMANDS[command]).main(rest)
    print(f"wagma-bench: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return exits.REFUSED


def entry() -> int:
    """The ``wagma-bench`` program (console script and ``python -m wagma_bench``): :func:`main`, then the
    objects it leaves are frozen out of the interpreter's last garbage collections. With torch imported those
    collections took about half a second of every command's exit here, and a test suite runs hundreds of
    commands; atexit handlers, flushing and closing still run as before."""
    try:
        return main()
    finally:
        gc.freeze()
