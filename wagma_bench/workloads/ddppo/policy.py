"""The recurrent point-goal navigation policy, shaped like habitat-baselines' PointNav policies.

Visual encoder of depth (and optionally RGB) -> features; point goal (GPS+compass, polar ``[rho, phi]``)
embedded as ``Linear([rho, cos(-phi), sin(-phi)])``; the previous action embedded (index 0 = none, at an
episode start); the three concatenated feed a GRU or LSTM; linear actor (categorical) and critic heads.
Masks reset the recurrent state and the previous action where a new episode starts.

Encoders: ``cnn`` is habitat's SimpleCNN (the Nature-DQN stack) and the default here because it is cheap
on a CPU; ``resnet18``/``resnet50`` are ResNets with GroupNorm and ``base_planes`` channels at the first
stage, as DD-PPO's (resnet50 with 32 base planes, i.e. half width, in the paper).
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

GOAL_EMBED = 32
ACTION_EMBED = 32


def _groups(channels: int) -> int:
    return max(1, channels // 16)


class _Basic(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, planes, 3, stride, 1, bias=False),
            nn.GroupNorm(_groups(planes), planes),
            nn.ReLU(True),
            nn.Conv2d(planes, planes, 3, 1, 1, bias=False),
            nn.GroupNorm(_groups(planes), planes),
        )
        self.short = (
            nn.Identity()
            if stride == 1 and cin == planes
            else nn.Sequential(
                nn.Conv2d(cin, planes, 1, stride, bias=False), nn.GroupNorm(_groups(planes), planes)
            )
        )

    def forward(self, x):
        return F.relu(self.body(x) + self.short(x))


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        out = planes * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, planes, 1, bias=False),
            nn.GroupNorm(_groups(planes), planes),
            nn.ReLU(True),
            nn.Conv2d(planes, planes, 3, stride, 1, bias=False),
            nn.GroupNorm(_groups(planes), planes),
            nn.ReLU(True),
            nn.Conv2d(planes, out, 1, bias=False),
            nn.GroupNorm(_groups(out), out),
        )
        self.short = (
            nn.Identity()
            if stride == 1 and cin == out
            else nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.GroupNorm(_groups(out), out))
        )

    def forward(self, x):
        return F.relu(self.body(x) + self.short(x))


RESNETS = {"resnet18": (_Basic, (2, 2, 2, 2)), "resnet50": (_Bottleneck, (3, 4, 6, 3))}


def make_encoder(kind: str, in_channels: int, base_planes: int, min_side: int = 256) -> nn.Module:
    if kind == "cnn" and min_side < 36:  # images too small for 8x8/4 kernels (gridnav): padded 3x3 convs
        return nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, 1, 1),
            nn.ReLU(True),
            nn.Conv2d(32, 64, 3, 2, 1),
            nn.ReLU(True),
            nn.Conv2d(64, 32, 3, 1, 1),
            nn.ReLU(True),
            nn.Flatten(),
        )
    if kind == "cnn":
        return nn.Sequential(
            nn.Conv2d(in_channels, 32, 8, 4),
            nn.ReLU(True),
            nn.Conv2d(32, 64, 4, 2),
            nn.ReLU(True),
            nn.Conv2d(64, 32, 3, 1),
            nn.ReLU(True),
            nn.Flatten(),
        )
    block, depths = RESNETS[kind]
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, base_planes, 7, 2, 3, bias=False),
        nn.GroupNorm(_groups(base_planes), base_planes),
        nn.ReLU(True),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = base_planes
    for i, n in enumerate(depths):
        planes = base_planes * 2**i
        for j in range(n):
            layers.append(block(cin, planes, 2 if (j == 0 and i > 0) else 1))
            cin = planes * block.expansion
    # habitat's compression layer: shrink channels before flattening into the visual fc
    layers += [nn.Conv2d(cin, 128, 3, 1, 1, bias=False), nn.GroupNorm(8, 128), nn.ReLU(True), nn.Flatten()]
    return nn.Sequential(*layers)


class PointNavPolicy(nn.Module):
    """Actor-critic with recurrent state; ``hidden`` is ``[layers (x2 for LSTM), E, hidden_size]``."""

    def __init__(
        self,
        obs_shapes: dict[str, tuple[int, ...]],
        num_actions: int,
        hidden_size: int = 512,
        rnn: str = "gru",
        rnn_layers: int = 1,
        backbone: str = "cnn",
        base_planes: int = 32,
    ):
        super().__init__()
        self.visual_keys = [k for k in ("depth", "rgb") if k in obs_shapes]
        if not self.visual_keys:
            raise ValueError("the policy needs a 'depth' or 'rgb' observation")
        h, w = obs_shapes[self.visual_keys[0]][:2]
        in_ch = sum(obs_shapes[k][2] for k in self.visual_keys)
        self.encoder = make_encoder(backbone, in_ch, base_planes, min(h, w))
        with torch.no_grad():
            flat = self.encoder(torch.zeros(1, in_ch, h, w)).shape[1]
        self.visual_fc = nn.Sequential(nn.Linear(flat, hidden_size), nn.ReLU(True))
        self.goal_embed = nn.Linear(3, GOAL_EMBED)
        self.action_embed = nn.Embedding(num_actions + 1, ACTION_EMBED)
        self.rnn_kind, self.rnn_layers, self.hidden_size = rnn, rnn_layers, hidden_size
        rnn_cls = nn.GRU if rnn == "gru" else nn.LSTM
        self.rnn = rnn_cls(hidden_size + GOAL_EMBED + ACTION_EMBED, hidden_size, rnn_layers)
        self.actor = nn.Linear(hidden_size, num_actions)
        self.critic = nn.Linear(hidden_size, 1)
        nn.init.orthogonal_(self.actor.weight, gain=0.01)
        nn.init.zeros_(self.actor.bias)
        nn.init.orthogonal_(self.critic.weight)
        nn.init.zeros_(self.critic.bias)

    def initial_hidden(self, num_envs: int) -> torch.Tensor:
        layers = self.rnn_layers * (2 if self.rnn_kind == "lstm" else 1)
        return torch.zeros(layers, num_envs, self.hidden_size)

    def _features(self, obs: dict, prev_actions: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """Per-step RNN inputs for a flat batch ``[N, ...]``."""
        vis = torch.cat([obs[k] for k in self.visual_keys], dim=-1).permute(0, 3, 1, 2)
        goal = obs["pointgoal_with_gps_compass"]
        goal = torch.stack([goal[:, 0], torch.cos(-goal[:, 1]), torch.sin(-goal[:, 1])], dim=-1)
        prev = (prev_actions + 1) * masks.long()  # 0 = no previous action (episode start)
        return torch.cat(
            [self.visual_fc(self.encoder(vis)), self.goal_embed(goal), self.action_embed(prev)], -1
        )

    def _run_rnn(self, x: torch.Tensor, hidden: torch.Tensor, mask: torch.Tensor):
        """``x`` [t, E, F] through the RNN from ``hidden``, which ``mask`` [E] resets first."""
        hidden = hidden * mask.view(1, -1, 1)
        if self.rnn_kind == "lstm":
            h, c = hidden.chunk(2, 0)
            out, (h, c) = self.rnn(x, (h.contiguous(), c.contiguous()))
            return out, torch.cat([h, c], 0)
        return self.rnn(x, hidden.contiguous())

    def forward(self, obs: dict, prev_actions: torch.Tensor, masks: torch.Tensor, hidden: torch.Tensor):
        """Sequences ``[T, E, ...]`` -> (action logits ``[T, E, A]``, values ``[T, E]``, final hidden).

        As habitat-baselines: the sequence is cut only at steps where some episode starts, and each
        piece runs through the RNN in one call."""
        T, E = masks.shape
        flat = {k: v.reshape(T * E, *v.shape[2:]) for k, v in obs.items()}
        x = self._features(flat, prev_actions.reshape(-1), masks.reshape(-1)).view(T, E, -1)
        starts = [0] + [t for t in range(1, T) if bool((masks[t] == 0).any())] + [T]
        outs = []
        for a, b in itertools.pairwise(starts):
            out, hidden = self._run_rnn(x[a:b], hidden, masks[a])
            outs.append(out)
        out = torch.cat(outs)
        return self.actor(out), self.critic(out).squeeze(-1), hidden
