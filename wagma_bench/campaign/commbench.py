"""``wagma-bench comm-bench``: our communication backend against the raw library calls, on the same buffers.

For each message size it times, on every rank, with a barrier before each repeat:

- ``allreduce``        our ``Comm.allreduce`` vs ``torch.distributed.all_reduce`` / ``MPI.Allreduce``;
- ``group_allreduce``  our butterfly-stage group allreduce vs the raw call on an equivalent raw group,
                       for S = 2, 4, ... up to the world size;
- ``wait_avoiding``    our wait-avoiding group allreduce as WAGMA-SGD uses it (model contributions, the
                       caller's buffer updated in place; all ranks ready: the pure overhead of activation,
                       progress thread and copies) vs the raw group allreduce it performs, the two timed
                       alternately, repeat by repeat, so that both see the same load. The engine computes
                       a mean and the raw call a sum, so the cheapest raw mean (NCCL's average; on gloo and
                       MPI, which have none, the raw sum and one division of the buffer) is timed
                       alternately too and reported beside it: the engine's own cost is its time over
                       that. Also reported:
                       the model-sized buffers the engine holds beyond the caller's (count and bytes) and
                       where a round's time goes (activation messages, snapshot copy, collective, hand-over
                       copy, each the mean per round over the ranks; "other", the slowest rank's median
                       minus those: thread hand-offs, waking up, waiting for the last member).

The time of a repeat is the slowest rank's (a collective is done when its last member is). Reported: the
median and the 10th/90th percentiles over repeats, the ratio ours/raw of the medians, and the algorithmic
bandwidth (bytes / time) against this machine's memory-copy bandwidth of the same buffer.

Across hosts (ranks placed by ``srun``, ``torchrun`` or ``mpiexec``) it also times the two link levels of the
simulator's network model apart, each rank's host name gathered first: ``intra``, a group allreduce among the
ranks of one host (every host that has more than one, its groups timed together: they share no link), and
``inter``, among one rank per host (each host's lowest rank; the other ranks wait): group sizes 2, 4, ... and
the whole count. Alpha and beta of each level are fitted as ``wagma-bench simulate --calibrate`` fits them
(:func:`wagma_bench.simulate.calibrate.fit_network`), printed, and written with the rows (``levels``,
``fit``). A run on one host measures the intra-node link only (its ``results`` are that level's rows).

Runs as ``wagma-bench comm-bench [--nproc N] [--sizes 4K,1M,100M] [--repeats R] [--out FILE.json]``: under
none of those launchers it forks ``--nproc`` local ranks; under ``srun`` or ``torchrun`` each process is a
rank of the launcher's world, joined as ``wagma-bench run`` joins it (the rendezvous at the step's first host,
gloo's interface the route to it: :func:`wagma_bench.runtime.launch.join_world`); with ``--comm mpi`` it runs
under mpiexec (started for you when needed) or ``srun --mpi=pmi2``. ``--device cuda`` puts the buffers on the
GPUs (NCCL with a GPU per rank, else gloo on CUDA tensors, as ``wagma-bench run`` decides) and synchronises
the device before a repeat's clock stops. Rank 0 prints and writes ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch

from wagma_bench import exits
from wagma_bench.record.files import write_text_atomic

UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}
DEFAULT_SIZES = "4K,64K,1M,16M,100M"
# One rank's peak resident memory, MiB, as reproduce/memory/footprint.py measures a workload's (peak VmRSS of
# a rank, `footprint.py comm-bench --nproc N --sizes S --repeats 2`, CPU, 2026-12-06, this 2-core 23.4 GiB
# machine): 398 and 403 with 4K messages (2 and 8 ranks), 448 with 16M, 618 and 632 with 100M (2 and 4 ranks).
# Torch and gloo without a model or data (a workload's rank holds about 1,100), and about 2.4 copies of the
# largest message (the buffer, the wait-avoiding engine's snapshot, gloo's scratch). Rounded up: ranks x this
# must fit the machine, as `run`'s ranks.
RANK_BASE_MB = 420.0
RANK_MESSAGE_COPIES = 2.5
COMM_TIMEOUT_S = 300.0  # a collective that has not completed by then fails (run's comm.timeout_s default)
RENDEZVOUS_TIMEOUT_S = (
    120.0  # for every rank to reach the store (run's launcher.rendezvous_timeout_s default)
)


def rank_memory_mb(sizes: list[int]) -> float:
    """What one comm-bench rank holds at its peak with these message sizes (the
    figure the machine check uses)."""
    return RANK_BASE_MB + RANK_MESSAGE_COPIES * max(sizes) / 2**20


def parse_size(text: str) -> int:
    text = text.strip().upper().rstrip("B")
    if not text:
        raise argparse.ArgumentTypeError("an empty size in the list; use e.g. 4K,1M,100M")
    mult = UNITS.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in UNITS else text
    try:
        size = int(float(number) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad size {text!r}; use e.g. 4K, 1M, 100M (units K, M, G)"
        ) from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"size {text!r} must be positive (at least 1 byte)")
    return size


def parse_sizes(text: str) -> list[int]:
    """``--sizes``: a comma-separated list, checked by argparse (a bad one is a usage error, exit 2)."""
    return [parse_size(s) for s in text.split(",")]


def group_sizes(world: int) -> list[int]:
    sizes, s = [], 2
    while s <= world:
        sizes.append(s)
        s *= 2
    return sizes


def copy_bandwidth(nbytes: int, repeats: int = 5) -> float:
    """Bytes per second of a plain copy of a buffer of ``nbytes`` (read + write counted once)."""
    src = torch.ones(max(1, nbytes // 4))
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return src.numel() * 4 / statistics.median(times)


class RawTorch:
    def __init__(self, groups):
        import torch.distributed as dist

        self.dist = dist
        self.pgs = {g: dist.new_group(list(g)) for g in groups if len(g) > 1}

    def allreduce(self, t, group=None):
        self.dist.all_reduce(t, group=self.pgs[group] if group else None)

    def mean(self, t, group):
        """The cheapest raw mean: NCCL's average, else the sum and one division (gloo has no AVG)."""
        if self.dist.get_backend(self.pgs[group]) == "nccl":
            self.dist.all_reduce(t, op=self.dist.ReduceOp.AVG, group=self.pgs[group])
        else:
            self.allreduce(t, group)
            t.div_(len(group))


