"""``workload=ddppo``: DD-PPO point-goal navigation (Wijmans et al., ICLR 2020) on our trainer.

How RL fits the one training loop, unchanged: one trainer step is one PPO minibatch. ``batches()`` runs a
rollout with the current model (the one built by ``build_model``, which the optimizer updates in place)
whenever the previous rollout's ``ppo_epoch x num_mini_batch`` minibatches are used up; ``forward``
returns the PPO loss of a minibatch; the optimizer combines and applies its gradient. The samples of a
step are the environment frames collected for it (all of a rollout's frames count on its first
minibatch), so the trainer's throughput is frames per second. An "epoch" of the trainer is one rollout
and its update (``train.epochs`` = number of PPO updates). With ``optimizer=allreduce`` and preemption
on, this is DD-PPO: gradients averaged over all ranks every minibatch, stragglers preempted.

Evaluation: ``num_eval_episodes`` start/goal pairs drawn once from a fixed seed (independent of the
run's), held out of training (training never draws these pairs; for habitat they come from the
``eval_split`` scenes); the metric is their success rate or SPL.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import torch
from torch.distributions import Categorical

from wagma_bench.comm.base import Comm
from wagma_bench.errors import ConfigError
from wagma_bench.workloads.base import Workload
from wagma_bench.workloads.ddppo.envs import make_env
from wagma_bench.workloads.ddppo.envs.base import NUM_ACTIONS, Episode, NavEnv
from wagma_bench.workloads.ddppo.policy import PointNavPolicy
from wagma_bench.workloads.ddppo.ppo import RolloutBuffer, ppo_loss
from wagma_bench.workloads.ddppo.preemption import RolloutCounter, should_stop_early
from wagma_bench.workloads.specs import DDPPOSpec, updates_per_rollout

EVAL_SEED = 2**31 - 1  # the held-out evaluation pairs do not depend on the run's seed


class DDPPOWorkload(DDPPOSpec, Workload):
    def __init__(self, cfg, rank, world_size, device):
        super().__init__(cfg, rank, world_size, device)
        self.settings, self.env_settings = cfg.workload, cfg.data
        self.metric_name = self.metric_of(cfg)
        self.envs: list[NavEnv] = [
            make_env(self.env_settings, seed=cfg.seed + 1000 * rank + i, gpu=self._gpu())
            for i in range(self.env_settings.num_envs)
        ]
        self.num_envs = len(self.envs)
        self.eval_env: NavEnv | None = None
        self.eval_episodes: list[Episode] | None = None
        self.holdout: set = set()
        if self.env_settings.name != "habitat":  # same scenes: hold the evaluation pairs out of training
            self.eval_episodes = self._draw_eval(self.envs[0])
            self.holdout = {ep.key() for ep in self.eval_episodes}
        self.rngs = [np.random.default_rng((cfg.seed, rank, i)) for i in range(self.num_envs)]
        self.gen = torch.Generator().manual_seed(cfg.seed * 100_003 + rank)
        self.model: PointNavPolicy | None = None
        self.counter: RolloutCounter | None = None
        self._stats: dict = {}
        self._loss_stats: dict = {}  # of the last PPO minibatch
        self._eval_stats: dict = {}

    def _gpu(self) -> int:
        return self.device.index if self.device.type == "cuda" else -1

    def attach(self, comm: Comm | None) -> None:
        """Give the workload the communicator whose shared counter drives preemption."""
        self.counter = RolloutCounter(comm, self.world_size)

    # --- model ------------------------------------------------------------------------------------
    def build_model(self) -> PointNavPolicy:
        s = self.settings
        self.model = PointNavPolicy(
            self.envs[0].obs_shapes,
            NUM_ACTIONS,
            s.hidden_size,
            s.rnn,
            s.rnn_layers,
            s.backbone,
            s.base_planes,
        )
        return self.model

    # --- data: rollouts ---------------------------------------------------------------------------
    @property
    def steps_per_rollout(self) -> int:
        return updates_per_rollout(self.settings)

    def steps_per_epoch(self) -> int:
        return self.steps_per_rollout

    @property
    def train_size(self) -> int:
        return self.settings.num_steps * self.num_envs * self.world_size

    @property
    def eval_size(self) -> int:
        """Held-out episodes of one evaluation."""
        return self.settings.num_eval_episodes

    def _episode(self, i: int) -> Episode:
        for _ in range(10_000):
            ep = self.envs[i].sample_episode(self.rngs[i])
            if ep.key() not in self.holdout:
                return ep
        raise ConfigError(
            f"env={self.env_settings.name}: the {len(self.holdout)} held-out evaluation pairs leave no "
            "training pairs; lower workload.num_eval_episodes or enlarge the layout"
        )

    def _draw_eval(self, env: NavEnv) -> list[Episode]:
        rng = np.random.default_rng(EVAL_SEED)
        return [env.sample_episode(rng) for _ in range(self.settings.num_eval_episodes)]

    def _to_tensors(self, obs: list[dict]) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(np.stack([o[k] for o in obs])).to(self.device) for k in obs[0]}

    def _start(self) -> None:
        self.obs = [env.reset(self._episode(i)) for i, env in enumerate(self.envs)]
        self.hidden = self.model.initial_hidden(self.num_envs).to(self.device)
        self.prev_actions = torch.zeros(self.num_envs, dtype=torch.long, device=self.device)
        self.masks = torch.zeros(self.num_envs, device=self.device)
        shapes = {k: tuple(v.shape) for k, v in self.obs[0].items()}
        self.buffer = RolloutBuffer(self.settings.num_steps, self.num_envs, shapes, tuple(self.hidden.shape))

    def _sample(self, logits: torch.Tensor, deterministic: bool) -> torch.Tensor:
        if deterministic:
            return logits.argmax(-1)
        probs = torch.softmax(logits.float().cpu(), -1)
        return torch.multinomial(probs, 1, generator=self.gen).squeeze(-1).to(logits.device)

    @torch.no_grad()
    def collect(self, k: int) -> int:
        """Rollout ``k`` with the current model; returns the frames collected (preemption may cut it)."""
        model, s, buf = self.model, self.settings, self.buffer
        t0 = time.perf_counter()
        buf.length = 0
        buf.hidden0.copy_(self.hidden.cpu())
        episodes = []
        preempted = False
        for t in range(s.num_steps):
            obs = self._to_tensors(self.obs)
            logits, values, hidden = model(
                {k_: v.unsqueeze(0) for k_, v in obs.items()},
                self.prev_actions.unsqueeze(0),
                self.masks.unsqueeze(0),
                self.hidden,
            )
            actions = self._sample(logits[0], False)
            log_probs = Categorical(logits=logits[0]).log_prob(actions)
            rewards, dones = torch.zeros(self.num_envs), torch.zeros(self.num_envs)
            for i, env in enumerate(self.envs):
                self.obs[i], rewards[i], done, info = env.step(int(actions[i]))
                if done:
                    dones[i] = 1.0
                    episodes.append(info)
                    self.obs[i] = env.reset(self._episode(i))
            buf.insert(
                {k_: v.cpu() for k_, v in obs.items()},
                self.prev_actions.cpu(),
                self.masks.cpu(),
                actions.cpu(),
                log_probs.cpu(),
                values[0].cpu(),
                rewards,
                dones,
            )
            self.prev_actions, self.hidden = actions, hidden
            self.masks = (1.0 - dones).to(self.device)
            if (
                s.preemption
                and self.counter is not None
                and t + 1 < s.num_steps
                and should_stop_early(t + 1, s.num_steps, self.counter.done(k), self.world_size, s.sync_frac)
            ):
                preempted = True
                break
        if self.counter is not None:
            self.counter.finish(k)
        obs = self._to_tensors(self.obs)
        _, next_value, _ = model(
            {k_: v.unsqueeze(0) for k_, v in obs.items()},
            self.prev_actions.unsqueeze(0),
            self.masks.unsqueeze(0),
            self.hidden,
        )
        buf.finish(next_value[0].cpu(), s.gamma, s.gae_lambda if s.use_gae else 1.0, s.normalize_advantage)
        frames = buf.length * self.num_envs
        self._stats = {
            "rollout_s": round(time.perf_counter() - t0, 5),
            "rollout_steps": buf.length,
            "preempted": preempted,
            "frames": frames,
            "episodes": len(episodes),
        }
        if episodes:
            self._stats["train_success"] = round(float(np.mean([e["success"] for e in episodes])), 4)
            self._stats["train_spl"] = round(float(np.mean([e["spl"] for e in episodes])), 4)
        return frames

    def batches(self, start_step: int) -> Iterator[dict]:
        if self.model is None:
            raise RuntimeError("build_model() must run before batches(): rollouts use that model")
        self._start()
        k, offset = divmod(start_step, self.steps_per_rollout)
        while True:
            frames = self.collect(k)
            minibatches = [
                mb
                for _ in range(self.settings.ppo_epoch)
                for mb in self.buffer.minibatches(self.settings.num_mini_batch, self.gen)
            ]
            for i, mb in enumerate(minibatches[offset:]):
                mb["frames"] = frames if i == 0 else 0
                yield mb
            k, offset = k + 1, 0

    # --- loss -------------------------------------------------------------------------------------
    def forward(self, model, batch):
        dev = self.device
        obs = {k: v.to(dev) for k, v in batch["obs"].items()}
        logits, values, _ = model(
            obs, batch["prev_actions"].to(dev), batch["masks"].to(dev), batch["hidden0"].to(dev)
        )
        dist = Categorical(logits=logits)
        terms = ppo_loss(
            dist.log_prob(batch["actions"].to(dev)),
            batch["log_probs"].to(dev),
            batch["advantages"].to(dev),
            values,
            batch["values"].to(dev),
            batch["returns"].to(dev),
            dist.entropy(),
            self.settings.clip,
            self.settings.value_loss_coef,
            self.settings.entropy_coef,
            self.settings.clip_value_loss,
        )
        self._loss_stats = {
            "value_loss": round(float(terms.value), 5),
            "entropy": round(float(terms.entropy), 4),
        }
        return terms.loss, int(batch["frames"])

    def step_stats(self) -> dict:
        out = dict(self._loss_stats)
        out.update(self._stats)  # rollout timing: only on the step that collected it
        out.update(self._eval_stats)  # both evaluation metrics, on the first step after an evaluation
        self._stats, self._eval_stats = {}, {}
        return out

    # --- evaluation -------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, model, comm: Comm) -> float:
        if self.eval_env is None:
            self.eval_env = make_env(
                self.env_settings,
                seed=EVAL_SEED + self.rank,
                gpu=self._gpu(),
                split=getattr(self.env_settings, "eval_split", None),
            )
        if self.eval_episodes is None:
            self.eval_episodes = self._draw_eval(self.eval_env)
        gen = torch.Generator().manual_seed(EVAL_SEED + self.rank)
        totals = torch.zeros(3, dtype=torch.float64)  # successes, SPL sum, episodes
        for ep in self.eval_episodes[self.rank :: self.world_size]:
            info = self._run_episode(model, ep, gen)
            totals += torch.tensor([info["success"], info["spl"], 1.0], dtype=torch.float64)
        totals = totals.to(comm.device)
        comm.allreduce(totals, op="sum")
        success, spl_ = (totals[:2] / totals[2].clamp(min=1)).cpu().tolist()
        self._eval_stats = {"eval_success": round(success, 4), "eval_spl": round(spl_, 4)}
        return success if self.settings.metric == "success" else spl_

    def _run_episode(self, model, ep: Episode, gen: torch.Generator) -> dict:
        obs = self.eval_env.reset(ep)
        hidden = model.initial_hidden(1).to(self.device)
        prev = torch.zeros(1, dtype=torch.long, device=self.device)
        mask = torch.zeros(1, device=self.device)
        while True:
            o = {k: v.unsqueeze(0) for k, v in self._to_tensors([obs]).items()}
            logits, _, hidden = model(o, prev.unsqueeze(0), mask.unsqueeze(0), hidden)
            if self.settings.eval_deterministic:
                action = logits[0].argmax(-1)
            else:
                action = torch.multinomial(
                    torch.softmax(logits[0].float().cpu(), -1), 1, generator=gen
                ).squeeze(-1)
            obs, _, done, info = self.eval_env.step(int(action))
            if done:
                return info
            prev, mask = action.to(self.device).view(1), torch.ones(1, device=self.device)
