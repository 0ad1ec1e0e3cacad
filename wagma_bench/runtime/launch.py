"""World discovery and local spawning.

``wagma-bench run`` runs as one rank of an existing world when started by torchrun (RANK/WORLD_SIZE),
srun (SLURM_PROCID/SLURM_NTASKS) or mpiexec (OMPI_COMM_WORLD_* / PMI_*); otherwise it spawns
``launcher.nproc`` local ranks with multiprocessing, forked from a fork server that has imported torch and
the suite once (:func:`start_rank_server`). The launching process itself never imports torch: it validates the
configuration from the torch-free specs and binds the rendezvous store's port, which a store process forked
from the same server serves (:func:`listen_for_store`, :func:`_serve_store`). A rank that dies, raises or
hangs ends the whole run within seconds: the survivors are terminated and the error names the failed rank
(:mod:`wagma_bench.runtime.supervise`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from wagma_bench import exits
from wagma_bench.config.schema import RunConfig
from wagma_bench.errors import ConfigError, SymlinkRefused
from wagma_bench.record.files import open_run_file
from wagma_bench.record.rundir import LOCK, finalize
from wagma_bench.runtime import signals, startup
from wagma_bench.runtime.hosts import check_reachable, choose_gloo_interface, node_address
from wagma_bench.runtime.partition import PartitionWatch, ReachListener, slurm_controller
from wagma_bench.runtime.supervise import (
    HEARTBEATS,
    LAUNCHER_DIR_ENV,
    CtrlC,
    LocalRanks,
    RanksLost,
    end_heartbeat,
    process_alive,
    ranks_ignore_ctrl_c,
    record_failed_run,
    report_error,
    shared_period_s,
    start_heartbeat,
    supervise,
)
from wagma_bench.runtime.world import World

if TYPE_CHECKING:  # torch, which the launching process never imports
    from wagma_bench.comm.base import Comm

#: what a rank runs once its world is up: (config, comm, run directory, local rank) -> rank 0's summary
RankProgram = Callable[[RunConfig, "Comm", Path, int], "dict | None"]


def launcher_run_id(env=os.environ) -> str | None:
    """A name for this run that every rank, and every restart or requeue of it, derives alike: torchrun's
    rendezvous id (``torchrun-ID``; ``--standalone`` makes a fresh one per torchrun, ``--rdzv-id`` names it),
    SLURM's job and step (``slurm-JOB.STEP`` or ``slurm-ARRAYJOB_TASK.STEP``: a requeued job keeps its id and
    numbers its steps again from 0; the step tells apart several sruns in one allocation). None where the
    launcher gives nothing stable (mpiexec; torchrun's default id ``none``, shared by unrelated runs)."""
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return "torchrun-" + re.sub(r"[^A-Za-z0-9._-]+", "_", run_id)
    step = env.get("SLURM_STEP_ID", "0")
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"slurm-{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}.{step}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}.{step}"
    return None


def store_shared_stamp(env=os.environ, timeout_s: float = 120.0) -> str:
    """One timestamp for all ranks of a torchrun world: the first rank to ask puts its own clock into the
    agent's store (MASTER_ADDR:MASTER_PORT), every rank reads that value back."""
    from datetime import datetime, timedelta

    import torch.distributed as dist

    store = dist.TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=timeout_s)
    )
    mine = datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
    return store.compare_set("wagma_bench/run_stamp", "", mine).decode()


