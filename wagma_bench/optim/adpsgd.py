"""AD-PSGD: asynchronous decentralized parallel SGD (Lian, Zhang, Zhang & Liu, ICML 2018).

Every rank applies its local gradient to its own model while a background **gossip thread** averages the
model with one peer at a time; the compute thread never waits for a peer. Deadlock is avoided as in the
paper's implementation, by a bipartite split: even ranks are *active* and initiate every averaging, odd
ranks are *passive* and only answer (a passive rank may be asked by several actives; it serves them one
at a time). An active rank's ``e``-th exchange goes to its partner in the random perfect matching
:func:`~wagma_bench.comm.topology.random_matching` ``(P, e, seed)``, i.e. a uniformly random passive rank,
and actives that are in step pick distinct passives.

One exchange, atomic with respect to the two models as they were snapshotted:

    active a, passive p:  snapshots s_a, s_p;  swap them;  x_a += (s_p - s_a) / 2,  x_p += (s_a - s_p) / 2

If neither rank took a step in between this is exactly ``x_a = x_p = (s_a + s_p) / 2``; gradient steps
taken while the models travelled are kept on top (the pair's sum is preserved). The thread never writes
the live parameters: autograd forbids in-place changes to weights between forward and backward, so the
correction is queued and the compute thread adds it at its next ``step`` (before its gradient update,
i.e. the gradient computed on the pre-average model is applied to the averaged one, the paper's update
``x_i <- (x_i + x_j) / 2 - lr * g(x_hat_i)``).

Pacing: an active rank starts at most one exchange per ``exchange_every`` local steps (default 1: the paper
pairs one averaging with each gradient), a passive rank answers every request.

Bounded staleness (the paper's ``T``): a peer's model used in an averaging was snapshotted at most one
exchange ago, and the two ranks' step counts differ by less than ``sync_period``, because every rank
completes every round and all ranks meet at the trainer's synchronisation points every ``sync_period``
rounds (``sync_period``). ``StepInfo.staleness`` reports, for the last averaging a rank applied, how many
steps the peer's snapshot was behind its own.

Evaluated model: ranks' models differ; by default the trainer evaluates their global mean (``eval.model
=auto`` -> average, the model of the paper's analysis); pending corrections are not yet in it.
"""

from __future__ import annotations

import threading
import time

import torch

from wagma_bench.comm.base import CommError
from wagma_bench.comm.topology import random_matching
from wagma_bench.optim.base import Algorithm, StepInfo
from wagma_bench.optim.specs import ADPSGDSpec

EXCHANGE, STOP = 1, 0
TAG_REQUEST, TAG_REPLY = 11, 12  # headers, on the control plane (NCCL has no tags nor any-source receives)
# A passive rank waits for requests for as long as the actives evaluate or checkpoint; a dead peer is
# detected on the model channel, which keeps the normal timeout.
HEADER_TIMEOUT_S = 7 * 24 * 3600.0


