"""The navigation environments' settings (the ``env:`` section's schemas), their option names (:data:`ENVS`)
and the check of habitat's install, without NumPy: what the configuration check
(:mod:`wagma_bench.workloads.specs`) reads in the launching process of ``wagma-bench run``, which imports
neither torch nor NumPy. The environments themselves (:mod:`.gridnav`, :mod:`.miniworld_nav`,
:mod:`.habitat_nav`) import NumPy."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import ClassVar

from wagma_bench.ranges import ANY, AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Range, setting

LAYOUTS = ("four_rooms", "two_rooms", "one_room")  # env.layout of the embedded environments


@dataclass
class GridNavSettings:
    name: str = "gridnav"
    layout: str = "four_rooms"  # four_rooms | two_rooms | one_room
    room_size: int = setting(5, POSITIVE)  # free cells along a room's side
    obs_width: int = setting(16, AT_LEAST_ONE)  # depth image width (rays)
    obs_height: int = setting(8, AT_LEAST_ONE)  # depth image height
    max_depth: float = setting(8.0, POSITIVE)  # depth is clipped here and scaled to [0, 1]
    max_episode_steps: int = setting(100, AT_LEAST_ONE)
    success_distance: float = setting(0.5, POSITIVE)  # metres (cells): STOP on the goal cell succeeds
    min_geodesic: float = setting(
        2.0, NON_NEGATIVE
    )  # episode generation: geodesic start-goal distance bounds
    max_geodesic: float = setting(100.0, POSITIVE)
    success_reward: float = setting(2.5, ANY)  # habitat's PointNav reward
    slack_reward: float = setting(-0.01, ANY)
    num_envs: int = setting(4, AT_LEAST_ONE)  # environments per rank

    CHOICES: ClassVar[dict[str, tuple]] = {
        "layout": LAYOUTS
    }  # checked with the config (wagma_bench.config.schema)


@dataclass
class MiniWorldNavSettings:
    name: str = "miniworld_pointnav"
    layout: str = "four_rooms"  # four_rooms | two_rooms | one_room
    room_size: float = setting(3.0, POSITIVE)  # metres along a room's side
    wall: float = setting(0.4, NON_NEGATIVE)  # gap between rooms (the doorways are short corridors)
    door_width: float = setting(1.2, POSITIVE)  # metres; the agent's body is 0.8 m wide
    obs_width: int = setting(64, AT_LEAST_ONE)  # rendered image size
    obs_height: int = setting(48, AT_LEAST_ONE)
    rgb: bool = False  # add the RGB image to the observation (depth is always there)
    max_depth: float = setting(10.0, POSITIVE)  # depth is clipped here and scaled to [0, 1] (habitat: 10 m)
    forward_step: float = setting(0.25, POSITIVE)  # metres per MOVE_FORWARD (habitat: 0.25)
    turn_angle: float = setting(
        30.0, POSITIVE
    )  # degrees per turn (habitat: 10; coarser here for a short CPU budget)
    max_episode_steps: int = setting(150, AT_LEAST_ONE)
    success_distance: float = setting(0.5, POSITIVE)  # metres, geodesic (habitat: 0.2)
    min_geodesic: float = setting(
        1.5, NON_NEGATIVE
    )  # episode generation: geodesic start-goal distance bounds (metres)
    max_geodesic: float = setting(100.0, POSITIVE)
    grid_resolution: float = setting(0.2, POSITIVE)  # metres per cell of the geodesic-distance grid
    success_reward: float = setting(2.5, ANY)  # habitat's PointNav reward
    slack_reward: float = setting(-0.01, ANY)
    num_envs: int = setting(4, AT_LEAST_ONE)  # environments per rank

    CHOICES: ClassVar[dict[str, tuple]] = {
        "layout": LAYOUTS
    }  # checked with the config (wagma_bench.config.schema)


INSTALL = (
    "env=habitat needs habitat-sim and habitat-lab, which are not installed. Install them in a conda "
    "environment (habitat-sim has no wheels for this glibc, and habitat-lab pins numpy 1.x):\n"
    "  conda create -n habitat python=3.10 cmake=3.14 && conda activate habitat\n"
    "  conda install habitat-sim withbullet headless -c conda-forge -c aihabitat\n"
    "  pip install habitat-lab==0.3.3 && pip install -e /path/to/wagma-bench\n"
    "and the data: the Gibson scene meshes (data/scene_datasets/gibson/*.glb, under the Gibson dataset's "
    "license agreement) and the PointNav Gibson v1 episodes (data/datasets/pointnav/gibson/v1/{train,val}/"
    "*.json.gz; see habitat-lab's DATASETS.md), or MP3D scenes and episodes for "
    "env.config_path=benchmark/nav/pointnav/pointnav_mp3d.yaml. "
    "Set env.data_root to the folder holding data/."
)


@dataclass
class HabitatNavSettings:
    name: str = "habitat"
    config_path: str = "benchmark/nav/pointnav/pointnav_gibson.yaml"  # habitat-lab task config
    data_root: str | None = None  # folder that holds data/scene_datasets and data/datasets (cwd if null)
    split: str = "train"  # episodes of training; evaluation uses eval_split
    eval_split: str = "val"
    max_episode_steps: int = setting(500, AT_LEAST_ONE)  # habitat's PointNav limit
    success_reward: float = setting(2.5, ANY)  # habitat-baselines' reward
    slack_reward: float = setting(-0.01, ANY)
    num_envs: int = setting(4, AT_LEAST_ONE)  # simulator instances per rank (DD-PPO: 4 per GPU)
    gpu_device_id: int = setting(-1, Range(-1))  # -1: the rank's local CUDA device


def habitat_available() -> bool:
    return (
        importlib.util.find_spec("habitat_sim") is not None
        and importlib.util.find_spec("habitat") is not None
    )


def check_habitat(s: HabitatNavSettings) -> None:
    from wagma_bench.errors import ConfigError

    if not habitat_available():
        raise ConfigError(INSTALL)


#: option name (``env=NAME``) -> schema of the ``env:`` section
ENVS: dict[str, type] = {
    "miniworld_pointnav": MiniWorldNavSettings,
    "gridnav": GridNavSettings,
    "habitat": HabitatNavSettings,
}