def agreed_run_dir_override(
    overrides: list[str], env=os.environ, shared_stamp=store_shared_stamp
) -> str | None:
    """``hydra.run.dir=...`` for a rank of an external world started without one.

    Hydra's default ``outputs/${now:...}`` is resolved by every rank on its own clock: ranks that start
    seconds apart split one run into several directories, and a restart gets a fresh one and finds no
    checkpoint. The launcher's run id names the directory instead; under torchrun without one (its default
    id ``none``) the ranks share the first rank's clock through torchrun's store, in the default's layout
    (conf/wagma.yaml). None where the user chose the directory, for a multirun (Hydra's sweep directory),
    and for mpiexec (no store before the world exists).
    """
    if any(o.startswith(("hydra.run.dir=", "-m", "--multirun")) for o in overrides):
        return None
    run_id = launcher_run_id(env)
    if run_id is not None:
        return f"hydra.run.dir=outputs/{run_id}_${{workload.name}}_${{optimizer.name}}"
    if env.get("TORCHELASTIC_RUN_ID") and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return f"hydra.run.dir=outputs/{shared_stamp(env)}_${{workload.name}}_${{optimizer.name}}"
    return None


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def slurm_master(env=os.environ) -> tuple[str, int]:
    """An address of the first host of the step's node list (its name, or slurmctld's NodeAddr for it where
    the name does not resolve: :func:`wagma_bench.runtime.hosts.node_address`) and a port derived from the job
    id."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
    try:
        hosts = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
        host = hosts[0] if hosts else "127.0.0.1"
    except (OSError, subprocess.SubprocessError):
        host = nodelist.split(",")[0]
    port = 20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000
    return node_address(host), port


def _pin_threads(local_world_size: int) -> None:
    # Several ranks on one CPU would each start one intra-op thread per core and thrash.
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world_size)))


CPU_DEFAULT_NPROC = 4  # local ranks without CUDA (launcher.nproc=null)
# device nodes without which torch sees no GPU: NVIDIA's, AMD's (ROCm, also torch.cuda), WSL's
GPU_DEVICE_NODES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")


def visible_cuda_devices() -> int:
    """``torch.cuda.device_count()``, without importing torch (1.3 s of CPU here) on a machine with no GPU
    device node, where torch's count is 0 too."""
    if not any(glob.glob(pattern) for pattern in GPU_DEVICE_NODES):
        return 0
    import torch

    return torch.cuda.device_count()


@dataclass(frozen=True)
class DevicePlan:
    nproc: int  # ranks (on this node)
    backend: str  # torch.distributed backend: nccl | gloo | mpi
    cuda: bool  # tensors on cuda:{local_rank % GPUs}
    note: str = ""  # said in the run's first line where the plan is not the usual one


def device_plan(cuda_devices: int, nproc: int | None, backend: str) -> DevicePlan:
    """Ranks, backend and device from the visible GPUs, the ranks asked for (None: one per GPU with CUDA,
    else 4) and ``comm.backend``. NCCL refuses two ranks on one GPU, so more ranks than GPUs run on gloo
    with CUDA tensors under ``auto`` and fail here, before any rank starts, under ``nccl``."""
    ranks = nproc if nproc is not None else (cuda_devices or CPU_DEFAULT_NPROC)
    if backend == "gloo":
        return DevicePlan(ranks, "gloo", False)
    if backend == "mpi":  # comm=mpi also trains on the GPU when there is one; MpiComm stages CUDA tensors
        return DevicePlan(ranks, "mpi", cuda_devices > 0)
    if cuda_devices == 0:
        if backend == "nccl":
            raise ConfigError(
                "comm.backend=nccl needs CUDA and no GPU is visible; comm.backend=auto runs gloo on CPU"
            )
        return DevicePlan(ranks, "gloo", False)
    if ranks <= cuda_devices:
        return DevicePlan(ranks, "nccl", True)
    if backend == "nccl":
        raise ConfigError(
            f"comm.backend=nccl with {ranks} ranks on {cuda_devices} GPU(s): NCCL needs a GPU of its "
            f"own for every rank; use launcher.nproc<={cuda_devices}, or comm.backend=auto (gloo with "
            "CUDA tensors)"
        )
    return DevicePlan(
        ranks,
        "gloo",
        True,
        f"{ranks} ranks on {cuda_devices} GPU(s): gloo with CUDA tensors "
        "(NCCL needs a GPU of its own for every rank)",
    )


