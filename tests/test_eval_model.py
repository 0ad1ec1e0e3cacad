"""Evaluation skips the copy and the broadcast where every rank holds the same model, on a real
gloo world: an Allreduce-SGD run's model is evaluated as it is; a model with float buffers (BatchNorm
statistics, each rank's own) is still broadcast."""

from __future__ import annotations

import torch
from torch import nn

from tests.dist_util import run_world
from wagma_bench.optim import OPTIMIZERS


def test_every_algorithm_declares_its_class_attributes():
    """What the trainer and the tables read from the class: set by each algorithm, not inherited."""
    from tests.test_conformance import missing, module_and_attributes

    problems = missing(module_and_attributes)
    assert not problems, "\n".join(problems)
    assert OPTIMIZERS["allreduce"].models_identical


def _evaluate_after_a_step(comm, with_buffers: bool):
    from wagma_bench.optim.allreduce import AllreduceSGD
    from wagma_bench.train.state import EvalModel

    torch.manual_seed(comm.rank)  # different data on every rank
    layers = [nn.Linear(4, 4), nn.BatchNorm1d(4)] if with_buffers else [nn.Linear(4, 4)]
    model = nn.Sequential(*layers)
    algo = AllreduceSGD(AllreduceSGD.Settings(), model, lambda p: torch.optim.SGD(p, lr=0.1), comm)
    algo.broadcast_initial_model()
    algo.zero_grad()
    model(torch.randn(8, 4)).pow(2).sum().backward()
    algo.step()
    broadcasts = []
    real_broadcast = comm.broadcast
    comm.broadcast = lambda *a, **k: (broadcasts.append(a[0].numel()), real_broadcast(*a, **k))[1]
    evaluated = EvalModel(model, "local", algo.models_identical, comm).get()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return evaluated is model, len(broadcasts), comm.allgather(weights)


def test_an_allreduce_run_is_evaluated_without_a_copy_or_a_broadcast():
    for same, broadcasts, weights in run_world(_evaluate_after_a_step, 2, False):
        assert same and broadcasts == 0
        assert torch.equal(weights[0], weights[1])  # what makes skipping right


def test_a_model_with_float_buffers_is_still_broadcast():
    for same, broadcasts, _ in run_world(_evaluate_after_a_step, 2, True):
        assert not same and broadcasts == 1
