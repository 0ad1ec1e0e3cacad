"""DD-PPO pieces without processes: GAE and PPO against hand-computed values, the preemption rule on
simulated ranks of known speed, the environments on scripted trajectories, the habitat adapter against a
fake habitat API, and the config of the env group."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from wagma_bench.config.schema import as_recorded
from wagma_bench.errors import ConfigError
from wagma_bench.workloads.ddppo.envs.base import (
    GOAL_KEY,
    MOVE_FORWARD,
    STOP,
    TURN_LEFT,
    TURN_RIGHT,
    Episode,
    polar_goal,
    spl,
)
from wagma_bench.workloads.ddppo.envs.gridnav import GridNavEnv, bfs_distances, make_grid
from wagma_bench.workloads.ddppo.envs.habitat_nav import HabitatNavEnv
from wagma_bench.workloads.ddppo.envs.specs import GridNavSettings, HabitatNavSettings, check_habitat
from wagma_bench.workloads.ddppo.policy import PointNavPolicy
from wagma_bench.workloads.ddppo.ppo import RolloutBuffer, gae, ppo_loss
from wagma_bench.workloads.ddppo.preemption import SLOTS, RolloutCounter, should_stop_early


# --- PPO / GAE ----------------------------------------------------------------------------------------
def test_gae_matches_hand_computation():
    rewards = torch.tensor([[1.0], [0.0], [2.0]])
    values = torch.tensor([[0.5], [0.4], [0.3]])
    dones = torch.tensor([[0.0], [1.0], [0.0]])  # the episode ends with step 1: no bootstrap across it
    adv, ret = gae(rewards, values, dones, torch.tensor([0.6]), gamma=0.9, lam=0.8)
    # t=2: 2 + .9*.6 - .3 = 2.24;  t=1: 0 - .4 = -.4;  t=0: (1 + .9*.4 - .5) + .9*.8*(-.4) = .572
    assert torch.allclose(adv.flatten(), torch.tensor([0.572, -0.4, 2.24]), atol=1e-6)
    assert torch.allclose(ret.flatten(), torch.tensor([1.072, 0.0, 2.54]), atol=1e-6)


def test_gae_lambda_one_is_discounted_return():
    rewards = torch.tensor([[1.0], [1.0], [1.0]])
    _, ret = gae(rewards, torch.zeros(3, 1), torch.zeros(3, 1), torch.tensor([10.0]), gamma=0.5, lam=1.0)
    assert torch.allclose(
        ret.flatten(), torch.tensor([1 + 0.5 + 0.25 + 0.125 * 10, 1 + 0.5 + 0.25 * 10, 1 + 0.5 * 10])
    )


def test_ppo_loss_matches_hand_computation():
    log_probs = torch.log(torch.tensor([0.6, 0.4]))
    old = torch.log(torch.tensor([0.5, 0.5]))  # ratios 1.2 and 0.8
    adv = torch.tensor([2.0, -1.0])
    values, old_values, returns = torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.0]), torch.tensor([2.0, 0.0])
    t = ppo_loss(
        log_probs,
        old,
        adv,
        values,
        old_values,
        returns,
        torch.tensor([1.3, 1.3]),
        clip=0.1,
        value_coef=0.5,
        entropy_coef=0.01,
    )
    # surrogates: min(2.4, 1.1*2) = 2.2 and min(-0.8, 0.9*-1) = -0.9 -> policy loss -(2.2 - 0.9)/2
    assert t.policy.item() == pytest.approx(-0.65)
    # value: sample 0 max((1-2)^2, (0.6-2)^2) = 1.96, sample 1: 0 -> 0.5 * mean = 0.49
    assert t.value.item() == pytest.approx(0.49)
    assert t.loss.item() == pytest.approx(-0.65 + 0.5 * 0.49 - 0.01 * 1.3)
    assert t.clip_frac.item() == pytest.approx(1.0)
    unclipped = ppo_loss(
        log_probs, old, adv, values, old_values, returns, torch.zeros(2), 0.1, 0.5, 0.0, clip_value=False
    )
    assert unclipped.value.item() == pytest.approx(0.25)  # 0.5 * mean(1, 0)


def test_rollout_minibatches_keep_whole_sequences():
    buf = RolloutBuffer(4, 4, {"x": (1,)}, (1, 4, 3))
    for t in range(3):  # a preempted rollout: 3 of 4 steps
        buf.insert(
            {"x": torch.full((4, 1), float(t))},
            torch.zeros(4, dtype=torch.long),
            torch.ones(4),
            torch.zeros(4, dtype=torch.long),
            torch.zeros(4),
            torch.zeros(4),
            torch.ones(4),
            torch.zeros(4),
        )
    buf.finish(torch.zeros(4), 0.99, 0.95, normalize=False)
    mbs = list(buf.minibatches(2, torch.Generator().manual_seed(0)))
    assert len(mbs) == 2 and all(mb["obs"]["x"].shape == (3, 2, 1) for mb in mbs)
    assert torch.equal(mbs[0]["obs"]["x"][:, 0, 0], torch.tensor([0.0, 1.0, 2.0]))


def test_policy_sequence_forward_equals_stepwise_with_resets():
    torch.manual_seed(0)
    shapes = {"depth": (8, 16, 1), GOAL_KEY: (2,)}
    for rnn in ("gru", "lstm"):
        net = PointNavPolicy(shapes, 4, hidden_size=16, rnn=rnn, rnn_layers=2)
        T, E = 5, 3
        obs = {"depth": torch.rand(T, E, 8, 16, 1), GOAL_KEY: torch.rand(T, E, 2)}
        prev = torch.randint(0, 4, (T, E))
        masks = torch.ones(T, E)
        masks[2, 1] = 0.0  # an episode starts at step 2 in env 1
        h0 = torch.randn(net.initial_hidden(E).shape)
        logits, _, h = net(obs, prev, masks, h0)
        hs, step_logits = h0, []
        for t in range(T):
            lt, _, hs = net({k: v[t : t + 1] for k, v in obs.items()}, prev[t : t + 1], masks[t : t + 1], hs)
            step_logits.append(lt)
        assert torch.allclose(torch.cat(step_logits), logits, atol=1e-5)
        assert torch.allclose(hs, h, atol=1e-5)


# --- preemption -----------------------------------------------------------------------------------------
class DictStore:
    """The shared-counter part of Comm, in one process (simulated ranks share it)."""

    def __init__(self):
        self.counts: dict[str, int] = {}

    def store_add(self, key: str, amount: int) -> int:
        self.counts[key] = self.counts.get(key, 0) + amount
        return self.counts[key]


def simulate(costs: list[int], num_steps: int, sync_frac: float, k: int = 0, store=None) -> list[int]:
    """Ranks with step time ``costs[r]`` collect rollout ``k`` in lock-step simulated time; returns each
    rank's rollout length under DD-PPO preemption (ties at one instant: lower rank first)."""
    store = store or DictStore()
    counters = [RolloutCounter(store, len(costs)) for _ in costs]
    steps, finished = [0] * len(costs), [False] * len(costs)
    now = 0
    while not all(finished):
        now += 1
        for r, c in enumerate(costs):
            if finished[r] or now % c:
                continue
            steps[r] += 1
            if steps[r] == num_steps or should_stop_early(
                steps[r], num_steps, counters[r].done(k), len(costs), sync_frac
            ):
                finished[r] = True
                counters[r].finish(k)
    return steps


