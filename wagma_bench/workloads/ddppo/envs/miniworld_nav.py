"""``miniworld_pointnav``: point-goal navigation in 3-D rooms rendered by MiniWorld (the embedded default).

MiniWorld (Chevalier-Boisvert et al., PyPI ``miniworld``) renders textured rooms with OpenGL; headless it
runs through EGL with Mesa's software renderer (``PYGLET_HEADLESS=true``, set here before pyglet loads).
The agent sees egocentric depth (optionally RGB too) and the GPS+compass vector to a goal point that is not
drawn, as in habitat's PointNav. Actions are habitat's (STOP, MOVE_FORWARD, TURN_LEFT, TURN_RIGHT) with a
fixed step and turn (no actuation noise). Geodesic distances (reward, success, SPL) are the straight-line
distance where the straight walk is free, else shortest paths on a ``grid_resolution`` grid of the
positions where the agent's body fits (8-connected Dijkstra): the reading of habitat's navmesh distance
chosen here. MiniWorld's coordinates are (x, z) with the heading
counter-clockwise seen from above; this module uses (x, -z) so that headings match the other environments.
"""

from __future__ import annotations

import heapq
import math
import os

import numpy as np

from wagma_bench.workloads.ddppo.envs.base import (
    GOAL_KEY,
    MOVE_FORWARD,
    STOP,
    TURN_LEFT,
    TURN_RIGHT,
    Episode,
    EpisodeTracker,
    NavEnv,
    polar_goal,
)
from wagma_bench.workloads.ddppo.envs.specs import MiniWorldNavSettings


def room_rects(
    layout: str, size: float, wall: float
) -> tuple[list[tuple[float, float, float, float]], list[tuple[int, int]]]:
    """Rooms as (min_x, max_x, min_z, max_z) and the pairs of neighbouring rooms to join by a door."""
    shape = {"one_room": (1, 1), "two_rooms": (1, 2), "four_rooms": (2, 2)}.get(layout)
    if shape is None:
        raise ValueError(f"unknown miniworld layout {layout!r}; choose one_room, two_rooms or four_rooms")
    rows, cols = shape
    rects, index = [], {}
    for r in range(rows):
        for c in range(cols):
            index[r, c] = len(rects)
            x0, z0 = c * (size + wall), r * (size + wall)
            rects.append((x0, x0 + size, z0, z0 + size))
    pairs = [(index[r, c], index[r, c + 1]) for r in range(rows) for c in range(cols - 1)]
    pairs += [(index[r, c], index[r + 1, c]) for r in range(rows - 1) for c in range(cols)]
    return rects, pairs


def dijkstra(free: np.ndarray, sources: dict[tuple[int, int], float], res: float) -> np.ndarray:
    """Geodesic distance field over free cells (row, col), 8-connected, from initial ``sources`` costs;
    a diagonal move needs both orthogonal neighbours free (no corner cutting)."""
    dist = np.full(free.shape, np.inf)
    heap = [(d, cell) for cell, d in sources.items()]
    for d, cell in heap:
        dist[cell] = d
    heapq.heapify(heap)
    h, w = free.shape
    diag = res * math.sqrt(2)
    while heap:
        d, (r, c) = heapq.heappop(heap)
        if d > dist[r, c]:
            continue
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (1, -1), (-1, 1), (-1, -1)):
            nr, nc = r + dr, c + dc
            if not (0 <= nr < h and 0 <= nc < w and free[nr, nc]):
                continue
            if dr and dc and not (free[r + dr, c] and free[r, c + dc]):
                continue
            nd = d + (diag if dr and dc else res)
            if nd < dist[nr, nc]:
                dist[nr, nc] = nd
                heapq.heappush(heap, (nd, (nr, nc)))
    return dist


