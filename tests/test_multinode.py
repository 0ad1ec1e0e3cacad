"""Cluster paths across real hosts: the local multi-host SLURM (``slurmctl.sh start --nodes 2``).

Two hosts ``wagma-n1``, ``wagma-n2``, each a network + UTS namespace with its own hostname, its own address on
a private bridge and its own slurmd; one slurmctld; the file system shared. Ranks on different hosts talk
real TCP between the namespaces. The cluster lives in a fresh /tmp directory for this module and is removed
at its end, checked: no namespace, veth, bridge or slurm process of it is left (docs/multinode.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.slurm_cluster import local_cluster, local_cluster_script, on_host
from wagma_bench.record.files import read_jsonl

BIN = Path(sys.executable).parent
HOSTS = ["wagma-n1", "wagma-n2"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the local cluster's hosts need root (namespaces)")


def _leftovers(cluster: dict) -> str:
    """What `slurmctl.sh status` still finds of the cluster (namespaces, links), and its slurm processes."""
    out = subprocess.run(
        [str(local_cluster_script()), "status"],
        env={**os.environ, **cluster},
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    left = [line for line in out.splitlines() if line.startswith(("namespace ", "link "))]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    left += [line for line in ps.splitlines() if cluster["SLURM_CONF"] in line]
    return "\n".join(left)


@pytest.fixture(scope="module")
def cluster():
    """Two hosts for this module; SLURM_CONF in os.environ while they run; checked to be gone afterwards."""
    with local_cluster(nodes=2) as env:
        old = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = env["SLURM_CONF"]
        try:
            yield env
        finally:
            os.environ.pop("SLURM_CONF") if old is None else os.environ.update(SLURM_CONF=old)
    assert not Path(env["WAGMA_SLURM_DIR"]).exists()
    assert _leftovers(env) == ""
    assert not [
        n
        for n in subprocess.run(
            ["ip", "netns", "list"], check=False, capture_output=True, text=True
        ).stdout.split()
        if n.startswith("wagma") and Path(env["SLURM_CONF"]).parent.name in n
    ]


def srun(args: list[str], timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["srun", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def run_cmd(*overrides: str) -> list[str]:
    return [str(BIN / "wagma-bench"), "run", "logger.progress=off", *overrides]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def first_event(run_dir: Path, key: str) -> dict:
    return next(e for e in read_jsonl(run_dir / "events.jsonl") if e["key"] == key)


def test_hosts_have_their_own_names_and_addresses(cluster):
    out = srun(
        [
            "-N",
            "2",
            "--ntasks-per-node",
            "1",
            "bash",
            "-c",
            (
                "echo \"$(hostname) $SLURM_NODEID $(ip -4 -o addr show eth0 | awk '{print $4}') "
                '$(ip route | grep -c default)"'
            ),
        ],
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows = sorted(line.split() for line in out.stdout.splitlines())
    assert [r[0] for r in rows] == HOSTS and [r[1] for r in rows] == ["0", "1"]
    addrs = [r[2] for r in rows]
    assert len(set(addrs)) == 2 and all(a.startswith("10.213.") for a in addrs)
    assert [r[3] for r in rows] == ["0", "0"]  # no route off the bridge


def test_gloo_interface_is_the_route_to_the_rendezvous_host(cluster):
    from wagma_bench.runtime.hosts import NetworkError, choose_gloo_interface, interface_address, node_address

    addr = node_address("wagma-n1")  # not resolvable: slurmctld's NodeAddr
    assert addr.startswith("10.213.") and addr.endswith(".11")
    env: dict[str, str] = {}
    bridge = choose_gloo_interface(addr, env)
    assert bridge.startswith("wagma-br") and env == {"GLOO_SOCKET_IFNAME": bridge}
    assert choose_gloo_interface("127.0.0.1", {}) is None  # one host: gloo's own choice
    assert choose_gloo_interface(addr, {"GLOO_SOCKET_IFNAME": "lo"}) == "lo"  # the user's choice stands
    with pytest.raises(NetworkError, match="GLOO_SOCKET_IFNAME=nosuch0: no such interface on host .*lo"):
        interface_address("nosuch0")


@pytest.mark.long  # make test: the smoke sweep's runs below, the same srun -N 2 --ntasks-per-node 1 world
def test_srun_one_rank_on_each_host(cluster, tmp_path):
    """The short cross-host run: rendezvous at wagma-n1's NodeAddr, gloo over the hosts' eth0, the run
    directory agreed, both hosts recorded. (Before the fix: 120 s, then a rendezvous timeout.) In make
    test-long: the smoke sweep's runs (`srun -N 2 --ntasks-per-node 1 wagma-bench run` in its job) assert the
    same in make test."""
    out = srun(
        [
            "-N",
            "2",
            "--ntasks-per-node",
            "1",
            *run_cmd("train.max_rounds=4", "eval.every_rounds=4", f"hydra.run.dir={tmp_path}"),
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    s = summary(tmp_path)
    assert (s["status"], s["world_size"], s["hosts"]) == ("completed", 2, HOSTS), s
    meta = first_event(tmp_path, "run_start")["metadata"]
    assert (meta["rank_hosts"], meta["local_ranks"]) == (HOSTS, [0, 0])


@pytest.mark.long
def test_srun_two_hosts_two_ranks_each(cluster, tmp_path):
    """`srun -N 2 --ntasks-per-node 2 wagma-bench run optimizer=wagma` completes,
    its summary names both hosts, run_start each rank's host and node-local rank. (Before the fix the ranks
    waited 120 s for the rendezvous host `wagma-n1`, a name that does not resolve, then failed.)"""
    out = srun(
        [
            "-N",
            "2",
            "--ntasks-per-node",
            "2",
            *run_cmd(
                "optimizer=wagma", "train.max_rounds=20", "eval.target=null", f"hydra.run.dir={tmp_path}"
            ),
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    s = summary(tmp_path)
    assert (s["status"], s["world_size"], s["hosts"]) == ("completed", 4, HOSTS), s
    meta = first_event(tmp_path, "run_start")["metadata"]
    assert meta["rank_hosts"] == ["wagma-n1", "wagma-n1", "wagma-n2", "wagma-n2"]
    assert meta["local_ranks"] == [0, 1, 0, 1] and (meta["nodes"], meta["ranks_per_node"]) == (2, 2)


@pytest.mark.parametrize(
    "interface, message",
    [
        (
            "lo",
            (
                r"GLOO_SOCKET_IFNAME=lo: rank \d on host wagma-n\d listens at 127\.0\.0\.1, which rank \d on "
                r"host wagma-n\d "
            ),
        ),
        pytest.param(
            "nosuch0", "GLOO_SOCKET_IFNAME=nosuch0: no such interface on host wagma-n", marks=pytest.mark.long
        ),
    ],
)
def test_wrong_gloo_interface_fails_fast_naming_it(cluster, tmp_path, interface, message):
    """Loopback on two hosts: gloo binds 127.0.0.1 and the peers' connections are refused. Before the check,
    gloo's own error named only addresses (`remote=[127.0.0.1]:PORT ... Connection refused`); now every rank
    fails within seconds (comm.timeout_s is 600 s here) naming the interface, the hosts and the ranks."""
    t0 = time.monotonic()
    out = srun(
        [
            "-N",
            "2",
            "--ntasks-per-node",
            "1",
            "--kill-on-bad-exit=1",
            *run_cmd("train.max_rounds=4", "comm.timeout_s=600", f"hydra.run.dir={tmp_path}"),
        ],
        env={"GLOO_SOCKET_IFNAME": interface},
        timeout=600,
    )
    took = time.monotonic() - t0
    assert out.returncode != 0
    assert took < 90, f"took {took:.0f} s\n{out.stderr[-3000:]}"
    import re

    assert re.search(message, out.stderr), out.stderr[-3000:]


@pytest.mark.long
def test_sweep_job_on_two_nodes(cluster, tmp_path):
    """A rendered sweep, `sbatch -N 2 --ntasks-per-node 2` (gpus=4 at 2 rank slots a node), Allreduce-SGD and
    WAGMA-SGD to their step budget: the batch script runs on wagma-n1, srun starts ranks on both hosts, which
    agree on one run directory each."""
    from wagma_bench.campaign import sweep, sweep_jobs

    out = tmp_path / "sweep"
    manifest = sweep.render(
        sweep.parse_spec(
            [
                "cluster=local",
                "cluster.gpus_per_node=2",
                "gpus=4",
                "optimizer=allreduce,wagma",
                "train.max_rounds=20",
                "eval.every_rounds=10",
            ]
        ),
        out,
        array=False,
    )
    script = (out / manifest["jobs"][0]["script"]).read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=2" in script
    sweep_jobs.submit(out)
    rows = sweep_jobs.wait(out, timeout_s=900, interval_s=2)
    assert [(r["slurm"], r["status"]) for r in rows] == [("COMPLETED", "completed")] * 2, rows
    for run in manifest["runs"]:
        run_dir = out / run["run_dir"]
        s = summary(run_dir)
        assert (s["world_size"], s["hosts"], s["rounds"] >= 20) == (4, HOSTS, True), s
        assert first_event(run_dir, "run_start")["metadata"]["rank_hosts"] == [HOSTS[0]] * 2 + [HOSTS[1]] * 2
        assert sorted(p.name for p in (run_dir / "steps").glob("rank*.jsonl")) == [
            f"rank{r}.jsonl" for r in range(4)
        ]


def _wait_for_checkpoint(run_dir: Path, proc: subprocess.Popen, timeout_s: float = 300) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        if (run_dir / "events.jsonl").exists():
            steps = [
                e["metadata"]["round"]
                for e in read_jsonl(run_dir / "events.jsonl")
                if e["key"] == "checkpoint"
            ]
            if steps:
                return steps[-1]
        time.sleep(0.5)
    raise AssertionError("no checkpoint in time")


def _start_two_host_run(
    run_dir: Path, timeout_s: float, max_steps: int
) -> tuple[list[str], subprocess.Popen]:
    """Allreduce-SGD under `srun -N 2 --ntasks-per-node 2`, checkpointing every half second: its command (for
    a rerun) and its process, output and errors merged."""
    cmd = [
        "srun",
        "-N",
        "2",
        "--ntasks-per-node",
        "2",
        *run_cmd(
            "optimizer=allreduce",
            f"train.max_rounds={max_steps}",
            "checkpoint.every_s=0.5",
            f"eval.every_rounds={10 * max_steps}",
            f"comm.timeout_s={timeout_s}",
            f"hydra.run.dir={run_dir}",
        ),
    ]
    return cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _node_back(cluster: dict, node: str) -> None:
    """Start the host's slurmd again and wait until SLURM has it back."""
    env = {**os.environ, **cluster}
    subprocess.run([str(local_cluster_script()), "start-node", node], env=env, check=True, timeout=60)
    _node_up(node)


