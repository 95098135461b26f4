"""Game families as records (d3qn_utils/games.py): the shipped families take the ids they took
before, and a new family is a wrapper and one record: a toy family of tiny image games,
registered here, gets its environment, storage, torso and presets, and an agent trains on it."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import keras
import numpy as np
import pytest
from conftest import small_agent

import apex
import d3qn_agent
from d3qn_utils import games, settings
from d3qn_utils.replay_storage import FrameStackStorage, StorageSpec, TransitionStorage

# --- the shipped families --------------------------------------------------------------------


@pytest.mark.parametrize(("env_name", "family"), [
    ("CartPole-v1", games.CLASSIC), ("Acrobot-v1", games.CLASSIC),
    ("MinAtar/Breakout-v1", games.MINATAR), ("MinAtar/NoSuchGame-v1", games.MINATAR),
    ("PongNoFrameskip-v4", games.ATARI), ("ALE/Breakout-v5", games.ATARI),
    ("NoSuchGame-v4", games.CLASSIC)])  # gymnasium's make_env reports an unknown id
def test_each_id_goes_to_its_family(env_name, family):
    assert games.family(env_name) is family


def test_an_unknown_id_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="'NoSuchGame-v4'"):
        games.make_env("NoSuchGame-v4")
    with pytest.raises(ValueError, match="must be a string, got 3"):
        games.family(3)


def test_a_game_is_in_at_most_one_family_and_vector_games_use_the_mlp():
    names = [family.name for family in games.FAMILIES]
    assert len(set(names)) == len(names) and games.FAMILIES[-1] is games.CLASSIC  # last resort
    for family in games.FAMILIES:
        assert not set(family.game_presets) & {game for other in games.FAMILIES
                                               if other is not family
                                               for game in other.game_presets}
        assert set(family.bfloat16_games) <= set(family.game_presets)
    assert games.torso("CartPole-v1") is None
    assert isinstance(games.replay_storage("CartPole-v1", 10), TransitionStorage)


# --- a new family: one wrapper and one record --------------------------------------------------

TOY_PREFIX = "Toy/"
TOY_GAME = "Toy/Corridor-v0"


class Corridor(gym.Env):
    """Walk right along a corridor of `length` cells to the reward at its end (1, terminated);
    the state is a uint8 (1, length, 1) image, 255 where the walker is."""

    def __init__(self, length: int = 5, render_mode: str | None = None) -> None:
        self.length, self.render_mode = length, render_mode
        self.observation_space = gym.spaces.Box(0, 255, (1, length, 1), np.uint8)
        self.action_space = gym.spaces.Discrete(2)  # 0: left, 1: right

    def frame(self) -> np.ndarray:
        frame = np.zeros((1, self.length, 1), np.uint8)
        frame[0, self.position, 0] = 255
        return frame

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.position = 0
        return self.frame(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.position = int(np.clip(self.position + (1 if action == 1 else -1), 0,
                                    self.length - 1))
        arrived = self.position == self.length - 1
        return self.frame(), float(arrived), arrived, False, {}


def make_toy_env(env_name: str, max_episode_steps: int | None = None,
                 render_mode: str | None = None) -> gym.Env:
    """The toy family's wrapper: its ids are registered on first use, as MinAtar's are."""
    if TOY_GAME not in gym.registry:
        gym.register(TOY_GAME, entry_point=Corridor, max_episode_steps=20)
    try:
        return gym.make(env_name, max_episode_steps=max_episode_steps, render_mode=render_mode)
    except gym.error.Error as err:
        raise ValueError(f"cannot make toy environment {env_name!r}: {err}") from err


def toy_torso(frames: Any, bfloat16: bool = False) -> Any:
    """One small dense layer over the flattened frame, named so the test can find it."""
    x = keras.layers.Rescaling(1.0 / 255.0)(frames)
    x = keras.layers.Flatten()(x)
    return keras.layers.Dense(8, activation="relu", name="toy_torso")(x)


TOY_PRESET = {  # every flag Ape-X converts, so apex.py can take it too
    "total_steps": 96, "memory_size": 64, "batch_size": 8, "learning_rate": 1e-3,
    "learning_starts": 32, "target_update": 16, "train_frequency": 2, "n_step": 1,
    "eval_every": 96, "eval_episodes": 1}
TOY = games.GameFamily(
    name="Toy", ids="Toy ids", recognises=lambda env_name: env_name.startswith(TOY_PREFIX),
    make_env=make_toy_env, storage=StorageSpec(FrameStackStorage, {"stack_axis": None}),
    torso=toy_torso, preset=TOY_PRESET, game_presets={TOY_GAME: {"gamma": 0.9}},
    packages=())


@pytest.fixture
def toy_family(monkeypatch):
    """The toy family added before the others, as a new family's record would be."""
    monkeypatch.setattr(games, "FAMILIES", [TOY, *games.FAMILIES])
    yield TOY
    gym.registry.pop(TOY_GAME, None)


def test_a_new_family_is_recognised_by_its_record_alone(toy_family):
    assert games.family(TOY_GAME) is toy_family
    assert games.family("CartPole-v1") is games.CLASSIC
    with pytest.raises(ValueError, match="'Toy/Missing-v0'"):
        games.make_env("Toy/Missing-v0")


def test_a_new_family_gets_its_presets_and_an_edit_still_wins(toy_family, monkeypatch):
    config, notes = settings.resolve(d3qn_agent, settings.D3QN_FLAGS, settings.d3qn_presets,
                                     {"env_name": TOY_GAME, "batch_size": 4})
    assert (config.memory_size, config.gamma, config.batch_size) == (64, 0.9, 4)
    assert "memory_size 64 (Toy preset)" in notes and f"gamma 0.9 ({TOY_GAME} preset)" in notes
    assert "batch_size 4 (--batch-size; the Toy preset has 8)" in notes
    monkeypatch.setattr(d3qn_agent, "N_STEP", 2)  # an edit at the top of d3qn_agent.py wins too
    config, _ = settings.resolve(d3qn_agent, settings.D3QN_FLAGS, settings.d3qn_presets,
                                 {"env_name": TOY_GAME})
    assert config.n_step == 2
    monkeypatch.setattr(apex, "ENV_NAME", TOY_GAME)
    config, notes = apex.resolve_config({})
    assert (config.memory_size, config.target_update, config.updates_per_step) == (64, 8, 0.5)
    assert "memory_size 64 (Toy preset)" in notes


def test_an_agent_trains_on_a_new_family_with_its_storage_and_torso(toy_family, tmp_path):
    agent = small_agent(tmp_path, TOY_GAME, gradient_steps_per_call=4, hidden_units=(4,))
    assert isinstance(agent.MEMORY.storage, FrameStackStorage)
    assert agent.MEMORY.storage.stack_axis is None
    assert agent.model.input.dtype == "uint8"
    assert agent.model.get_layer("toy_torso").units == 8
    before = [np.array(weight) for weight in agent.model.get_weights()]
    agent.run()
    assert agent.step == TOY_PRESET["total_steps"]
    assert len(agent.MEMORY) > 0 and len(agent.evaluations) == 1
    assert any(not np.array_equal(old, new)
               for old, new in zip(before, agent.model.get_weights(), strict=True))
