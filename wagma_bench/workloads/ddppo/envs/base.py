"""What every point-goal navigation environment shares: actions, episodes, the habitat reward and
metrics, and the GPS+compass observation.

Conventions follow habitat-lab's PointNav task: actions ``STOP, MOVE_FORWARD, TURN_LEFT, TURN_RIGHT``;
an episode ends when the agent calls STOP (success if it is within ``success_distance`` of the goal,
by geodesic distance) or after ``max_episode_steps``; SPL (Anderson et al. 2018) is
``success * shortest / max(shortest, path_length)``; the reward per step is the decrease of the geodesic
distance to the goal, plus ``slack_reward``, plus ``success_reward`` on success.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field

import numpy as np

STOP, MOVE_FORWARD, TURN_LEFT, TURN_RIGHT = 0, 1, 2, 3
NUM_ACTIONS = 4
GOAL_KEY = "pointgoal_with_gps_compass"


@dataclass(frozen=True)
class Episode:
    """A start pose and a goal point; ``shortest`` is the geodesic start-goal distance (metres)."""

    start: tuple[float, float]
    heading: float  # radians, counter-clockwise
    goal: tuple[float, float]
    shortest: float
    ref: object = field(default=None, compare=False, repr=False)  # the simulator's own episode, if any

    def key(self) -> tuple:
        """Identity of the start/goal pair (used to hold evaluation pairs out of training)."""
        return tuple(round(v, 3) for v in (*self.start, *self.goal))


def spl(success: bool, shortest: float, path_length: float) -> float:
    """Success weighted by (normalised inverse) path length, as habitat's SPL measure."""
    if not success:
        return 0.0
    return shortest / max(shortest, path_length, 1e-9)


def polar_goal(pos: np.ndarray, heading: float, goal: np.ndarray) -> np.ndarray:
    """GPS+compass point goal in the agent's frame: ``[rho, phi]``, phi > 0 when the goal is to the left
    (counter-clockwise of the heading)."""
    rel = np.asarray(goal, dtype=np.float64) - np.asarray(pos, dtype=np.float64)
    fwd = np.array([math.cos(heading), math.sin(heading)])
    left = np.array([-math.sin(heading), math.cos(heading)])
    return np.array([math.hypot(*rel), math.atan2(rel @ left, rel @ fwd)], dtype=np.float32)


class EpisodeTracker:
    """Reward and metrics of one episode, from the geodesic distance to the goal after every step."""

    def __init__(self, shortest: float, success_distance: float, success_reward: float, slack_reward: float):
        self.shortest, self.success_distance = shortest, success_distance
        self.success_reward, self.slack_reward = success_reward, slack_reward
        self.distance = shortest
        self.path_length = 0.0
        self.steps = 0

    def step(self, moved: float, distance: float, stopped: bool) -> tuple[float, bool]:
        """Account one step (``moved`` metres, new geodesic ``distance``); returns (reward, success)."""
        self.steps += 1
        self.path_length += moved
        reward = (self.distance - distance) + self.slack_reward
        self.distance = distance
        success = stopped and distance <= self.success_distance
        if success:
            reward += self.success_reward
        return reward, success

    def metrics(self, success: bool) -> dict:
        return {
            "success": float(success),
            "spl": spl(success, self.shortest, self.path_length),
            "distance_to_goal": self.distance,
            "episode_length": self.steps,
        }


class NavEnv(abc.ABC):
    """One point-goal navigation environment (one per simulator instance; several per rank)."""

    num_actions: int = NUM_ACTIONS
    obs_shapes: dict[str, tuple[int, ...]]  # observation key -> shape (images are H, W, C)

    @abc.abstractmethod
    def sample_episode(self, rng: np.random.Generator) -> Episode:
        """A random valid episode of this environment's scene(s), drawn from ``rng``."""

    @abc.abstractmethod
    def reset(self, episode: Episode) -> dict[str, np.ndarray]:
        """Start ``episode``; returns the first observation."""

    @abc.abstractmethod
    def step(self, action: int) -> tuple[dict[str, np.ndarray], float, bool, dict]:
        """(observation, reward, done, info); ``info`` holds the episode's metrics when ``done``."""

    def close(self) -> None:
        pass
