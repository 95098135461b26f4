"""Game families as records (d3qn_utils/games.py): the shipped families take the ids they took
before, and a new family is a wrapper and one record: a toy family of tiny image games,
registered here, gets its environment, storage, torso and presets, and an agent trains on it.
A run of every family's game, the toy families' too (one of levels fixed when the game is made,
as Procgen's), resumes as if never stopped."""

from __future__ import annotations

import dataclasses
import json
import shutil
from typing import Any

import gymnasium as gym
import keras
import numpy as np
import pytest
from conftest import small_agent

import apex
import d3qn_agent
from d3qn_utils import games, run_files, settings
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
    assert isinstance(games.storage_spec("CartPole-v1")(10), TransitionStorage)


# --- a new family: one wrapper and one record --------------------------------------------------

TOY_PREFIX = "Toy/"
TOY_GAME = "Toy/Corridor-v0"
LEVELS_PREFIX = "ToyLevels/"
LEVELS_GAME = "ToyLevels/Corridor-v0"


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


class LevelCorridor(Corridor):
    """A corridor under a row that shows its level, as Procgen's games are: the levels come from
    the `seed` the game is made with (None: 0), the next one at each reset, whose own seed
    changes nothing. A level is `length` random bytes, so no two levels look alike."""

    def __init__(self, length: int = 5, render_mode: str | None = None,
                 seed: int | None = None) -> None:
        super().__init__(length, render_mode)
        self.observation_space = gym.spaces.Box(0, 255, (2, length, 1), np.uint8)
        self.levels = np.random.default_rng(0 if seed is None else seed)
        self.level = np.zeros(length, np.uint8)

    def frame(self) -> np.ndarray:
        return np.concatenate([super().frame(), self.level.reshape(1, self.length, 1)])

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        self.level = self.levels.integers(0, 256, self.length, dtype=np.uint8)
        self.position = 0
        return self.frame(), {}


def make_toy_env(env_name: str, max_episode_steps: int | None = None,
                 render_mode: str | None = None, **levels_seed: int | None) -> gym.Env:
    """The toy families' wrapper: their ids are registered on first use, as MinAtar's are;
    `levels_seed`: `seed=`, which a game of fixed levels is made with."""
    if TOY_GAME not in gym.registry:
        gym.register(TOY_GAME, entry_point=Corridor, max_episode_steps=20)
        gym.register(LEVELS_GAME, entry_point=LevelCorridor, max_episode_steps=20)
    try:
        return gym.make(env_name, max_episode_steps=max_episode_steps, render_mode=render_mode,
                        **levels_seed)
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
    make_env=make_toy_env, seeding=games.Seeding.RESET,
    storage=StorageSpec(FrameStackStorage, {"stack_axis": None}),
    torso=toy_torso, preset=TOY_PRESET, game_presets={TOY_GAME: {"gamma": 0.9}},
    packages=())
TOY_LEVELS = games.GameFamily(  # as a Procgen family would be
    name="Toy levels", ids="ToyLevels ids",
    recognises=lambda env_name: env_name.startswith(LEVELS_PREFIX), make_env=make_toy_env,
    seeding=games.Seeding.CONSTRUCTION,
    storage=StorageSpec(FrameStackStorage, {"stack_axis": None}), torso=toy_torso,
    preset=TOY_PRESET)


@pytest.fixture
def toy_family(monkeypatch):
    """The toy families added before the others, as a new family's record would be."""
    monkeypatch.setattr(games, "FAMILIES", [TOY, TOY_LEVELS, *games.FAMILIES])
    yield TOY
    for game in (TOY_GAME, LEVELS_GAME):
        gym.registry.pop(game, None)


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


# --- how a family's games are seeded: an episode replays from its seed, so a run resumes ------


