"""Values that cannot be right, refused before anything starts: each names the key, the value and what is
allowed (non-finite numbers, targets outside their metric's range, unknown keys however Hydra reports them,
unknown cluster keys in sweep and simulate, an override Hydra cannot parse), and a quoted run directory read
as Hydra reads it. Through the real CLI where the user meets it."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from tests.cli_util import CONF, compose, run
from wagma_bench.config.cluster import load_profile
from wagma_bench.config.schema import validate
from wagma_bench.errors import ConfigError
from wagma_bench.imbalance import IMBALANCES

REFUSED_AT_ONCE = [
    (
        "train.lr=nan",
        "train.lr=nan",
        "finite",
    ),  # a value validate() refuses; every other value: in-process below
    ("optimizer.gruop_size=2", "optimizer.gruop_size", "valid keys of optimizer: name, bucket_mb"),
    (
        "optimizer=walgma",
        "optimizer=walgma",
        "no such option of optimizer; choose one of: adpsgd, allreduce,",
    ),
    (
        "imbalance=slow",
        "imbalance=slow",
        "choose one of: authors, fixed, independent, lognormal, none, shared_draw",
    ),
    # a world beyond the machine's memory (docs/failure-behaviour.md)
    (
        "launcher.nproc=512",
        "launcher.nproc=512 is not allowed on this machine: 512 ranks x about",
        "it must be at most",
    ),
]


@pytest.mark.parametrize("override,named,allowed", REFUSED_AT_ONCE, ids=[c[0] for c in REFUSED_AT_ONCE])
def test_value_that_cannot_be_right_exits_2_within_seconds_naming_the_key(tmp_path, override, named, allowed):
    run_dir = tmp_path / "run"
    t0 = time.perf_counter()
    out = run(["launcher.nproc=2", override, f"hydra.run.dir={run_dir}"], timeout=120)
    took = time.perf_counter() - t0
    assert out.returncode == 2, out.stderr[-2000:]
    line = [x for x in out.stderr.splitlines() if x.startswith("wagma-bench run: error:")]
    assert len(line) == 1 and named in line[0] and allowed in line[0], out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    # a few seconds on a quiet machine; the bound leaves room for a loaded one (it guards against training)
    assert took < 60, f"{override}: refused after {took:.1f} s"
    assert not (run_dir / "events.jsonl").exists() and not (run_dir / "steps").exists()


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["train.lr=inf"], "train.lr=inf is not allowed; it must be a finite number"),
        (["train.lr=-inf"], "train.lr=-inf is not allowed"),
        (["train.milestones=[30,nan]"], "train.milestones=[30.0, nan] (element nan) is not allowed"),
        (["imbalance=shared_draw", "imbalance.delay_s=nan"], "imbalance.delay_s=nan is not allowed"),
        (
            ["imbalance=independent", "imbalance.probability=1.5"],
            "imbalance.probability=1.5 is not allowed; it must be in [0, 1]",
        ),
        (
            ["imbalance=independent", "imbalance.probability=-0.1"],
            "imbalance.probability=-0.1 is not allowed; it must be in [0, 1]",
        ),
        (
            ["imbalance=independent", "imbalance.delay_s=-1"],
            "imbalance.delay_s=-1.0 is not allowed; it must be >= 0",
        ),
        (["eval.target=nan"], "eval.target=nan is not allowed"),
        (["eval.target=-0.1"], "eval.target=-0.1 is not allowed with workload=resnet"),
        (["workload=transformer", "eval.target=101"], "its metric (bleu) is in [0, 100]"),
        (["workload=ddppo", "workload.metric=spl", "eval.target=1.5"], "its metric (spl) is in [0, 1]"),
        (
            ["eval.target=1.5"],
            "eval.target=1.5 is not allowed with workload=resnet; its metric (top1) is in [0, 1]",
        ),
        (["seed=2147483648"], "seed=2147483648 is not allowed"),
        (["seed=-1"], "seed=-1 is not allowed; it must be in [0, 2147483647]"),
        (["workload=transformer", "data.seed=-3"], "data.seed=-3 is not allowed"),
    ],
)
def test_non_finite_numbers_targets_and_seeds_fail_the_config_check(overrides, message):
    with pytest.raises(ConfigError) as err:
        validate(compose("launcher.nproc=2", *overrides))
    assert message in str(err.value), str(err.value)


def test_targets_within_their_metric_range_pass():
    validate(compose("launcher.nproc=2", "eval.target=1.0"))
    validate(compose("launcher.nproc=2", "workload=transformer", "eval.target=25"))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["optimizer=wagma", "optimizer.gruop_size=2"], "valid keys of optimizer: name, group_size, tau"),
        (["train.lr_sched=3"], "train.lr_sched: unknown key"),
        (
            ["optimizer.group_size.x=1"],
            (
                "optimizer.group_size: unknown key (optimizer=allreduce; given as "
                "optimizer.group_size.x=1); valid keys of optimizer: name, bucket_mb"
            ),
        ),
        (["hydra.rn.dir=x"], "hydra.rn: unknown key"),
        (["-m", "optimizer=allreduce,wagma", "optimizer.tau=3"], "valid keys of optimizer: name, bucket_mb"),
    ],
)
def test_unknown_key_however_hydra_reports_it_lists_the_valid_keys(overrides, message):
    from wagma_bench.config.overrides import precheck

    with pytest.raises(ConfigError) as err:
        precheck(overrides, CONF)
    assert message in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "args",
    [
        ["cluster.network.alpah_s=1e-6"],
        ["cluster.network.inter.alpah_s=1e-6"],
        ["cluster.launcher.torhc=srun"],
    ],
)
def test_unknown_nested_cluster_key_is_refused_by_sweep(args):
    from wagma_bench.campaign import sweep

    with pytest.raises(ConfigError) as err:
        load_profile("local", [a.removeprefix("cluster.") for a in args])
    key = args[0].split("=")[0]
    assert f"{key}: unknown key" in str(err.value) and "valid keys of" in str(err.value), str(err.value)
    with pytest.raises(ConfigError, match="unknown key"):
        sweep.parse_spec(["gpus=8", "optimizer=allreduce", *args])


def test_unknown_nested_cluster_key_is_refused_by_simulate(tmp_path, capsys):
    from wagma_bench.cli.simulate import main

    code = main(
        [
            "cluster=local",
            "cluster.network.alpah_s=1e-6",
            "gpus=8",
            "optimizer=allreduce",
            "--out",
            str(tmp_path / "sim"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert "cluster.network.alpah_s: unknown key" in err
    assert "valid keys of cluster.network: allreduce, intra, inter, injection_GBps, control_alpha_s" in err
    assert not (tmp_path / "sim").exists()


def test_quoted_run_dir_with_spaces_and_non_ascii_is_used_as_hydra_reads_it(tmp_path):
    target = tmp_path / "a dir" / "Läufe ü"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = run(
        [
            "launcher.nproc=1",
            "train.max_rounds=2",
            "eval.every_rounds=2",
            "logger.progress=off",
            f'hydra.run.dir="{target}"',
        ],
        cwd=cwd,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((target / "summary.json").read_text())["status"] == "completed"
    assert list(cwd.iterdir()) == [], f"stray files in the working directory: {list(cwd.rglob('*'))}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a dir", "cwd"]


def test_failed_override_parse_creates_nothing(tmp_path):
    run_dir = tmp_path / "run"
    out = run(["train.lr=0.1)", f"hydra.run.dir={run_dir}"], timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "wagma-bench run: error: Error parsing override 'train.lr=0.1)'" in out.stderr
    assert not run_dir.exists()


def test_the_former_imbalance_paper_is_read_as_shared_draw_with_one_line_naming_both(capsys, monkeypatch):
    """One policy for every old name (config/renamed.py): `paper` was renamed `shared_draw` (it is not the
    authors' rule) and, as an old key is, is read under its new name with one line that names it and the
    authors' rule, `independent`; a sweep's list is read item by item, and the result composes."""
    from wagma_bench.config import renamed
    from wagma_bench.config.overrides import precheck
    from wagma_bench.config.renamed import renamed_overrides

    monkeypatch.setattr(renamed, "_SAID", set())  # as in a fresh process
    assert renamed_overrides(["imbalance=paper"]) == ["imbalance=shared_draw"]
    assert renamed_overrides(["-m", "imbalance=none,paper"]) == ["-m", "imbalance=none,shared_draw"]
    said = capsys.readouterr().err.splitlines()
    assert said == [renamed.deprecation_line("imbalance=paper")], said
    assert "is read as imbalance=shared_draw" in said[0] and "rule is imbalance=independent" in said[0]
    precheck(renamed_overrides(["imbalance=paper"]), CONF)


SWEEP_ARGS = ["cluster=local", "gpus=4", "--dry-run", "--out", "OUT"]


@pytest.mark.parametrize(
    "command,args", [("simulate", []), ("tune", ["--out", "OUT"]), ("sweep", SWEEP_ARGS)]
)
def test_an_unknown_option_of_a_group_is_one_line_naming_the_options_elsewhere(tmp_path, command, args):
    """simulate, tune and sweep refuse an unknown option as `run` does."""
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    out = run(["optimizer=walgma", *args], command=command, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"wagma-bench {command}: error:"), out.stderr[-2000:]
    assert "optimizer=walgma: no such option of optimizer; choose one of: adpsgd, allreduce," in lines[0]
    assert not (tmp_path / "out").exists()


# every imbalance preset that delays a count of ranks (imbalance=shared_draw): that count against the world
WITH_NUM_SLOW = sorted(
    name
    for name, cls in IMBALANCES.items()
    if "num_slow" in {f.name for f in dataclasses.fields(cls.Settings)}
)


def test_every_preset_with_a_count_of_slow_ranks_is_checked_below():
    assert WITH_NUM_SLOW == ["shared_draw"]


@pytest.mark.parametrize("name", WITH_NUM_SLOW)
def test_more_slow_ranks_than_ranks_fails_the_config_check(name):
    """num_slow=9 of 4 ranks used to be taken as "every rank, every step" (the draw is capped at the world),
    as imbalance.ranks=[7] is refused. The whole world slow is allowed."""
    with pytest.raises(ConfigError) as err:
        validate(compose(f"imbalance={name}", "imbalance.num_slow=9", "launcher.nproc=4"))
    assert str(err.value) == "imbalance.num_slow=9 is not allowed with 4 ranks; it must be at most 4", str(
        err.value
    )
    whole_world = validate(compose(f"imbalance={name}", "imbalance.num_slow=4", "launcher.nproc=4"))
    assert whole_world.imbalance.num_slow == 4


@pytest.mark.parametrize("name", WITH_NUM_SLOW)
def test_more_slow_ranks_than_ranks_is_refused_before_any_rank_starts(tmp_path, name):
    run_dir = tmp_path / "run"
    # two steps: were it accepted, the run would end soon (every rank sleeping every step)
    out = run(
        [
            f"imbalance={name}",
            "imbalance.num_slow=9",
            "launcher.nproc=4",
            "train.max_rounds=2",
            "eval.every_rounds=2",
            f"hydra.run.dir={run_dir}",
        ],
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    said = "wagma-bench run: error: imbalance.num_slow=9 is not allowed with 4 ranks; it must be at most 4"
    assert lines == [said], out.stderr[-2000:]
    assert not (run_dir / "events.jsonl").exists() and not (run_dir / "steps").exists()


@pytest.mark.parametrize("name", WITH_NUM_SLOW)
def test_simulate_refuses_more_slow_ranks_than_its_smallest_world(tmp_path, capsys, name):
    """simulate checks each world size as it checks imbalance.ranks: 9 slow ranks fit 16 GPUs, not 4."""
    from wagma_bench.cli.simulate import main

    code = main(
        [
            f"imbalance={name}",
            "imbalance.num_slow=9",
            "gpus=16,4",
            "optimizer=allreduce",
            "--out",
            str(tmp_path / "sim"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip() == (
        "wagma-bench simulate: error: imbalance.num_slow=9 is not allowed with 4 ranks; it must be at most 4"
    ), err
    assert not (tmp_path / "sim").exists()


# a group's option is a name of its folder; Hydra joins a path onto the folder: `../../etc/passwd` was named
# as the group `optimizer.......etc`, `./wagma` ran WAGMA-SGD, `../wagma` loaded the main config as an
# optimizer (exit 1)
PATH_LIKE = [
    "optimizer=../../etc/passwd",
    "optimizer=./wagma",
    "optimizer=../wagma",
    "imbalance=none/../fixed",
]


@pytest.mark.parametrize("override", PATH_LIKE)
def test_a_path_as_a_group_option_is_refused_in_the_users_words(override):
    from wagma_bench.config.overrides import precheck

    key = override.split("=")[0]
    with pytest.raises(ConfigError) as err:
        precheck(["launcher.nproc=2", override], CONF)
    message = str(err.value)
    assert message.startswith(f"{override}: no such option of {key}; choose one of: "), message
    assert "\n" not in message and (key != "optimizer" or "adpsgd, allreduce," in message), message


@pytest.mark.parametrize(
    "command,args",
    [("run", ["hydra.run.dir=OUT"]), ("simulate", ["--out", "OUT"]), ("tune", ["--out", "OUT"])],
)
def test_a_path_as_a_group_option_is_one_line_quoting_it_in_every_command(tmp_path, command, args):
    args = [str(tmp_path / "out") if a == "OUT" else a.replace("OUT", str(tmp_path / "out")) for a in args]
    out = run(["optimizer=../../etc/passwd", *args], command=command, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"wagma-bench {command}: error: "), out.stderr[-2000:]
    assert (
        "optimizer=../../etc/passwd: no such option of optimizer; choose one of: adpsgd, allreduce,"
        in lines[0]
    ), lines[0]
    assert not (tmp_path / "out").exists()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


@pytest.mark.parametrize(
    "override", ["train.lr=nan", "launcher.nproc=512", "optimizer=wagma optimizer.group_size=3"]
)
def test_a_refused_command_leaves_the_run_directory_as_it_found_it(tmp_path, checkpointed, override):
    """Hydra writes its copy of the configuration (.hydra/) before the job is checked: a refused command in a
    finished run's directory replaced the record of what ran there with the refused values (train.lr: .nan),
    and in a new directory left one holding only .hydra/."""
    import shutil

    finished = tmp_path / "finished"
    shutil.copytree(checkpointed, finished, symlinks=True)
    before = _files(finished)
    for run_dir in (finished, tmp_path / "new"):
        out = run(["launcher.nproc=2", *override.split(), f"hydra.run.dir={run_dir}"], timeout=120)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert _files(finished) == before
    assert not (tmp_path / "new").exists()