def make_comm(cfg: RunConfig, world: World, master: tuple[str, int] | None, run_dir: str = ""):
    """Create this rank's communicator (the one backend every algorithm uses)."""
    import torch

    plan = device_plan(torch.cuda.device_count(), world.local_world_size, cfg.comm.backend)
    use_cuda = plan.cuda
    device = (
        torch.device(f"cuda:{world.local_rank % torch.cuda.device_count()}")
        if use_cuda
        else torch.device("cpu")
    )
    if use_cuda:
        torch.cuda.set_device(device)
    if cfg.comm.name == "mpi":
        from wagma_bench.comm.mpi import MpiComm

        return MpiComm.init(timeout_s=cfg.comm.timeout_s, device=device)
    backend = plan.backend
    if cfg.comm.emulate:  # NCCL's limits on a gloo world (comm.emulate=nccl)
        backend = "gloo"
    return join_world(
        world,
        master,
        backend,
        device,
        cfg.comm.timeout_s,
        cfg.launcher.rendezvous_timeout_s,
        run_identity(run_dir),
        cfg.comm.emulate,
    )


def join_world(
    world: World,
    master: tuple[str, int] | None,
    backend: str,
    device,
    timeout_s: float,
    rendezvous_timeout_s: float,
    identity: str,
    emulate: str | None = None,
):
    """This rank's torch.distributed communicator in ``world``: under torchrun through its agent's store, else
    through the run's rendezvous store at ``master`` (None: MASTER_ADDR/MASTER_PORT). Where the ranks may be
    on several hosts, gloo's interface is chosen (the route to the rendezvous host) and every rank checked to
    reach the next before gloo connects (:mod:`wagma_bench.runtime.hosts`). `run` and `comm-bench` both join
    their worlds here."""
    from wagma_bench.comm.torch_dist import TorchComm

    if world.source == "torchrun":  # torchrun's agent hosts the store: join it, in this attempt's namespace
        interface = choose_gloo_interface(os.environ["MASTER_ADDR"], os.environ)
        store = torchrun_attempt_store(rendezvous_timeout_s)
        check_reachable(store, world.rank, world.world_size, interface)
        return TorchComm.init(backend, world.rank, world.world_size, store, timeout_s, device, emulate)
    if master is None:
        master = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    store = join_store(master, world.rank, rendezvous_timeout_s, identity)
    if world.source != "local":  # ranks may be on several hosts: gloo must bind where the others reach it
        check_reachable(store, world.rank, world.world_size, choose_gloo_interface(master[0], os.environ))
    return TorchComm.init(backend, world.rank, world.world_size, store, timeout_s, device, emulate)


def external_master(world: World, torch_under_mpi: tuple[str, int] | None) -> tuple[str, int] | None:
    """The rendezvous address of a rank placed by a launcher, for :func:`join_world`: under srun the step's
    first host (:func:`slurm_master`) unless MASTER_ADDR is set; torch.distributed under mpiexec, which
    gives none, ``torch_under_mpi`` (`run`'s launcher.master_addr and port); else None (MASTER_ADDR and
    MASTER_PORT, torchrun's or the user's; and for MPI's own communicator, which needs none)."""
    if "MASTER_ADDR" in os.environ:
        return None
    if world.source == "slurm":
        return slurm_master()
    if world.source == "mpi":
        return torch_under_mpi
    return None


RANK_DIR_ENV = "WAGMA_BENCH_RANK_DIR"  # under the re-executing launcher (comm=mpi): each rank's PID and error
RUN_KEY = "wagma_bench/run"  # the run a rendezvous store serves: set by its host, checked by every other rank
RUN_NONCE_ENV = "WAGMA_BENCH_RUN_NONCE"  # the local launcher's nonce for its ranks
STORE_HOSTED_ENV = (
    "WAGMA_BENCH_STORE_HOSTED"  # "1": the local launcher's store process hosts it; rank 0 joins too
)