def _make_world_class():
    # torch.optim imports torch._dynamo, which loads triton's LLVM; loading it after Mesa's llvmpipe (the
    # software renderer) segfaults the process, before it is fine. So: triton first, then pyglet/Mesa.
    import torch._dynamo  # noqa: F401

    os.environ.setdefault("PYGLET_HEADLESS", "true")
    from miniworld.miniworld import MiniWorldEnv
    from miniworld.opengl import FrameBuffer
    from miniworld.params import DEFAULT_PARAMS

    class PointNavWorld(MiniWorldEnv):
        """The static rooms; the agent is moved by :class:`MiniWorldNavEnv`, the goal is not drawn."""

        def __init__(self, s: MiniWorldNavSettings):
            self.settings = s
            params = DEFAULT_PARAMS.no_random()
            params.set("forward_step", s.forward_step)
            params.set("forward_drift", 0.0)
            params.set("turn_step", s.turn_angle)
            super().__init__(
                max_episode_steps=2**31,
                obs_width=s.obs_width,
                obs_height=s.obs_height,
                window_width=1,
                window_height=1,
                params=params,
            )
            # one sample per pixel: multisampling only smooths edges and costs software rendering time
            self.obs_fb = FrameBuffer(s.obs_width, s.obs_height, 1)

        def _gen_world(self):
            rects, pairs = room_rects(self.settings.layout, self.settings.room_size, self.settings.wall)
            rooms = [self.add_rect_room(min_x=a, max_x=b, min_z=c, max_z=d) for a, b, c, d in rects]
            half = self.settings.door_width / 2
            for i, j in pairs:
                a, b = rects[i], rects[j]
                if a[2] == b[2]:  # side by side: a door in the wall between them, centred in z
                    mid = (a[2] + a[3]) / 2
                    self.connect_rooms(rooms[i], rooms[j], min_z=mid - half, max_z=mid + half, max_y=2.2)
                else:  # one above the other: centred in x
                    mid = (a[0] + a[1]) / 2
                    self.connect_rooms(rooms[i], rooms[j], min_x=mid - half, max_x=mid + half, max_y=2.2)
            self.place_agent()

    return PointNavWorld


