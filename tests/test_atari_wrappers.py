"""Tests for atari_wrappers.py: make_env on the real ALE, then the small wrappers."""

from __future__ import annotations

import subprocess
import sys

import gymnasium
import numpy as np
import pytest
from conftest import ROOT
from gymnasium.wrappers import FrameStackObservation

from atari_wrappers import ChannelsLast, FireOnReset, SignReward, is_atari, make_env

PONG = "PongNoFrameskip-v4"
FRAME_SHAPE = (84, 84)
STACK = 4


# --- make_env, real ALE


@pytest.fixture(scope="module")
def pong():
    env = make_env(PONG, seed=0)
    yield env
    env.close()


def test_the_first_game_prints_no_ale_banner_before_a_runs_first_line():
    program = "import atari_wrappers; atari_wrappers.make_env('PongNoFrameskip-v4').reset(seed=0)"
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Arcade Learning Environment" not in done.stdout + done.stderr


def test_observations_are_uint8_channels_last_stacks(pong):
    assert pong.observation_space.shape == (84, 84, STACK)
    assert pong.observation_space.dtype == np.uint8
    obs, info = pong.reset(seed=0)
    assert isinstance(info, dict)
    assert obs.shape == (84, 84, STACK) and obs.dtype == np.uint8
    assert obs in pong.observation_space
    for _ in range(20):
        previous = obs
        result = pong.step(pong.action_space.sample())
        assert len(result) == 5
        obs, reward, terminated, truncated, info = result
        assert obs.shape == (84, 84, STACK) and obs.dtype == np.uint8
        assert obs in pong.observation_space
        assert reward in (-1.0, 0.0, 1.0)
        assert isinstance(terminated, bool) and isinstance(truncated, bool)
        assert isinstance(info, dict)
        # Newest frame last: the three older frames are the previous observation's newest three.
        np.testing.assert_array_equal(obs[..., :-1], previous[..., 1:])


def test_reset_with_seed_is_reproducible():
    def rollout(env_id: str, seed: int) -> list[np.ndarray]:
        env = make_env(env_id)
        obs, _ = env.reset(seed=seed)
        observations = [obs]
        actions = np.random.default_rng(0).integers(env.action_space.n, size=60)
        for action in actions:
            obs, *_ = env.step(int(action))
            observations.append(obs)
        env.close()
        return observations

    # v5 has sticky actions, so this also checks that their random numbers follow the seed.
    for env_id in (PONG, "ALE/Pong-v5"):
        first, second = rollout(env_id, seed=123), rollout(env_id, seed=123)
        for a, b in zip(first, second, strict=True):
            np.testing.assert_array_equal(a, b)


def test_seed_argument_makes_later_resets_reproducible():
    first, second = make_env(PONG, seed=7), make_env(PONG, seed=7)
    for _ in range(2):
        np.testing.assert_array_equal(first.reset()[0], second.reset()[0])
    assert first.action_space.sample() == second.action_space.sample()


def test_v5_id_skips_frames_once_and_keeps_sticky_actions():
    env = make_env("ALE/Pong-v5")
    assert env.unwrapped._frameskip == 1  # AtariPreprocessing does the skipping
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (84, 84, STACK) and obs in env.observation_space


def test_max_episode_steps_truncates_in_agent_steps_and_records_raw_score():
    env = make_env(PONG, max_episode_steps=5, clip_rewards=False)
    env.reset(seed=0)
    for step in range(1, 6):
        _, _, terminated, truncated, info = env.step(0)
        assert not terminated
        assert truncated == (step == 5)
    assert info["episode"]["l"] == 5


def test_fire_on_reset_is_applied_to_games_with_fire():
    env = make_env("ALE/Breakout-v5")
    wrappers = []
    while isinstance(env, gymnasium.Wrapper):
        wrappers.append(type(env))
        env = env.env
    assert FireOnReset in wrappers and SignReward in wrappers and ChannelsLast in wrappers


def test_frame_stack_argument_sets_the_channel_count():
    env = make_env(PONG, frame_stack=2)
    assert env.reset(seed=0)[0].shape == (84, 84, 2)


@pytest.mark.parametrize("env_id", ["NoSuchGame-v4", "ALE/NoSuchGame-v5", "CartPole-v1"])
def test_unknown_or_non_atari_id_raises_one_clear_error(env_id):
    with pytest.raises(ValueError, match="ale-py") as error:
        make_env(env_id)
    assert env_id in str(error.value)


@pytest.mark.parametrize("keyword", [{"frame_stack": 0}, {"noop_max": -1},
                                     {"max_episode_steps": 0}])
def test_bad_arguments_raise(keyword):
    with pytest.raises(ValueError, match=next(iter(keyword))):
        make_env(PONG, **keyword)


def test_is_atari_uses_the_registry():
    assert is_atari(PONG) and is_atari("ALE/Pong-v5") and is_atari("ALE/Breakout-v5")
    assert not is_atari("CartPole-v1")
    assert not is_atari("NoSuchGame-v4")


# --- small wrappers, fake env


class ScriptedEnv(gymnasium.Env):
    """Tiny stand-in for an ALE env: random (84, 84) frames, scripted rewards, records actions."""

    def __init__(self, rewards=(0.0,), meanings=("NOOP", "FIRE", "LEFT")) -> None:
        self.observation_space = gymnasium.spaces.Box(0, 255, FRAME_SHAPE, np.uint8)
        self.action_space = gymnasium.spaces.Discrete(len(meanings))
        self.meanings = list(meanings)
        self.rewards = list(rewards)
        self.actions: list[int] = []
        self.resets = 0

    def get_action_meanings(self) -> list[str]:
        return self.meanings

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets += 1
        return self.observation_space.sample(), {}

    def step(self, action):
        self.actions.append(int(action))
        reward = self.rewards[(len(self.actions) - 1) % len(self.rewards)]
        return self.observation_space.sample(), reward, False, False, {}


def test_fire_on_reset_presses_fire_after_reset():
    env = ScriptedEnv()
    FireOnReset(env).reset(seed=0)
    assert env.resets == 1 and env.actions == [1]


def test_fire_on_reset_refuses_games_without_fire():
    with pytest.raises(ValueError, match="FIRE"):
        FireOnReset(ScriptedEnv(meanings=("NOOP", "LEFT")))


def test_sign_reward_keeps_only_the_sign():
    env = SignReward(ScriptedEnv(rewards=(5.0, -0.25, 0.0, 1.0)))
    env.reset(seed=0)
    assert [env.step(0)[1] for _ in range(4)] == [1.0, -1.0, 0.0, 1.0]


def test_channels_last_moves_the_stack_axis_and_updates_the_space():
    env = ChannelsLast(FrameStackObservation(ScriptedEnv(), stack_size=3))
    assert env.observation_space.shape == (84, 84, 3)
    assert env.observation_space.dtype == np.uint8
    obs, _ = env.reset(seed=0)
    assert obs.shape == (84, 84, 3) and obs.flags.c_contiguous and obs in env.observation_space