def test_preemption_rule_thresholds():
    assert not should_stop_early(24, 100, 4, 4, 0.6)  # less than a quarter of the rollout
    assert should_stop_early(25, 100, 3, 4, 0.6)  # 3 >= 0.6 * 4
    assert not should_stop_early(50, 100, 2, 4, 0.6)  # 2 < 2.4


def test_preemption_with_ranks_of_known_speed():
    # Ranks 0-2 finish at t=100; 3 of 5 >= 0.6*5, so rank 3 (50 steps) and rank 4 (25 steps) stop then.
    assert simulate([1, 1, 1, 2, 4], 100, 0.6) == [100, 100, 100, 50, 25]
    # A rank slower than 4x has fewer than 25 steps at that instant: it goes on to the 25% floor.
    assert simulate([1, 1, 1, 2, 5], 100, 0.6) == [100, 100, 100, 50, 25]
    assert simulate([1, 1, 1, 2, 8], 100, 0.6) == [100, 100, 100, 50, 25]
    # With sync_frac=1 nobody is preempted; with 0.2 the first finisher stops everyone else.
    assert simulate([1, 2, 3], 90, 1.0) == [90, 90, 90]
    assert simulate([1, 2, 3], 90, 0.2) == [90, 45, 30]


def test_counter_slots_are_reused_without_mixing_rollouts():
    store = DictStore()
    for k in range(3 * SLOTS + 5):  # many rollouts through the same slots
        assert simulate([1, 1, 1, 2, 4], 100, 0.6, k=k, store=store) == [100, 100, 100, 50, 25]
    assert len(store.counts) == SLOTS