class MiniWorldNavEnv(NavEnv):
    def __init__(self, s: MiniWorldNavSettings):
        self.settings = s
        self.world = _make_world_class()(s)
        self.obs_shapes = {"depth": (s.obs_height, s.obs_width, 1), GOAL_KEY: (2,)}
        if s.rgb:
            self.obs_shapes["rgb"] = (s.obs_height, s.obs_width, 3)
        self._build_grid()
        self._fields: dict[tuple, np.ndarray] = {}

    # --- geometry -----------------------------------------------------------------------------------
    def _build_grid(self) -> None:
        w, res = self.world, self.settings.grid_resolution
        self.x0, self.y0 = w.min_x, -w.max_z
        cols, rows = math.ceil((w.max_x - w.min_x) / res), math.ceil((w.max_z - w.min_z) / res)
        self.free = np.zeros((rows, cols), dtype=bool)
        for r in range(rows):
            for c in range(cols):
                self.free[r, c] = self._fits(self._centre(r, c))
        self.free_cells = np.argwhere(self.free)

    def _centre(self, r: int, c: int) -> np.ndarray:
        res = self.settings.grid_resolution
        return np.array([self.x0 + (c + 0.5) * res, self.y0 + (r + 0.5) * res])

    def _fits(self, p: np.ndarray) -> bool:
        pos3 = np.array([p[0], 0.0, -p[1]])
        return any(room.point_inside(pos3) for room in self.world.rooms) and not self.world.intersect(
            self.world.agent, pos3, self.world.agent.radius
        )

    def _near_cells(self, p: np.ndarray):
        res = self.settings.grid_resolution
        fc, fr = (p[0] - self.x0) / res - 0.5, (p[1] - self.y0) / res - 0.5
        for r in (math.floor(fr), math.floor(fr) + 1):
            for c in (math.floor(fc), math.floor(fc) + 1):
                if 0 <= r < self.free.shape[0] and 0 <= c < self.free.shape[1] and self.free[r, c]:
                    yield (r, c), float(np.hypot(*(self._centre(r, c) - p)))

    def _field(self, goal: tuple[float, float]) -> np.ndarray:
        if goal not in self._fields:
            if len(self._fields) > 64:
                self._fields.clear()
            sources = dict(self._near_cells(np.asarray(goal)))
            self._fields[goal] = dijkstra(self.free, sources, self.settings.grid_resolution)
        return self._fields[goal]

    def _visible(self, p: np.ndarray, q: np.ndarray) -> bool:
        """Whether the straight segment p-q stays where the agent's body fits (checked on the grid)."""
        res, length = self.settings.grid_resolution, float(np.hypot(*(q - p)))
        if length <= 2 * res:
            return True
        t = np.arange(res, length - res, res / 2) / length
        pts = p[None, :] + t[:, None] * (q - p)[None, :]
        cols = np.clip(np.floor((pts[:, 0] - self.x0) / res).astype(int), 0, self.free.shape[1] - 1)
        rows = np.clip(np.floor((pts[:, 1] - self.y0) / res).astype(int), 0, self.free.shape[0] - 1)
        return bool(self.free[rows, cols].all())

    def geodesic(self, p: np.ndarray, goal: tuple[float, float]) -> float:
        """Straight-line distance when the goal is in reach of a straight walk, else the grid's."""
        p, g = np.asarray(p, dtype=np.float64), np.asarray(goal, dtype=np.float64)
        if self._visible(p, g):
            return float(np.hypot(*(g - p)))
        field = self._field(goal)
        near = [field[cell] + d for cell, d in self._near_cells(np.asarray(p))]
        return float(min(near)) if near else math.inf

    # --- episodes -----------------------------------------------------------------------------------
    def _sample_point(self, rng: np.random.Generator) -> tuple[float, float]:
        res = self.settings.grid_resolution
        while True:
            r, c = self.free_cells[rng.integers(len(self.free_cells))]
            p = self._centre(r, c) + rng.uniform(-res / 2, res / 2, size=2)
            if self._fits(p):
                return float(p[0]), float(p[1])

    def sample_episode(self, rng: np.random.Generator) -> Episode:
        for _ in range(1000):
            start, goal = self._sample_point(rng), self._sample_point(rng)
            d = self.geodesic(np.asarray(start), goal)
            if self.settings.min_geodesic <= d <= self.settings.max_geodesic:
                return Episode(
                    start=start, heading=float(rng.uniform(-math.pi, math.pi)), goal=goal, shortest=d
                )
        s = self.settings
        raise ValueError(
            f"miniworld_pointnav: no start/goal pair with geodesic distance in "
            f"[{s.min_geodesic}, {s.max_geodesic}] in layout {s.layout}"
        )

    def reset(self, episode: Episode) -> dict[str, np.ndarray]:
        self.episode, self.goal = episode, tuple(episode.goal)
        agent = self.world.agent
        agent.pos = np.array([episode.start[0], 0.0, -episode.start[1]])
        agent.dir = episode.heading
        self.tracker = EpisodeTracker(
            episode.shortest,
            self.settings.success_distance,
            self.settings.success_reward,
            self.settings.slack_reward,
        )
        return self._obs(self.world.render_obs())

    def _pos(self) -> np.ndarray:
        return np.array([self.world.agent.pos[0], -self.world.agent.pos[2]])

    def _obs(self, rgb: np.ndarray) -> dict[str, np.ndarray]:
        depth = self.world.obs_fb.get_depth_map(0.04, 100.0)  # the depth buffer of the frame just drawn
        obs = {
            "depth": (np.clip(depth, 0, self.settings.max_depth) / self.settings.max_depth).astype(
                np.float32
            ),
            GOAL_KEY: polar_goal(self._pos(), self.world.agent.dir, np.asarray(self.goal)),
        }
        if self.settings.rgb:
            obs["rgb"] = rgb.astype(np.float32) / 255.0
        return obs

    def step(self, action: int):
        w = self.world
        before = self._pos()
        if action == STOP:
            rgb = w.render_obs()
        elif action in (MOVE_FORWARD, TURN_LEFT, TURN_RIGHT):
            mw_action = {
                MOVE_FORWARD: w.actions.move_forward,
                TURN_LEFT: w.actions.turn_left,
                TURN_RIGHT: w.actions.turn_right,
            }[action]
            rgb = w.step(mw_action)[0]
        else:
            raise ValueError(
                f"action {action} is not one of 0..3 (STOP, MOVE_FORWARD, TURN_LEFT, TURN_RIGHT)"
            )
        moved = float(np.hypot(*(self._pos() - before)))
        reward, success = self.tracker.step(
            moved, self.geodesic(self._pos(), self.goal), stopped=action == STOP
        )
        done = action == STOP or self.tracker.steps >= self.settings.max_episode_steps
        return self._obs(rgb), reward, done, self.tracker.metrics(success) if done else {}

    def close(self) -> None:
        self.world.close()
