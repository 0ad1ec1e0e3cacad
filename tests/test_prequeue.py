"""Checked before the queue (wagma_bench/campaign/prequeue.py): `sweep` and `tune` refuse a data path that
does not exist or lacks its layout when they render, unless `--data-on-nodes` says only the compute nodes see
it; they print a GPU-hour line (checked here against the simulator called directly);
`cluster.array_parallelism` throttles the job array (`%N`; SLURM itself accepts it in tests/test_slurm.py's
profile-overrides test)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from wagma_bench.campaign import prequeue, sweep
from wagma_bench.cli import sweep as sweep_cli
from wagma_bench.cli import tune as tune_cli
from wagma_bench.config.cluster import load_profile
from wagma_bench.errors import ConfigError

PAPER = ["cluster=daint", "experiment=paper_resnet50"]


def imagenet_tree(root: Path, splits=("train", "val"), classes=("n01440764", "n01443537")) -> Path:
    """ImageNet's folder layout with one (empty, never opened) image per class."""
    for split in splits:
        for cls in classes:
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            (root / split / cls / f"{cls}_1.JPEG").write_bytes(b"")
    return root


def render(tmp_path: Path, args: list[str], **kwargs) -> dict:
    return sweep.render(sweep.parse_spec(args), tmp_path / "sweep", **kwargs)


def test_a_missing_data_root_exits_2_naming_it_and_the_dry_run_prints_gpu_hours(tmp_path):
    """The path was not checked before the queue: every job of the sweep failed at its start."""
    out = tmp_path / "sweep"
    cmd = [
        sys.executable,
        "-m",
        "wagma_bench",
        "sweep",
        *PAPER,
        "gpus=8",
        "optimizer=allreduce",
        "data.root=/nonexistent",
        "--dry-run",
        "--out",
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and "data.root=/nonexistent: no such directory" in res.stderr, (
        res.stderr
    )
    assert "reproduce/imagenet/README.md" in res.stderr and "--data-on-nodes" in res.stderr
    assert not out.exists()


def test_the_dry_run_says_the_data_was_checked_and_prints_the_gpu_hours(tmp_path, capsys):
    root = imagenet_tree(tmp_path / "imagenet")
    args = [
        *PAPER,
        "gpus=8",
        "optimizer=allreduce",
        f"data.root={root}",
        "--dry-run",
        "--out",
        str(tmp_path / "s"),
    ]
    assert sweep_cli.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"data.root={root}: exists, readable, imagenet layout" in lines
    (line,) = [x for x in lines if x.startswith("GPU-hours: ")]
    assert "expected" in line and "simulated" in line and "cluster.time=12:00:00" in line


@pytest.mark.parametrize(
    "broken, message",
    [
        (
            lambda r: (
                [f.unlink() for f in (r / "val").rglob("*.JPEG")]
                and [d.rmdir() for d in (r / "val").iterdir()]
            ),
            "holds no class sub-folders",
        ),
        (lambda r: [f.unlink() for f in (r / "val" / "n01443537").iterdir()], "n01443537 holds no images"),
        (
            lambda r: (
                [f.unlink() for f in (r / "val").rglob("*.JPEG")]
                and [d.rmdir() for d in (r / "val").iterdir()]
                and (r / "val").rmdir()
            ),
            "no 'val/' folder",
        ),
    ],
)
def test_an_imagenet_folder_without_its_val_layout_is_refused_at_render_time(tmp_path, broken, message):
    root = imagenet_tree(tmp_path / "imagenet")
    broken(root)
    with pytest.raises(ConfigError, match=message) as err:
        render(tmp_path, [*PAPER, "gpus=8", "optimizer=allreduce", f"data.root={root}"])
    assert str(err.value).startswith(f"data.root={root}: ") and "reproduce/imagenet/README.md" in str(
        err.value
    )
    assert not (tmp_path / "sweep").exists()


def test_a_file_for_a_folder_and_a_wmt_folder_without_its_files_are_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=f"data.root={tmp_path / 'file'}: not a directory"):
        render(tmp_path, [*PAPER, "gpus=8", "optimizer=allreduce", f"data.root={tmp_path / 'file'}"])
    (tmp_path / "wmt").mkdir()
    with pytest.raises(
        ConfigError,
        match=r"data.path=.*wmt is not a fairseq-binarized en-de directory: missing "
        r"dict.en.txt.*reproduce/transformer/README.md",
    ):
        render(
            tmp_path,
            [
                "cluster=daint",
                "gpus=8",
                "optimizer=allreduce",
                "experiment=paper_transformer",
                f"data.path={tmp_path / 'wmt'}",
            ],
        )