def run_identity(run_dir: str, env=os.environ) -> str:
    """Who this run is, the same on each of its ranks: the local launcher's nonce or the cluster launcher's
    run id (two sruns of one job differ by their step), and its run directory, as ``ID DIR``; without an id
    (mpiexec) the directory alone identifies it."""
    tag = env.get(RUN_NONCE_ENV) or launcher_run_id(env) or "-"
    return f"{tag} {run_dir}"


def _same_run(theirs: str, mine: str) -> bool:
    # by the id where there is one (a node may see the run directory under another path), else by directory
    tag, mine_tag = theirs.split(" ", 1)[0], mine.split(" ", 1)[0]
    return tag == mine_tag if mine_tag != "-" else theirs == mine


class ForeignStore(RuntimeError):
    """The rendezvous store at the run's address serves another run."""


def listen_for_store(addr: str, port: int) -> socket.socket:
    """The listening socket of a local run's rendezvous store, bound by the launcher before any rank starts
    (``port`` 0: a free one) and served by its store process (:func:`_serve_store`): of two runs racing for
    one fixed port the second fails here, naming the run that holds it where it is one of ours, not after its
    ranks have started. The launcher keeps its copy open until its ranks have ended, so the port stays the
    run's. SO_REUSEADDR as the store's own server: a port whose earlier connections linger in TIME_WAIT is
    free."""
    try:
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as err:
        raise ConfigError(f"launcher.master_addr={addr} is not an address of this machine ({err})") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((addr, port))
    except OSError as err:
        sock.close()
        if not port:
            raise ConfigError(
                f"launcher.master_addr={addr} is not an address of this machine ({err.strerror})"
            ) from None
        holder = noted_holder(addr, port) or store_holder(addr, port)
        by = f"the rendezvous store of run {holder}" if holder else f"another program ({err.strerror})"
        raise ConfigError(
            f"launcher.master_port={port} is in use on {addr} by {by}; choose another port, or leave "
            "launcher.master_port=null for a free one"
        ) from None
    sock.listen()
    return sock


def join_store(master: tuple[str, int], rank: int, timeout_s: float, identity: str, host: bool | None = None):
    """This rank's connection to the run's rendezvous store (rank 0 hosts it and names the run in it, unless
    the local launcher's store process does: ``host`` False, from :data:`STORE_HOSTED_ENV`).

    A rank that reaches a store of another run (a fixed ``launcher.master_port`` or a SLURM-derived port that
    another run holds) fails here, before any key of that run's world is touched, naming the port and the
    run it found: joining would break both worlds."""
    from datetime import timedelta

    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    if host is None:
        host = rank == 0 and os.environ.get(STORE_HOSTED_ENV) != "1"
    if host:  # wait_for_workers=False: the clients join without a world size (no key of theirs written)
        store = dist.TCPStore(master[0], master[1], is_master=True, timeout=timeout, wait_for_workers=False)
        store.set(RUN_KEY, identity)
        return store
    store = dist.TCPStore(master[0], master[1], is_master=False, timeout=timeout)
    try:
        store.wait([RUN_KEY])
    except RuntimeError as err:  # DistStoreError (a timeout) is a RuntimeError
        raise ForeignStore(
            f"the rendezvous store at {master[0]}:{master[1]} named no run within {timeout_s:g} s "
            f"(launcher.rendezvous_timeout_s): another program's store? ({err})"
        ) from None
    theirs = store.get(RUN_KEY).decode(errors="replace")
    if not _same_run(theirs, identity):
        raise ForeignStore(
            f"the rendezvous store at {master[0]}:{master[1]} belongs to another run ({theirs}); "
            f"this run ({identity}) does not join it: choose another launcher.master_port, or "
            "leave it null for a free one"
        )
    return store


def _port_note(addr: str, port: int) -> Path:
    import tempfile

    return Path(tempfile.gettempdir()) / f"wagma-bench-port-{addr}-{port}"


