"""Hostile and careless input at the command line (issue 79): damaged files the suite reads back, links where
it writes, copied sweep folders. Each command is called in this process (``wagma_bench.cli.main``) and must
answer in one line on stderr with exit 2, never a traceback."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from wagma_bench.cli import main

VALID_MANIFEST = {
    "version": 1,
    "jobs": [{"script": "jobs/000_0002gpu.sbatch", "gpus": 2, "array": True, "runs": 1, "job_id": None}],
    "runs": [
        {
            "name": "r0",
            "gpus": 2,
            "overrides": ["seed=1"],
            "run_dir": "runs/r0",
            "job": 0,
            "array_index": 0,
        }
    ],
}
DAMAGED = {
    "cut at 700 bytes": lambda text: text[:700],
    "empty": lambda text: "",
    "a JSON list": lambda text: "[1, 2]",
    "jobs a string": lambda text: json.dumps({**VALID_MANIFEST, "jobs": "all"}),
    "a run_dir outside": lambda text: json.dumps(
        {**VALID_MANIFEST, "runs": [{**VALID_MANIFEST["runs"][0], "run_dir": "../../escaped"}]}
    ),
}


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("action", ["status", "cancel", "submit", "wait"])
@pytest.mark.parametrize("damage", list(DAMAGED))
def test_a_damaged_sweep_manifest_is_one_line(tmp_path, capsys, action, damage):
    text = json.dumps({**VALID_MANIFEST, "runs": VALID_MANIFEST["runs"] * 8}, indent=2)
    assert len(text) > 900
    (tmp_path / "manifest.json").write_text(DAMAGED[damage](text))
    rc = main(["sweep", action, str(tmp_path), *(["--timeout", "1"] if action == "wait" else [])])
    line = one_line(capsys)
    assert rc == 2 and "manifest.json" in line, line


@pytest.mark.parametrize(
    "content,said",
    [
        ('{"version": 1, "report": {', "not valid JSON"),
        ("", "empty"),
        ("[1, 2]", "must be a mapping"),
        ('{"version": 1}', "report is missing"),
    ],
)
def test_a_damaged_wandb_spec_is_one_line(tmp_path, capsys, monkeypatch, content, said):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    spec = tmp_path / "wandb-report.json"
    spec.write_text(content)
    rc = main(["report", "--wandb-publish", str(spec)])
    line = one_line(capsys)
    assert rc == 2 and str(spec) in line and said in line, line


MEASURED_OK = {"format": "wagma-bench measured inputs 1", "measured_on": "cpu"}


@pytest.mark.parametrize(
    "section,value",
    [
        ("gossip_cost", "0.1"),
        ("compute", [0.1]),
        ("network", "fast"),
        ("skipped", 3),
        ("gossip_cost", {"value": 0.1, "replicates": 4}),
        ("network", {"intra": "fast"}),
    ],
)
def test_a_measured_file_with_a_wrongly_typed_section_is_one_line(tmp_path, capsys, section, value):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({**MEASURED_OK, section: value}))
    rc = main(
        ["simulate", "gpus=8", "optimizer=allreduce", "--measured", str(path), "--out", str(tmp_path / "s")]
    )
    line = one_line(capsys)
    assert rc == 2 and str(path) in line and section in line, line
    assert not (tmp_path / "s").exists()


def render(out: Path) -> int:
    return main(
        ["sweep", "cluster=local", "gpus=2", "train.max_rounds=4", "--data-on-nodes", "--out", str(out)]
    )


def test_a_dangling_link_at_the_manifest_is_named_and_nothing_is_left(tmp_path, capsys):
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "manifest.json").symlink_to(tmp_path / "nowhere.json")
    assert render(out) == 2
    line = one_line(capsys)
    assert f"{out / 'manifest.json'} is a symbolic link" in line, line
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]
    assert not (tmp_path / "nowhere.json").exists()


def test_a_copied_sweep_folder_is_refused_naming_the_original(tmp_path, capsys):
    import shutil

    original = tmp_path / "sweep"
    assert render(original) == 0
    capsys.readouterr()
    copy = tmp_path / "copy"
    shutil.copytree(original, copy, symlinks=True)
    rc = main(["sweep", "submit", str(copy)])
    line = one_line(capsys)
    assert rc == 2 and f"rendered in {original}" in line, line
    assert json.loads((original / "manifest.json").read_text())["jobs"][0]["job_id"] is None


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--cfg", "job"],  # before the fix: the composed configuration printed, exit 0
        ["simulate", "gpus=8"],
        ["sweep", "cluster=local", "gpus=2", "--dry-run"],
        ["tune", "--dry-run", "cluster=local", "gpus=2"],
    ],
    ids=lambda c: c[0],
)
@pytest.mark.parametrize(
    "old,new",
    [("train.max_steps=5", "train.max_rounds=7"), ("optimizer.period=4", "optimizer.sync_period=8")],
)
def test_an_old_and_a_new_name_at_two_values_are_refused_naming_both(tmp_path, capsys, command, old, new):
    optimizer = ["optimizer=local_sgd"] if old.startswith("optimizer") else []
    rc = main(
        [*command, *optimizer, old, new, *(["--out", str(tmp_path / "o")] if command[0] != "run" else [])]
    )
    line = one_line(capsys) if rc == 2 else capsys.readouterr().err
    assert rc == 2 and old.partition("=")[0] in line and new.partition("=")[0] in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "args,named",
    [
        (["gpus=65536", "train.max_rounds=1000000000"], "train.max_rounds=1000000000"),
        (["gpus=4", "train.max_rounds=100000000"], "train.max_rounds=100000000"),
        (["gpus=8", "--interval", "1000000000"], "--interval 1000000000"),
        (["gpus=8", "compute=persistent", "sigma_rank=1e300"], "sigma_rank=1e+300"),
        (["gpus=8", "step_s=inf"], "step_s=inf"),
        (["gpus=8", "rho=0.5"], "rho=0.5"),
    ],
)
def test_simulate_refuses_unbounded_work_and_magnitudes_within_a_second(tmp_path, capsys, args, named):
    """Bounded by the work a simulation implies (ranks x rounds; replicates x that), finite inputs only, and
    rho only with the model that reads it (compute=persistent)."""
    import time

    import wagma_bench.cli.simulate  # noqa: F401 - its imports are not the refusal's time

    start = time.perf_counter()
    rc = main(["simulate", "optimizer=allreduce", *args, "--out", str(tmp_path / "s")])
    took = time.perf_counter() - start
    line = one_line(capsys)
    assert rc == 2 and named in line, line
    assert took < 5, took  # the refusal comes before anything is simulated (1 s on a quiet machine)
    assert not (tmp_path / "s").exists()


def test_a_simulation_refused_for_its_size_imports_neither_the_simulator_nor_scipy_nor_matplotlib():
    """The bounds are checked before the modules that simulate, fit and draw are imported (they took 1.3 s
    of a 1.0-1.2 s refusal here at load 9): the refusal of `simulate gpus=65536 train.max_rounds=1000000000`
    comes at once. A fresh interpreter, so that what this session imported does not count."""
    from tests.proc_util import heavy_modules_after

    code = (
        "from wagma_bench.cli import simulate\n"
        "assert simulate.main(['gpus=65536', 'train.max_rounds=1000000000']) == 2"
    )
    heavy = ("scipy", "matplotlib", "torch", "wagma_bench.simulate.predict", "wagma_bench.simulate.configure")
    assert heavy_modules_after(code, heavy) == []


def test_simulates_output_json_holds_finite_values_only(tmp_path):
    """A NaN or an infinity (a spread that overflowed, a throughput of 0) is written as null: strict readers
    (jq, JavaScript) refuse the bare tokens Python writes."""
    from wagma_bench.simulate.interval import compact_json
    from wagma_bench.simulate.outputs import write_table

    def strict(text: str):
        return json.loads(text, parse_constant=lambda token: pytest.fail(f"bare {token} in {text[:80]}"))

    rows = [{"optimizer": "wagma", "world_size": 8, "throughput": float("inf"), "time_to_target_s": math.nan}]
    write_table(rows, tmp_path, "predictions")
    assert strict((tmp_path / "predictions.json").read_text())[0]["throughput"] is None
    assert strict(compact_json({"predictions": [{"8": {"wagma": {"throughput": math.nan}}}]}))


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB file system of its own (a tmpfs: mounting one needs root, as the namespace tests do)."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    yield disk
    subprocess.run(["umount", str(disk)], check=False)


def test_simulate_on_a_filling_disk_leaves_its_earlier_outputs_whole(small_disk, capsys):
    """The tables fit, the figure does not: exit 1 in one line, --out as the earlier simulation left it (no
    new table beside the old figure), nothing staged left; a staging folder of a killed run is removed."""
    import shutil
    import socket
    import subprocess

    out = small_disk / "sim"
    args = ["simulate", "optimizer=allreduce", "train.max_rounds=20", "--out", str(out)]
    assert main([args[0], "gpus=8", *args[1:]]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == ["predictions.csv", "predictions.json", "throughput.png"]
    pid = subprocess.Popen(["true"])  # a PID that has ended: the killed run's
    pid.wait()
    killed = small_disk / f".sim.tmp-{socket.gethostname()}-{pid.pid}-abcdefgh"
    killed.mkdir()
    (killed / ".predictions.json.tmpxyz").write_bytes(b"")
    (small_disk / "filler").write_bytes(b"\0" * (shutil.disk_usage(small_disk).free - 3 * 4096))
    capsys.readouterr()
    assert main([args[0], "gpus=8,16", *args[1:]]) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("wagma-bench")]
    assert said[0] == f"wagma-bench: removed {killed}, left by a killed run (PID {pid.pid})", said
    assert len(said) == 2 and "No space left on device" in said[1], said
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "sim"]
    (small_disk / "filler").unlink()
    assert main([args[0], "gpus=8,16", *args[1:]]) == 0
    assert (out / "predictions.json").read_bytes() != before["predictions.json"]