@pytest.mark.parametrize("first", [SLOTS + 3, 5 * SLOTS - 1])
def test_counter_is_right_on_a_fresh_store_past_the_first_slots(first):
    """A resumed run: the rendezvous store is new, the rollout index is not. Preemption must
    fire from the first rollout on, as in the run before the restart."""
    store = DictStore()
    for k in range(first, first + SLOTS + 2):
        assert simulate([1, 1, 1, 2, 4], 100, 0.6, k=k, store=store) == [100, 100, 100, 50, 25], k


# --- environments ---------------------------------------------------------------------------------------
def grid(**kw) -> GridNavEnv:
    return GridNavEnv(GridNavSettings(**kw))


def test_gridnav_is_deterministic_for_a_seed():
    a, b = grid(), grid()
    ea = [a.sample_episode(np.random.default_rng(7)) for _ in range(3)]
    eb = [b.sample_episode(np.random.default_rng(7)) for _ in range(3)]
    assert ea == eb
    oa, ob = a.reset(ea[0]), b.reset(eb[0])
    for act in (1, 2, 1, 3, 1, 1):
        oa, ra, *_ = a.step(act)
        ob, rb, *_ = b.step(act)
        assert ra == rb and all(np.array_equal(oa[k], ob[k]) for k in oa)


def test_gridnav_layout_and_geodesic():
    free = make_grid("two_rooms", 3)
    assert free.shape == (5, 9) and free[2, 4]  # door in the middle of the dividing wall
    d = bfs_distances(free, (1, 1))
    assert d[1, 3] == 2 and d[1, 5] == 6  # through the door at (4, 2): 3 + 1 + 2 moves


def test_gridnav_scripted_trajectories_success_and_spl():
    env = grid(layout="one_room", success_reward=2.5, slack_reward=-0.01)
    ep = Episode(start=(1, 1), heading=0.0, goal=(3, 1), shortest=2.0)
    obs = env.reset(ep)
    assert obs[GOAL_KEY] == pytest.approx([2.0, 0.0])  # straight ahead
    rewards = []
    for act in (MOVE_FORWARD, MOVE_FORWARD, STOP):
        obs, r, done, info = env.step(act)
        rewards.append(r)
    assert done and info["success"] == 1.0 and info["spl"] == pytest.approx(1.0)
    assert rewards == pytest.approx([0.99, 0.99, 2.49])
    env.reset(ep)  # a detour of 4 moves: SPL = 2 / 4
    for act in (TURN_LEFT, MOVE_FORWARD, TURN_RIGHT, MOVE_FORWARD, MOVE_FORWARD, TURN_RIGHT, MOVE_FORWARD):
        _, _, done, _ = env.step(act)
        assert not done
    _, _, done, info = env.step(STOP)
    assert info == {"success": 1.0, "spl": 0.5, "distance_to_goal": 0.0, "episode_length": 8}
    env.reset(ep)  # stopping short fails
    env.step(MOVE_FORWARD)
    _, _, done, info = env.step(STOP)
    assert done and info["success"] == 0.0 and info["spl"] == 0.0 and info["distance_to_goal"] == 1.0


def test_gridnav_walls_and_step_limit():
    env = grid(layout="one_room", max_episode_steps=5)
    env.reset(Episode(start=(1, 1), heading=math.pi, goal=(3, 1), shortest=2.0))  # facing the west wall
    obs, _, done, _ = env.step(MOVE_FORWARD)
    assert tuple(env.cell) == (1, 1) and not done
    mid = obs["depth"][3:5, 7:9, 0]  # the wall is 0.5 cell ahead of the agent's centre
    assert np.all(np.abs(mid * 8.0 - 0.55) < 0.06)
    for _ in range(3):
        _, _, done, _ = env.step(TURN_LEFT)
    _, _, done, info = env.step(TURN_LEFT)
    assert done and info["episode_length"] == 5 and info["success"] == 0.0


def test_polar_goal_and_spl():
    assert polar_goal(np.zeros(2), 0.0, np.array([0.0, 2.0])) == pytest.approx([2.0, math.pi / 2])  # left
    assert polar_goal(np.zeros(2), math.pi / 2, np.array([1.0, 0.0]))[1] == pytest.approx(-math.pi / 2)
    assert spl(True, 3.0, 6.0) == 0.5 and spl(True, 3.0, 2.9) == 1.0 and spl(False, 3.0, 3.0) == 0.0