class RawMpi:
    def __init__(self, groups):
        from mpi4py import MPI

        self.MPI = MPI
        self.world = MPI.COMM_WORLD.Dup()
        self.comms = {}
        for i, g in enumerate(groups):
            if len(g) > 1 and self.world.rank in g:
                self.comms[g] = self.world.Create_group(self.world.Get_group().Incl(list(g)), tag=i)

    def allreduce(self, t, group=None):
        comm = self.comms[group] if group else self.world
        comm.Allreduce(self.MPI.IN_PLACE, t.numpy(), op=self.MPI.SUM)

    def mean(self, t, group):
        """The cheapest raw mean: MPI has no average, so the sum and one division."""
        self.allreduce(t, group)
        t.div_(len(group))


def _time(comm, fn, repeats: int, setup=None, warmed=None) -> list[float]:
    """Per repeat, the slowest rank's time of ``fn()`` (one warm-up first, then ``warmed()``; ``setup`` runs
    untimed before each)."""
    out = []
    for i in range(repeats + 1):
        if i == 1 and warmed:
            warmed()
        if setup:
            setup()
        comm.barrier()
        t0 = time.perf_counter()
        fn()
        if comm.device.type == "cuda":  # the kernels, not only their launch
            torch.cuda.synchronize(comm.device)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=comm.device)
        if i:
            out.append(float(comm.allgather(dt).max()))
    return out