def note_port_holder(addr: str, port: int, identity: str) -> Path | None:
    """Note that this launcher holds the fixed ``port`` for the run ``identity`` (a file in the temp
    directory, removed when the run ends): a second run that cannot bind it names the holder from there, at
    once, where asking the store itself (:func:`store_holder`) needs torch, seconds of import on a busy
    machine."""
    from wagma_bench.record.files import write_text_atomic

    path = _port_note(addr, port)
    try:
        write_text_atomic(path, f"{os.getpid()} {identity}")
    except OSError:  # another user's note, or no room: the loser of a race then asks the store
        return None
    return path


def noted_holder(addr: str, port: int, wait_s: float = 1.0) -> str | None:
    """The run noted as holding ``port`` (:func:`note_port_holder`), if its launcher is alive; a run that
    bound the port a moment ago notes it right after, so the note is awaited for ``wait_s``."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        try:
            pid, identity = _port_note(addr, port).read_text().split(" ", 1)
            return identity if process_alive(int(pid)) else None
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                return None
        time.sleep(0.05)


def store_holder(addr: str, port: int, timeout_s: float = 3.0) -> str | None:
    """The run whose rendezvous store listens at ``addr:port`` (None: no store of a run answers there)."""
    from datetime import timedelta

    import torch.distributed as dist

    try:
        store = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=timeout_s))
        store.wait([RUN_KEY])
        return store.get(RUN_KEY).decode(errors="replace")
    except (RuntimeError, ValueError):
        return None


def torchrun_attempt_store(timeout_s: float, env=os.environ):
    """torchrun's store (env://), its keys under this attempt's prefix (``TORCHELASTIC_RESTART_COUNT``).

    The agent's store outlives the workers: after a restart (``--max-restarts``) the new workers would find
    the previous attempt's keys of the same names, and gloo would connect to the dead workers' addresses
    (``Gloo connectFullMesh failed ... Connection refused``) whenever it reads a peer's key before that
    peer has rewritten it. torch's env:// handler adds no prefix of its own."""
    from datetime import timedelta

    import torch.distributed as dist

    store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout_s)))
    return dist.PrefixStore(f"wagma_bench/attempt-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def run_rank(
    cfg: RunConfig, run_dir: str, world: World, master: tuple[str, int] | None, program: RankProgram
) -> dict | None:
    """Entry point of one rank, in a spawned process or under an external launcher: set up its world, then run
    ``program`` (the trainer's ``train``: the command passes it in, so that this layer does not import the
    one above it). ``cfg`` is the configuration the command checked once, for this world size (a spawned rank
    gets it pickled): a rank does not check it again."""
    startup.mark("rank")
    startup.mark("imported")
    _pin_threads(world.local_world_size)
    watch = None
    if world.source != "local":  # no launcher of ours watches: the ranks tell which of them are gone
        listener = ReachListener(master[0] if master else os.environ.get("MASTER_ADDR", "127.0.0.1"))
        start_heartbeat(
            Path(run_dir) / HEARTBEATS,
            world.rank,
            shared_period_s(world.local_world_size),
            (listener.addr, listener.port),
        )
    ranks_dir = os.environ.get(RANK_DIR_ENV)
    if ranks_dir:  # for the launcher's message when this rank ends the job
        with open_run_file(Path(ranks_dir) / f"rank{world.rank}.pid", "w") as f:  # as report_error, beside it
            f.write(str(os.getpid()))
    comm = make_comm(cfg, world, master, run_dir)
    startup.mark("world")
    if world.source != "local":
        watch = PartitionWatch(
            Path(run_dir) / HEARTBEATS,
            world.rank,
            world.world_size,
            partial(record_lost, Path(run_dir)),
            slurm_controller(),
        )
    try:
        return program(cfg, comm, Path(run_dir), world.local_rank)
    except RanksLost as err:
        survivors = sorted(set(range(world.world_size)) - set(err.ranks))
        if (
            0 in err.ranks and survivors and world.rank == survivors[0]
        ):  # rank 0 cannot record it: its host is gone
            record_lost(Path(run_dir), str(err))
        raise
    except BaseException as err:
        if ranks_dir:
            report_error(ranks_dir, world.rank, err)
        # end the job now (MPI) rather than let the peers wait for their timeout; not for a second Ctrl-C,
        # which every rank took (the trainer recorded it) and whose launcher kills a rank still running 2 s
        # later
        if comm.abort_ends_job and not isinstance(err, KeyboardInterrupt):
            if isinstance(err, SymlinkRefused):  # a link planted mid-run: its one line says it all
                sys.stderr.write(f"[rank {world.rank}] failed: {err}\n")
            else:
                traceback.print_exc()
            try:
                if world.rank != 0:  # the abort kills rank 0 too, before it can record the failure
                    finalize(
                        Path(run_dir),
                        status="failed",
                        error=f"rank {world.rank} failed: {type(err).__name__}: {err}",
                    )
            finally:  # whatever the record met, the job ends now (the peers would wait for comm.timeout_s)
                comm.abort(1)
        raise
    finally:
        if watch is not None:
            watch.close()
        comm.close()
        if world.source != "local":  # the run directory keeps no heartbeat of a run that has ended
            end_heartbeat(Path(run_dir) / HEARTBEATS, world.rank)


