"""``gridnav``: a fast pure-numpy point-goal task on a grid of rooms, for tests and quick runs.

The same task as the 3-D default at a fraction of its cost: the agent stands in a cell facing one of
four directions; MOVE_FORWARD enters the next cell unless it is a wall, turns are 90 degrees. Its
egocentric depth image is ray-cast like a 2.5-D renderer (walls one cell high, camera at half height,
90 degree field of view), so the same policy and encoder run on it. Geodesic distances are exact
(breadth-first search over the free cells); one cell is one metre.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

import wagma_bench.workloads.ddppo.envs.base as actions  # the action ids, GOAL_KEY
from wagma_bench.workloads.ddppo.envs.base import Episode, EpisodeTracker, NavEnv, polar_goal
from wagma_bench.workloads.ddppo.envs.specs import GridNavSettings

FOV = math.pi / 2
RAY_STEP = 0.05  # cells between ray samples


def make_grid(layout: str, room: int) -> np.ndarray:
    """Free-cell mask ``[H, W]`` (True = free) with an outer wall; rooms joined by one-cell doors."""
    if layout == "one_room":
        rows, cols = 1, 1
    elif layout == "two_rooms":
        rows, cols = 1, 2
    elif layout == "four_rooms":
        rows, cols = 2, 2
    else:
        raise ValueError(f"unknown gridnav layout {layout!r}; choose one_room, two_rooms or four_rooms")
    h, w = rows * (room + 1) + 1, cols * (room + 1) + 1
    free = np.zeros((h, w), dtype=bool)
    for r in range(rows):
        for c in range(cols):
            y, x = 1 + r * (room + 1), 1 + c * (room + 1)
            free[y : y + room, x : x + room] = True
    door = room // 2
    for r in range(rows):
        for c in range(cols - 1):  # doors in vertical walls
            free[1 + r * (room + 1) + door, (c + 1) * (room + 1)] = True
    for r in range(rows - 1):
        for c in range(cols):  # doors in horizontal walls
            free[(r + 1) * (room + 1), 1 + c * (room + 1) + door] = True
    return free


def bfs_distances(free: np.ndarray, source: tuple[int, int]) -> np.ndarray:
    """Shortest number of moves from ``source`` (x, y) to every cell (4-connected); inf where unreachable."""
    dist = np.full(free.shape, np.inf)
    x0, y0 = source
    dist[y0, x0] = 0
    queue = deque([(x0, y0)])
    while queue:
        x, y = queue.popleft()
        for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            nx, ny = x + dx, y + dy
            if free[ny, nx] and dist[ny, nx] == np.inf:
                dist[ny, nx] = dist[y, x] + 1
                queue.append((nx, ny))
    return dist


def raycast_depth(
    free: np.ndarray, pos: np.ndarray, heading: float, width: int, height: int, max_depth: float
) -> np.ndarray:
    """Egocentric depth ``[height, width, 1]`` in [0, 1] (metres / max_depth), left to right."""
    angles = heading + np.linspace(FOV / 2, -FOV / 2, width)
    steps = np.arange(RAY_STEP, max_depth, RAY_STEP)
    xs = pos[0] + np.outer(np.cos(angles), steps)
    ys = pos[1] + np.outer(np.sin(angles), steps)
    cx = np.clip(np.floor(xs).astype(int), 0, free.shape[1] - 1)
    cy = np.clip(np.floor(ys).astype(int), 0, free.shape[0] - 1)
    hit = ~free[cy, cx]
    first = np.where(hit.any(1), hit.argmax(1), len(steps) - 1)
    wall = steps[first] * np.cos(angles - heading)  # planar depth, as a depth camera reports
    focal = (width / 2) / math.tan(FOV / 2)
    v = np.abs(np.arange(height) - (height - 1) / 2) + 0.5
    floor = 0.5 * focal / v  # depth of the floor/ceiling seen at that row
    depth = np.minimum(wall[None, :], floor[:, None])
    return (np.clip(depth, 0, max_depth) / max_depth).astype(np.float32)[..., None]


class GridNavEnv(NavEnv):
    def __init__(self, s: GridNavSettings):
        self.settings = s
        self.free = make_grid(s.layout, s.room_size)
        self.cells = np.argwhere(self.free)[:, ::-1]  # (x, y) of every free cell
        self.obs_shapes = {"depth": (s.obs_height, s.obs_width, 1), actions.GOAL_KEY: (2,)}
        self._fields: dict[tuple[int, int], np.ndarray] = {}

    def _field(self, goal: tuple[int, int]) -> np.ndarray:
        if goal not in self._fields:
            self._fields[goal] = bfs_distances(self.free, goal)
        return self._fields[goal]

    def sample_episode(self, rng: np.random.Generator) -> Episode:
        for _ in range(1000):
            start, goal = (
                tuple(int(v) for v in self.cells[i]) for i in rng.integers(len(self.cells), size=2)
            )
            d = self._field(goal)[start[1], start[0]]
            if self.settings.min_geodesic <= d <= self.settings.max_geodesic:
                return Episode(
                    start=start, heading=int(rng.integers(4)) * math.pi / 2, goal=goal, shortest=float(d)
                )
        s = self.settings
        raise ValueError(
            f"gridnav: no start/goal pair with geodesic distance in [{s.min_geodesic}, "
            f"{s.max_geodesic}] in layout {s.layout} of room_size {s.room_size}"
        )

    def reset(self, episode: Episode) -> dict[str, np.ndarray]:
        self.episode = episode
        self.cell = np.array(episode.start, dtype=int)
        self.dir = round(episode.heading / (math.pi / 2)) % 4
        self.goal = tuple(int(v) for v in episode.goal)
        self.tracker = EpisodeTracker(
            episode.shortest,
            self.settings.success_distance,
            self.settings.success_reward,
            self.settings.slack_reward,
        )
        return self._obs()

    def _obs(self) -> dict[str, np.ndarray]:
        heading = self.dir * math.pi / 2
        centre = self.cell + 0.5
        return {
            "depth": raycast_depth(
                self.free,
                centre,
                heading,
                self.settings.obs_width,
                self.settings.obs_height,
                self.settings.max_depth,
            ),
            actions.GOAL_KEY: polar_goal(centre, heading, np.asarray(self.goal) + 0.5),
        }

    def step(self, action: int):
        moved = 0.0
        if action == actions.MOVE_FORWARD:
            dx, dy = ((1, 0), (0, 1), (-1, 0), (0, -1))[self.dir]
            nxt = self.cell + (dx, dy)
            if self.free[nxt[1], nxt[0]]:
                self.cell, moved = nxt, 1.0
        elif action == actions.TURN_LEFT:
            self.dir = (self.dir + 1) % 4
        elif action == actions.TURN_RIGHT:
            self.dir = (self.dir - 1) % 4
        elif action != actions.STOP:
            raise ValueError(
                f"action {action} is not one of 0..3 (actions.STOP, actions.MOVE_FORWARD, actions.TURN_LEFT, "
                "actions.TURN_RIGHT)"
            )
        distance = float(self._field(self.goal)[self.cell[1], self.cell[0]])
        reward, success = self.tracker.step(moved, distance, stopped=action == actions.STOP)
        done = action == actions.STOP or self.tracker.steps >= self.settings.max_episode_steps
        return self._obs(), reward, done, self.tracker.metrics(success) if done else {}