def test_a_path_only_the_nodes_see_is_said_not_checked(tmp_path):
    manifest = render(
        tmp_path, [*PAPER, "gpus=8", "optimizer=allreduce", "data.root=/scratch/imagenet"], data_on_nodes=True
    )
    assert manifest["checks"]["data"] == [
        (
            "data.root=/scratch/imagenet: not checked (--data-on-nodes: only the "
            "compute nodes see it); each run checks it at its start"
        )
    ]
    habitat = ["cluster=local", "gpus=2", "workload=ddppo", "env=habitat"]
    with pytest.raises(ConfigError, match=f"env.data_root={tmp_path}: no data/ folder"):
        render(tmp_path / "h", [*habitat, f"env.data_root={tmp_path}"])
    (tmp_path / "data").mkdir()
    assert render(tmp_path / "h", [*habitat, f"env.data_root={tmp_path}"])["checks"]["data"] == [
        f"env.data_root={tmp_path}: exists, readable, habitat layout"
    ]
    # the embedded data has no path to check
    assert render(tmp_path / "b", ["cluster=local", "gpus=2", "optimizer=allreduce"])["checks"]["data"] == []


def test_the_gpu_hours_are_the_simulators_round_time_times_the_plans_rounds(tmp_path):
    """Against the simulator called here directly: for each run, GPUs x rounds x simulated seconds per round,
    the rounds counted by hand (90 epochs of ImageNet's 1,281,167 images at batch 128 per GPU, for every
    optimizer: a budget ends where it says, also off WAGMA-SGD's period of 11)."""
    from wagma_bench.simulate.costs import Network
    from wagma_bench.simulate.des import SimConfig, simulate
    from wagma_bench.simulate.presets import preset

    manifest = render(
        tmp_path,
        [*PAPER, "gpus=8,64", "optimizer=allreduce,wagma", "seeds=2", "data.root=/scratch/imagenet"],
        data_on_nodes=True,
    )
    daint = load_profile("daint")
    net = Network.from_profile(daint.network.as_dict(), daint.gpus_per_node, "daint")
    expected = 0.0
    for gpus in (8, 64):
        per_epoch = math.ceil(1_281_167 / (128 * gpus))
        for opt in ("allreduce", "wagma"):
            rounds = 90 * per_epoch
            res = simulate(SimConfig(opt, gpus, preset("resnet50"), net, steps=prequeue.SIM_ROUNDS))
            expected += 2 * gpus * rounds * res.time_s / res.rounds  # two seeds
    est = manifest["checks"]["gpu_hours"]
    assert est["expected"] == pytest.approx(expected / 3600, rel=1e-9)
    assert est["bound"] == pytest.approx(2 * 2 * (8 + 64) * 12.0)  # runs x GPUs x cluster.time
    assert est["sources"] == {"measured": 0, "simulated": 8, "unknown": 0}
    assert f"GPU-hours: {expected / 3600:,.1f} expected" in est["line"]
    assert f"upper bound, one allocation per run: {2 * 2 * 72 * 12.0:,.1f}" in est["line"]
    assert "(requeues come on top)" in est["line"] and est["longer_than_time"] == 0


def test_measured_step_times_replace_the_simulators(tmp_path):
    """A finished run of the same workload, data, optimizer and world gives its training clock per round."""
    run = tmp_path / "measured" / "run1"
    run.mkdir(parents=True)
    start = {
        "key": "run_start",
        "value": None,
        "metadata": {
            "workload": "resnet",
            "data": "imagenet",
            "optimizer": "allreduce",
            "world_size": 8,
            "train_samples": 1_281_167,
            "config": {"data": {"name": "imagenet"}},
        },
    }
    (run / "events.jsonl").write_text(json.dumps(start) + "\n")
    (run / "summary.json").write_text(json.dumps({"steps": 200, "train_s": 100.0}))
    manifest = render(
        tmp_path,
        [*PAPER, "gpus=8", "optimizer=allreduce,wagma", "data.root=/x", "train.max_rounds=1000"],
        data_on_nodes=True,
        step_times=(str(tmp_path / "measured"),),
    )
    est = manifest["checks"]["gpu_hours"]
    assert est["sources"] == {"measured": 1, "simulated": 1, "unknown": 0}
    assert "1 run measured (--step-times)" in est["line"]
    alone = render(
        tmp_path / "b",
        [*PAPER, "gpus=8", "optimizer=allreduce", "data.root=/x", "train.max_rounds=1000"],
        data_on_nodes=True,
        step_times=(str(tmp_path / "measured"),),
    )
    assert alone["checks"]["gpu_hours"]["expected"] == pytest.approx(8 * 1000 * 0.5 / 3600)
    (tmp_path / "empty").mkdir()
    for where, said in (("empty", "no run that trained"), ("nowhere", "no such run or sweep directory")):
        with pytest.raises(ConfigError, match=f"--step-times.*{said}"):
            render(
                tmp_path / "c",
                [*PAPER, "gpus=8", "optimizer=allreduce", "data.root=/x"],
                data_on_nodes=True,
                step_times=(str(tmp_path / where),),
            )


