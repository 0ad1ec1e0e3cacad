"""A cluster user's first day without SLURM at hand: requests that fit the profile's node
(wagma_bench/campaign/nodefit.py), the smoke sweep's script and the line a real sweep prints without one
beside it (wagma_bench/campaign/smoke.py). SLURM's own answers: tests/test_slurm.py (``--check`` against a
64-CPU stand-in) and tests/test_multinode.py (the smoke sweep on two hosts)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from wagma_bench.campaign import nodefit, smoke, sweep
from wagma_bench.cli import doctor
from wagma_bench.cli import sweep as sweep_cli
from wagma_bench.config.cluster import load_profile
from wagma_bench.config.paths import CONF_DIR
from wagma_bench.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["cluster.hardware.cpus_per_node=64"],
            (
                "cluster.cpus_per_task=12 asks 8 tasks x 12 = 96 CPUs a node; cluster generic8's node "
                "(hardware) has 64: cluster.cpus_per_task=8 fits"
            ),
        ),
        (
            ["cluster.gpus_per_node=16", "cluster.cpus_per_task=4"],
            (
                "cluster.gpus_per_node=16 asks 16 GPUs a node (one task per GPU); cluster generic8's node "
                "(hardware) has 8: cluster.gpus_per_node=8 fits"
            ),
        ),
        (
            ["cluster.sbatch_extra=['--mem=3T']"],
            "cluster.sbatch_extra asks --mem=3072G a node; cluster generic8's node (hardware) has 2048 GB",
        ),
    ],
)
def test_a_request_beyond_the_profiles_node_is_refused_before_rendering_naming_the_key(
    tmp_path, capsys, overrides, message
):
    """generic8 asked for 96 cores a node without saying so; a 64-CPU site's SLURM refused it only in the
    queue ("Requested node configuration is not available")."""
    out = tmp_path / "s"
    args = ["cluster=generic8", "gpus=32", "optimizer=allreduce", *overrides, "--dry-run", "--out", str(out)]
    assert sweep_cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_the_dry_run_prints_what_each_node_asks_beside_the_profiles_node(tmp_path, capsys):
    args = ["cluster=generic8", "cluster.cpus_per_task=8", "gpus=16", "optimizer=allreduce", "--dry-run"]
    assert sweep_cli.main([*args, "--out", str(tmp_path / "s")]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("per node: ")]
    assert line == (
        "per node: 8 tasks x cluster.cpus_per_task=8 = 64 CPUs, 8 GPUs (--gres=gpu:8), memory: SLURM's "
        "default; cluster generic8's node (hardware): 96 CPUs, 8 GPUs, 2048 GB"
    )


def test_every_profile_states_its_node():
    for path in sorted((CONF_DIR / "cluster").glob("*.yaml")):
        hw = load_profile(path.stem).hardware
        assert hw.cpus_per_node >= 1 and hw.gpus_per_node >= 0, path
        assert "mem_gb:" in path.read_text(), f"{path.name}: the node's memory (mem_gb) is not stated"
        # the profile's own request fits its own node
        nodefit.check_fits(load_profile(path.stem), [load_profile(path.stem).gpus_per_node])


def test_sinfo_node_parses_cpus_gres_and_memory(monkeypatch):
    class Out:
        stdout = "64 gpu:h100:8(S:0-1) 1031000\n96 gpu:8 2000000\n"

    monkeypatch.setattr(nodefit.subprocess, "run", lambda *a, **k: Out())  # sinfo's own output, as printed
    node = nodefit.sinfo_node("gpu")
    assert (node.cpus, node.gpus, round(node.mem_gb)) == (64, 8, 1007)
    assert node.source == "partition gpu's node (sinfo)"


def test_smoke_renders_one_two_node_job_of_every_optimizer_and_comm_bench(tmp_path, capsys):
    out = tmp_path / "smoke"
    assert sweep_cli.main(["--smoke", "cluster=generic8", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    script = (out / "jobs" / "smoke.sbatch").read_text()
    optimizers = sorted(p.stem for p in (CONF_DIR / "optimizer").glob("*.yaml"))
    assert [r["name"] for r in manifest["runs"]] == [f"0016gpu_{o}" for o in optimizers]
    assert manifest["smoke"] == {"commbench": "commbench.json"} and len(manifest["jobs"]) == 1
    for line in ("--nodes=2", "--ntasks=16", "--ntasks-per-node=8", "--gres=gpu:8", "--time=01:00:00"):
        assert f"#SBATCH {line}\n" in script, line
    runs = re.findall(
        r"^srun .* wagma-bench run experiment=smoke optimizer=(\w+) hydra.run.dir=(\S+) ",
        script,
        re.MULTILINE,
    )
    assert runs == [(o, str(out.resolve() / "runs" / f"0016gpu_{o}")) for o in optimizers]
    (bench,) = [x for x in script.splitlines() if " wagma-bench comm-bench " in x]
    assert bench.startswith("srun ") and f"--device cuda --out {out.resolve() / 'commbench.json'}" in bench
    assert "upper bound, one job: 16.0 = its GPUs x cluster.time=01:00:00" in printed
    with pytest.raises(ConfigError, match="leave gpus=, seeds= and seed= out"):
        smoke.smoke_spec(["cluster=generic8", "gpus=8"])


def test_a_real_sweep_says_in_one_line_when_no_smoke_sweep_lies_beside_it(tmp_path, capsys):
    args = ["cluster=local", "gpus=2", "optimizer=allreduce", "--dry-run", "--out", str(tmp_path / "a")]
    assert sweep_cli.main(args) == 0
    assert [x for x in capsys.readouterr().out.splitlines() if "smoke sweep" in x] == [
        (
            f"no smoke sweep of cluster local beside this one (in {tmp_path}): run one first, wagma-bench "
            f"sweep --smoke cluster=local --out {tmp_path / 'smoke_local'} (docs/slurm.md)"
        )
    ]
    smoke.render(smoke.smoke_spec(["cluster=local", "optimizer=allreduce"]), tmp_path / "smoke_local")
    assert "has no commbench.json yet" in smoke.beside_line(tmp_path / "a", "local")
    (tmp_path / "smoke_local" / "commbench.json").write_text("{}")
    found = smoke.beside_line(tmp_path / "a", "local")
    assert found.startswith(f"smoke sweep: {tmp_path / 'smoke_local'} ran on cluster local"), found
    assert smoke.beside_line(tmp_path / "deeper" / "b", "local").startswith("smoke sweep: ")  # one folder up
    assert smoke.beside_line(tmp_path / "a", "generic4").startswith("no smoke sweep of cluster generic4")


def test_smoke_spec_keeps_a_narrowed_optimizer_list_and_the_users_time():
    spec = smoke.smoke_spec(
        ["cluster=local", "cluster.gpus_per_node=1", "optimizer=allreduce,wagma", "cluster.time=5"]
    )
    assert spec.gpus == [2] and spec.axes == {"optimizer": ["allreduce", "wagma"]}
    assert spec.cluster.time == "5" and spec.common[0] == "experiment=smoke"
    assert [r.name for r in sweep.expand(spec)] == ["0002gpu_allreduce", "0002gpu_wagma"]


SYSTEM_PYTHON = Path("/usr/bin/python3")


def _system_python_matches() -> bool:
    """The system Python (which any user can run; this venv's base lies under /root, mode 700) is of this
    Python's minor version, so that a venv of it can import the packages already installed here."""
    if not SYSTEM_PYTHON.exists():
        return False
    out = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return out.stdout.strip() == str(sys.version_info[:2])


@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("useradd") or not _system_python_matches(),
    reason="needs root to make a throwaway user, and a system Python of this minor version",
)
def test_setup_user_installs_without_root_and_doctor_names_what_is_missing_with_its_command():
    """`make setup-user` as a throwaway non-root user, into a venv of its own that sees the packages already
    installed here (a .pth file; a real build of fairseq takes minutes): every pip step with --dry-run
    --no-index, so each must be satisfied by what is here without root, apt-get or a download; then doctor's
    table. The dry run installs no console scripts, so the venv has no fairseq-preprocess (WMT's preparation
    needs it): doctor names it with its command."""
    user = f"wbsetup{os.getpid()}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/bash", user], check=True)
    home = Path(tempfile.mkdtemp(prefix="wagma-setup-user-", dir="/tmp"))
    try:
        home.chmod(0o755)
        shutil.chown(home, user)
        venv = home / "venv"
        as_user = ["runuser", "-u", user, "--"]
        subprocess.run([*as_user, str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True)
        site = next((venv / "lib").glob("python3.*/site-packages"))
        (site / "here.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        env = [f"HOME={home}", f"PATH={venv / 'bin'}:/usr/bin:/bin", f"PYTHONPATH={REPO}"]
        out = subprocess.run(
            [
                *as_user,
                "env",
                "-i",
                *env,
                "make",
                "--no-print-directory",
                "-C",
                str(REPO),
                "setup-user",
                f"VENV={venv}",
                "PIP_FLAGS=--dry-run --no-index --no-build-isolation",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        subprocess.run(["userdel", user], check=False)
        shutil.rmtree(home, ignore_errors=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "apt-get" not in out.stdout and "sudo" not in out.stdout
    steps = [x for x in out.stdout.splitlines() if x.startswith(f"{venv}/bin/python -m pip install")]
    assert any("fairseq-fixed==0.12.3.1" in s for s in steps) and any("-e '.[" in s for s in steps), steps
    table = out.stdout[out.stdout.index("wagma-bench doctor: ") :].splitlines()
    row = next(i for i, x in enumerate(table) if x.startswith("fairseq-preprocess (WMT)"))
    assert "MISSING" in table[row] and f"not in {venv}/bin nor on PATH" in table[row], table
    assert table[row + 1].strip() == f"-> {doctor.FAIRSEQ_CMD}"
    assert doctor.FAIRSEQ_CMD.endswith("pip install --no-build-isolation fairseq-fixed==0.12.3.1")
    assert any(x.startswith("torch with CUDA") and " ok " in x for x in table), table
    assert re.fullmatch(r"\d+ missing: run the commands above in this venv", table[-1]), table[-1]


def test_a_sweep_rendered_under_tmp_or_with_a_venv_in_dev_shm_warns_once_naming_the_paths(tmp_path, capsys):
    """Rendered scripts pointed RUN_DIR, --output and the venv at the login node's /tmp without a word."""
    from wagma_bench.campaign import nodepaths

    out = tmp_path / "s"  # pytest's tmp_path lies under /tmp
    args = ["cluster=generic8", "cluster.venv=/dev/shm/wb", "gpus=8", "optimizer=allreduce", "--dry-run"]
    assert sweep_cli.main([*args, "--out", str(out)]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("warning: ")]
    assert line.startswith(f"warning: --out {out} (under /tmp); venv /dev/shm/wb (under /dev/shm): "), line
    assert "export PATH=/dev/shm/wb/bin:$PATH" in (out / "jobs" / "000_0008gpu.sbatch").read_text()
    if nodepaths.node_local(REPO) is not None:
        pytest.skip(f"this checkout lies on a node-local path itself: {REPO}")
    assert nodepaths.warning_line({"--out": str(REPO / "sweeps" / "x"), "venv": None}) is None
    link = REPO / f".wb-link-{os.getpid()}"
    try:  # a link outside /tmp that leads into it is /tmp all the same
        link.symlink_to(tmp_path)
        assert nodepaths.node_local(link / "s") == "under /tmp"
    finally:
        link.unlink(missing_ok=True)


def test_transformer_cluster_script_runs_without_an_activated_venv_and_logs_to_wandb(tmp_path):
    """reproduce/transformer/cluster.sh failed with `exec: wagma-bench: not found` outside an activated venv,
    and its sweeps reached W&B only if the user knew to add logger=wandb."""
    out = tmp_path / "wmt"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO), "GPUS": "16"}
    env["OPTIMIZERS"] = "allreduce"  # one run: the script's own default, glob(*), composes each optimizer
    script = REPO / "reproduce" / "transformer" / "cluster.sh"
    args = ["bash", str(script), "/scratch/wmt17", "--data-on-nodes", "--dry-run", "--out", str(out)]
    res = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert "logger=wandb" in manifest["common_overrides"] and len(manifest["runs"]) == 1
    assert "logger=wandb" in (out / manifest["jobs"][0]["script"]).read_text()
    bad_env = {**env, "WAGMA_BENCH": str(tmp_path / "nope")}
    bad = subprocess.run(args, env=bad_env, capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "is not an executable wagma-bench" in bad.stderr, bad.stderr
