"""Outer optimizers: one step on the averaged model delta, composable with every model-averaging optimizer.

A base optimizer (local SGD, WAGMA-SGD, D-PSGD, SGP) runs its rounds as usual; every ``outer_period``
rounds, where the models are globally averaged, the outer step treats the change of the averaged model since
the previous outer step as a pseudo-gradient ``d = x_prev - x_avg`` and replaces the average by

- ``slowmo`` (Wang, Tantia, Ballas & Rabbat, ICLR 2020, Algorithm 1): ``u <- beta u + d / lr``,
  ``x <- x_prev - alpha lr u`` with ``lr`` the local optimizer's learning rate at that round
  (``outer_lr`` is alpha, ``outer_momentum`` beta);
- ``nesterov`` (DiLoCo, Douillard et al. 2023: the outer optimizer is SGD with Nesterov momentum):
  ``m <- mu m + d``, ``x <- x_prev - eta (d + mu m)`` (``outer_lr`` is eta, ``outer_momentum`` mu;
  torch's ``SGD(nesterov=True)`` update with ``d`` as the gradient).

Both are written as ``x_avg`` plus a correction, ``x <- x_avg + (1 - alpha) d - alpha beta lr u_old`` and
``x <- x_avg + (1 - eta) d - eta mu m``, which is the same recursion and makes the identity outer step
(``outer_lr=1``, ``outer_momentum=0``) leave the base's average unchanged bit for bit (``x + 0 * d = x``).

Where the average comes from (the base's ``outer_at``): ``average`` bases (local SGD, WAGMA-SGD) average the
models globally themselves (local SGD every ``period`` rounds, WAGMA-SGD at its synchronous rounds) and call
the outer step right after that average, so it costs no communication; ``exact`` bases (D-PSGD, SGP) have no
global average, so the outer layer takes one (an allreduce of the models, SlowMo's ExactAverage) every
``outer_period`` rounds. After an outer step every rank holds the same model.

State: the previous outer model and the momentum buffer, in the base's ``state_dict`` (``"outer"``), so a
resumed run continues bit-identically.
"""

from __future__ import annotations

import torch

from wagma_bench.optim.specs import OuterSettings

#: (outer_lr, outer_momentum) when left null: SlowMo's alpha 1 and beta 0.5 (fairscale's SlowMo defaults,
#: within the range the paper found best), DiLoCo's outer learning rate 0.7 and Nesterov momentum 0.9
DEFAULTS = {"slowmo": (1.0, 0.5), "nesterov": (0.7, 0.9)}


class OuterStep:
    """The outer optimizer's state and update (settings: an :class:`OuterSettings`)."""

    def __init__(self, settings: OuterSettings, tensors: list[torch.Tensor]):
        lr, momentum = DEFAULTS[settings.outer]
        self.rule = settings.outer
        self.lr = lr if settings.outer_lr is None else settings.outer_lr
        self.momentum = momentum if settings.outer_momentum is None else settings.outer_momentum
        self.period = settings.effective_outer_period()
        self.prev = [t.detach().clone() for t in tensors]  # the model after the previous outer step
        self.u = [torch.zeros_like(t) for t in tensors]  # slowmo: u; nesterov: m

    def due(self, round_: int) -> bool:
        return round_ % self.period == 0

    def restart(self, tensors: list[torch.Tensor]) -> None:
        """Take ``tensors`` as the starting point (after the initial broadcast)."""
        for p, t in zip(self.prev, tensors):
            p.copy_(t)

    def step(self, tensors: list[torch.Tensor], inner_lr: float) -> None:
        """``tensors`` hold the global average of the models (the same on every rank); replace them by the
        outer step's model. ``inner_lr``: the local optimizer's learning rate (SlowMo's gamma_t)."""
        a, b = self.lr, self.momentum
        for x, p, u in zip(tensors, self.prev, self.u):
            d = p.sub_(x)  # the pseudo-gradient x_prev - x_avg, in the buffer of x_prev
            if self.rule == "slowmo":
                x.add_(d, alpha=1.0 - a)
                if b:
                    x.add_(u, alpha=-a * b * inner_lr)
                u.mul_(b).add_(d, alpha=1.0 / inner_lr)
            else:  # nesterov
                u.mul_(b).add_(d)
                x.add_(d, alpha=1.0 - a)
                if b:
                    x.add_(u, alpha=-a * b)
            p.copy_(x)

    def state_dict(self) -> dict:
        return {"prev": [p.clone() for p in self.prev], "u": [u.clone() for u in self.u]}

    def load_state_dict(self, state: dict) -> None:
        for mine, saved in zip(self.prev + self.u, state["prev"] + state["u"]):
            mine.copy_(saved)
