"""MinAtar: the ids through make_env, the small-image torso, the frame storage, the preset, a short
run that learns, --test --record, and checkpoint/resume on a MinAtar game."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from conftest import ROOT, command_line, small_flags

import d3qn_agent
from d3qn_agent import DQNAgent, DuelingCombine, OurModel, episode_seed, make_env
from d3qn_utils import games, minatar_wrappers, settings
from d3qn_utils.games import storage_spec, torso
from d3qn_utils.patch_conv import PatchConv2D
from d3qn_utils.replay_storage import FrameStackStorage, TransitionStorage
from PER import Memory

BREAKOUT = "MinAtar/Breakout-v1"
CHANNELS = {"Asterix": 4, "Breakout": 4, "Freeway": 7, "Seaquest": 10, "SpaceInvaders": 6}


# --- environments ----------------------------------------------------------------------------


@pytest.mark.parametrize("game", minatar_wrappers.GAMES)
def test_each_game_gives_uint8_frames_and_a_seed_repeats_its_episode(game):
    env = make_env(f"MinAtar/{game}-v1")
    assert env.observation_space.shape == (10, 10, CHANNELS[game])
    assert env.observation_space.dtype == np.uint8

    def play(seed: int) -> tuple[list[np.ndarray], list[float]]:
        frame, _ = env.reset(seed=seed)
        frames, rewards, rng = [frame], [], np.random.default_rng(seed)
        for _ in range(200):  # sticky actions and spawns both come from the reset's seed
            action = int(rng.integers(env.action_space.n))
            frame, reward, terminated, truncated, _ = env.step(action)
            frames.append(frame)
            rewards.append(reward)
            if terminated or truncated:
                break
        return frames, rewards

    frames, rewards = play(7)
    again, rewards_again = play(7)
    assert rewards == rewards_again
    assert all(np.array_equal(a, b) for a, b in zip(frames, again, strict=True))
    assert set(np.unique(np.stack(frames))) <= {0, 255}
    assert any(not np.array_equal(a, b) for a, b in zip(frames, play(8)[0], strict=False))


@pytest.mark.parametrize("game", minatar_wrappers.GAMES)
def test_a_seeded_reset_plays_the_episode_minatars_own_seeding_plays(game):
    """`BinaryFrame` seeds the game's generator in place; minatar's `seed` makes a new one.
    Episode after episode from other seeds, both give the same frames, rewards and ends."""
    ours, theirs = make_env(f"MinAtar/{game}-v1"), make_env(f"MinAtar/{game}-v1")
    rng = np.random.default_rng(3)
    for seed in (5, 11, 5, 2**31 - 1):
        theirs.unwrapped.game.seed(seed)  # minatar's: a new RandomState(seed)
        frame, _ = ours.reset(seed=seed)
        assert np.array_equal(frame, theirs.reset()[0])
        for _ in range(100):
            action = int(rng.integers(ours.action_space.n))
            step, step_theirs = ours.step(action), theirs.step(action)
            assert np.array_equal(step[0], step_theirs[0])
            assert step[1:4] == step_theirs[1:4]
            if step[2] or step[3]:
                break


def test_v0_has_all_six_actions_and_v1_the_minimal_set():
    with pytest.warns(DeprecationWarning, match="out of date"):  # gymnasium prefers -v1
        assert make_env("MinAtar/Breakout-v0").action_space.n == 6
    assert make_env(BREAKOUT).action_space.n == 3


def test_an_unknown_game_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"'MinAtar/Pong-v1'.*MinAtar/Breakout-v1"):
        make_env("MinAtar/Pong-v1")


def test_the_screen_is_a_uint8_picture_of_the_grid():
    env = make_env(BREAKOUT, render_mode="rgb_array")
    frame, _ = env.reset(seed=0)
    screen = env.render()
    scale = minatar_wrappers.SCREEN_SCALE
    assert screen.shape == (10 * scale, 10 * scale, 3) and screen.dtype == np.uint8
    occupied = frame.any(axis=-1)  # cells with an object are coloured, the others black
    cells = screen[::scale, ::scale]
    assert (cells[~occupied] == 0).all() and cells[occupied].any(axis=-1).all()


# --- network and replay ------------------------------------------------------------------


@pytest.mark.parametrize("dueling", [True, False], ids=["dueling", "plain"])
def test_a_minatar_game_gets_the_minatar_torso(dueling):
    model = OurModel((10, 10, 7), 3, dueling, image_torso=torso(BREAKOUT))
    assert model.input.dtype == "uint8"
    assert not any(isinstance(layer, keras.layers.Conv2D) for layer in model.layers)
    conv = [layer for layer in model.layers if isinstance(layer, PatchConv2D)]
    assert len(conv) == 1 and (conv[0].filters, conv[0].kernel_size) == (16, 3)
    assert conv[0].output.shape == (None, 8, 8, 16)
    dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
    assert dense[0].units == 128 and dense[0].input.shape == (None, 8 * 8 * 16)
    assert any(isinstance(layer, DuelingCombine) for layer in model.layers) == dueling
    frames = np.random.default_rng(0).integers(2, size=(5, 10, 10, 7), dtype=np.uint8) * 255
    assert np.asarray(model(frames)).shape == (5, 3)


def test_patch_conv_is_conv2d_and_loads_in_safe_mode(tmp_path):
    images = np.random.default_rng(1).normal(size=(4, 10, 10, 6)).astype(np.float32)
    patch, conv = PatchConv2D(16, 3, activation="relu"), keras.layers.Conv2D(16, 3,
                                                                           activation="relu")
    expected = patch(images)
    conv(images)
    conv.set_weights(patch.get_weights())  # the same weights, in the same layout
    np.testing.assert_allclose(np.asarray(expected), np.asarray(conv(images)), atol=1e-5)
    model = OurModel((10, 10, 6), 4, dueling=True, image_torso=torso(BREAKOUT))
    model.save(tmp_path / "minatar.keras")
    loaded = keras.models.load_model(tmp_path / "minatar.keras", safe_mode=True)
    frames = np.random.default_rng(2).integers(2, size=(3, 10, 10, 6), dtype=np.uint8) * 255
    np.testing.assert_array_equal(np.asarray(loaded(frames)), np.asarray(model(frames)))


def test_single_frames_come_back_exactly_and_each_is_stored_once():
    rng = np.random.default_rng(3)
    storage = FrameStackStorage(100, stack_axis=None)
    episodes = [[rng.integers(2, size=(10, 10, 4), dtype=np.uint8) * 255 for _ in range(length)]
                for length in (6, 4)]
    slots = []
    for frames in episodes:
        for t in range(len(frames) - 1):
            slot, freed = storage.add((frames[t], t % 3, float(t), frames[t + 1],
                                       t == len(frames) - 2))
            slots.append(slot)
            assert freed.size == 0
    transitions = [(frames[t], frames[t + 1])
                   for frames in episodes for t in range(len(frames) - 1)]
    assert storage.written == sum(len(frames) for frames in episodes)  # one slot per frame
    states, _, _, next_states, dones = storage.get(np.array(slots))
    for i, (state, next_state) in enumerate(transitions):
        np.testing.assert_array_equal(states[i], state)
        np.testing.assert_array_equal(next_states[i], next_state)
    assert dones.sum() == 2
    restored = FrameStackStorage(100, stack_axis=None)
    restored.load_state_dict(storage.state_dict())
    assert restored.stack_axis is None and restored.state_shape == (10, 10, 4)
    for got, expected in zip(restored.get(np.array(slots)), storage.get(np.array(slots)),
                             strict=True):
        np.testing.assert_array_equal(got, expected)


def test_each_family_gets_its_storage_and_is_sized_by_it():
    assert isinstance(storage_spec("CartPole-v1")(10), TransitionStorage)
    assert storage_spec("PongNoFrameskip-v4")(10).stack_axis == -1
    assert storage_spec(BREAKOUT)(10).stack_axis is None
    # A MinAtar slot holds a whole (10, 10, 4) state (400 bytes), its action 8, reward 4 and two
    # flags: not one of 4 stacked frames (100 + 14), as an Atari stack of that shape would be.
    assert storage_spec(BREAKOUT).bytes_per_slot((10, 10, 4), np.uint8) == 414
    assert storage_spec("PongNoFrameskip-v4").bytes_per_slot((10, 10, 4), np.uint8) == 114
    # Nothing is stacked, so a memory of as many slots as channels holds transitions.
    assert storage_spec(BREAKOUT).min_capacity((10, 10, 4)) == 2
    Memory.check_fits(4, storage_spec(BREAKOUT), (10, 10, 4), np.uint8)


# --- the agent -----------------------------------------------------------------------------


def test_minatar_at_the_top_gets_the_minatar_preset(monkeypatch):
    monkeypatch.setattr(d3qn_agent, "ENV_NAME", BREAKOUT)
    config, notes = settings.resolve(d3qn_agent, settings.D3QN_FLAGS, settings.d3qn_presets, {})
    for name, value in games.MINATAR.preset.items():
        assert getattr(config, name) == value, name
        assert f"{name} {value} (MinAtar preset)" in notes


@pytest.mark.slow  # 20,000 steps of training
def test_a_short_run_learns_above_random_play_and_records_a_gif(tmp_path):
    # 20,000 steps: under the preset's Adam epsilon (3.125e-4) 10,000 do not yet show learning.
    agent = DQNAgent(BREAKOUT, total_steps=20_000, learning_starts=1_000,
                     exploration_steps=3_000, eval_every=20_000, eval_episodes=20, seed=0,
                     model_dir=str(tmp_path / "models"), plot_dir=str(tmp_path / "plots"))
    agent.run()
    storage = agent.MEMORY.storage  # one byte per cell, each frame once
    assert isinstance(storage, FrameStackStorage) and storage.frames.dtype == np.uint8
    env, rng, random_returns = make_env(BREAKOUT), np.random.default_rng(0), []
    for episode in range(20):
        env.reset(seed=episode_seed(0, 9, episode))
        done, score = False, 0.0
        while not done:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(3)))
            score, done = score + reward, terminated or truncated
        random_returns.append(score)
    learned = agent.evaluations[-1][2]
    assert learned >= 1.0 and learned >= 3 * np.mean(random_returns), (learned, random_returns)

    gif = tmp_path / "breakout.gif"
    result = subprocess.run(
        [sys.executable, str(ROOT / "d3qn_agent.py"), "--env-name", BREAKOUT, "--test",
         "--test-episodes", "1", "--model", agent.Model_name, "--record", str(gif)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "episode: 1/1" in result.stdout and gif.stat().st_size > 0


# Gradient steps from step 100 on, before the step-200 checkpoint and after it; no XLA to compile
# (test_checkpoint.py resumes a run with XLA).
TINY = command_line(small_flags(
    None, env_name=BREAKOUT, memory_size=600, learning_starts=100, train_frequency=1,
    gradient_steps_per_call=4, target_update=50, exploration_steps=200, eval_every=1_000_000,
    eval_episodes=1, seed=5, total_steps=400, checkpoint_every=200))


def test_a_resumed_minatar_run_matches_an_uninterrupted_one(tmp_path, capsys):
    # Both runs in this process: starting a Python with TensorFlow costs more than the runs
    # (test_checkpoint.py resumes in a fresh process).
    def train(directory: Path, *flags: str) -> None:
        code = d3qn_agent.main([*TINY, "--model-dir", str(directory / "models"), "--plot-dir",
                                str(directory / "plots"), *flags])
        assert code == 0, capsys.readouterr().err

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(straight)
    steps = sorted((straight / "models").rglob("step-*"))
    assert [path.name for path in steps] == ["step-0000000200", "step-0000000400"]
    shutil.copytree(steps[0], resumed / steps[0].relative_to(straight))
    train(resumed, "--resume")
    finished = sorted((resumed / "models").rglob("step-0000000400"))
    assert len(finished) == 1
    expected = json.loads((steps[1] / "progress.json").read_text())["progress"]
    got = json.loads((finished[0] / "progress.json").read_text())["progress"]
    for key in ("step", "episode", "scores", "rng", "environments"):
        assert got[key] == expected[key], key
