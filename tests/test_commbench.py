"""`wagma-bench comm-bench` prints its table and writes JSON with ratios against the raw library calls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent / "wagma-bench"


def test_comm_bench_prints_the_table_and_writes_json(tmp_path):
    out_file = tmp_path / "cb.json"
    out = subprocess.run([str(BIN), "comm-bench", "--nproc", "2", "--sizes", "4K,64K", "--repeats", "2",
                          "--out", str(out_file)], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ours/raw" in out.stdout and "wait_avoiding" in out.stdout
    result = json.loads(out_file.read_text())
    ops = {(r["op"], r["impl"]) for r in result["results"]}
    assert {("allreduce", "ours"), ("allreduce", "raw"), ("group_allreduce", "raw"), ("wait_avoiding", "ours")} <= ops
    assert len(result["table"]) == 2 * 3  # two sizes x (allreduce, group S=2, wait-avoiding S=2)
    assert all(r["ratio"] > 0 and r["bandwidth_GBps"] > 0 for r in result["table"])
    wait_avoiding = [r for r in result["table"] if r["op"] == "wait_avoiding"]
    # the engine computes a mean: its ratio to the raw sum-then-divide, timed alternately, is reported too
    assert all(r["raw_mean_ms"] > 0 and r["ratio_to_raw_mean"] > 0 for r in wait_avoiding), wait_avoiding
    assert "ours/raw-mean" in out.stdout
    rows = [r for r in result["results"] if r["op"] == "wait_avoiding"]
    assert all(len(r["paired_raw_s"]) == len(r["paired_raw_mean_s"]) == 2 for r in rows)
