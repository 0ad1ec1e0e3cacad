"""Flat, contiguous storage for a model's parameters and gradients.

Parameters (and separately their gradients) are re-pointed into one flat tensor per bucket, so that a
model or a gradient travels as one or a few contiguous buffers, with zero copies: the optimizer keeps
updating the views, and a collective on the flat tensor moves the whole bucket.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Bucket:
    params: list[nn.Parameter]
    data: torch.Tensor  # flat parameters
    grad: torch.Tensor  # flat gradients


def flatten_into_buckets(module: nn.Module, bucket_mb: float = float("inf")) -> list[Bucket]:
    """Move every trainable parameter of ``module`` and its gradient into flat bucket storage.

    Buckets are filled in reverse registration order, which approximates the order in which backward
    produces gradients (as DistributedDataParallel does), so early buckets can be reduced first.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    limit = bucket_mb * 2**20
    groups: list[list[nn.Parameter]] = [[]]
    size = 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if groups[-1] and size + nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += nbytes
    return [_make_bucket(g) for g in groups]


def _make_bucket(params: list[nn.Parameter]) -> Bucket:
    dtype, device = params[0].dtype, params[0].device
    total = sum(p.numel() for p in params)
    data = torch.empty(total, dtype=dtype, device=device)
    grad = torch.zeros(total, dtype=dtype, device=device)
    offset = 0
    for p in params:
        n = p.numel()
        data[offset : offset + n].copy_(p.data.reshape(-1))
        p.data = data[offset : offset + n].view_as(p)
        p.grad = grad[offset : offset + n].view_as(p)
        offset += n
    return Bucket(params, data, grad)


def zero_grads(buckets: list[Bucket]) -> None:
    for b in buckets:
        b.grad.zero_()