def record_lost(run_dir: Path, error: str) -> None:
    """A survivor's record of a run whose rank 0 may be gone: the failure, and the run directory's lock
    released (a rerun on another host could not tell it stale)."""
    record_failed_run(run_dir, error)
    (run_dir / LOCK).unlink(missing_ok=True)


def _die_with_launcher(launcher_pid: int, sig: int | None = None) -> None:
    """``sig`` (SIGTERM by default) to this process when its launcher dies (SIGKILLed, OOM), so ranks never
    train on unsupervised: a rank's TERM handler checkpoints at the next synchronisation point and ends the
    run as preempted (``run_suspend``), resumable; the store process, which keeps SIGTERM blocked, takes
    SIGKILL. A rank's parent is the launcher's fork server, which outlives the launcher while any rank lives
    (each rank holds the server's liveness pipe), so the parent-death signal (prctl) cannot serve: a thread
    waits on the launcher's pidfd (Linux 5.3+), elsewhere polls it every second."""
    import select
    import signal
    import threading
    import time

    try:
        pidfd = os.pidfd_open(launcher_pid)
    except (AttributeError, OSError):  # no pidfd here, or the launcher is already gone
        pidfd = None

    def watch():
        if pidfd is not None:
            select.select([pidfd], [], [])  # readable once the launcher has exited
        else:
            while process_alive(launcher_pid):
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM if sig is None else sig)

    threading.Thread(target=watch, name="launcher-watchdog", daemon=True).start()


# The fork server's preload: importing it imports what every local rank needs
# (torch, torch._dynamo, the suite)
RANK_SERVER_PRELOAD = "wagma_bench.runtime.rank_server"


def start_rank_server() -> None:
    """Start the fork server of the local ranks now, so that its imports overlap the launcher's own start-up
    (Hydra, validation). It inherits the launcher's blocked Ctrl-C (see
    :func:`~wagma_bench.runtime.supervise.ranks_ignore_ctrl_c`); what differs per run travels in each rank's
    arguments, not in the server's environment, which is the launcher's at this moment. Idempotent; the server
    is stopped when the launcher exits (:func:`stop_rank_server`), so a command refused after this point does
    not leave it importing."""
    import atexit
    import multiprocessing
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload([RANK_SERVER_PRELOAD])
    atexit.unregister(stop_rank_server)
    atexit.register(
        stop_rank_server
    )  # first: a Ctrl-C kept while the server starts is raised as the window closes
    with ranks_ignore_ctrl_c():
        forkserver.ensure_running()