class ADPSGD(ADPSGDSpec, Algorithm):
    paper = "AD-PSGD, Lian et al., ICML 2018"
    models_identical = False  # the ranks' models differ where evaluation happens
    default_eval_model = "average"

    def __init__(self, settings, model, local_opt_factory, comm, seed=0):
        super().__init__(settings, model, local_opt_factory, comm, seed)
        if len(self.buckets) != 1:
            raise ValueError("adpsgd averages the model as one flat buffer")
        self.flat = self.buckets[0].data
        self.active = comm.rank % 2 == 0
        self._pending = torch.zeros_like(self.flat)  # averaging corrections not yet applied
        self._snapshot = torch.empty_like(self.flat)  # gossip thread: own model as sent
        self._received = torch.empty_like(self.flat)  # gossip thread: the peer's model
        self._lock = threading.Lock()
        self._stepped = threading.Event()  # exchange_every local steps happened since the last set (actives)
        self._since = 0  # local steps since the event was last set
        self._closing = False
        self._error: BaseException | None = None
        self._staleness = 0
        self.exchanges = 0
        self._thread = None
        if comm.world_size > 1:
            # Collective: every rank forks here. Headers (small, tagged, received from any rank) travel on
            # the control plane, models on the data plane, untagged: NCCL matches them by sender and order.
            # Requests wait as long as a passive is busy; replies keep the normal timeout.
            self._hcomm = comm.fork_control(timeout_s=HEADER_TIMEOUT_S)
            self._rcomm = comm.fork_control()
            self._gcomm = comm.fork()
            loop = self._active_loop if self.active else self._passive_loop
            self._thread = threading.Thread(
                target=self._guarded(loop), daemon=True, name=f"adpsgd-gossip-{comm.rank}"
            )
            self._thread.start()

    # --- compute thread ---------------------------------------------------------------------------
    def step(self) -> StepInfo:
        self._raise_if_failed()
        t0 = time.perf_counter()
        with self._lock:  # only ever held for in-memory copies, never across communication
            wait_s = time.perf_counter() - t0
            self.flat.add_(self._pending)
            self._pending.zero_()
            self.local_optimizer.step()
            self.round += 1
            staleness, self._staleness = self._staleness, 0
        self._since += 1
        if self._since >= self.settings.exchange_every:
            self._since = 0
            self._stepped.set()
        return StepInfo(round=self.round, comm_s=wait_s, staleness=staleness)

    def state_dict(self) -> dict:
        with self._lock:
            return {**super().state_dict(), "pending": self._pending.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        with self._lock:
            self._pending.copy_(state["pending"])

    def close(self) -> None:
        """Stop the gossip thread: actives finish their exchange and tell every passive to stop."""
        if self._thread is None:
            return
        self._closing = True
        self._stepped.set()
        # A thread blocked on a dead or hung peer ends with the communicator's timeout error.
        timeout_s = 2 * self.comm.timeout_s
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():
            raise CommError(
                f"rank {self.comm.rank}: adpsgd gossip thread did not stop within {timeout_s:.0f} s"
            )
        self._raise_if_failed()

    # --- gossip thread ----------------------------------------------------------------------------
    def _active_loop(self) -> None:
        passives = range(1, self.comm.world_size, 2)
        header = torch.zeros(2, dtype=torch.int64)
        e = 0
        while True:
            self._stepped.wait()
            if self._closing:
                break
            self._stepped.clear()
            partner = random_matching(self.comm.world_size, e, self.seed)[self.comm.rank]
            e += 1
            if partner != self.comm.rank:  # odd worlds: one active sits out each matching
                self._exchange(partner, first=True, header=header)
        stop = torch.tensor([STOP, 0], dtype=torch.int64)
        for p in passives:
            self._hcomm.send(stop, p, TAG_REQUEST)

    def _passive_loop(self) -> None:
        stops_expected = len(range(0, self.comm.world_size, 2))
        header = torch.zeros(2, dtype=torch.int64)
        while stops_expected:
            src = self._hcomm.recv_any(header, TAG_REQUEST)
            if int(header[0]) == STOP:
                stops_expected -= 1
                continue
            self._exchange(src, first=False, header=header)

    def _exchange(self, peer: int, first: bool, header: torch.Tensor) -> None:
        """Swap model snapshots with ``peer`` (the active sends first) and queue the averaging correction.

        For the passive, ``header`` already holds the active's header (received by ``recv_any``).
        """
        snapshot = self._snapshot
        with self._lock:
            torch.add(self.flat, self._pending, out=snapshot)
            mine = torch.tensor([EXCHANGE, self.round], dtype=torch.int64)
        # Both sides in the same order: a gloo (or NCCL) send completes only once its receive is posted.
        if first:
            self._hcomm.send(mine, peer, TAG_REQUEST)
            self._gcomm.send(snapshot, peer)
            self._rcomm.recv(header, peer, TAG_REPLY)
            self._gcomm.recv(self._received, peer)
        else:
            self._gcomm.recv(self._received, peer)
            self._rcomm.send(mine, peer, TAG_REPLY)
            self._gcomm.send(snapshot, peer)
        self._received.sub_(snapshot).mul_(0.5)
        with self._lock:
            self._pending.add_(self._received)
            self._staleness = max(self._staleness, int(mine[1]) - int(header[1]))
            self.exchanges += 1

    def _guarded(self, loop):
        def run():
            try:
                loop()
            except BaseException as err:  # noqa: BLE001 - surfaced to the compute thread by step() / close()
                self._error = err

        return run

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise CommError(
                f"rank {self.comm.rank}: adpsgd gossip with a peer failed: {self._error}"
            ) from self._error