def _row(op, impl, s, nbytes, times):
    times = sorted(times)
    q = lambda f: times[min(len(times) - 1, int(f * len(times)))]
    return {
        "op": op,
        "impl": impl,
        "group_size": s,
        "bytes": nbytes,
        "median_s": statistics.median(times),
        "p10_s": q(0.1),
        "p90_s": q(0.9),
        "repeats": len(times),
    }


def bench_rank(comm, sizes: list[int], repeats: int) -> list[dict]:
    """Every measurement on this rank (a collective over all ranks)."""
    from wagma_bench.comm.topology import butterfly_stage

    p = comm.world_size
    stages = {s: butterfly_stage(p, s, 0) for s in group_sizes(p)}
    all_groups = [g for part in stages.values() for g in part]
    comm.new_groups(all_groups)
    raw = RawMpi(all_groups) if comm.backend_name == "mpi" else RawTorch(all_groups)
    rows = []
    for nbytes in sizes:
        buf = torch.ones(max(1, nbytes // 4), device=comm.device)
        rows.append(
            _row(
                "allreduce",
                "ours",
                p,
                nbytes,
                _time(comm, lambda buf=buf: comm.allreduce(buf, op="sum"), repeats),
            )
        )
        rows.append(
            _row("allreduce", "raw", p, nbytes, _time(comm, lambda buf=buf: raw.allreduce(buf), repeats))
        )
        for s, part in stages.items():
            mine = next(g for g in part if comm.rank in g)
            rows.append(
                _row(
                    "group_allreduce",
                    "ours",
                    s,
                    nbytes,
                    _time(
                        comm, lambda buf=buf, part=part: comm.group_allreduce(buf, part, op="sum"), repeats
                    ),
                )
            )
            rows.append(
                _row(
                    "group_allreduce",
                    "raw",
                    s,
                    nbytes,
                    _time(comm, lambda buf=buf, mine=mine: raw.allreduce(buf, mine), repeats),
                )
            )
            rows.append(
                _wait_avoiding_row(
                    comm,
                    buf,
                    part,
                    s,
                    nbytes,
                    repeats,
                    raw=lambda buf=buf, mine=mine: raw.allreduce(buf, mine),
                    raw_mean=lambda buf=buf, mine=mine: raw.mean(buf, mine),
                )
            )
    return rows


def _wait_avoiding_row(comm, buf, part, s: int, nbytes: int, repeats: int, raw, raw_mean) -> dict:
    """All ranks ready at once (each posts before the barrier, then asks for the round): the pure cost of
    activation, the progress thread and the buffer copies over the group allreduce the engine performs.
    In order, every rank answers the same rounds, so all of them close after the same round (the engine's
    stop protocol needs that; there is no synchronous round)."""
    from wagma_bench.comm.topology import FixedSchedule
    from wagma_bench.comm.wait_avoiding import PHASES, WaitAvoidingAllreduce

    engine = WaitAvoidingAllreduce(
        comm,
        buf,
        FixedSchedule(comm.world_size, part),
        contribution="model",
        timeout_s=comm.timeout_s,
        in_order=True,
        in_place=True,
    )

    def warmed():
        engine.timings, engine.rounds = dict.fromkeys(PHASES, 0.0), 0

    # Each repeat times the raw group allreduce ``raw()``, the raw mean and then the engine's round, one after
    # the other, so that the ratios compare them under the same load (a shared machine's load drifts).
    ours, paired, paired_mean = [], [], []
    for i in range(repeats):
        paired += _time(comm, raw, 1)
        paired_mean += _time(comm, raw_mean, 1)
        ours += _time(
            comm, engine.request, 1, setup=lambda: engine.post(buf), warmed=warmed if i == 0 else None
        )
    row = _row("wait_avoiding", "ours", s, nbytes, ours)
    row["paired_raw_s"], row["paired_raw_mean_s"] = paired, paired_mean
    buffers = engine.extra_buffers()
    engine.close()
    mine = torch.tensor(
        [engine.timings[k] / max(1, engine.rounds) for k in PHASES] + list(buffers),
        dtype=torch.float64,
        device=comm.device,
    )
    every = comm.allgather(mine).reshape(comm.world_size, len(PHASES) + 2)
    phases = every[:, : len(PHASES)].mean(0).tolist()
    count, extra = (int(v) for v in every[:, len(PHASES) :].max(0).values.tolist())  # the rank holding most
    row["round_ms"] = {k: 1e3 * v for k, v in zip(PHASES, phases, strict=True)}
    row["round_ms"]["other"] = 1e3 * row["median_s"] - sum(row["round_ms"].values())
    row["extra_buffers"], row["extra_bytes"] = count, extra
    return row


def ratio_table(rows: list[dict], copy_bps: float) -> list[dict]:
    """One line per (op, group size, bytes): ours vs raw (wait_avoiding is compared with the raw group
    allreduce it performs), bandwidth and its fraction of the copy bandwidth."""
    raw = {(r["op"], r["group_size"], r["bytes"]): r for r in rows if r["impl"] == "raw"}
    out = []
    for r in rows:
        if r["impl"] != "ours":
            continue
        ref = raw[("group_allreduce" if r["op"] == "wait_avoiding" else r["op"], r["group_size"], r["bytes"])]
        extra = {k: r[k] for k in ("extra_buffers", "extra_bytes", "round_ms") if k in r}
        if "paired_raw_s" in r:  # the raw call (and the raw mean) timed alternately with ours
            ref = _row(ref["op"], "raw", r["group_size"], r["bytes"], r["paired_raw_s"])
            mean_s = statistics.median(r["paired_raw_mean_s"])
            extra |= {"raw_mean_ms": 1e3 * mean_s, "ratio_to_raw_mean": r["median_s"] / mean_s}
        bw = r["bytes"] / r["median_s"]
        out.append(
            {
                "op": r["op"],
                "group_size": r["group_size"],
                "bytes": r["bytes"],
                "ours_ms": 1e3 * r["median_s"],
                "ours_p10_ms": 1e3 * r["p10_s"],
                "ours_p90_ms": 1e3 * r["p90_s"],
                "raw_ms": 1e3 * ref["median_s"],
                "ratio": r["median_s"] / ref["median_s"],
                "bandwidth_GBps": bw / 1e9,
                "algbw_GBps": bw / 1e9,
                "busbw_GBps": bw * bus_factor(r["group_size"]) / 1e9,
                "of_copy_bw": bw / copy_bps,
                **extra,
            }
        )
    return out


def bus_factor(n: int) -> float:
    """nccl-tests' bus bandwidth of an allreduce over n ranks: busbw = algbw x 2(n-1)/n, the rate each link
    carries in a bandwidth-optimal allreduce, comparable across n (and with nccl-tests' and OSU's figures)."""
    return 2 * (n - 1) / n


def human(nbytes: int) -> str:
    for unit, mult in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if nbytes >= mult:
            return f"{nbytes / mult:g}{unit}"
    return f"{nbytes}B"


def format_table(lines: list[dict]) -> str:
    head = (
        f"{'op':<16}{'S':>4}{'size':>8}{'ours ms':>11}{'p10-p90':>17}{'raw ms':>10}{'ours/raw':>10}"
        f"{'algbw':>8}{'busbw':>8}{'/copy':>7}"
    )
    out = [head + "   (algbw, busbw: nccl-tests' GB/s)", "-" * len(head)]
    for r in lines:
        spread = f"{r['ours_p10_ms']:.2f}-{r['ours_p90_ms']:.2f}"
        out.append(
            f"{r['op']:<16}{r['group_size']:>4}{human(r['bytes']):>8}{r['ours_ms']:>11.3f}{spread:>17}"
            f"{r['raw_ms']:>10.3f}{r['ratio']:>10.3f}{r['algbw_GBps']:>8.2f}{r['busbw_GBps']:>8.2f}"
            f"{r['of_copy_bw']:>7.2f}"
        )
    for r in lines:
        if "round_ms" in r:
            phases = ", ".join(f"{k.replace('_', '-')} {v:.2f}" for k, v in r["round_ms"].items())
            out.append(
                f"wait_avoiding S={r['group_size']} {human(r['bytes'])}: raw mean "
                f"{r['raw_mean_ms']:.3f} ms, ours/raw-mean {r['ratio_to_raw_mean']:.3f}; extra buffers "
                f"{r['extra_buffers']} ({human(r['extra_bytes'])}); per round, ms: {phases}"
            )
    return "\n".join(out)


def run_and_report(comm, sizes: list[int], repeats: int, out: Path | None) -> dict | None:
    rows = bench_rank(comm, sizes, repeats)
    hosts = rank_hosts(comm)
    levels = bench_levels(comm, level_groups(hosts), sizes, repeats) if len(set(hosts)) > 1 else None
    if comm.rank != 0:
        return None
    copy_bps = copy_bandwidth(max(sizes))
    result = {
        "backend": comm.backend_name,
        "world_size": comm.world_size,
        "hostname": socket.gethostname(),
        "hosts": hosts,
        "torch": torch.__version__,
        "copy_bandwidth_GBps": copy_bps / 1e9,
        "results": rows,
        "table": ratio_table(rows, copy_bps),
    }
    if levels is not None:
        result["levels"] = levels
    print(
        f"comm-bench: backend={comm.backend_name} ranks={comm.world_size} {hosts_line(hosts)} "
        f"copy bandwidth {copy_bps / 1e9:.2f} GB/s, median of {repeats} repeats (slowest rank each)"
    )
    print(format_table(result["table"]), flush=True)
    if levels is not None:
        print(format_levels(levels))
    result["fit"] = network_fit(result)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, json.dumps(result, indent=2))
        print(f"comm-bench: wrote {out} (wagma-bench simulate --calibrate {out} reads it)")
    return result


# --- the link levels across hosts ------------------------------------------------------------------------

HOST_BYTES = 255  # a host name's longest (POSIX HOST_NAME_MAX)


def rank_hosts(comm) -> list[str]:
    """Every rank's host name, in rank order (a collective): the name's bytes in a tensor, gathered."""
    name = socket.gethostname().encode()[:HOST_BYTES]
    mine = torch.zeros(HOST_BYTES + 1, dtype=torch.float64, device=comm.device)
    mine[0] = len(name)
    mine[1 : len(name) + 1] = torch.tensor(list(name), dtype=torch.float64)
    every = comm.allgather(mine).cpu().to(torch.int64).tolist()
    return [bytes(row[1 : row[0] + 1]).decode(errors="replace") for row in every]


def ranks_by_host(hosts: list[str]) -> dict[str, list[int]]:
    """The ranks of each host, hosts in the order of their lowest rank."""
    by_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    return by_host


def level_sizes(n: int) -> list[int]:
    """Group sizes timed at a level of ``n`` members (ranks of a host, or hosts): 2, 4, ... below n, and n."""
    return [s for s in group_sizes(n) if s < n] + ([n] if n > 1 else [])


def level_groups(hosts: list[str]) -> dict[str, dict[int, list[tuple[int, ...]]]]:
    """Per level and group size, the groups timed together: ``intra``, the first S ranks of every host that
    has at least S (S up to the fewest ranks any host with more than one has); ``inter``, one rank of each of
    the first S hosts (its lowest). A level with nothing to time (one rank a host; one host) is left out."""
    by_host = ranks_by_host(hosts)
    shared = [ranks for ranks in by_host.values() if len(ranks) > 1]
    levels: dict[str, dict[int, list[tuple[int, ...]]]] = {}
    if shared:
        levels["intra"] = {
            s: [tuple(r[:s]) for r in shared if len(r) >= s] for s in level_sizes(min(map(len, shared)))
        }
    if len(by_host) > 1:
        firsts = [ranks[0] for ranks in by_host.values()]
        levels["inter"] = {s: [tuple(firsts[:s])] for s in level_sizes(len(firsts))}
    return levels


def bench_levels(
    comm, levels: dict[str, dict[int, list[tuple[int, ...]]]], sizes: list[int], repeats: int
) -> dict[str, list[dict]]:
    """Per level, our group allreduce over its groups (a rank in none waits at the barrier), timed as the
    other rows: the slowest rank's time per repeat."""
    comm.new_groups([g for by_size in levels.values() for groups in by_size.values() for g in groups])
    rows: dict[str, list[dict]] = {level: [] for level in levels}
    for nbytes in sizes:
        buf = torch.ones(max(1, nbytes // 4), device=comm.device)
        for level, by_size in levels.items():
            for s, groups in by_size.items():
                covered = {r for g in groups for r in g}
                part = [*groups, *((r,) for r in range(comm.world_size) if r not in covered)]
                row = _row(
                    "group_allreduce",
                    "ours",
                    s,
                    nbytes,
                    _time(
                        comm, lambda buf=buf, part=part: comm.group_allreduce(buf, part, op="sum"), repeats
                    ),
                )
                rows[level].append(row | {"groups": len(groups)})
    return rows


def hosts_line(hosts: list[str]) -> str:
    by_host = ranks_by_host(hosts)
    if len(by_host) == 1:
        return f"host={hosts[0]}"
    return "hosts=" + ", ".join(f"{h} ({len(r)} rank{'s' if len(r) > 1 else ''})" for h, r in by_host.items())


def format_levels(levels: dict[str, list[dict]]) -> str:
    head = f"{'level':<7}{'S':>4}{'size':>8}{'ms':>11}{'p10-p90':>17}{'algbw':>8}{'busbw':>8}"
    out = [head + "   (group allreduce: intra = ranks of one host, inter = one rank a host)", "-" * len(head)]
    for level, rows in levels.items():
        for r in rows:
            bw = r["bytes"] / r["median_s"]
            spread = f"{1e3 * r['p10_s']:.2f}-{1e3 * r['p90_s']:.2f}"
            out.append(
                f"{level:<7}{r['group_size']:>4}{human(r['bytes']):>8}"
                f"{1e3 * r['median_s']:>11.3f}{spread:>17}"
                f"{bw / 1e9:>8.2f}{bw * bus_factor(r['group_size']) / 1e9:>8.2f}"
            )
    return "\n".join(out)


def network_fit(result: dict) -> dict | None:
    """Alpha and beta of each link level, fitted as ``simulate --calibrate`` fits them, printed; None (said)
    where the rows cannot be fitted (one message size)."""
    from wagma_bench.simulate.calibrate import fit_network

    try:
        _, report = fit_network([result])
    except ValueError as err:
        print(f"comm-bench: no alpha/beta fit: {err}")
        return None
    for level in ("intra", "inter"):
        fit = report["levels"][level]
        if fit["measured"]:
            print(
                f"comm-bench: {level}-node link ({report['algorithm']}): alpha {fit['alpha_s'] * 1e6:.1f} "
                f"us, beta {fit['beta_s_per_byte']:.3g} s/B ({fit['bandwidth_GBps']:.3g} GB/s), relative RMS "
                f"error {fit['rel_rms']:.2f}, {fit['rows']} rows"
            )
        else:
            print(f"comm-bench: {level}-node link {fit['note']}")
    return report


def _rank_main(index: int, nproc: int, port: int, args: dict) -> None:
    import torch.distributed as dist

    from wagma_bench.comm.torch_dist import TorchComm
    from wagma_bench.runtime.launch import device_plan

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    backend, device = "gloo", torch.device("cpu")
    if args["device"] == "cuda":
        backend = device_plan(torch.cuda.device_count(), nproc, "auto").backend
        device = torch.device(f"cuda:{index % torch.cuda.device_count()}")
        torch.cuda.set_device(device)
    store = dist.TCPStore(
        "127.0.0.1", port, nproc, is_master=False, timeout=timedelta(seconds=RENDEZVOUS_TIMEOUT_S)
    )
    comm = TorchComm.init(backend, index, nproc, store, COMM_TIMEOUT_S, device)
    try:
        run_and_report(comm, args["sizes"], args["repeats"], args["out"])
    finally:
        comm.close()


def _launched_rank(world, sizes: list[int], repeats: int, device: str, out: Path) -> int:
    """One rank of the launcher's world (srun, torchrun; torch.distributed under mpiexec), joined as `run`'s
    ranks join theirs, on gloo, or with ``--device cuda`` on the plan `run` would make for this host's
    ranks."""
    from wagma_bench.runtime.launch import device_plan, external_master, join_world, run_identity

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, world.local_world_size)))
    backend, dev = "gloo", torch.device("cpu")
    if device == "cuda":
        backend = device_plan(torch.cuda.device_count(), world.local_world_size, "auto").backend
        dev = torch.device(f"cuda:{world.local_rank % torch.cuda.device_count()}")
        torch.cuda.set_device(dev)
    master = external_master(world, ("127.0.0.1", 29500))
    comm = join_world(
        world, master, backend, dev, COMM_TIMEOUT_S, RENDEZVOUS_TIMEOUT_S, run_identity(f"comm-bench {out}")
    )
    try:
        run_and_report(comm, sizes, repeats, out)
    finally:
        comm.close()
    return exits.OK


