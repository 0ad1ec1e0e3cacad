"""What each simulation is given, built from a :class:`~wagma_bench.simulate.request.Request`: per optimizer
the configuration `wagma-bench run` would compose and check with the same overrides, the cluster profile's
network (as `sweep` reads it), the workload's cost model (its preset, simulate's own keys, the measured spread
and inputs), and one :class:`~wagma_bench.simulate.des.SimConfig` per optimizer and world size."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from wagma_bench.config.cluster import load_profile
from wagma_bench.config.paths import CONF_DIR, conf_context
from wagma_bench.config.schedules import CONTROL_EVERY
from wagma_bench.config.schema import RunConfig, check_world, runs_on, validate
from wagma_bench.imbalance import Imbalance
from wagma_bench.simulate.costs import Network
from wagma_bench.simulate.des import ADPSGD_AVERAGING, Progress, SimConfig, Workload, local_state_tensors
from wagma_bench.simulate.measured import read_measured, with_measured
from wagma_bench.simulate.presets import preset_for
from wagma_bench.simulate.request import (
    BOUNDS,
    DEFAULT_GPUS,
    PERSISTENT_ONLY,
    WORKLOAD_KEYS,
    Request,
    UsageError,
    check_work,
    optimizer_overrides,
)
from wagma_bench.simulate.run_spread import with_measured_spread

# a missing data path (data.root=???) does not change a prediction: filled with this before `validate`
NOT_READ = "(not read by simulate)"


def load_network(cluster: str, overrides: list[str]) -> Network:
    """The cluster profile's ``network:`` section, read by `sweep`'s loader (``cluster.network.KEY=VALUE``
    changes one number; a link's number given so is checked here, named as the user typed it)."""
    from wagma_bench.simulate.costs import LINK_RANGES, link_value

    for o in overrides:
        key, _, value = o.partition("=")
        if key.startswith("network.") and key.rsplit(".", 1)[-1] in LINK_RANGES:
            try:
                link_value(key.rsplit(".", 1)[-1], value, f"cluster.{key}")
            except ValueError as err:
                raise UsageError(str(err)) from None
    profile = load_profile(cluster, overrides)
    network = profile.network.as_dict() if profile.network else {}
    return Network.from_profile(network, profile.gpus_per_node, f"conf/cluster/{cluster}.yaml network")


def compose_runs(req: Request) -> dict[str, RunConfig]:
    """Per optimizer, the configuration `wagma-bench run` would compose and check with these overrides.
    An ``optimizer.KEY`` goes to the selected optimizers that have that setting (to all when none has it,
    so that the error is `run`'s)."""
    check_work(req)  # first: a request of unbounded work is refused before Hydra composes anything
    from hydra import compose
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from wagma_bench.config.overrides import refuse_path_options, unknown_key_message, unknown_option_message

    runs = {}
    with conf_context():
        for name in req.optimizers:
            mine = optimizer_overrides(req, name)
            overrides = req.run_overrides + [f"optimizer={name}"] + mine
            refuse_path_options(
                overrides, CONF_DIR
            )  # `optimizer=../x`: in the user's words, as `run` says it
            try:
                cfg = compose(config_name="wagma", overrides=overrides)
            except (HydraException, OmegaConfBaseException) as err:  # unknown option or key: run's message
                raise UsageError(
                    unknown_key_message(err, overrides, CONF_DIR)
                    or unknown_option_message(err)
                    or hydra_message(err)
                ) from None
            if not req.optimizers_chosen and not runs_on(name, str(cfg.workload.name)):
                # every optimizer by default: those that run on this workload (not DropCompute on RL)
                continue
            for key in OmegaConf.missing_keys(cfg):
                if key.split(".")[0] in ("data", "env"):
                    OmegaConf.update(cfg, key, NOT_READ)
            runs[name] = validate(cfg)
    return runs


def hydra_message(err: BaseException) -> str:
    """A composition error as `run` shows it (Hydra prints the error and the errors that caused it)."""
    lines = []
    while err is not None:
        lines.append(str(err).strip())
        err = err.__cause__
    return "\n".join(lines)


def check_worlds(runs: dict[str, RunConfig], gpus: list[int]) -> None:
    """Each optimizer's settings against each world size, as `run` checks them against its world."""
    for run in runs.values():
        for p in gpus:
            check_world(run.optimizer, run.imbalance, p)


def make_workload(run: RunConfig, own: dict[str, str]) -> Workload:
    """The preset of `run`'s workload and data options, with simulate's own workload keys applied. A batch
    other than the preset's (``train.batch_size``) needs its step time (``step_s``): the preset's is measured
    at its own batch, and the model does not guess how compute scales with the batch."""
    wl = dataclasses.replace(preset_for(run.workload.name, run.data.name))
    if "batch" in own and "step_s" not in own and int(own["batch"]) != wl.batch:
        raise UsageError(
            f"train.batch_size={own['batch']}: the {wl.name} preset's step_s={wl.step_s} s is one "
            f"step at batch {wl.batch}; give step_s= for batch {own['batch']} too"
        )
    for key in WORKLOAD_KEYS & set(own):
        cur = getattr(wl, key)
        if isinstance(cur, (int, float)) and not isinstance(cur, bool):
            try:
                number = float(own[key])
            except ValueError:
                raise UsageError(f"{key}={own[key]!r} is not a number") from None
            low, high, allowed = BOUNDS.get(key, (-math.inf, math.inf, "a finite number"))
            if not (math.isfinite(number) and low <= number <= high):
                raise UsageError(f"{key}={own[key]} is not allowed; it must be {allowed}")
            setattr(wl, key, int(number) if isinstance(cur, int) else number)
        else:
            if key == "adpsgd_averaging" and own[key] not in ADPSGD_AVERAGING:
                allowed = ", ".join(ADPSGD_AVERAGING)
                raise UsageError(f"adpsgd_averaging={own[key]} is not allowed; choose one of: {allowed}")
            setattr(wl, key, own[key])
        wl.source = "preset + overrides"
    ignored = next((k for k in PERSISTENT_ONLY if k in own and wl.compute != "persistent"), None)
    if ignored is not None:
        raise UsageError(
            f"{ignored}={own[ignored]} is not allowed with compute={wl.compute}: only compute=persistent "
            f"reads it; give compute=persistent too, or leave {ignored} out"
        )
    return wl


def model_inputs(
    req: Request, runs: dict[str, RunConfig], pooled: Workload | None = None, network: Network | None = None
) -> tuple[Workload, Network]:
    """The workload and network the predictions use: the workload pooled from the calibrated runs, else the
    preset of `run`'s workload with simulate's keys; the network calibrated, else the cluster profile's; then
    the compute spread of ``--compute-from``'s runs and ``--measured``'s inputs (the command line wins over
    the file)."""
    first = next(iter(runs.values()))
    workload = pooled if pooled is not None else make_workload(first, req.own)
    if network is None:
        network = load_network(req.cluster or "daint", req.cluster_overrides)
    if req.compute_from:
        workload = with_measured_spread(workload, req.compute_from)
    if req.measured:
        measured = read_measured(req.measured)
        workload, network = with_measured(workload, network, measured, set(req.own))
        print(measured.line())
    return workload, network


def sim_config(
    run: RunConfig,
    world_size: int,
    workload: Workload,
    network: Network,
    imbalance: Imbalance,
    steps: int,
    control_every: int = CONTROL_EVERY,
    seed: int | None = None,
    progress: Progress | None = None,
) -> SimConfig:
    """One simulation of a composed run configuration (``seed``: another than the run's; ``progress``: told
    where it is)."""
    return SimConfig(
        run.optimizer.name,
        world_size,
        workload,
        network,
        imbalance,
        run.optimizer,
        steps,
        run.seed if seed is None else seed,
        control_every,
        local_state_tensors(run.train.local_optimizer, run.train.momentum),
        progress,
    )


def typed_settings(section: str, registry: dict, values: dict) -> Any:
    """A run's recorded ``section`` settings (``run_start``'s config) as its option's typed ``Settings``."""
    name = values.get("name")
    if name not in registry:
        raise UsageError(f"{section}={name!r} is not available; choose one of: {', '.join(sorted(registry))}")
    try:
        return registry[name].Settings(**values)
    except TypeError:
        valid = ", ".join(f.name for f in dataclasses.fields(registry[name].Settings))
        raise UsageError(f"{section} {name}: unknown setting in {sorted(values)}; valid: {valid}") from None


def composed(req: Request, runs: dict[str, RunConfig], network: Network, workload: Workload) -> str:
    """``--cfg job``: the cluster's network, the workload, the imbalance and every optimizer's settings that
    the simulations of these overrides would use, as YAML."""
    from dataclasses import asdict

    from omegaconf import OmegaConf

    first = next(iter(runs.values()))
    job = {
        "gpus": req.gpus or list(DEFAULT_GPUS),
        "cluster": req.cluster or "daint",
        "network": {k: v for k, v in asdict(network).items() if not k.startswith("_")},
        "workload": asdict(workload),
        "imbalance": asdict(first.imbalance),
        "optimizers": {n: asdict(r.optimizer) for n, r in runs.items()},
        "local_state": local_state_tensors(first.train.local_optimizer, first.train.momentum),
        "steps": req.steps,
        "seed": first.seed,
        "control_every": req.control_every,
    }
    return OmegaConf.to_yaml(OmegaConf.create(job))