def test_a_run_the_suite_cannot_size_has_unknown_expected_gpu_hours_and_only_a_bound(tmp_path):
    """The embedded Transformer's epoch is counted in tokens of a corpus made at the run's start: unknown
    here. The line called the bound "expected" (8,640.0 expected for 18 such runs) and the manifest said
    ``longer_than_time: 0`` for runs of unknown length."""
    manifest = render(tmp_path, ["cluster=generic8", "gpus=8", "optimizer=allreduce", "workload=transformer"])
    est = manifest["checks"]["gpu_hours"]
    assert est["sources"]["unknown"] == 1 and est["expected"] is None and est["longer_than_time"] is None
    assert est["line"].startswith("GPU-hours: expected unknown: 1 run of unknown length or round time")
    assert (
        "upper bound, one allocation per run: 96.0" in est["line"] and "requeues come on top" in est["line"]
    )
    assert json.loads((tmp_path / "sweep" / "manifest.json").read_text())["checks"]["gpu_hours"] == est
    # a known run beside it: expected for that one, unknown for the other
    mixed = render(
        tmp_path / "m", ["cluster=generic8", "gpus=8", "optimizer=allreduce", "workload=transformer,resnet"]
    )["checks"]["gpu_hours"]
    assert mixed["expected"] > 0 and mixed["expected_runs"] == 1 and mixed["longer_than_time"] is None
    assert " expected for 1 run = " in mixed["line"] and "; unknown for the other 1 run of" in mixed["line"]


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_array_parallelism_must_be_a_positive_count(value):
    with pytest.raises(ConfigError, match="cluster.array_parallelism"):
        load_profile("generic8", [f"array_parallelism={value}"])


