"""PPO with generalised advantage estimation (Schulman et al. 2017; 2016), as DD-PPO uses it.

Pure functions of tensors: the advantage recursion, the clipped surrogate, the clipped value loss and
the entropy bonus. The rollout buffer keeps one rollout of ``T`` steps for ``E`` environments of one
rank; its length may be shorter than the configured ``num_steps`` when DD-PPO's straggler preemption
ends the rollout early (then only the filled prefix is used).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns of a ``[T, E]`` rollout.

    ``dones[t]`` is 1 when the episode ended with step ``t`` (so ``values[t+1]`` belongs to a new
    episode and is not bootstrapped); ``next_value`` is the critic's value of the observation after the
    last step. ``lam=1`` gives Monte-Carlo returns, ``lam=0`` one-step TD.
    """
    T = rewards.shape[0]
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        nxt = next_value if t == T - 1 else values[t + 1]
        live = 1.0 - dones[t]
        delta = rewards[t] + gamma * nxt * live - values[t]
        last = delta + gamma * lam * live * last
        adv[t] = last
    return adv, adv + values


@dataclass
class PPOTerms:
    loss: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    clip_frac: torch.Tensor


def ppo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    clip: float,
    value_coef: float,
    entropy_coef: float,
    clip_value: bool = True,
) -> PPOTerms:
    """The PPO objective to minimise: ``-L_clip + value_coef * L_value - entropy_coef * H``.

    Value-loss clipping as in OpenAI baselines / habitat-baselines: the larger of the squared errors of
    the new value and of the old value moved by at most ``clip``; both value terms carry the factor 1/2.
    """
    ratio = torch.exp(log_probs - old_log_probs)
    surr = torch.min(ratio * advantages, ratio.clamp(1.0 - clip, 1.0 + clip) * advantages)
    policy = -surr.mean()
    if clip_value:
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        value = 0.5 * torch.max((values - returns).pow(2), (clipped - returns).pow(2)).mean()
    else:
        value = 0.5 * (values - returns).pow(2).mean()
    ent = entropy.mean()
    loss = policy + value_coef * value - entropy_coef * ent
    clip_frac = ((ratio - 1.0).abs() > clip).float().mean()
    return PPOTerms(loss, policy.detach(), value.detach(), ent.detach(), clip_frac.detach())


class RolloutBuffer:
    """One rank's rollout: ``num_steps`` x ``num_envs`` transitions plus the recurrent state at its start."""

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        obs_shapes: dict[str, tuple[int, ...]],
        hidden_shape: tuple[int, ...],
    ):
        T, E = num_steps, num_envs
        self.num_steps, self.num_envs = T, E
        self.obs = {k: torch.zeros(T, E, *s) for k, s in obs_shapes.items()}
        self.prev_actions = torch.zeros(T, E, dtype=torch.long)
        self.masks = torch.zeros(T, E)  # 0 where the step starts a new episode
        self.actions = torch.zeros(T, E, dtype=torch.long)
        self.log_probs = torch.zeros(T, E)
        self.values = torch.zeros(T, E)
        self.rewards = torch.zeros(T, E)
        self.dones = torch.zeros(T, E)
        self.hidden0 = torch.zeros(*hidden_shape)  # [layers, E, H] recurrent state before step 0
        self.length = 0  # filled steps (< num_steps after preemption)
        self.advantages = torch.zeros(T, E)
        self.returns = torch.zeros(T, E)

    def insert(self, obs: dict, prev_actions, masks, actions, log_probs, values, rewards, dones) -> None:
        t = self.length
        for k, v in obs.items():
            self.obs[k][t].copy_(v)
        self.prev_actions[t] = prev_actions
        self.masks[t] = masks
        self.actions[t] = actions
        self.log_probs[t] = log_probs
        self.values[t] = values
        self.rewards[t] = rewards
        self.dones[t] = dones
        self.length += 1

    def finish(self, next_value: torch.Tensor, gamma: float, lam: float, normalize: bool) -> None:
        n = self.length
        adv, ret = gae(self.rewards[:n], self.values[:n], self.dones[:n], next_value, gamma, lam)
        if normalize:
            adv = (adv - adv.mean()) / (adv.std() + 1e-5)
        self.advantages[:n], self.returns[:n] = adv, ret

    def minibatches(self, num_mini_batch: int, generator: torch.Generator):
        """Recurrent minibatches (as habitat-baselines): whole sequences of a random split of the
        environments, so the recurrent state can be rebuilt from ``hidden0``."""
        n = self.length
        perm = torch.randperm(self.num_envs, generator=generator)
        for envs in perm.chunk(num_mini_batch):
            yield {
                "obs": {k: v[:n, envs] for k, v in self.obs.items()},
                "prev_actions": self.prev_actions[:n, envs],
                "masks": self.masks[:n, envs],
                "actions": self.actions[:n, envs],
                "log_probs": self.log_probs[:n, envs],
                "values": self.values[:n, envs],
                "returns": self.returns[:n, envs],
                "advantages": self.advantages[:n, envs],
                "hidden0": self.hidden0[:, envs],
            }
