"""Tests for the D3QN agent on Atari: the conv network, the Atari defaults and the frame-sharing
replay storage, and a short command-line run on Pong (in-process) that writes a model and a
plot."""

from __future__ import annotations

import re
from pathlib import Path

import keras
import numpy as np
import pytest

from d3qn_agent import DQNAgent, DuelingCombine, OurModel, main
from d3qn_utils.games import torso
from d3qn_utils.gradient_steps import Batches
from d3qn_utils.patch_conv import PatchConv2D
from d3qn_utils.replay_storage import FrameStackStorage

PONG = "PongNoFrameskip-v4"
PONG_STATE = (84, 84, 4)
PONG_ACTIONS = 6


def pong_agent(tmp_path: Path, **flags) -> DQNAgent:
    """A Pong agent that writes only under tmp_path; other flags as given."""
    return DQNAgent(PONG, model_dir=str(tmp_path / "models"), plot_dir=str(tmp_path / "plots"),
                    **flags)


# --- network ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dueling", [True, False], ids=["dueling", "plain"])
def test_an_atari_game_gets_the_nature_dqn_torso(dueling):
    model = OurModel(PONG_STATE, PONG_ACTIONS, dueling, image_torso=torso(PONG))
    assert model.input.dtype == "uint8"
    rescaling = [layer for layer in model.layers if isinstance(layer, keras.layers.Rescaling)]
    assert len(rescaling) == 1 and rescaling[0].scale == pytest.approx(1 / 255)
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert [(c.filters, c.kernel_size, c.strides, c.activation.__name__) for c in convs] == [
        (32, (8, 8), (4, 4), "relu"), (64, (4, 4), (2, 2), "relu"), (64, (3, 3), (1, 1), "relu")]
    # The first dense layer after the torso has 512 units; then the head.
    dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
    assert dense[0].units == 512
    assert model.layers.index(dense[0]) > model.layers.index(convs[-1])
    head = sorted(layer.units for layer in dense[1:])
    assert head == ([1, PONG_ACTIONS] if dueling else [PONG_ACTIONS])
    assert any(isinstance(layer, DuelingCombine) for layer in model.layers) == dueling
    # Rescaling happens inside the model, so raw uint8 frames go in directly.
    frames = np.random.default_rng(0).integers(0, 256, (2, *PONG_STATE), dtype=np.uint8)
    q_values = np.asarray(model(frames))
    assert q_values.shape == (2, PONG_ACTIONS) and np.isfinite(q_values).all()


@pytest.mark.parametrize(("game", "state"),
                         [(PONG, PONG_STATE), ("MinAtar/Freeway-v1", (10, 10, 7))],
                         ids=["nature", "minatar"])
def test_bfloat16_convolutions_compute_the_same_q_values_and_save_for_safe_mode(tmp_path, game,
                                                                                state):
    model = OurModel(state, PONG_ACTIONS, dueling=True, bfloat16=True, image_torso=torso(game))
    plain = OurModel(state, PONG_ACTIONS, dueling=True, image_torso=torso(game))
    plain.set_weights(model.get_weights())  # one layout; the weights are float32 in both
    convolutions = [layer.name for layer in model.layers
                    if isinstance(layer, (keras.layers.Conv2D, PatchConv2D))]
    assert convolutions and convolutions == [layer.name for layer in model.layers
                                             if layer.compute_dtype == "bfloat16"]
    assert {variable.dtype for variable in model.weights} == {"float32"}
    frames = np.random.default_rng(4).integers(0, 256, (64, *state), dtype=np.uint8)
    q_values, exact = model(frames), np.asarray(plain(frames))
    assert keras.backend.standardize_dtype(q_values.dtype) == "float32"
    # bfloat16 keeps 8 bits of each number: here ~1% of the largest Q-value at most.
    np.testing.assert_allclose(np.asarray(q_values), exact, atol=0.03 * np.abs(exact).max())
    model.save(tmp_path / "bfloat16.keras")
    loaded = keras.models.load_model(tmp_path / "bfloat16.keras", safe_mode=True)
    assert loaded.get_layer(convolutions[0]).dtype_policy.name == "mixed_bfloat16"
    np.testing.assert_array_equal(np.asarray(loaded(frames)), np.asarray(q_values))


def test_a_bfloat16_agent_trains_and_acts_through_the_compiled_call(tmp_path):
    agent = pong_agent(tmp_path, memory_size=100, bfloat16=True)
    assert "bfloat16 convolutions" in agent.report.description
    assert agent.greedy_actions.layers is None  # numpy's float32 would act on other numbers
    rng = np.random.default_rng(5)
    frames = rng.integers(0, 256, (2, 32, *PONG_STATE), dtype=np.uint8)
    ones = np.ones((1, 32), np.float32)
    batches = Batches(frames[:1], rng.integers(0, PONG_ACTIONS, (1, 32), dtype=np.int32), ones,
                      frames[1:], 0 * ones, 0.99 * ones, ones)
    before = agent.model.get_weights()
    _, (loss,) = agent.learn(batches, 0)
    assert np.isfinite(loss)
    assert all(np.any(old != new) for old, new in zip(before, agent.model.get_weights(),
                                                        strict=True))
    states = frames[0, :8]
    np.testing.assert_array_equal(agent.greedy_actions(states),
                                  np.asarray(agent.model(states)).argmax(axis=1))