def seeded_by_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy family of fixed levels with a record that says `reset(seed=)` replays them."""
    monkeypatch.setattr(games, "FAMILIES", [
        dataclasses.replace(family, seeding=games.Seeding.RESET) if family is TOY_LEVELS
        else family for family in games.FAMILIES])


def first_observations(env: gym.Env, seeds: list[int]) -> list[bytes]:
    return [env.reset(seed=seed)[0].tobytes() for seed in seeds]


def test_a_game_of_fixed_levels_is_made_again_on_a_seeded_reset(toy_family, monkeypatch):
    env = games.make_env(LEVELS_GAME)
    assert isinstance(env, games.MadeAgainOnSeededReset)
    seeds = [3, 4, 3, 4]
    first = first_observations(env, seeds)
    assert first[:2] == first[2:] and first[0] != first[1]  # one seed, one episode
    assert env.reset()[0].tobytes() != first[1]  # an unseeded reset: the seed's next level
    assert first_observations(games.make_env(LEVELS_GAME), seeds) == first  # in any env made
    # Its levels fixed when made, a seeded reset of the game itself starts the next level.
    seeded_by_reset(monkeypatch)
    assert len(set(first_observations(games.make_env(LEVELS_GAME), seeds))) == 4


# A game of each family, for the resume test: a new family adds one.
EXAMPLE_GAMES = {games.CLASSIC.name: "CartPole-v1", games.MINATAR.name: "MinAtar/Breakout-v1",
                 games.ATARI.name: "PongNoFrameskip-v4", TOY.name: TOY_GAME,
                 TOY_LEVELS.name: LEVELS_GAME}
# 120 steps with a checkpoint and an evaluation at 60, inside an episode (45 steps at most),
# gradient steps from step 20 on.
TINY_RUN = {"total_steps": 120, "checkpoint_every": 60, "eval_every": 60, "eval_episodes": 2,
            "max_episode_steps": 45, "memory_size": 200, "batch_size": 8, "learning_starts": 20,
            "train_frequency": 2, "gradient_steps_per_call": 2, "target_update": 10,
            "exploration_steps": 80, "hidden_units": (8,), "seed": 2}


def straight_and_resumed(tmp_path, env_name: str) -> tuple[Any, Any, dict[str, Any]]:
    """A run of TINY_RUN in one go, and one resumed from its halfway checkpoint (copied where the
    second finds it); both agents, and the halfway checkpoint's progress."""
    straight = small_agent(tmp_path / "straight", env_name, **TINY_RUN)
    straight.run()
    halfway = sorted((tmp_path / "straight").rglob("step-*"))[0]
    assert halfway.name == "step-0000000060"
    shutil.copytree(halfway, tmp_path / "resumed" / halfway.relative_to(tmp_path / "straight"))
    resumed = small_agent(tmp_path / "resumed", env_name, **TINY_RUN)
    resumed.begin(run_files.LATEST)
    resumed.run()
    return straight, resumed, json.loads((halfway / "progress.json").read_text())["progress"]


@pytest.mark.parametrize("family", [*games.FAMILIES, TOY, TOY_LEVELS],
                         ids=lambda family: family.name)
def test_a_resumed_run_of_each_family_matches_an_uninterrupted_one(family, toy_family, tmp_path):
    straight, resumed, halfway = straight_and_resumed(tmp_path, EXAMPLE_GAMES[family.name])
    # An episode in progress, replayed from its seed:
    assert halfway["environments"]["open_episodes"][0]["actions"]
    assert len(halfway["evaluations"]) == 1 and len(straight.evaluations) == 2
    assert resumed.state_dict()["progress"] == straight.state_dict()["progress"]
    for got, expected in zip(resumed.model.get_weights(), straight.model.get_weights(),
                             strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_a_game_of_fixed_levels_seeded_as_by_reset_fails_its_resume_naming_seeding(
        toy_family, monkeypatch, tmp_path):
    seeded_by_reset(monkeypatch)
    with pytest.raises(ValueError, match=r"did not reproduce .* `seeding`, d3qn_utils/games\.py"):
        straight_and_resumed(tmp_path, LEVELS_GAME)