def test_array_parallelism_throttles_the_sweeps_and_tunes_job_array(tmp_path, capsys):
    manifest = render(
        tmp_path, ["cluster=local", "cluster.array_parallelism=3", "gpus=2", "optimizer=allreduce", "seeds=5"]
    )
    assert "#SBATCH --array=0-4%3\n" in (tmp_path / "sweep" / manifest["jobs"][0]["script"]).read_text()
    assert (
        "--array=0-4\n" in sweep.sbatch_lines(load_profile("local"), 2, "x", "log", 5)[-1] + "\n"
    )  # unthrottled
    assert "hydra.launcher.array_parallelism=3" in sweep.submitit_overrides(
        load_profile("local", ["array_parallelism=3"]), 2
    )
    out = tmp_path / "tune"
    assert (
        tune_cli.main(
            [
                "cluster=local",
                "cluster.array_parallelism=2",
                "gpus=2",
                "optimizer=allreduce",
                "tune.trials=2",
                "tune.studies=2",
                "train.max_rounds=10",
                "--dry-run",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "GPU-hours: " in capsys.readouterr().out
    assert "#SBATCH --array=0-3%2\n" in next((out / "jobs").glob("*.sbatch")).read_text()


def test_tune_refuses_a_missing_data_root_before_writing_its_plan(tmp_path, capsys):
    out = tmp_path / "tune"
    args = [
        *PAPER,
        "gpus=8",
        "optimizer=allreduce",
        "tune.trials=1",
        "tune.studies=1",
        "--dry-run",
        "--out",
        str(out),
    ]
    assert tune_cli.main([*args[:4], "data.root=/nonexistent", *args[4:]]) == 2
    assert "data.root=/nonexistent: no such directory" in capsys.readouterr().err
    assert not out.exists()  # tune.json not written: the same command with the path mended is the same tuning
    assert tune_cli.main([*args[:4], "data.root=/nonexistent", *args[4:], "--data-on-nodes"]) == 0
    assert "data.root=/nonexistent: not checked (--data-on-nodes" in capsys.readouterr().out


# --- reproduce/imagenet/prepare.py: the official archives into the layout checked above ---------------------

PREPARE = Path(__file__).resolve().parents[1] / "reproduce" / "imagenet" / "prepare.py"
VAL_LABELS = {
    "ILSVRC2012_val_00000001": "n01443537",
    "ILSVRC2012_val_00000002": "n01440764",
    "ILSVRC2012_val_00000003": "n01443537",
}


def _tar(path: Path, files: dict[str, bytes]) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w:gz" if path.name.endswith(".gz") else "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def fake_archives(src: Path, labels: str) -> None:
    """ILSVRC-2012's archives in miniature: per-class tars inside the training tar, a flat validation tar, and
    the validation labels as Kaggle's CSV or the devkit's ground truth and meta.mat (class index -> wnid)."""
    import io

    import numpy as np
    from scipy.io import savemat

    src.mkdir()
    inner = {}
    for wnid in ("n01440764", "n01443537"):
        _tar(src / f"{wnid}.tar", {f"{wnid}_{i}.JPEG": f"{wnid}{i}".encode() for i in (1, 2)})
        inner[f"{wnid}.tar"] = (src / f"{wnid}.tar").read_bytes()
        (src / f"{wnid}.tar").unlink()
    _tar(src / "ILSVRC2012_img_train.tar", inner)
    _tar(src / "ILSVRC2012_img_val.tar", {f"{i}.JPEG": i.encode() for i in VAL_LABELS})
    if labels == "kaggle":
        rows = [f"{i},{w} 10 20 30 40 {w} 1 2 3 4" for i, w in VAL_LABELS.items()]
        (src / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n" + "\n".join(rows) + "\n")
        return
    # the devkit numbers classes in its own order (not the wnids'): 1 is n01443537 here
    synsets = np.array(
        [(1, "n01443537"), (2, "n01440764"), (1001, "n00001740")],
        dtype=[("ILSVRC2012_ID", "O"), ("WNID", "O")],
    )
    meta = io.BytesIO()
    savemat(meta, {"synsets": synsets})
    truth = "".join(f"{1 if w == 'n01443537' else 2}\n" for w in VAL_LABELS.values())
    _tar(
        src / "ILSVRC2012_devkit_t12.tar.gz",
        {
            "ILSVRC2012_devkit_t12/data/meta.mat": meta.getvalue(),
            "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt": truth.encode(),
        },
    )


def prepare_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("imagenet_prepare", PREPARE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("labels", ["kaggle", "devkit"])
def test_prepare_builds_the_layout_the_render_check_accepts(tmp_path, labels, capsys):
    src, root = tmp_path / "archives", tmp_path / "imagenet"
    fake_archives(src, labels)
    assert prepare_module().main([str(src), str(root)]) == 0  # in this process: torch is imported once
    assert f"data.root={root}: the layout data=imagenet reads" in capsys.readouterr().out
    found = sorted(str(p.relative_to(root)) for p in root.rglob("*.JPEG"))
    assert found == [
        "train/n01440764/n01440764_1.JPEG",
        "train/n01440764/n01440764_2.JPEG",
        "train/n01443537/n01443537_1.JPEG",
        "train/n01443537/n01443537_2.JPEG",
        "val/n01440764/ILSVRC2012_val_00000002.JPEG",
        "val/n01443537/ILSVRC2012_val_00000001.JPEG",
        "val/n01443537/ILSVRC2012_val_00000003.JPEG",
    ]
    assert (
        root / "val" / "n01443537" / "ILSVRC2012_val_00000003.JPEG"
    ).read_bytes() == b"ILSVRC2012_val_00000003"
    assert sorted(p.name for p in root.iterdir()) == ["train", "val"]  # the .partial folders renamed
    manifest = render(tmp_path, [*PAPER, "gpus=8", "optimizer=allreduce", f"data.root={root}"])
    assert manifest["checks"]["data"] == [f"data.root={root}: exists, readable, imagenet layout"]


def test_the_example_in_docs_slurm_is_the_commands_output(tmp_path, capsys):
    """docs/slurm.md's "Checked before the queue" shows a command and its output: the output is generated, not
    typed."""
    import re
    import shlex

    page = (Path(__file__).resolve().parents[1] / "docs" / "slurm.md").read_text()
    section = page.split("## Checked before the queue", 1)[1]
    block = section.split("```\n", 2)[1]
    command, _, shown = block.partition("\n" + "wagma-bench sweep: ")
    argv = shlex.split(command.removeprefix("$ ").replace("\\\n", " "))
    assert argv[:2] == ["wagma-bench", "sweep"]
    argv[argv.index("--out") + 1] = str(tmp_path / "s")
    assert sweep_cli.main(argv[2:]) == 0
    printed = capsys.readouterr().out.splitlines()
    first = "wagma-bench sweep: " + shown.splitlines()[0]
    assert re.sub(r"in [\d.]+ s: .*", "", printed[0]) == re.sub(r"in [\d.]+ s: .*", "", first)
    assert shown.splitlines()[1:] == printed[1 : len(shown.splitlines())]


# --- issue 79: nothing written outside OUT, a split complete only when its archive is ------------------


def test_a_label_that_is_not_a_wnid_is_refused_and_nothing_escapes(tmp_path):
    src, root = tmp_path / "deep" / "archives", tmp_path / "deep" / "imagenet"
    src.parent.mkdir()
    fake_archives(src, "kaggle")
    csv = src / "LOC_val_solution.csv"
    csv.write_text(
        csv.read_text().replace(
            "ILSVRC2012_val_00000002,n01440764", "ILSVRC2012_val_00000002,../../escaped_here"
        )
    )
    with pytest.raises(SystemExit, match=r"ILSVRC2012_val_00000002.*'\.\./\.\./escaped_here'.*WordNet id"):
        prepare_module().main([str(src), str(root)])
    assert not list(tmp_path.rglob("escaped_here*")) and not (root / "val").exists()


@pytest.mark.parametrize("where", ["out", "train"])
def test_an_output_root_that_is_a_link_is_refused(tmp_path, where):
    src, target = tmp_path / "archives", tmp_path / "elsewhere"
    fake_archives(src, "kaggle")
    target.mkdir()
    root = tmp_path / "imagenet"
    if where == "out":
        root.symlink_to(target)
    else:
        root.mkdir()
        (target / "n01440764").mkdir()
        (root / "train").symlink_to(target)
    with pytest.raises(SystemExit, match="symbolic link"):
        prepare_module().main([str(src), str(root)])
    assert sorted(p.name for p in target.iterdir()) == ([] if where == "out" else ["n01440764"])


def test_a_training_tar_cut_at_a_member_boundary_is_not_marked_complete(tmp_path):
    import tarfile

    src, root = tmp_path / "archives", tmp_path / "imagenet"
    fake_archives(src, "kaggle")
    tar = src / "ILSVRC2012_img_train.tar"
    with tarfile.open(tar) as t:
        second = t.getmembers()[1]
    tar.write_bytes(tar.read_bytes()[: second.offset])  # the first class's tar whole, nothing after it
    with pytest.raises(SystemExit, match=f"{tar.name}.*ends after.*cut short"):
        prepare_module().main([str(src), str(root)])
    assert not (root / "train").exists() and (root / "train.partial").is_dir()


def test_the_layout_check_refuses_a_file_for_a_class_and_other_classes_in_val(tmp_path):
    from wagma_bench.workloads.specs import check_imagenet_root

    root = imagenet_tree(tmp_path / "imagenet")
    first = min((root / "val").iterdir())
    for f in first.iterdir():
        f.unlink()
    first.rmdir()
    first.write_text("")  # a file where val's first class is: torchvision would number val's classes anew
    with pytest.raises(ConfigError, match=f"{first} is a file.*class folders only"):
        check_imagenet_root(str(root))
    first.unlink()
    (root / "val" / "n99999999").mkdir()
    (root / "val" / "n99999999" / "a.JPEG").write_bytes(b"x")
    with pytest.raises(ConfigError, match=f"'val/' has not the classes of 'train/'.*{first.name}"):
        check_imagenet_root(str(root))


def test_the_layout_check_knows_torchvisions_image_extensions_and_refuses_without_importing_torch(tmp_path):
    """The check spells out ImageFolder's extensions so that a refusal comes before torch is imported (5
    CPU-seconds): the list must stay torchvision's, and a refusal must leave torch unimported."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    from wagma_bench.workloads.specs import IMAGE_EXTENSIONS

    assert IMAGE_EXTENSIONS == IMG_EXTENSIONS
    root = imagenet_tree(tmp_path / "imagenet")
    for f in (root / "val" / min(p.name for p in (root / "val").iterdir())).iterdir():
        f.unlink()
    probe = (
        "import sys\nfrom wagma_bench.errors import ConfigError\n"
        "from wagma_bench.workloads.specs import check_imagenet_root\n"
        f"try:\n    check_imagenet_root({str(root)!r})\nexcept ConfigError as err:\n    print(err)\n"
        "print(sorted(m for m in ('torch', 'torchvision') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "holds no images" in out and out.strip().endswith("[]"), out