@pytest.fixture(scope="module")
def miniworld_env():
    from wagma_bench.workloads.ddppo.envs.miniworld_nav import MiniWorldNavEnv
    from wagma_bench.workloads.ddppo.envs.specs import MiniWorldNavSettings

    env = MiniWorldNavEnv(MiniWorldNavSettings(layout="one_room", obs_width=32, obs_height=24))
    yield env
    env.close()


def test_miniworld_scripted_episode(miniworld_env):
    env = miniworld_env
    # one 3 m room: x in [0, 3], y = -z in [-3, 0]; walk 1.5 m east to the goal, then STOP
    ep = Episode(
        start=(0.75, -1.5),
        heading=0.0,
        goal=(2.25, -1.5),
        shortest=env.geodesic(np.array([0.75, -1.5]), (2.25, -1.5)),
    )
    assert ep.shortest == pytest.approx(1.5, abs=0.1)
    obs = env.reset(ep)
    assert obs["depth"].shape == (24, 32, 1) and 0.0 < obs["depth"].min() <= obs["depth"].max() <= 1.0
    assert obs[GOAL_KEY] == pytest.approx([1.5, 0.0], abs=1e-5)
    for _ in range(6):
        obs, r, done, _ = env.step(MOVE_FORWARD)
        assert not done and r == pytest.approx(0.25 - 0.01, abs=0.1)
    assert obs[GOAL_KEY][0] == pytest.approx(0.0, abs=1e-5)
    _, _, done, info = env.step(STOP)
    assert done and info["success"] == 1.0 and info["spl"] == pytest.approx(1.0, abs=0.07)
    obs = env.reset(ep)
    for _ in range(3):  # three 30-degree left turns put the goal on the right
        obs, *_ = env.step(TURN_LEFT)
    assert obs[GOAL_KEY][1] == pytest.approx(-math.pi / 2, abs=1e-4)
    _, _, done, info = env.step(STOP)
    assert done and info["success"] == 0.0 and info["spl"] == 0.0


def test_miniworld_episodes_deterministic_for_a_seed(miniworld_env):
    a = [miniworld_env.sample_episode(np.random.default_rng(3)) for _ in range(2)]
    b = [miniworld_env.sample_episode(np.random.default_rng(3)) for _ in range(2)]
    assert a == b and all(ep.shortest >= 1.5 for ep in a)
    d1 = miniworld_env.reset(a[0])["depth"]
    d2 = miniworld_env.reset(b[0])["depth"]
    assert np.array_equal(d1, d2)


# --- habitat adapter against a fake habitat.Env -----------------------------------------------------------
class FakeHabitatEnv:
    """Speaks habitat-lab's Env API for a straight corridor: the goal lies ``geodesic`` metres ahead."""

    def __init__(self, geodesic=1.0, max_steps=500):
        self.observation_space = SimpleNamespace(
            spaces={"depth": SimpleNamespace(shape=(4, 4, 1)), GOAL_KEY: SimpleNamespace(shape=(2,))}
        )
        self.episodes = [
            SimpleNamespace(
                episode_id=str(i),
                start_position=[0.0, 0.0, 0.0],
                goals=[SimpleNamespace(position=[0.0, 0.0, -geodesic])],
                info={"geodesic_distance": geodesic},
            )
            for i in range(3)
        ]
        self.max_steps, self._current = max_steps, None
        self.closed = False

    @property
    def current_episode(self):
        return self._current

    @current_episode.setter
    def current_episode(self, ep):
        self._current = ep

    def _obs(self):
        return {
            "depth": np.full((4, 4, 1), 0.5, np.float32),
            GOAL_KEY: np.array([self.d, 0.0], np.float32),
            "rgb": np.zeros((4, 4, 3), np.uint8),
        }

    def reset(self):
        self.d, self.path, self.steps, self.episode_over, self.stopped = (
            self._current.info["geodesic_distance"],
            0.0,
            0,
            False,
            False,
        )
        return self._obs()

    def step(self, action: int):
        assert isinstance(action, int) and 0 <= action < 4
        self.steps += 1
        if action == 1:
            self.d, self.path = self.d - 0.25, self.path + 0.25
        self.stopped = action == 0
        self.episode_over = self.stopped or self.steps >= self.max_steps
        return self._obs()

    def get_metrics(self):
        success = float(self.stopped and self.d <= 0.2)
        g = self._current.info["geodesic_distance"]
        return {"distance_to_goal": self.d, "success": success, "spl": success * g / max(g, self.path)}

    def close(self):
        self.closed = True


