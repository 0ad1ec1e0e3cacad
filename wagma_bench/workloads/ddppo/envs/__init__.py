"""Registry of navigation environments, keyed by their Hydra option name (``env=NAME``).

Importing the package loads only their settings (:mod:`.specs`, no NumPy), which the configuration check reads
in the launching process; :func:`make_env` imports the environment it builds (those and :mod:`.base` import
NumPy)."""

from __future__ import annotations

from wagma_bench.workloads.ddppo.envs.specs import ENVS


def make_env(settings, seed: int, gpu: int = -1, split: str | None = None):
    """One environment instance (a :class:`~.base.NavEnv`) for ``settings`` (an instance of a schema in
    :data:`ENVS`)."""
    if settings.name == "gridnav":
        from wagma_bench.workloads.ddppo.envs.gridnav import GridNavEnv

        return GridNavEnv(settings)
    if settings.name == "miniworld_pointnav":
        from wagma_bench.workloads.ddppo.envs.miniworld_nav import MiniWorldNavEnv

        return MiniWorldNavEnv(settings)
    if settings.name == "habitat":
        from wagma_bench.workloads.ddppo.envs.habitat_nav import HabitatNavEnv, make_habitat_env

        return HabitatNavEnv(settings, lambda: make_habitat_env(settings, split or settings.split, seed, gpu))
    raise ValueError(f"unknown env {settings.name!r}; choose one of: {', '.join(sorted(ENVS))}")


__all__ = ["ENVS", "make_env"]
