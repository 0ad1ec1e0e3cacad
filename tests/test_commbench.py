"""`wagma-bench comm-bench` prints its table and writes JSON with ratios against the raw library calls."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

from tests.cli_util import BIN
from tests.proc_util import held_fork_server, listening_ports, rank_pids


def test_comm_bench_prints_the_table_and_writes_json(tmp_path):
    out_file = tmp_path / "cb.json"
    out = subprocess.run(
        [
            str(BIN),
            "comm-bench",
            "--nproc",
            "2",
            "--sizes",
            "4K,64K",
            "--repeats",
            "2",
            "--out",
            str(out_file),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ours/raw" in out.stdout and "wait_avoiding" in out.stdout
    result = json.loads(out_file.read_text())
    ops = {(r["op"], r["impl"]) for r in result["results"]}
    assert {
        ("allreduce", "ours"),
        ("allreduce", "raw"),
        ("group_allreduce", "raw"),
        ("wait_avoiding", "ours"),
    } <= ops
    assert len(result["table"]) == 2 * 3  # two sizes x (allreduce, group S=2, wait-avoiding S=2)
    assert all(r["ratio"] > 0 and r["bandwidth_GBps"] > 0 for r in result["table"])
    wait_avoiding = [r for r in result["table"] if r["op"] == "wait_avoiding"]
    # the engine computes a mean: its ratio to the raw sum-then-divide, timed alternately, is reported too
    assert all(r["raw_mean_ms"] > 0 and r["ratio_to_raw_mean"] > 0 for r in wait_avoiding), wait_avoiding
    assert "ours/raw-mean" in out.stdout
    rows = [r for r in result["results"] if r["op"] == "wait_avoiding"]
    assert all(len(r["paired_raw_s"]) == len(r["paired_raw_mean_s"]) == 2 for r in rows)
    # the engine's buffers beyond the model and its round's breakdown (docs/wait-avoiding-engine.md), per size
    assert "extra buffers" in out.stdout and "snapshot" in out.stdout
    for row in wait_avoiding:
        assert 0 <= row["extra_buffers"] <= 2 and row["extra_bytes"] == row["extra_buffers"] * row["bytes"], (
            row
        )
        phases = row["round_ms"]
        assert set(phases) == {"activation", "snapshot", "collective", "hand_over", "other"}
        assert phases["collective"] > 0 and all(v >= 0 for k, v in phases.items() if k != "other")


def test_comm_bench_listens_on_its_store_port_before_its_ranks_can_start(tmp_path):
    """The command holds its ranks' store port (listening) from the moment the OS picks it, before its fork
    server exists: no window in which another process can take the port. It used to take a port that was free,
    let go of it, and have rank 0 bind it once started; in make test another process took it meanwhile
    (EADDRINUSE)."""
    out_file = tmp_path / "cb.json"
    bench = subprocess.Popen(
        [str(BIN), "comm-bench", "--nproc", "2", "--sizes", "4K", "--repeats", "1", "--out", str(out_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        with held_fork_server(bench):
            assert not rank_pids(bench.pid)
            assert len(listening_ports(bench.pid)) == 1, "the store's port is not held before the ranks start"
        _, err = bench.communicate(timeout=300)
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.communicate()
    assert bench.returncode == 0, err[-3000:]
    assert json.loads(out_file.read_text())["table"]


def test_bandwidths_are_nccl_tests_algbw_and_busbw():
    from wagma_bench.campaign.commbench import format_table, ratio_table

    rows = [
        {
            "op": "allreduce",
            "impl": impl,
            "group_size": n,
            "bytes": 100_000_000,
            "median_s": 0.1,
            "p10_s": 0.09,
            "p90_s": 0.11,
        }
        for impl in ("ours", "raw")
        for n in (4, 2)
    ]
    table = {r["group_size"]: r for r in ratio_table(rows, copy_bps=10e9)}
    assert table[4]["algbw_GBps"] == 1.0 and table[4]["busbw_GBps"] == 1.5  # 2 (n - 1) / n = 1.5 at n = 4
    assert table[2]["busbw_GBps"] == table[2]["algbw_GBps"] == 1.0  # ... and 1 at n = 2
    text = format_table(list(table.values()))
    assert "algbw" in text and "busbw" in text and "    1.00    1.50" in text


def test_bad_sizes_are_refused_in_one_line_before_any_rank_starts(tmp_path, capsys):
    """Parsed by argparse's type hook: a bad or non-positive size is a usage error (exit 2, one line), not a
    traceback, and nothing is measured or written."""
    import pytest

    from wagma_bench.cli.commbench import main

    for sizes, said in (
        ("abc", "'ABC'"),
        ("1T", "'1T'"),
        ("0", "must be positive"),
        ("-1", "must be positive"),
        ("4K,,1M", "empty"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(["--sizes", sizes, "--out", str(tmp_path / "cb.json")])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("wagma-bench comm-bench: error: argument --sizes:") and said in err[-1], err
        assert "Traceback" not in "\n".join(err)
    assert not (tmp_path / "cb.json").exists()


def test_more_ranks_than_the_machine_can_hold_are_refused_before_any_rank_starts(tmp_path):
    """`--nproc` is bounded as `run`'s launcher.nproc is (config.schema.check_ranks_fit): 64 ranks used to
    start on a 24 GiB machine and print nothing for minutes. 4096 ranks exceed any machine this runs on; were
    they not refused, the group is killed (ranks and fork server) rather than let them start."""
    out_file = tmp_path / "cb.json"
    bench = subprocess.Popen(
        [str(BIN), "comm-bench", "--nproc", "4096", "--out", str(out_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.communicate()
    assert bench.returncode == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith(
        "wagma-bench comm-bench: error: --nproc=4096 is not allowed on this machine: 4096 ranks x about "
    ), lines[0]
    assert re.search(r"; it must be at most \d+$", lines[0]), lines[0]
    assert not out_file.exists()


def test_link_levels_group_the_ranks_of_a_host_and_one_rank_a_host():
    """Which groups comm-bench times for each link level, from the ranks' host names (pure)."""
    from wagma_bench.campaign.commbench import level_groups

    assert level_groups(["a", "a", "b", "b"]) == {"intra": {2: [(0, 1), (2, 3)]}, "inter": {2: [(0, 2)]}}
    three = level_groups(["a"] * 4 + ["b"] * 4 + ["c"] * 4)
    assert three["intra"] == {2: [(0, 1), (4, 5), (8, 9)], 4: [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]}
    assert three["inter"] == {
        2: [(0, 4)],
        3: [(0, 4, 8)],
    }  # group sizes 2, 4, ... below the count, and the count
    assert level_groups(["a", "b"]) == {"inter": {2: [(0, 1)]}}  # one rank a host: no intra-node group
    assert level_groups(["a", "a", "a", "b"]) == {
        "intra": {2: [(0, 1)], 3: [(0, 1, 2)]},
        "inter": {2: [(0, 3)]},
    }
    assert level_groups(["a", "a"]) == {
        "intra": {2: [(0, 1)]}
    }  # one host (a --nproc run): no inter-node group
