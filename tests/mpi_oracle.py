"""Exact-oracle checks of MpiComm; run under ``mpiexec -n P python tests/mpi_oracle.py`` (tests/test_mpi.py).

Every rank fills its tensors with its rank number, so each result has one exact expected value. A failed
check aborts the whole MPI job (a clean exit would leave the peers waiting); rank 0 prints ``ok`` at the end.
"""

from __future__ import annotations

import threading
import time
import traceback

import torch

from wagma_bench.comm import topology
from wagma_bench.comm.base import CommError
from wagma_bench.comm.mpi import MPI, MpiComm


def full(rank: float, n: int = 5, dtype=torch.float64) -> torch.Tensor:
    return torch.full((n,), float(rank), dtype=dtype)


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def world_collectives(comm: MpiComm) -> None:
    r, p = comm.rank, comm.world_size
    for dtype in (torch.float32, torch.float64, torch.float16, torch.int64):
        t = full(r, dtype=dtype)
        comm.allreduce(t, op="sum")
        check(torch.equal(t, full(p * (p - 1) // 2, dtype=dtype)), f"allreduce sum {dtype}: {t}")
    t = full(r)
    comm.allreduce(t, op="mean")
    check(torch.equal(t, full((p - 1) / 2)), f"allreduce mean: {t}")
    t = full(r, n=1000)
    handle = comm.allreduce(t, op="mean", async_op=True)
    handle.wait()
    handle.wait()  # a second wait is a no-op (no second division)
    check(torch.equal(t, full((p - 1) / 2, n=1000)), "async allreduce mean")

    t = full(r, dtype=torch.bfloat16)
    comm.broadcast(t, src=p - 1)
    check(torch.equal(t, full(p - 1, dtype=torch.bfloat16)), f"broadcast bfloat16: {t}")
    gathered = comm.allgather(torch.tensor([r, 10 * r], dtype=torch.int32))
    want = torch.tensor([[i, 10 * i] for i in range(p)], dtype=torch.int32)
    check(torch.equal(gathered, want), f"allgather: {gathered}")
    comm.barrier()


def butterfly_groups(comm: MpiComm) -> None:
    """After new_groups + group_allreduce every rank holds exactly its group's mean, at every stage."""
    r, p = comm.rank, comm.world_size
    for size in (2, 4):
        for stage in range(topology.num_stages(p, size)):
            groups = topology.butterfly_stage(p, size, stage)
            comm.new_groups(groups)
            mine = next(g for g in groups if r in g)
            t = full(r)
            comm.group_allreduce(t, groups)
            check(torch.equal(t, full(sum(mine) / len(mine))), f"S={size} stage {stage} group {mine}: {t}")
            if len(mine) > 1:
                t = full(r)
                comm.allreduce(t, op="sum", group=tuple(reversed(mine)), async_op=True).wait()
                check(torch.equal(t, full(sum(mine))), f"group sum {mine}: {t}")
                t = full(r)
                comm.broadcast(t, src=mine[-1], group=mine)
                check(torch.equal(t, full(mine[-1])), f"group broadcast {mine}: {t}")


def point_to_point(comm: MpiComm) -> None:
    r, p = comm.rank, comm.world_size
    got = full(-1)
    recv = comm.irecv(got, src=(r - 1) % p, tag=3)
    send = comm.isend(full(r), dst=(r + 1) % p, tag=3)
    send.wait()
    recv.wait()
    check(torch.equal(got, full((r - 1) % p)), f"ring irecv: {got}")

    if r == 0:
        sources = []
        for _ in range(p - 1):
            t = full(-1, n=2)
            src = comm.recv_any(t, tag=7)
            check(torch.equal(t, full(src, n=2)), f"recv_any: payload {t} from {src}")
            sources.append(src)
        check(sorted(sources) == list(range(1, p)), f"recv_any sources {sources}")
    else:
        comm.send(full(r, n=2), dst=0, tag=7)
    comm.barrier()


def forked_thread(comm: MpiComm) -> None:
    """A forked communicator used from a background thread while the main thread runs collectives."""
    r, p = comm.rank, comm.world_size
    twin = comm.fork()
    groups = topology.butterfly_stage(p, 2, 0)
    twin.new_groups(groups)
    mine = next(g for g in groups if r in g)
    errors: list[BaseException] = []

    def background() -> None:
        try:
            for _ in range(30):
                t = torch.ones(10_000)
                twin.allreduce(t, op="sum")
                check(torch.equal(t, torch.full((10_000,), float(p))), "forked allreduce")
                t = full(r)
                twin.group_allreduce(t, groups)
                check(torch.equal(t, full(sum(mine) / len(mine))), "forked group allreduce")
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            errors.append(err)

    thread = threading.Thread(target=background)
    thread.start()
    for _ in range(30):
        t = full(r, n=10_000)
        comm.allreduce(t, op="mean")
        check(torch.equal(t, full((p - 1) / 2, n=10_000)), "main-thread allreduce during forked use")
    thread.join()
    if errors:
        raise errors[0]
    twin.close()


def store(comm: MpiComm) -> None:
    r, p = comm.rank, comm.world_size
    comm.store_add("total", r + 1)
    tickets = [comm.store_add("tickets", 1) for _ in range(10)]
    comm.barrier()
    check(comm.store_add("total", 0) == p * (p + 1) // 2, "store_add total")
    check(comm.store_add("other", 0) == 0, "a new key starts at 0")
    everyone = comm.allgather(torch.tensor(tickets)).flatten().tolist()
    check(sorted(everyone) == list(range(1, 10 * p + 1)), f"store_add is atomic: {sorted(everyone)}")
    for i in range(300):  # one key per use, as DD-PPO does: many keys, each its own counter
        comm.store_add(f"round/{i}", 1)
    comm.barrier()
    counts = [comm.store_add(f"round/{i}", 0) for i in range(300)]
    check(counts == [p] * 300, f"per-use keys: {sorted(set(counts))}")
    comm.barrier()


def timeouts(comm: MpiComm) -> None:
    r, p = comm.rank, comm.world_size
    short = comm.fork(timeout_s=0.5)
    start = time.monotonic()
    try:
        short.irecv(full(0), src=(r + 1) % p, tag=99).wait()  # nobody sends
        raise AssertionError("irecv from a silent peer returned")
    except CommError as err:
        check("receive from rank" in str(err) and time.monotonic() - start < 30, f"irecv timeout: {err}")
    try:
        short.recv_any(full(0), tag=98)
        raise AssertionError("recv_any with no sender returned")
    except CommError as err:
        check("any rank" in str(err), f"recv_any timeout: {err}")
    comm.barrier()
    late = full(r)
    if r == 0:  # rank 0 alone enters an allreduce; the others join only after its timeout
        try:
            short.allreduce(late, op="sum")
            raise AssertionError("allreduce without peers returned")
        except CommError as err:
            check("allreduce over the world" in str(err), f"allreduce timeout: {err}")
    comm.barrier()
    if r != 0:
        short.allreduce(late, op="sum")  # completes rank 0's pending request
    comm.barrier()
    short.close()


def bad_input(comm: MpiComm) -> None:
    for call, what in [
        (lambda: comm.allreduce(torch.zeros(4, 4).t()), "contiguous"),
        (lambda: comm.allreduce(torch.zeros(2), op="max"), "'mean' or 'sum'"),
        (lambda: comm.allreduce(torch.zeros(2, dtype=torch.bfloat16)), "cannot reduce"),
        (lambda: comm.isend(torch.zeros(2), 0, tag=comm.max_tag + 1), "MPI_TAG_UB"),
    ]:
        try:
            call()
            raise AssertionError(f"no error for {what}")
        except ValueError as err:
            check(what in str(err), f"error text {err}")


def main() -> None:
    comm = MpiComm.init(timeout_s=60.0, device=torch.device("cpu"))
    try:
        check(MPI.Query_thread() == MPI.THREAD_MULTIPLE, "thread level")
        check(comm.backend_name == "mpi" and comm.world_size == MPI.COMM_WORLD.Get_size(), "attributes")
        for part in (
            world_collectives,
            butterfly_groups,
            point_to_point,
            forked_thread,
            store,
            timeouts,
            bad_input,
        ):
            start = time.monotonic()
            part(comm)
            if comm.rank == 0:
                print(f"{part.__name__}: {time.monotonic() - start:.2f} s", flush=True)
        comm.close()
    except BaseException:  # noqa: BLE001 - any failure must take the whole MPI job down
        print(f"[rank {comm.rank}] FAILED\n{traceback.format_exc()}", flush=True)
        comm.abort(1)
    if comm.rank == 0:
        print(f"ok {comm.world_size} ranks", flush=True)


if __name__ == "__main__":
    main()