def bench(
    nproc: int, sizes: list[int], repeats: int, comm_name: str, device: str, out: Path, argv: list[str]
) -> int:
    """Measure and report: under a launcher (srun, torchrun, mpiexec) as a rank of its world, under none by
    starting ``mpiexec`` with the same ``argv`` (``comm_name`` mpi), else ``nproc`` local ranks forked from
    the rank server. The arguments were checked by the command (:mod:`wagma_bench.cli.commbench`)."""
    from wagma_bench.runtime.world import detect_world

    world = detect_world()
    if world is not None and comm_name == "torch":  # a rank of srun's or torchrun's world: join it
        return _launched_rank(world, sizes, repeats, device, out)
    if comm_name == "mpi":
        if world is None:  # start ourselves under the MPI library's mpiexec
            mpiexec = Path(sys.executable).parent / "mpiexec"
            cmd = [
                str(mpiexec if mpiexec.exists() else "mpiexec"),
                "-n",
                str(nproc),
                sys.executable,
                "-m",
                "wagma_bench",
                "comm-bench",
                *argv,
            ]
            return subprocess.call(cmd)
        from wagma_bench.comm.mpi import MpiComm

        comm = MpiComm.init(timeout_s=COMM_TIMEOUT_S, device=torch.device("cpu"))
        try:
            run_and_report(comm, sizes, repeats, out)
        finally:
            comm.close()
        return exits.OK
    import torch.multiprocessing as mp

    from wagma_bench.runtime.launch import listen_for_store, serve_store, start_rank_server

    # The ranks' store is this process's, on loopback, on the port the OS gives it as it starts listening: a
    # port picked free and bound later by rank 0 could be taken meanwhile (it was, in make test). Made before
    # the fork server starts: the server, started by exec, inherits no thread and no socket of it.
    store = serve_store(listen_for_store("127.0.0.1", 0), timeout_s=RENDEZVOUS_TIMEOUT_S)
    start_rank_server()  # the ranks are forked from it, torch imported once
    mp.start_processes(
        _rank_main,
        args=(nproc, store.port, {"sizes": sizes, "repeats": repeats, "out": out, "device": device}),
        nprocs=nproc,
        start_method="forkserver",
    )
    return exits.OK
