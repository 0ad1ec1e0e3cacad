"""`wagma-bench sweep` and `simulate` read their arguments with Hydra's override parser: the sweep grammar of
`run -m`, and the same names as `run`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli_util import BIN

OPTIMIZERS = sorted(
    p.stem for p in (Path(__file__).resolve().parent.parent / "conf" / "optimizer").glob("*.yaml")
)


def sweep(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    out_dir = tmp_path / "sweep"
    out = subprocess.run(
        [str(BIN), "sweep", *args, "--dry-run", "--out", str(out_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    manifest = out_dir / "manifest.json"
    runs = [r["name"] for r in json.loads(manifest.read_text())["runs"]] if manifest.exists() else []
    return out, runs


def test_glob_and_range(tmp_path):
    out, runs = sweep(tmp_path, "cluster=local", "gpus=4", "optimizer=glob(*)", "seed=range(1,4)")
    assert out.returncode == 0, out.stderr
    assert f"{3 * len(OPTIMIZERS)} runs" in out.stdout
    assert runs == [f"0004gpu_{o}_s{s}" for o in OPTIMIZERS for s in (1, 2, 3)]


def test_choice_glob_exclude_and_a_gpu_range(tmp_path):
    out, runs = sweep(
        tmp_path,
        "cluster=generic4",
        "gpus=range(4,9,4)",
        "optimizer=choice(wagma,allreduce)",
        "imbalance=glob(*,exclude=[authors,fixed,independent,lognormal])",
    )
    assert out.returncode == 0, out.stderr
    assert runs == [
        f"{g:04d}gpu_{o}_{i}" for g in (4, 8) for o in ("wagma", "allreduce") for i in ("none", "shared_draw")
    ]


def test_interval_cannot_be_enumerated(tmp_path):
    out, runs = sweep(tmp_path, "cluster=local", "gpus=4", "train.lr=interval(0.01,0.1)")
    assert out.returncode == 2 and "interval()" in out.stderr and "range(), choice()" in out.stderr
    assert runs == []


@pytest.mark.parametrize(
    "setting, named",
    [
        (["imbalance=fixed", "imbalance.ranks=[3]"], "imbalance.ranks=[3] is not allowed with 2 ranks"),
        (
            ["imbalance=shared_draw", "imbalance.num_slow=3"],
            "imbalance.num_slow=3 is not allowed with 2 ranks",
        ),
    ],
)
def test_a_setting_the_world_of_one_gpu_count_refuses_is_refused_at_render(tmp_path, setting, named):
    """The world's rules at each GPU count of the sweep, as `run` would apply them at its start: the sweep
    rendered (exit 0) and its 2-GPU runs failed in the queue."""
    out, runs = sweep(tmp_path, "cluster=local", "gpus=2,4", *setting)
    assert out.returncode == 2 and runs == [], out.stdout
    assert "run 0002gpu" in out.stderr and named in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_overrides_may_follow_the_flags(tmp_path):
    """`--out DIR gpus=2`: an override after a flag was refused ("unrecognized arguments: gpus=2")."""
    out = subprocess.run(
        [
            str(BIN),
            "sweep",
            "cluster=local",
            "--out",
            str(tmp_path / "s"),
            "gpus=2",
            "--dry-run",
            "optimizer=wagma",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert [r["name"] for r in json.loads((tmp_path / "s" / "manifest.json").read_text())["runs"]] == [
        "0002gpu"
    ]
    assert "optimizer=wagma" in "".join(f.read_text() for f in (tmp_path / "s" / "jobs").glob("*.sbatch"))


def test_submitit_refuses_a_time_without_minutes_in_one_line(tmp_path):
    """cluster.time=INFINITE rendered as a job script, and crashed --submitit with a ValueError traceback."""
    out = subprocess.run(
        [str(BIN), "sweep", "cluster=local", "gpus=2", "cluster.time=INFINITE", "--submitit"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "cluster.time=INFINITE is not allowed with --submitit" in out.stderr


def test_cfg_job_prints_every_runs_composed_configuration(tmp_path):
    out = subprocess.run(
        [
            str(BIN),
            "sweep",
            "cluster=local",
            "gpus=4",
            "optimizer=choice(wagma,sgp)",
            "seed=range(1,3)",
            "--cfg",
            "job",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    headers = [line for line in out.stdout.splitlines() if line.startswith("# run ")]
    assert [h.split()[2] for h in headers] == [
        "0004gpu_wagma_s1",
        "0004gpu_wagma_s2",
        "0004gpu_sgp_s1",
        "0004gpu_sgp_s2",
    ]
    assert "\nseed: 2\n" in out.stdout and "  name: sgp\n" in out.stdout
    assert not list(tmp_path.iterdir())  # nothing rendered


def simulate(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = subprocess.run(
        [str(BIN), "simulate", *args, "train.max_rounds=22", "--out", str(tmp_path / "sim")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    predictions = tmp_path / "sim" / "predictions.json"
    return out, json.loads(predictions.read_text()) if predictions.exists() else []


def test_simulate_takes_runs_names(tmp_path):
    """`simulate` names workloads as `run` does (workload=resnet data=imagenet is the ResNet-50 preset)."""
    out, rows = simulate(
        tmp_path, "workload=resnet", "data=imagenet", "gpus=64,1024", "optimizer=allreduce,wagma"
    )
    assert out.returncode == 0, out.stderr
    assert [(r["optimizer"], r["world_size"], r["workload"]) for r in rows] == [
        (o, p, "resnet50") for p in (64, 1024) for o in ("allreduce", "wagma")
    ]


def test_simulate_takes_hydras_sweep_grammar(tmp_path):
    out, rows = simulate(
        tmp_path, "workload=resnet", "gpus=range(8,17,8)", "optimizer=choice(allreduce,wagma)"
    )
    assert out.returncode == 0, out.stderr
    assert [(r["optimizer"], r["world_size"], r["workload"]) for r in rows] == [
        (o, p, "resnet20") for p in (8, 16) for o in ("allreduce", "wagma")
    ]  # data defaults as in `run`
    out, _ = simulate(tmp_path, "workload=transformer", "gpus=8")
    assert out.returncode == 2 and "no simulate preset for workload=transformer" in out.stderr


def test_simulate_cfg_job_prints_what_it_would_simulate_and_simulates_nothing(tmp_path):
    import yaml

    out = subprocess.run(
        [
            str(BIN),
            "simulate",
            "workload=resnet",
            "data=imagenet",
            "gpus=64,1024",
            "optimizer=allreduce,wagma",
            "optimizer.tau=5",
            "imbalance=shared_draw",
            "--cfg",
            "job",
            "--out",
            str(tmp_path / "sim"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    job = yaml.safe_load(out.stdout)
    assert job["gpus"] == [64, 1024] and job["workload"]["name"] == "resnet50"
    assert job["optimizers"]["wagma"]["tau"] == 5 and set(job["optimizers"]) == {"allreduce", "wagma"}
    assert job["imbalance"]["name"] == "shared_draw"
    assert not (tmp_path / "sim").exists()


@pytest.mark.parametrize("experiment", ["compare_balanced", "compare_imbalance"])
def test_comparison_experiments_sweep_every_registered_optimizer(experiment):
    """The "every optimizer" presets name none: glob(*) over conf/optimizer/, so a new one is in them."""
    from hydra import compose, initialize_config_dir

    from wagma_bench.campaign.sweep import parse_overrides
    from wagma_bench.config.paths import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="wagma", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    swept = dict(parse_overrides([f"{k}={v}" for k, v in cfg.hydra.sweeper.params.items()]))
    assert sorted(swept["optimizer"]) == sorted(OPTIMIZERS) and swept["seed"] == ["1", "2", "3"]
