"""``habitat``: habitat-lab's PointNav task (Gibson or MP3D episodes) for clusters with habitat-sim.

habitat-sim is installed with conda (its wheels need a newer glibc than many clusters and CI images) and
habitat-lab pins NumPy 1.x, so neither is a dependency of this project:
:func:`~wagma_bench.workloads.ddppo.envs.specs.check_habitat` fails in the launching process, before any rank
starts, with the install and data instructions.

The adapter speaks habitat-lab's ``habitat.Env`` API: observations ``depth`` (``[H, W, 1]`` in [0, 1])
and ``pointgoal_with_gps_compass`` (``[rho, phi]``), integer actions in habitat's order (STOP,
MOVE_FORWARD, TURN_LEFT, TURN_RIGHT), ``episode_over``, and the measures ``distance_to_goal``,
``success`` and ``spl`` from ``get_metrics()``. The reward is computed from ``distance_to_goal`` as
habitat-baselines' navigation reward; success and SPL are habitat's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from wagma_bench.workloads.ddppo.envs.base import GOAL_KEY, STOP, Episode, EpisodeTracker, NavEnv
from wagma_bench.workloads.ddppo.envs.specs import HabitatNavSettings


def make_habitat_env(s: HabitatNavSettings, split: str, seed: int, gpu: int):
    """A real ``habitat.Env`` for the PointNav task (only where habitat-lab is installed)."""
    import os

    import habitat
    from habitat.config import read_write

    if s.data_root:
        os.chdir(s.data_root)  # habitat's configs name data/ relative to the working directory
    config = habitat.get_config(s.config_path)
    with read_write(config):
        config.habitat.dataset.split = split
        config.habitat.seed = seed
        config.habitat.environment.max_episode_steps = s.max_episode_steps
        config.habitat.simulator.habitat_sim_v0.gpu_device_id = gpu
    return habitat.Env(config=config)


class HabitatNavEnv(NavEnv):
    """One habitat-lab environment behind our :class:`NavEnv` interface."""

    def __init__(self, s: HabitatNavSettings, env_factory: Callable[[], Any]):
        self.settings = s
        self.env = env_factory()
        depth = self.env.observation_space.spaces["depth"].shape
        self.obs_shapes = {"depth": tuple(depth), GOAL_KEY: (2,)}
        self.episodes = list(self.env.episodes)
        if not self.episodes:
            raise ValueError("the habitat dataset holds no episodes (check env.split and the data folder)")

    def sample_episode(self, rng: np.random.Generator) -> Episode:
        ep = self.episodes[int(rng.integers(len(self.episodes)))]
        start, goal = ep.start_position, ep.goals[0].position  # habitat: y is up
        return Episode(
            start=(float(start[0]), float(-start[2])),
            heading=0.0,
            goal=(float(goal[0]), float(-goal[2])),
            shortest=float(ep.info["geodesic_distance"]),
            ref=ep,
        )

    def reset(self, episode: Episode) -> dict[str, np.ndarray]:
        self.env.current_episode = episode.ref
        obs = self.env.reset()
        self.tracker = EpisodeTracker(
            episode.shortest, 0.0, self.settings.success_reward, self.settings.slack_reward
        )
        return self._obs(obs)

    @staticmethod
    def _obs(obs) -> dict[str, np.ndarray]:
        return {
            "depth": np.asarray(obs["depth"], dtype=np.float32),
            GOAL_KEY: np.asarray(obs[GOAL_KEY], dtype=np.float32),
        }

    def step(self, action: int):
        obs = self.env.step(int(action))
        m = self.env.get_metrics()
        success = bool(m["success"]) if action == STOP else False
        reward, _ = self.tracker.step(0.0, float(m["distance_to_goal"]), stopped=False)
        if success:
            reward += self.settings.success_reward
        done = bool(self.env.episode_over)
        info = {}
        if done:
            info = self.tracker.metrics(success)
            info["success"], info["spl"] = float(m["success"]), float(m["spl"])
        return self._obs(obs), reward, done, info

    def close(self) -> None:
        self.env.close()