def test_habitat_adapter_against_fake_api():
    env = HabitatNavEnv(HabitatNavSettings(), lambda: FakeHabitatEnv(geodesic=1.0))
    assert env.obs_shapes == {"depth": (4, 4, 1), GOAL_KEY: (2,)}
    ep = env.sample_episode(np.random.default_rng(0))
    assert ep.shortest == 1.0 and ep.goal == (0.0, 1.0) and ep.ref in env.env.episodes
    obs = env.reset(ep)
    assert set(obs) == {"depth", GOAL_KEY} and obs[GOAL_KEY][0] == 1.0
    for _ in range(4):
        obs, r, done, info = env.step(MOVE_FORWARD)
        assert r == pytest.approx(0.25 - 0.01) and not done
    _, r, done, info = env.step(STOP)
    assert done and info["success"] == 1.0 and info["spl"] == 1.0 and r == pytest.approx(2.5 - 0.01)
    env.reset(ep)
    _, _, done, info = env.step(STOP)
    assert done and info["success"] == 0.0 and info["spl"] == 0.0
    env.close()
    assert env.env.closed


def test_habitat_missing_fails_with_install_instructions():
    # habitat-sim cannot be installed on this image (glibc 2.36): here the guard must fire
    from wagma_bench.workloads.ddppo.envs.specs import habitat_available

    if habitat_available():
        check_habitat(HabitatNavSettings())  # a cluster with habitat: no error
        return
    with pytest.raises(ConfigError, match="conda install habitat-sim") as err:
        check_habitat(HabitatNavSettings())
    assert "Gibson" in str(err.value) and "pointnav" in str(err.value)


# --- configuration ----------------------------------------------------------------------------------------
def compose(*overrides):
    from pathlib import Path

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from wagma_bench.config.schema import validate

    conf = Path(__file__).resolve().parent.parent / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return validate(hydra_compose("wagma", overrides=["workload=ddppo", *overrides]))


@pytest.mark.parametrize("env", ["miniworld_pointnav", "gridnav", "habitat"])
def test_every_env_option_composes_and_validates(env):
    cfg = compose(f"env={env}")
    recorded = as_recorded(cfg)
    assert cfg.data.name == env and recorded["env"]["name"] == env and "data" not in recorded
    assert cfg.train.lr_reference_batch is None


def test_env_section_is_checked():
    with pytest.raises(ConfigError, match="valid keys of env"):
        compose("env=gridnav", "+env.room_sise=3")
    with pytest.raises(ConfigError, match="choose one of: gridnav, habitat, miniworld_pointnav"):
        compose("env=gridnav", "env.name=minigrid")
    with pytest.raises(ConfigError, match="remove the section"):
        compose("+data.name=mnist5k")
    from wagma_bench.workloads.ddppo.workload import DDPPOWorkload

    with pytest.raises(ConfigError, match="num_mini_batch"):
        DDPPOWorkload.check(compose("env=gridnav", "env.num_envs=1"))


@pytest.mark.parametrize("backbone,side", [("resnet18", 64), ("resnet50", 64), ("cnn", 48)])
def test_policy_backbones_build_and_run(backbone, side):
    net = PointNavPolicy(
        {"depth": (side, side, 1), "rgb": (side, side, 3), GOAL_KEY: (2,)},
        4,
        hidden_size=32,
        rnn="lstm",
        rnn_layers=2,
        backbone=backbone,
        base_planes=8,
    )
    obs = {
        "depth": torch.rand(2, 3, side, side, 1),
        "rgb": torch.rand(2, 3, side, side, 3),
        GOAL_KEY: torch.rand(2, 3, 2),
    }
    logits, values, h = net(obs, torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3), net.initial_hidden(3))
    assert logits.shape == (2, 3, 4) and values.shape == (2, 3) and h.shape == (4, 3, 32)


def test_unscaled_learning_rate_for_rl():
    from wagma_bench.config.schedules import peak_lr

    assert peak_lr(2.5e-4, 256, 1024, None) == 2.5e-4  # DD-PPO: the same rate at any number of GPUs
    assert peak_lr(0.1, 128, 4, 256) == pytest.approx(0.2)
