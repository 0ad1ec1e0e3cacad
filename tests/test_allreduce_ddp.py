"""Allreduce-SGD is DistributedDataParallel: same seed and data give the same weights after K steps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.dist_util import run_world
from wagma_bench.optim.allreduce import AllreduceSGD
from wagma_bench.workloads.resnet import CifarResNet

STEPS = 5


def _model():
    torch.manual_seed(0)
    return CifarResNet(8, 1, 10)


def _batches(rank, n=STEPS):
    g = torch.Generator().manual_seed(100 + rank)
    return [
        (torch.randn(8, 1, 12, 12, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(n)
    ]


def _sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=True)


def _train_both(comm, bucket_mb):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    data = _batches(comm.rank)
    ref = DDP(_model(), bucket_cap_mb=bucket_mb)
    opt = _sgd(ref.parameters())
    for x, y in data:
        opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        opt.step()
    ours_model = _model()
    settings = AllreduceSGD.Settings(bucket_mb=bucket_mb)
    algo = AllreduceSGD(settings, ours_model, _sgd, comm)
    for x, y in data:
        algo.zero_grad()
        F.cross_entropy(ours_model(x), y).backward()
        info = algo.step()
    dist.barrier()
    diff = max((a - b).abs().max().item() for a, b in zip(ref.module.parameters(), ours_model.parameters()))
    moved = max((a - b).abs().max().item() for a, b in zip(_model().parameters(), ours_model.parameters()))
    return diff, moved, info.round, len(algo.buckets)


@pytest.mark.parametrize("world,bucket_mb", [(2, 25.0), (3, 0.01)])
def test_same_weights_as_ddp_after_k_steps(world, bucket_mb):
    results = run_world(_train_both, world, bucket_mb)
    for diff, moved, rounds, buckets in results:
        assert diff < 1e-5
        assert moved > 1e-3  # training actually changed the weights
        assert rounds == STEPS
    if bucket_mb < 1:
        assert results[0][3] > 1  # several buckets overlapped with backward
