"""SGP: Stochastic Gradient Push (Assran, Loizou, Ballas & Rabbat, ICML 2019).

Push-sum gossip over the time-varying directed exponential graph: at step ``t`` rank ``i`` pushes to the
single peer ``(i + 2**k) mod P`` with ``k = t mod log2 P``
(:func:`~wagma_bench.comm.topology.exponential_peer`), keeping half of its numerator ``x_i`` and push-sum
weight ``w_i`` and sending the other half (uniform column-stochastic mixing). The de-biased model
``z_i = x_i / w_i`` is what the rank computes its gradient on and what evaluation sees. One step (SGP
Algorithm 1, with the local optimizer's update ``u(g)``):

    g = grad f_i(z_i);  x_i <- x_i - lr * u(g);  send (x_i / 2, w_i / 2) to out-peer
    x_i <- x_i / 2 + received x;  w_i <- w_i / 2 + received w;  z_i <- x_i / w_i

Implementation: the model's parameters hold ``z_i`` (so forward, backward and evaluation use the de-biased
model); ``step`` re-biases them to ``x_i = w_i z_i`` for the optimizer update and the gossip, then divides
again, as the authors' ``GossipDataParallel`` does. The local optimizer therefore updates the numerator,
and its weight decay acts on ``x_i`` (identical to acting on ``z_i`` while ``w_i = 1``).

On this graph every rank has exactly one in-peer and one out-peer per step, so with synchronous gossip the
mixing is doubly stochastic and ``w_i`` stays exactly 1; for ``P = 2**n`` and no gradient, ``n`` steps give
the exact global mean (the oracle the tests check). ``overlap: true`` is SGP's 1-overlap variant: the
message pushed at step ``t`` is folded in at step ``t + 1``, so the exchange overlaps a whole step of
computation; mass in flight makes ``w_i`` differ from 1 and the de-biasing matters. A checkpoint stores
``z_i``, ``w_i`` and the one message in flight at that moment (received, folded in at the next step after
a resume), so no push-sum mass is lost across a restart.

Evaluated model: ranks' de-biased models differ; by default the trainer evaluates their global mean
(``eval.model=auto`` -> average, the quantity SGP's convergence theorem bounds); ``eval.model=local``
evaluates rank 0's de-biased model.
"""

from __future__ import annotations

import time

import torch

from wagma_bench.comm.topology import exponential_in_peer, exponential_peer
from wagma_bench.optim.base import Algorithm, StepInfo
from wagma_bench.optim.specs import SGPSpec


class SGP(SGPSpec, Algorithm):
    paper = "SGP, Assran et al., ICML 2019"
    models_identical = False  # the ranks' models differ where evaluation happens
    default_eval_model = "average"

    def __init__(self, settings, model, local_opt_factory, comm, seed=0):
        super().__init__(settings, model, local_opt_factory, comm, seed)
        if len(self.buckets) != 1:
            raise ValueError("sgp gossips the model as one flat buffer")
        self.flat = self.buckets[0].data
        # push-sum weight w_i, in the model's dtype: it travels in the same message as the model
        self._w = torch.ones((), dtype=self.flat.dtype, device=self.flat.device)
        n = self.flat.numel() + 1  # the message: numerator half, then weight half
        self._out = [torch.empty(n, dtype=self.flat.dtype, device=self.flat.device) for _ in range(2)]
        self._sending: list = [None, None]  # send in flight from each of the two buffers
        self._in = torch.empty_like(self._out[0])
        self._receiving = None  # receive in flight (overlap: the message pushed at the previous step)
        self._received = False  # _in holds a message that arrived but is not folded in yet (checkpoints)

    @property
    def weight(self) -> float:
        return float(self._w)

    def step(self) -> StepInfo:
        t = self.round
        self.flat.mul_(self._w)  # re-bias: x = w z
        self.local_optimizer.step()
        comm_s = self._gossip(t) if self.comm.world_size > 1 else 0.0
        self.flat.div_(self._w)  # de-bias: z = x / w
        self.round += 1
        self.outer_round(self.round)  # synchronous gossip keeps w = 1: the average of the z is the models'
        return StepInfo(round=self.round, comm_s=comm_s, staleness=int(self.settings.overlap))

    def _gossip(self, t: int) -> float:
        """Push half of (x, w) to this step's out-peer and add what arrived; returns the waiting time."""
        self.flat.mul_(0.5)
        self._w.mul_(0.5)
        waited = 0.0
        slot = t % 2
        if self._sending[slot] is not None:  # the buffer's send from step t - 2 must be done
            t0 = time.perf_counter()
            self._sending[slot].wait()
            waited += time.perf_counter() - t0
        out = self._out[slot]
        out[:-1].copy_(self.flat)
        out[-1] = self._w
        self._sending[slot] = self.comm.isend(out, exponential_peer(self.comm.rank, self.comm.world_size, t))
        if not self.settings.overlap:
            self._receiving = self.comm.irecv(
                self._in, exponential_in_peer(self.comm.rank, self.comm.world_size, t)
            )
        t0 = time.perf_counter()
        self._fold_in()
        if not self.settings.overlap:
            self._sending[slot].wait()
            self._sending[slot] = None
        waited += time.perf_counter() - t0
        if self.settings.overlap:  # receive this step's message while the next step computes
            self._receiving = self.comm.irecv(
                self._in, exponential_in_peer(self.comm.rank, self.comm.world_size, t)
            )
        return waited

    def _collect(self) -> None:
        """Wait for the receive in flight (if any); its message stays in ``_in`` until folded in."""
        if self._receiving is not None:
            self._receiving.wait()
            self._receiving = None
            self._received = True

    def _fold_in(self) -> None:
        """Add the mass of the message received (waiting for it if in flight) to (x, w)."""
        self._collect()
        if not self._received:
            return
        self._received = False
        self.flat.add_(self._in[:-1])
        self._w.add_(self._in[-1])

    def state_dict(self) -> dict:
        # Overlap: the message in flight carries mass its sender no longer has; without it a resumed run
        # would lose it (the sum of the weights would drop below the world size).
        self._collect()
        in_flight = self._in.clone() if self._received else None
        return {**super().state_dict(), "weight": self.weight, "in_flight": in_flight}

    def largest_state_dict(self) -> dict:
        state = self.state_dict()
        if (
            self.settings.overlap and state["in_flight"] is None
        ):  # a checkpoint's may carry a message: its size
            state["in_flight"] = self._in
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._w.fill_(state["weight"])
        if state.get("in_flight") is not None:  # folded in at the next step, as the lost receive would be
            self._in.copy_(state["in_flight"])
            self._received = True

    def close(self) -> None:
        """Overlap: take in the last step's message and finish the sends, so no peer is left waiting."""
        self.flat.mul_(self._w)
        self._fold_in()
        self.flat.div_(self._w)
        for i, h in enumerate(self._sending):
            if h is not None:
                h.wait()
                self._sending[i] = None
