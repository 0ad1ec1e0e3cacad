"""Registry of navigation environments, keyed by their Hydra option name (``env=NAME``)."""

from __future__ import annotations

from wagma_bench.workloads.ddppo.envs.base import NUM_ACTIONS, Episode, NavEnv
from wagma_bench.workloads.ddppo.envs.gridnav import GridNavEnv, GridNavSettings
from wagma_bench.workloads.ddppo.envs.habitat_nav import HabitatNavEnv, HabitatNavSettings, make_habitat_env
from wagma_bench.workloads.ddppo.envs.miniworld_nav import MiniWorldNavEnv, MiniWorldNavSettings

#: option name -> schema of the ``env:`` section
ENVS: dict[str, type] = {
    "miniworld_pointnav": MiniWorldNavSettings,
    "gridnav": GridNavSettings,
    "habitat": HabitatNavSettings,
}


def make_env(settings, seed: int, gpu: int = -1, split: str | None = None) -> NavEnv:
    """One environment instance for ``settings`` (an instance of a schema in :data:`ENVS`)."""
    if settings.name == "gridnav":
        return GridNavEnv(settings)
    if settings.name == "miniworld_pointnav":
        return MiniWorldNavEnv(settings)
    if settings.name == "habitat":
        return HabitatNavEnv(settings, lambda: make_habitat_env(settings, split or settings.split, seed, gpu))
    raise ValueError(f"unknown env {settings.name!r}; choose one of: {', '.join(sorted(ENVS))}")


__all__ = ["ENVS", "NUM_ACTIONS", "Episode", "NavEnv", "make_env"]