def stop_rank_server() -> None:
    """Kill the fork server (a server still importing would only notice the launcher's exit once done). Its
    ranks, if any still run, are not its to end: they are separate processes."""
    import signal
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _spawned_rank(
    index: int,
    program: RankProgram,
    cfg: RunConfig,
    run_dir: str,
    nproc: int,
    master: tuple[str, int],
    launcher_pid: int | None = None,
    heartbeat_dir: str | None = None,
    env: dict | None = None,
) -> None:
    signals.rank_listening_later()  # a SIGTERM from now on is the trainer's to act on, once it listens
    _ignore_ctrl_c()
    os.environ.update(env or {})
    startup.inherit()
    if launcher_pid is not None:
        _die_with_launcher(launcher_pid)
    if heartbeat_dir is not None:
        start_heartbeat(heartbeat_dir, index)
    try:
        run_rank(cfg, run_dir, World(index, nproc, index, nproc, "local"), master, program)
        _exit_now(0)
    except BaseException as err:  # noqa: BLE001 - reported, then the process exits non-zero
        if isinstance(
            err, ConfigError
        ):  # a setting refused where only a rank can check it (the model's size)
            sys.stderr.write(f"[rank {index}] refused: {err}\n")
            sys.stderr.flush()
        elif not isinstance(err, (KeyboardInterrupt, SymlinkRefused)):
            # a second Ctrl-C, or a link planted mid-run (every rank meets it at its next write): the launcher
            # says it, once for all ranks, in one line naming the link
            sys.stderr.write(f"[rank {index}] failed:\n{traceback.format_exc()}")
            sys.stderr.flush()
        if heartbeat_dir is not None:
            report_error(heartbeat_dir, index, err)
        os._exit(
            exits.INTERRUPTED if isinstance(err, KeyboardInterrupt) else exits.FAILED
        )  # not waiting for threads blocked on dead peers


STORE_PROCESS_NAME = "wagma-store"  # the local run's store process, as ps and top show it


def _serve_store(store_socket: socket.socket, identity: str, timeout_s: float, launcher_pid: int) -> None:
    """The local run's rendezvous store, in a process of its own forked from the rank server (the launcher
    imports no torch): a TCPStore served on the socket the launcher bound (``master_listen_fd``) and named for
    the run, until the launcher kills it after its ranks have ended, or itself ends. A store that outlives
    every rank: a rank that ends first (a Ctrl-C, a failure) does not take it from the others, whose end the
    launcher decides. It keeps SIGTERM and SIGHUP blocked, as the server forked it: a signal to the whole
    group is the launcher's to act on, and ranks still checkpointing need their store."""
    import signal

    _ignore_ctrl_c()
    with contextlib.suppress(OSError):  # its name in ps and top (Linux), which tells it from the ranks
        Path("/proc/self/comm").write_text(STORE_PROCESS_NAME)
    store = serve_store(store_socket, timeout_s)
    store.set(RUN_KEY, identity)
    _die_with_launcher(launcher_pid, signal.SIGKILL)  # when the launcher is gone
    while True:
        signal.pause()


def serve_store(store_socket: socket.socket, timeout_s: float):
    """A TCPStore served on ``store_socket`` (listening, from :func:`listen_for_store`, which it takes over):
    on that socket's address alone, and on a port held from the moment it was chosen (given a port instead,
    torch's libuv server listens on every interface, IPv6 included)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    # TCPStore's libuv server (torch's default since 2.4) takes over a listening socket only from torch 2.8
    # (pytorch#150215); on an older torch the legacy server does
    legacy = {} if torch.__version__ >= "2.8" else {"use_libuv": False}
    host, port = store_socket.getsockname()[:2]
    return dist.TCPStore(
        host,
        port,
        is_master=True,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
        master_listen_fd=store_socket.detach(),
        **legacy,
    )


def _ignore_ctrl_c() -> None:
    """A rank's Ctrl-C is its launcher's to forward (the trainer installs its handlers); until then it is
    ignored, whatever the fork server's own disposition was."""
    import signal

    from wagma_bench.runtime.slurm import FORWARDED_INTERRUPT

    for sig in (signal.SIGINT, FORWARDED_INTERRUPT):
        signal.signal(sig, signal.SIG_IGN)
    # the fork server was started with them blocked (supervise.ranks_ignore_ctrl_c): pending ones are dropped
    # now, being ignored; the trainer's handlers need them unblocked
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, FORWARDED_INTERRUPT})