# --- Atari defaults --------------------------------------------------------------------------


def test_pong_agent_uses_the_atari_defaults_its_preset_and_the_frame_store(tmp_path):
    agent = pong_agent(tmp_path)
    config = agent.config
    assert agent.state_shape == PONG_STATE and agent.action_size == PONG_ACTIONS
    assert isinstance(agent.MEMORY.storage, FrameStackStorage)
    assert agent.MEMORY.capacity == 100_000
    assert isinstance(agent.optimizer, keras.optimizers.Adam)
    assert float(agent.optimizer.learning_rate) == pytest.approx(1e-4)
    assert (config.batch_size, config.learning_starts, config.target_update) == (
        32, 10_000, 1_000)
    # The Pong preset: the documented run's budget, train frequency, XLA and checkpoints.
    assert (config.total_steps, config.train_frequency, config.xla,
            config.checkpoint_every) == (500_000, 2, False, 25_000)
    # Linear epsilon: 1 -> 0.01 over the first 100k steps, then flat.
    assert agent.epsilon_at(0) == 1.0
    assert agent.epsilon_at(50_000) == pytest.approx(0.505)
    assert agent.epsilon_at(100_000) == pytest.approx(0.01)
    assert agent.epsilon_at(1_000_000) == pytest.approx(0.01)
    assert any(isinstance(layer, keras.layers.Conv2D) for layer in agent.model.layers)


def test_explicit_flags_override_the_atari_defaults_one_by_one(tmp_path):
    agent = pong_agent(tmp_path, memory_size=500, learning_rate=3e-4, use_per=False)
    assert isinstance(agent.MEMORY.storage, FrameStackStorage)
    assert agent.MEMORY.capacity == 500
    assert float(agent.optimizer.learning_rate) == pytest.approx(3e-4)
    # Flags that were not given keep their Atari values.
    config = agent.config
    assert (config.learning_starts, config.train_frequency, config.epsilon_min) == (
        10_000, 2, 0.01)


def test_run_trains_every_second_step_from_learning_starts(tmp_path, monkeypatch):
    agent = pong_agent(tmp_path, total_steps=40, learning_starts=8, memory_size=200,
                       batch_size=4, max_episode_steps=20, eval_episodes=1)
    replay_steps = []
    train_once = agent.replay

    def counting_replay(due: int) -> float:
        replay_steps.append(due)
        return train_once(due)

    monkeypatch.setattr(agent, "replay", counting_replay)
    agent.run()
    assert replay_steps == list(range(8, 41, 2))  # the Pong preset's train frequency
    assert len(agent.MEMORY) > 0 and agent.episode == 2  # two 20-step episodes (time limit)


# --- command line ----------------------------------------------------------------------------


def test_command_line_smoke_run_on_pong_writes_a_loadable_model_and_a_plot(tmp_path, capsys):
    models, plots = tmp_path / "models", tmp_path / "plots"
    # 200 steps, training every 2nd from step 100 on (50 gradient steps, small batches);
    # 100-step episodes so that training episodes finish and the final greedy evaluation is
    # short. In-process: starting a Python with TensorFlow costs more than the run
    # (test_agent.py runs the script itself).
    argv = ["--env-name", PONG, "--total-steps", "200", "--memory-size", "500",
            "--learning-starts", "100", "--batch-size", "8", "--max-episode-steps", "100",
            "--eval-episodes", "1", "--model-dir", str(models), "--plot-dir", str(plots)]
    assert main(argv) == 0, capsys.readouterr().err
    assert "episode: 2, step: 200/200" in capsys.readouterr().out
    name = "DDQN_PongNoFrameskip-v4_Dueling_PER"
    assert (plots / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    frames = np.random.default_rng(0).integers(0, 256, (1, *PONG_STATE), dtype=np.uint8)
    for suffix in ("", "_last"):
        model = keras.models.load_model(models / f"{name}{suffix}.keras", safe_mode=True)
        q_values = np.asarray(model(frames))
        assert q_values.shape == (1, PONG_ACTIONS) and np.isfinite(q_values).all()
    # Biases start at zero, so non-zero biases in the last model show that gradient steps ran.
    biases = [layer.bias.numpy() for layer in model.layers
              if getattr(layer, "bias", None) is not None]
    assert len(biases) == 6 and all(np.any(bias != 0) for bias in biases)


def test_memory_too_small_for_a_frame_stack_is_refused(tmp_path):
    with pytest.raises(ValueError, match=re.escape(
            "MEMORY_SIZE (--memory-size) must be at least 5 for (84, 84, 4) states in a "
            "FrameStackStorage, got 4")):
        pong_agent(tmp_path, memory_size=4, batch_size=4)