def _node_up(node: str) -> None:
    """Wait until SLURM has the host back (idle, or mix: the killed job's allocation may linger until
    slurmctld has settled it); a host marked DOWN returns once its slurmd registers (ReturnToService=2)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["sinfo", "-h", "-n", node, "-o", "%t"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if state in ("idle", "mix"):
            return
        time.sleep(0.5)
    raise AssertionError(f"{node} did not return: {state}")


@pytest.mark.long
@pytest.mark.parametrize("lost, ranks", [("wagma-n2", "2, 3"), ("wagma-n1", "0, 1")])
def test_lost_node_is_named_and_the_rerun_resumes(cluster, tmp_path, lost, ranks):
    """Every process of one host killed mid-run (its slurmd, slurmstepd and ranks): the survivors see their
    collective fail, find the ranks whose heartbeat in the run directory stopped, and end naming the host
    and its ranks, within comm.timeout_s + a margin; run_stop and summary.json say so (written by rank 0, or
    by the lowest surviving rank where rank 0's host is the lost one). The rerun resumes from the last
    complete checkpoint."""
    timeout_s = 60
    cmd, proc = _start_two_host_run(tmp_path, timeout_s, max_steps=60)
    try:
        _wait_for_checkpoint(tmp_path, proc)
        subprocess.run(
            [str(local_cluster_script()), "kill-node", lost], env={**os.environ, **cluster}, check=True
        )
        t0 = time.monotonic()
        output, _ = proc.communicate(timeout=timeout_s + 120)
    finally:
        proc.kill()
    took = time.monotonic() - t0
    assert proc.returncode != 0
    named = f"host {lost} lost: ranks {ranks} (no heartbeat for"
    assert named in output, output[-3000:]
    assert took < timeout_s + 30, f"srun ended {took:.0f} s after the host was lost"
    s = summary(tmp_path)
    assert s["status"] == "failed" and named in s["error"], s
    (stop,) = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["key"] == "run_stop"]
    assert named in stop["metadata"]["error"]
    checkpoints = [
        e["metadata"]["round"] for e in read_jsonl(tmp_path / "events.jsonl") if e["key"] == "checkpoint"
    ]
    # no lock left, even where rank 0's host is gone: a rerun whose rank 0 lands elsewhere must not be refused
    assert not (tmp_path / ".lock").exists()
    _node_back(cluster, lost)
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    events = read_jsonl(tmp_path / "events.jsonl")
    (resume,) = [e for e in events if e["key"] == "run_resume"]
    assert resume["metadata"]["round"] == checkpoints[-1], (resume, checkpoints)
    assert summary(tmp_path)["status"] == "completed"


def _link(cluster: dict, node: str, state: str) -> None:
    """Take a host's link to the bridge down (or up): its end of the veth pair on the bridge side, so the
    host itself sees no carrier; its processes, and the shared file system, are untouched."""
    net = Path(cluster["WAGMA_SLURM_DIR"]).joinpath("cluster.env").read_text().split("NET=")[1].split()[0]
    subprocess.run(["ip", "link", "set", f"wagma{net}-h{node.removeprefix('wagma-n')}", state], check=True)


@pytest.mark.long
@pytest.mark.parametrize("cut, ranks", [("wagma-n2", "2, 3"), ("wagma-n1", "0, 1")])
def test_a_host_cut_off_by_the_network_is_named_and_recorded_before_srun_returns(
    cluster, tmp_path, cut, ranks
):
    """One host's link taken down mid-run (its ranks keep running, the file system stays shared): the side
    that still reaches the SLURM controller names the cut-off host and its ranks, its lowest rank records the
    failure (run_stop, summary.json) and releases the lock, all before srun returns, well before
    comm.timeout_s. Before the partition watch: SLURM killed the healthy side after ~30 s with nothing
    recorded, and the cut-off side later named the healthy host."""
    timeout_s = 120
    _, proc = _start_two_host_run(tmp_path, timeout_s, max_steps=100000)
    try:
        _wait_for_checkpoint(tmp_path, proc)
        _link(cluster, cut, "down")
        t0 = time.monotonic()
        output, _ = proc.communicate(timeout=timeout_s + 120)
        took = time.monotonic() - t0
        s = summary(tmp_path)  # as srun returned
        lock_left = (tmp_path / ".lock").exists()
    finally:
        proc.kill()
        _link(cluster, cut, "up")
    named = f"host {cut} lost: ranks {ranks} (unreachable from host"
    assert s["status"] == "failed" and named in s["error"], (s, output[-3000:])
    (stop,) = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["key"] == "run_stop"]
    assert named in stop["metadata"]["error"]
    assert not lock_left
    assert took < timeout_s, f"srun ended {took:.0f} s after the link went down"
    _node_up(cut)


@pytest.mark.long
def test_two_node_job_preempted_resumes_in_the_same_run_directory(cluster, tmp_path):
    """USR1 to a two-node job's ranks (as --signal=USR1@90 sends it): every rank on both hosts saves, rank 0
    requeues the job, which starts again on both hosts and resumes from the checkpoint in the same run
    directory: one run_start, one run_resume, ranks on both hosts both times."""
    from wagma_bench.campaign import sweep, sweep_jobs

    out = tmp_path / "sweep"
    manifest = sweep.render(
        sweep.parse_spec(
            [
                "cluster=local",
                "cluster.gpus_per_node=2",
                "gpus=4",
                "optimizer=allreduce",
                "train.max_rounds=60",
                "eval.every_rounds=60",
                "checkpoint.every_s=1e9",
            ]
        ),
        out,
        array=False,
    )
    (job_id,) = sweep_jobs.submit(out)
    run_dir = out / manifest["runs"][0]["run_dir"]
    deadline = time.monotonic() + 600
    while not all(
        (run_dir / "steps" / f"rank{r}.jsonl").exists()
        and (run_dir / "steps" / f"rank{r}.jsonl").stat().st_size
        for r in range(4)
    ):
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR1", job_id], check=True, timeout=60)
    rows = sweep_jobs.wait(out, timeout_s=900, interval_s=2)
    assert rows[0]["slurm"] == "COMPLETED", rows
    s = summary(run_dir)
    assert (s["status"], s["restarts"], s["hosts"]) == ("completed", 1, HOSTS), s
    events = read_jsonl(run_dir / "events.jsonl")
    keys = [e["key"] for e in events]
    assert keys.count("run_start") == 1 and keys.count("run_resume") == 1 and keys.count("run_stop") == 1
    suspend = next(e for e in events if e["key"] == "run_suspend")
    resume = next(e for e in events if e["key"] == "run_resume")
    assert (
        suspend["metadata"]["status"] == "preempted"
        and resume["metadata"]["round"] == suspend["metadata"]["round"]
    )
    log = next((out / "logs").glob("*.out")).read_text()
    assert "(restart 0) on wagma-n[1-2]" in log and "(restart 1) on wagma-n[1-2]" in log


@pytest.mark.long
def test_mpi_started_by_srun_across_hosts(cluster, tmp_path):
    """comm=mpi under `srun --mpi=pmi2` (SLURM 22.05's PMI-2 server, the mpich wheel's PMI-2 client) on two
    hosts, one rank a host: the MPI oracles (allreduce, groups, p2p, recv_any, the counter window, timeouts),
    then a WAGMA-SGD run. Two ranks a host is not reliable with the mpich wheel here (any-source receives
    from the other host lost, a garbled PMI-2 request): docs/multinode.md."""
    oracle = Path(__file__).with_name("mpi_oracle.py")
    out = srun(["--mpi=pmi2", "-N", "2", "--ntasks-per-node", "1", sys.executable, str(oracle)], timeout=300)
    assert out.returncode == 0 and "ok 2 ranks" in out.stdout, out.stderr[-3000:]
    out = srun(
        [
            "--mpi=pmi2",
            "-N",
            "2",
            "--ntasks-per-node",
            "1",
            *run_cmd(
                "comm=mpi",
                "optimizer=wagma",
                "train.max_rounds=22",
                "eval.every_rounds=11",
                f"hydra.run.dir={tmp_path}",
            ),
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    s = summary(tmp_path)
    assert (s["status"], s["world_size"], s["hosts"], s["versions"]["comm"]) == (
        "completed",
        2,
        HOSTS,
        "mpi",
    ), s


def _comm_bench(out_file: Path, launcher: list[str]) -> str:
    """comm-bench under ``launcher`` with two small sizes, two repeats: its stdout (rank 0 prints)."""
    out = subprocess.run(
        [
            *launcher,
            str(BIN / "wagma-bench"),
            "comm-bench",
            "--sizes",
            "4K,256K",
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
    return out.stdout


def _simulated_network(bench: Path, out: Path, capsys) -> tuple[dict, dict]:
    """`simulate --calibrate BENCH gpus=4 --cfg job`: the calibration report it writes, and the network the
    simulation would use, as --cfg job prints it."""
    import yaml

    from wagma_bench.cli.simulate import main as simulate

    capsys.readouterr()
    assert (
        simulate(
            ["--calibrate", str(bench), "gpus=4", "optimizer=allreduce", "--cfg", "job", "--out", str(out)]
        )
        == 0
    )
    printed = capsys.readouterr().out
    job = yaml.safe_load(printed[printed.index("\ngpus:") + 1 :])
    return json.loads((out / "calibration.json").read_text())["network"], job["network"]


@pytest.mark.slow
def test_comm_bench_across_hosts_fits_each_link_level_and_simulate_uses_them(cluster, tmp_path, capsys):
    """`srun -N 2 --ntasks-per-node 2 wagma-bench comm-bench` joins srun's world (ranks
    on both hosts), times the intra-node link (the ranks of one host) and the inter-node link (one rank a
    host) apart and fits alpha and beta of each; `simulate --calibrate FILE` reads the file and simulates with
    the inter-node fit for its inter level, the intra-node fit for intra, 2 ranks a node. Before: comm-bench
    forked --nproc local ranks on each host (two worlds that never met), and the fit gave one link for both
    levels."""
    bench = tmp_path / "cb.json"
    stdout = _comm_bench(bench, ["srun", "-N", "2", "--ntasks-per-node", "2"])
    result = json.loads(bench.read_text())
    assert (result["world_size"], result["hosts"]) == (4, [HOSTS[0]] * 2 + [HOSTS[1]] * 2), result["hosts"]
    intra, inter = result["levels"]["intra"], result["levels"]["inter"]
    assert [(r["group_size"], r["groups"]) for r in intra] == [(2, 2)] * 2  # each host's pair, timed together
    assert [(r["group_size"], r["groups"]) for r in inter] == [(2, 1)] * 2  # rank 0 and rank 2
    fit = result["fit"]["levels"]
    assert fit["intra"]["measured"] and fit["inter"]["measured"] and result["fit"]["notes"] == []
    assert "comm-bench: intra-node link (" in stdout and "comm-bench: inter-node link (" in stdout, stdout
    report, used = _simulated_network(bench, tmp_path / "sim", capsys)
    for level in ("intra", "inter"):
        link = (fit[level]["alpha_s"], fit[level]["beta_s_per_byte"])
        assert (report["levels"][level]["alpha_s"], report["levels"][level]["beta_s_per_byte"]) == link
        assert (used[level]["alpha_s"], used[level]["beta_s_per_byte"]) == pytest.approx(link, rel=1e-12)
    assert used["intra"] != used["inter"] and used["gpus_per_node"] == report["gpus_per_node"] == 2


@pytest.mark.long
def test_comm_bench_one_rank_a_host_measures_the_inter_node_link_only(cluster, tmp_path, capsys):
    """`srun -N 2 --ntasks-per-node 1`: no two ranks share a host, so the intra-node link is not measured; the
    report says so and the simulation takes the inter-node fit for both levels."""
    bench = tmp_path / "cb.json"
    stdout = _comm_bench(bench, ["srun", "-N", "2", "--ntasks-per-node", "1"])
    result = json.loads(bench.read_text())
    assert result["hosts"] == HOSTS and list(result["levels"]) == ["inter"]
    assert "comm-bench: intra-node link not measured (one rank a host)" in stdout, stdout
    report, used = _simulated_network(bench, tmp_path / "sim", capsys)
    assert not report["levels"]["intra"]["measured"] and report["levels"]["inter"]["measured"]
    note = "intra-node link not measured (one rank a host): the inter-node fit is used for both levels"
    assert report["notes"] == [note]
    assert used["intra"] == used["inter"] and used["inter"]["alpha_s"] == pytest.approx(
        result["fit"]["alpha_s"]
    )


def _address(cluster: dict, node: str) -> str:
    out = subprocess.run(
        on_host(cluster, node, ["ip", "-4", "-o", "addr", "show", "eth0"]),
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return out.split()[3].split("/")[0]


def _worker_pids(cluster: dict, node: str) -> list[int]:
    """The wagma-bench rank processes (not torchrun's agent) on a host."""
    net = Path(cluster["WAGMA_SLURM_DIR"]).joinpath("cluster.env").read_text().split("NET=")[1].split()[0]
    ns = f"wagma{net}"
    pids = subprocess.run(
        ["ip", "netns", "pids", f"{ns}-{node.removeprefix('wagma-')}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    found = []
    for pid in pids:
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"wagma-bench") for a in args) and not any(a.endswith(b"torchrun") for a in args):
            found.append(int(pid))
    return found


@pytest.mark.long
def test_torchrun_across_two_hosts_restarts_a_killed_worker(cluster, tmp_path):
    """`torchrun --nnodes 2` on each host, c10d rendezvous at wagma-n1: a worker killed on wagma-n2 is
    restarted by its agent (--max-restarts 1), both workers resume from the checkpoint, every step is
    logged once. The hosts' names resolve nowhere, so torchrun is given what it would otherwise look up:
    --local-addr (its agents' store and the workers' MASTER_ADDR) and is_host (which agent hosts the
    rendezvous store; torch compares the endpoint with the resolved hostname)."""
    endpoint = f"{_address(cluster, HOSTS[0])}:29517"
    procs = []
    for node in HOSTS:
        cmd = [
            str(BIN / "torchrun"),
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-conf",
            f"is_host={node == HOSTS[0]}",
            "--local-addr",
            _address(cluster, node),
            "--rdzv-id",
            "mn-torchrun",
            "--max-restarts",
            "1",
            "--no-python",
            *run_cmd(
                "train.max_rounds=60",
                "eval.every_rounds=60",
                "checkpoint.every_s=0.5",
                f"hydra.run.dir={tmp_path}",
            ),
        ]
        procs.append(
            subprocess.Popen(
                on_host(cluster, node, ["env", f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}", *cmd]),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        _wait_for_checkpoint(tmp_path, procs[1])
        (worker,) = _worker_pids(cluster, HOSTS[1])
        os.kill(worker, 9)
        outputs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs[1][-3000:]
    s = summary(tmp_path)
    assert (s["status"], s["world_size"], s["hosts"], s["restarts"]) == ("completed", 2, HOSTS, 1), s
    for r in range(2):
        steps = [rec["local_step"] for rec in read_jsonl(tmp_path / "steps" / f"rank{r}.jsonl")]
        assert steps == list(range(1, len(steps) + 1)) and steps[-1] >= 60, (r, steps)


@pytest.mark.long
def test_comm_bench_under_torchrun_on_two_hosts(cluster, tmp_path):
    """`torchrun --nnodes 2 --nproc-per-node 2 wagma-bench comm-bench` on each host (c10d rendezvous at
    wagma-n1, given --local-addr and is_host as in the test above): the workers join torchrun's world and time
    both link levels."""
    endpoint = f"{_address(cluster, HOSTS[0])}:29518"
    bench = tmp_path / "cb.json"
    procs = []
    for node in HOSTS:
        cmd = [
            str(BIN / "torchrun"),
            "--nnodes",
            "2",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-conf",
            f"is_host={node == HOSTS[0]}",
            "--local-addr",
            _address(cluster, node),
            "--rdzv-id",
            "mn-comm-bench",
            "--no-python",
            str(BIN / "wagma-bench"),
            "comm-bench",
            "--sizes",
            "4K,64K",
            "--repeats",
            "2",
            "--out",
            str(bench),
        ]
        procs.append(
            subprocess.Popen(
                on_host(cluster, node, ["env", f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}", *cmd]),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        outputs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    result = json.loads(bench.read_text())
    assert sorted(result["hosts"]) == [HOSTS[0]] * 2 + [HOSTS[1]] * 2 and result["world_size"] == 4
    assert result["fit"]["levels"]["intra"]["measured"] and result["fit"]["levels"]["inter"]["measured"]


# --- a partition: the connected side names the host that was cut off (wagma_bench/runtime/partition.py) ----


@pytest.fixture
def silent_port():
    """A local port that never answers, as a host cut off by the network: a listener whose accept queue (of
    one) is full, so the kernel drops every further connection request and the connect times out. (An address
    off this machine will not do here: this sandbox's network answers every outgoing connection.)"""
    import socket

    with socket.create_server(("127.0.0.1", 0), backlog=0) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            yield port


def _publish(folder: Path, ranks_by_host: dict[str, tuple[list[int], str, int]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for host, (ranks, addr, port) in ranks_by_host.items():
        for r in ranks:
            (folder / f"rank{r}").write_text(f"{host} {addr} {port}")


def _watch_verdict(tmp_path, monkeypatch, silent: int, rank: int, controller) -> tuple[list[str], list[int]]:
    """A watch of rank ``rank`` in a world of this host (ranks 0, 1, a real listener) and a host `far`
    (ranks 2, 3, at the silent port), stalled from the start: what it records and how it exits."""
    import socket

    from wagma_bench.runtime import partition

    monkeypatch.setattr(partition, "STALL_S", 0.0)
    monkeypatch.setattr(partition, "PROBE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(
        partition, "PROBE_EVERY_S", 0.1
    )  # the verdict after PROBES probes, not PROBES seconds
    listener = partition.ReachListener("127.0.0.1")
    _publish(
        tmp_path,
        {socket.gethostname(): ([0, 1], listener.addr, listener.port), "far": ([2, 3], "127.0.0.1", silent)},
    )
    recorded, exits = [], []
    watch = partition.PartitionWatch(tmp_path, rank, 4, recorded.append, controller, exit=exits.append)
    deadline = time.monotonic() + 30
    while not exits and time.monotonic() < deadline:
        time.sleep(0.1)
    watch.close()
    return recorded, exits


def test_the_connected_side_names_the_unreachable_host_and_its_lowest_rank_records(
    tmp_path, monkeypatch, silent_port
):
    """No controller: a tie of one host each is won by rank 0's side; rank 0 records once, naming `far`."""
    recorded, exits = _watch_verdict(tmp_path, monkeypatch, silent_port, 0, None)
    assert exits == [1] and len(recorded) == 1, (recorded, exits)
    assert recorded[0].startswith("host far lost: ranks 2, 3 (unreachable from host "), recorded


def test_the_other_connected_ranks_exit_without_recording(tmp_path, monkeypatch, silent_port):
    from wagma_bench.runtime import partition

    monkeypatch.setattr(partition, "RECORD_S", 0.0)
    recorded, exits = _watch_verdict(tmp_path, monkeypatch, silent_port, 1, None)
    assert exits == [1] and recorded == []


def test_a_side_that_cannot_reach_the_controller_is_the_cut_off_one_and_records_nothing(
    tmp_path, monkeypatch, silent_port, capfd
):
    recorded, exits = _watch_verdict(tmp_path, monkeypatch, silent_port, 0, ("127.0.0.1", silent_port))
    assert exits == [1] and recorded == []
    assert (
        "this host is cut off (it reaches neither the SLURM controller nor hosts far)"
        in capfd.readouterr().err
    )


def test_a_reachable_world_is_left_alone_however_long_it_stalls(tmp_path, monkeypatch):
    """Every host answers: a long evaluation or checkpoint only costs probes."""
    import socket

    from wagma_bench.runtime import partition

    monkeypatch.setattr(partition, "STALL_S", 0.0)
    listener = partition.ReachListener("127.0.0.1")
    _publish(
        tmp_path,
        {
            socket.gethostname(): ([0], listener.addr, listener.port),
            "near": ([1], listener.addr, listener.port),
        },
    )
    watch = partition.PartitionWatch(
        tmp_path, 0, 2, lambda e: pytest.fail(e), None, exit=lambda c: pytest.fail(c)
    )
    for _ in range(partition.PROBES + 1):  # more probes than make a host unreachable
        assert watch.check() is None
    watch.close()


def test_the_controller_is_read_from_slurm_conf(tmp_path):
    from wagma_bench.runtime.partition import SLURMCTLD_PORT, slurm_controller

    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=ctl(10.1.2.3)\nSlurmctldPort=7001\n")
    assert slurm_controller({"SLURM_JOB_ID": "1", "SLURM_CONF": str(conf)}) == ("10.1.2.3", 7001)
    conf.write_text("SlurmctldHost=ctl\n")
    assert slurm_controller({"SLURM_JOB_ID": "1", "SLURM_CONF": str(conf)}) == ("ctl", SLURMCTLD_PORT)
    assert slurm_controller({"SLURM_CONF": str(conf)}) is None  # not in a SLURM job


@pytest.mark.slow
def test_smoke_sweep_runs_every_optimizer_and_comm_bench_across_two_hosts(cluster, tmp_path):
    """`sweep --smoke`'s one job on the two hosts (one rank slot a node, gloo on CPU): each optimizer of the
    script trains across both hosts, then comm-bench across them writes the file `simulate --calibrate` reads.
    Kept small: two optimizers (tests/test_cluster_user.py checks that the script holds every one), 3 rounds
    of the embedded data, two small message sizes."""
    from wagma_bench.campaign import smoke, sweep_jobs
    from wagma_bench.simulate.calibrate import find_inputs, is_comm_bench

    out = tmp_path / "smoke"
    spec = smoke.smoke_spec(
        [
            "cluster=local",
            "cluster.gpus_per_node=1",
            "optimizer=allreduce,wagma",
            "data=mnist5k",  # the embedded data: ResNet-20 on CPU instead of ResNet-50 on synthetic tensors
            "workload.arch=resnet20",
            "train.max_rounds=3",
        ]
    )
    manifest = smoke.render(spec, out, commbench_args=("--sizes", "4K,64K", "--repeats", "1"))
    script = (out / "jobs" / "smoke.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --ntasks-per-node=1\n" in script
    sweep_jobs.submit(out)
    rows = sweep_jobs.wait(out, timeout_s=600, interval_s=2)
    log = "\n".join(p.read_text() for p in (out / "logs").glob("*.out"))
    assert [(r["slurm"], r["status"]) for r in rows] == [("COMPLETED", "completed")] * 2, (rows, log[-3000:])
    for run in manifest["runs"]:  # rendezvous at wagma-n1's NodeAddr, gloo over eth0, both hosts recorded
        s = summary(out / run["run_dir"])
        assert (s["world_size"], s["hosts"], s["rounds"]) == (2, HOSTS, 3), s
        meta = first_event(out / run["run_dir"], "run_start")["metadata"]
        assert (meta["rank_hosts"], meta["local_ranks"]) == (HOSTS, [0, 0]), meta
    bench = json.loads((out / "commbench.json").read_text())
    assert is_comm_bench(bench) and bench["hosts"] == HOSTS, bench.get("hosts")
    assert find_inputs([out / "commbench.json"])[1] == [bench]
    assert "every optimizer and comm-bench ran" in log