def _exit_now(code: int) -> None:
    """End a local rank after its run: its files are closed and its process groups destroyed (the comm's
    close), so only the interpreter's finalization is left, and that is skipped. Finalizing while torch's and
    gloo's native threads still exist is where a rank of a completed run could die by SIGABRT.
    multiprocessing's own finalizers run first: they release the named semaphores a library made (fairseq
    makes one at import), which the launcher's resource tracker would otherwise report as leaked."""
    import logging
    from multiprocessing import util

    logging.shutdown()
    util._run_finalizers()  # what multiprocessing's exit function does; no public name for it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def spawn_local(
    cfg: RunConfig,
    run_dir: Path,
    nproc: int,
    addr: str,
    port: int | None,
    program: RankProgram,
    announce: str = "",
) -> int | None:
    """Spawn ``nproc`` local ranks running ``program`` (see :func:`run_rank`; a module-level function, which
    the ranks import by name) and wait; a rank that fails or hangs ends the others within seconds
    (:mod:`wagma_bench.runtime.supervise`) and raises :class:`RunFailed` naming it. A fixed ``port`` in use
    raises :class:`ConfigError` before any rank starts. ``announce`` is printed once the launcher has taken
    Ctrl-C over, so that a Ctrl-C after it always reaches the run. Returns the signal that stopped the run, or
    None: SIGINT for a Ctrl-C (the ranks then stopped at a checkpoint; a second Ctrl-C raises
    :class:`RunInterrupted`), SIGTERM or SIGHUP to the launcher (passed to the ranks as SIGTERM: they
    checkpoint and stop, preempted)."""
    import multiprocessing
    import secrets
    import shutil
    import tempfile

    store_socket = listen_for_store(addr, port or 0)  # names the run that holds a fixed port
    nonce = secrets.token_hex(8)
    port_note = (
        note_port_holder(addr, port, f"{nonce} {run_dir}") if port else None
    )  # at once: a loser awaits it
    master = (addr, store_socket.getsockname()[1])
    heartbeats = Path(tempfile.mkdtemp(prefix="wagma-bench-heartbeat-"))
    ctrl_c = store = None
    try:
        ctrl_c = CtrlC([], heartbeats)  # from now on a Ctrl-C reaches the ranks, started or not
        if announce:
            print(announce, flush=True)
        start_rank_server()
        startup.mark("spawned")
        env = {
            RUN_NONCE_ENV: nonce,
            startup.STARTUP_ENV: startup.for_ranks(),
            LAUNCHER_DIR_ENV: str(heartbeats),
            STORE_HOSTED_ENV: "1",
        }
        context = multiprocessing.get_context("forkserver")
        store = context.Process(
            target=_serve_store,
            name="store",
            args=(store_socket, f"{nonce} {run_dir}", cfg.launcher.rendezvous_timeout_s, os.getpid()),
        )
        store.start()
        processes = [
            context.Process(
                target=_spawned_rank,
                name=f"rank{index}",
                args=(index, program, cfg, str(run_dir), nproc, master, os.getpid(), str(heartbeats), env),
            )
            for index in range(nproc)
        ]
        for process in processes:
            process.start()
        ctrl_c.start(processes)
        supervise(LocalRanks(processes), heartbeats, hung_after_s=cfg.comm.timeout_s, ctrl_c=ctrl_c)
    finally:
        if ctrl_c is not None:
            ctrl_c.restore()
        shutil.rmtree(heartbeats, ignore_errors=True)
        if (
            store is not None and store.pid is not None
        ):  # it outlives the ranks; the port is theirs till they end
            store.kill()  # SIGKILL: it keeps SIGTERM blocked (_serve_store)
            store.join()
        if port_note is not None:
            port_note.unlink(missing_ok=True)
        store_socket.close()
    import signal

    return ctrl_c.terminated or (signal.SIGINT if ctrl_c.count else None)
