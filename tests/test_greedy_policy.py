"""Tests for greedy_policy.py: the numpy forward pass picks the network's own greedy actions, and
follows the weights when the agent says they changed; ε-greedy's draws and the best evaluated
network kept, as both programs use them; the agent's actions for several environments at once."""

from __future__ import annotations

import numpy as np
import pytest

from d3qn_agent import ADVANTAGE_LAYER, OurModel
from d3qn_utils.games import torso
from d3qn_utils.greedy_policy import (
    GreedyPolicy,
    epsilon_greedy,
    epsilon_greedy_actions,
    keep_best,
    numpy_layers,
)


@pytest.mark.parametrize("dueling", [True, False])
def test_numpy_forward_picks_the_networks_greedy_actions(dueling):
    model = OurModel((4,), 3, dueling, hidden_units=(32, 16))
    policy = GreedyPolicy(model, np.float32, head=ADVANTAGE_LAYER)
    assert [layer.name for layer in policy.layers][-1] == (
        "action_advantage" if dueling else "q_values")  # argmax A is argmax Q
    assert (numpy_layers(model) is None) == dueling  # without `head`, the dueling merge is compiled
    states = np.random.default_rng(0).normal(size=(1_000, 4)).astype(np.float32)
    np.testing.assert_array_equal(policy(states), np.asarray(model(states)).argmax(axis=1))
    assert policy(states[:1]).shape == (1,)


def test_the_weights_are_copied_again_only_after_weights_changed():
    model = OurModel((4,), 2, True, hidden_units=(8,))
    policy = GreedyPolicy(model, np.float32, head=ADVANTAGE_LAYER)
    states = np.random.default_rng(1).normal(size=(200, 4)).astype(np.float32)
    before = policy(states)
    model.set_weights([-w for w in model.get_weights()])  # flips the sign of A, so of argmax
    np.testing.assert_array_equal(policy(states), before)  # the copy it holds
    policy.weights_changed()
    after = policy(states)
    np.testing.assert_array_equal(after, np.asarray(model(states)).argmax(axis=1))
    assert (after != before).any()


@pytest.mark.parametrize("dueling", [True, False])
def test_numpy_forward_of_the_small_image_torso_picks_the_networks_greedy_actions(dueling):
    model = OurModel((10, 10, 7), 3, dueling, image_torso=torso("MinAtar/Freeway-v1"))
    policy = GreedyPolicy(model, np.uint8, head=ADVANTAGE_LAYER)
    assert [layer.__class__.__name__ for layer in policy.layers] == [
        "Rescaling", "PatchConv2D", "Flatten", "Dense", "Dense"]
    frames = np.random.default_rng(3).integers(2, size=(500, 10, 10, 7), dtype=np.uint8) * 255
    q_values = np.asarray(model(frames))
    np.testing.assert_array_equal(policy(frames), q_values.argmax(axis=1))
    model.set_weights([-w for w in model.get_weights()])
    policy.weights_changed()
    np.testing.assert_array_equal(policy(frames), np.asarray(model(frames)).argmax(axis=1))


def test_atari_images_go_through_the_backends_compiled_call():
    model = OurModel((84, 84, 4), 6, True, image_torso=torso("PongNoFrameskip-v4"))
    assert numpy_layers(model, ADVANTAGE_LAYER) is None
    policy = GreedyPolicy(model, np.uint8, head=ADVANTAGE_LAYER)
    frames = np.random.default_rng(2).integers(256, size=(5, 84, 84, 4), dtype=np.uint8)
    np.testing.assert_array_equal(policy(frames), np.asarray(model(frames)).argmax(axis=1))


def test_a_bfloat16_torso_goes_through_the_backends_compiled_call():
    # float32 numpy would differ from it
    model = OurModel((10, 10, 7), 3, True, bfloat16=True, image_torso=torso("MinAtar/Freeway-v1"))
    assert numpy_layers(model, ADVANTAGE_LAYER) is None
    frames = np.random.default_rng(6).integers(2, size=(50, 10, 10, 7), dtype=np.uint8) * 255
    np.testing.assert_array_equal(GreedyPolicy(model, np.uint8, head=ADVANTAGE_LAYER)(frames),
                                  np.asarray(model(frames)).argmax(axis=1))


def test_epsilon_greedy_explores_with_probability_epsilon_else_acts_greedily():
    def greedy(states: np.ndarray) -> np.ndarray:
        return np.array([2])

    state = np.zeros(4, np.float32)
    rng, twin = np.random.default_rng(5), np.random.default_rng(5)
    actions = [epsilon_greedy(greedy, state, 0.25, rng, 3) for _ in range(200)]
    # The same draws by hand: one uniform each, and an action among 3 when it is below 0.25.
    expected = [int(twin.integers(3)) if twin.random() < 0.25 else 2 for _ in range(200)]
    assert actions == expected and set(actions) == {0, 1, 2}
    assert {epsilon_greedy(greedy, state, 0.0, rng, 3) for _ in range(50)} == {2}


def test_epsilon_greedy_actions_draw_for_each_state_in_turn_and_pass_forward_once():
    batches = []

    def greedy(states: np.ndarray) -> np.ndarray:
        batches.append(len(states))
        return np.arange(len(states)) % 3  # state i's greedy action: i mod 3

    states = [np.full(4, i, np.float32) for i in range(5)]
    rng, twin = np.random.default_rng(7), np.random.default_rng(7)
    for _ in range(40):
        actions = epsilon_greedy_actions(greedy, states, 0.5, rng, 3)
        expected = [int(twin.integers(3)) if twin.random() < 0.5 else i % 3 for i in range(5)]
        assert actions == expected
    assert set(batches) == {5} and len(batches) < 40  # all states in one pass, only if needed
    # One state: the draws and the action of epsilon_greedy.
    rng, twin = np.random.default_rng(3), np.random.default_rng(3)
    assert [epsilon_greedy_actions(greedy, states[:1], 0.3, rng, 3)[0] for _ in range(100)] == [
        epsilon_greedy(greedy, states[0], 0.3, twin, 3) for _ in range(100)]


def test_keep_best_saves_each_new_best_or_tie_and_notes_the_first_solve():
    saved = []
    best, solved, note = keep_best(10.0, 100, -np.inf, None, 50.0, saved.append, "m.keras")
    assert (best, solved, note) == (10.0, None, ", best so far: saved m.keras")
    best, solved, note = keep_best(5.0, 200, best, solved, 50.0, saved.append, "m.keras")
    assert (best, solved, note) == (10.0, None, "")
    best, solved, note = keep_best(60.0, 300, best, solved, 50.0, saved.append, "m.keras")
    assert (best, solved, note) == (60.0, 300, ", best so far: saved m.keras, solved (>= 50)")
    best, solved, note = keep_best(60.0, 400, best, solved, 50.0, saved.append, "m.keras")
    assert (best, solved, note) == (60.0, 300, ", best so far: saved m.keras")  # a tie: the later
    assert saved == ["m.keras"] * 3
    assert keep_best(1e9, 500, best, None, None, saved.append, "m.keras")[1] is None  # no threshold
