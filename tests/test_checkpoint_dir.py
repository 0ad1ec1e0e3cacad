"""``checkpoint.dir``: a run's checkpoint sets on another file system (scratch), found again by a rerun, and
the size of one checkpoint said at the start, against the files a real run writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli_util import keys, run
from wagma_bench.errors import ConfigError
from wagma_bench.record.checkpoint import WHERE, check_folder, configured_folder, latest_set, record_folder

ARGS = ["launcher.nproc=2", "eval.every_rounds=4", "checkpoint.every_s=0", "logger.progress=off"]


def test_a_run_checkpoints_into_checkpoint_dir_and_its_rerun_resumes_from_there(tmp_path):
    """The sets go to OTHER/<run>-<hash>/, none to RUN_DIR/checkpoint; the run directory records where they
    are; the rerun with a larger budget resumes from them. The size said at the start is the size of the rank
    files written (within a record's alignment, 64 bytes, per tensor of the file). The run and its rerun are
    one multirun (one launcher, one fork server): its second job reruns the first's directory with the larger
    budget, in rank processes of its own."""
    run_dir, other = tmp_path / "run", tmp_path / "scratch"
    out = run(
        [
            "-m",
            *ARGS,
            f"checkpoint.dir={other}",
            "train.max_rounds=4,8",
            f"hydra.sweep.dir={tmp_path}",
            f"hydra.sweep.subdir={run_dir.name}",
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    folder = configured_folder(run_dir, str(other))
    assert folder.parent == other and not (run_dir / "checkpoint").exists()
    assert json.loads((run_dir / WHERE).read_text()) == {"dir": str(folder)}
    said = re.findall(
        r"checkpoints: \S+ \S+ \((\d+) bytes\) per rank x 2 ranks = .* in (\S+); the last 2", out.stdout
    )
    assert len(said) == 2 and all(where == str(folder) for _, where in said), out.stdout[-2000:]
    assert keys(run_dir).count("run_resume") == 1 and keys(run_dir)[-1] == "run_stop"
    resume = [
        e
        for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
        if e["key"] == "run_resume"
    ]
    assert resume[0]["metadata"]["round"] == 4  # the first job's last set, found in checkpoint.dir
    found = latest_set(run_dir)
    assert found is not None and found[0] == folder / "round-8" and not (run_dir / "checkpoint").exists()
    import torch

    for rank_file in sorted(found[0].glob("rank*.pt")):
        saved = torch.load(rank_file, weights_only=False)
        tensors = len(saved["model"]) + sum(
            len(v) for v in saved["algo"]["local_optimizer"]["state"].values()
        )
        assert abs(rank_file.stat().st_size - int(said[0][0])) <= 64 * tensors, (
            rank_file.stat().st_size,
            said[0],
        )


def test_each_run_gets_its_own_folder_and_a_relative_dir_is_under_the_run_directory(tmp_path):
    """One setting for a whole sweep: two runs never share a folder; a requeue (the same path) finds its
    own."""
    a, b = tmp_path / "runs" / "0_wagma_s1", tmp_path / "runs" / "1_wagma_s2"
    shared = str(tmp_path / "scratch")
    assert configured_folder(a, shared) != configured_folder(b, shared)
    assert configured_folder(a, shared) == configured_folder(Path(str(a) + "/"), shared)
    assert configured_folder(a, shared).name.startswith("0_wagma_s1-")
    assert configured_folder(a, "ckpt").parent == a / "ckpt"
    assert configured_folder(a, None) == a / "checkpoint"


def test_invalid_checkpoint_dirs_are_refused_naming_the_key(tmp_path):
    run_dir = tmp_path / "run"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for value in (str(a_file), str(a_file / "sub")):
        with pytest.raises(
            ConfigError, match=rf"checkpoint.dir={re.escape(value)} is not allowed: {a_file} is a file"
        ):
            check_folder(run_dir, value, resume=True)
    # a link where the run writes (its own subfolder) is refused; the user's DIR itself may be one
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "linked").symlink_to(target)
    check_folder(run_dir, str(tmp_path / "linked"), resume=True)
    planted = configured_folder(run_dir, str(tmp_path / "scratch"))
    planted.parent.mkdir()
    planted.symlink_to(target)
    with pytest.raises(
        ConfigError,
        match=rf"checkpoint.dir=.* is not allowed: {re.escape(str(planted))} is a "
        r"symbolic link",
    ):
        check_folder(run_dir, str(tmp_path / "scratch"), resume=True)


def test_a_rerun_whose_checkpoint_dir_no_longer_leads_to_the_sets_is_refused(tmp_path):
    """Not a silent fresh start beside the old sets: refused, unless checkpoint.resume=false."""
    run_dir = tmp_path / "run"
    old = configured_folder(run_dir, str(tmp_path / "a"))
    (old / "round-4").mkdir(parents=True)
    manifest = {"round": 4, "world_size": 2, "resume_hash": "h", "files": {}}  # as its schema reads it
    (old / "round-4" / "manifest.json").write_text(json.dumps(manifest))
    (old / "latest").write_text("round-4\n")
    run_dir.mkdir()
    record_folder(run_dir, old)
    for moved in (str(tmp_path / "b"), None):
        with pytest.raises(ConfigError, match=rf"the run's checkpoints are in {re.escape(str(old))}"):
            check_folder(run_dir, moved, resume=True)
        check_folder(run_dir, moved, resume=False)
    assert check_folder(run_dir, str(tmp_path / "a"), resume=True) == old


def test_a_file_as_checkpoint_dir_exits_2_before_any_rank_starts(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    out = run(["launcher.nproc=2", f"checkpoint.dir={a_file}", f"hydra.run.dir={tmp_path / 'run'}"])
    assert out.returncode == 2, out.stderr[-3000:]
    assert f"checkpoint.dir={a_file} is not allowed: {a_file} is a file" in out.stderr
    assert not (tmp_path / "run" / "events.jsonl").exists()


@pytest.mark.slow
def test_a_link_planted_at_the_checkpoint_folder_mid_run_fails_the_run_in_one_line(tmp_path):
    """A link put at the checkpoint folder once the first set is written (the folder moved away): the next
    save refuses it on every rank. The run fails (exit 1) in one line naming the link and checkpoint.dir, no
    rank prints a traceback, nothing is written or removed through the link (not even the incomplete set the
    launcher discards after a failure), and the record says why."""
    import subprocess
    import time

    from tests.cli_util import BIN

    run_dir, victim = tmp_path / "run", tmp_path / "victim"
    (victim / "round-99").mkdir(parents=True)  # an incomplete set: a failed run's clean-up removes those
    launcher = subprocess.Popen(
        [str(BIN), "run", *ARGS, "train.max_rounds=400", f"hydra.run.dir={run_dir}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    folder, deadline = run_dir / "checkpoint", time.monotonic() + 240
    while not (folder / "latest").exists():  # planted between two saves (a save every 4 rounds)
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()[1][-3000:]
        time.sleep(0.005)
    folder.rename(tmp_path / "moved")
    folder.symlink_to(victim)
    _, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 1, err[-3000:]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-3000:]
    last = err.strip()
    assert last.startswith("wagma-bench run: error: rank "), err[-3000:]
    assert f"{folder} is a symbolic link (to {victim})" in last and "checkpoint.dir" in last, last
    assert sorted(victim.rglob("*")) == [victim / "round-99"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and f"{folder} is a symbolic link" in summary["error"], summary
    assert keys(run_dir)[-1] == "run_stop"


def test_an_mpi_abort_that_names_no_rank_is_told_by_the_rank_that_reported_its_error(tmp_path):
    """Under comm=mpi a rank that meets the planted link aborts the job, and MPICH's abort line names no
    rank the launcher can read: its line names the lowest rank that left an error (it said only 'mpiexec
    exited with code 1'), the error's type name dropped as the local launcher drops it."""
    from wagma_bench.runtime.supervise import mpiexec_failure

    said = "D/checkpoint is a symbolic link (to T); a run never writes through a link: remove it, or ..."
    (tmp_path / "rank1.error").write_text(f"SymlinkRefused: {said}")
    (tmp_path / "rank0.pid").write_text("1")
    tail = [
        "Abort(1) on node 1 (rank 1 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 1) - process 1\n"
    ]
    assert mpiexec_failure(1, tail, tmp_path) == f"rank 1 failed: {said}"
    (tmp_path / "rank1.error").unlink()
    assert mpiexec_failure(1, tail, tmp_path) == "mpiexec exited with code 1"
