"""``habitat``: habitat-lab's PointNav task (Gibson or MP3D episodes) for clusters with habitat-sim.

habitat-sim is installed with conda (its wheels need a newer glibc than many clusters and CI images) and
habitat-lab pins NumPy 1.x, so neither is a dependency of this project: :func:`check_habitat` fails in
the launching process, before any rank starts, with the install and data instructions.

The adapter speaks habitat-lab's ``habitat.Env`` API: observations ``depth`` (``[H, W, 1]`` in [0, 1])
and ``pointgoal_with_gps_compass`` (``[rho, phi]``), integer actions in habitat's order (STOP,
MOVE_FORWARD, TURN_LEFT, TURN_RIGHT), ``episode_over``, and the measures ``distance_to_goal``,
``success`` and ``spl`` from ``get_metrics()``. The reward is computed from ``distance_to_goal`` as
habitat-baselines' navigation reward; success and SPL are habitat's own.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from wagma_bench.ranges import ANY, AT_LEAST_ONE, Range, setting
from wagma_bench.workloads.ddppo.envs.base import GOAL_KEY, STOP, Episode, EpisodeTracker, NavEnv

INSTALL = (
    "env=habitat needs habitat-sim and habitat-lab, which are not installed. Install them in a conda "
    "environment (habitat-sim has no wheels for this glibc, and habitat-lab pins numpy 1.x):\n"
    "  conda create -n habitat python=3.10 cmake=3.14 && conda activate habitat\n"
    "  conda install habitat-sim withbullet headless -c conda-forge -c aihabitat\n"
    "  pip install habitat-lab==0.3.3 && pip install -e /path/to/wagma-bench\n"
    "and the data: the Gibson scene meshes (data/scene_datasets/gibson/*.glb, under the Gibson dataset's "
    "license agreement) and the PointNav Gibson v1 episodes (data/datasets/pointnav/gibson/v1/{train,val}/"
    "*.json.gz; see habitat-lab's DATASETS.md), or MP3D scenes and episodes for "
    "env.config_path=benchmark/nav/pointnav/pointnav_mp3d.yaml. Set env.data_root to the folder holding data/.")


@dataclass
class HabitatNavSettings:
    name: str = "habitat"
    config_path: str = "benchmark/nav/pointnav/pointnav_gibson.yaml"  # habitat-lab task config
    data_root: str | None = None  # folder that holds data/scene_datasets and data/datasets (cwd if null)
    split: str = "train"             # episodes of training; evaluation uses eval_split
    eval_split: str = "val"
    max_episode_steps: int = setting(500, AT_LEAST_ONE)  # habitat's PointNav limit
    success_reward: float = setting(2.5, ANY)  # habitat-baselines' reward
    slack_reward: float = setting(-0.01, ANY)
    num_envs: int = setting(4, AT_LEAST_ONE)  # simulator instances per rank (DD-PPO: 4 per GPU)
    gpu_device_id: int = setting(-1, Range(-1))  # -1: the rank's local CUDA device


def habitat_available() -> bool:
    return importlib.util.find_spec("habitat_sim") is not None and importlib.util.find_spec("habitat") is not None


def check_habitat(s: HabitatNavSettings) -> None:
    from wagma_bench.errors import ConfigError

    if not habitat_available():
        raise ConfigError(INSTALL)


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
        return Episode(start=(float(start[0]), float(-start[2])), heading=0.0,
                       goal=(float(goal[0]), float(-goal[2])), shortest=float(ep.info["geodesic_distance"]),
                       ref=ep)

    def reset(self, episode: Episode) -> dict[str, np.ndarray]:
        self.env.current_episode = episode.ref
        obs = self.env.reset()
        self.tracker = EpisodeTracker(episode.shortest, 0.0, self.settings.success_reward, self.settings.slack_reward)
        return self._obs(obs)

    @staticmethod
    def _obs(obs) -> dict[str, np.ndarray]:
        return {"depth": np.asarray(obs["depth"], dtype=np.float32),
                GOAL_KEY: np.asarray(obs[GOAL_KEY], dtype=np.float32)}

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
