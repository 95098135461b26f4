"""Tests for rank_based.py's `RankBasedMemory`: ranks by hand, then statistics with fixed seeds.
Checkpoints of it are tested in test_memory_state.py."""

import re

import numpy as np
import pytest
from memory_helpers import (
    experience,
    filled_memory,
    frame_stacks,
    names_bad,
    snapshot,
    states_equal,
)

from d3qn_utils.replay_storage import FrameStackStorage, TransitionStorage
from rank_based import RankBasedMemory


def test_defaults_are_the_papers():
    memory = RankBasedMemory(4)
    assert memory.kind == "rank-based"
    assert (memory.alpha, memory.beta, memory.beta_increment) == (0.7, 0.5, 0.001)


def test_store_returns_the_slot_and_new_transitions_rank_first():
    memory = RankBasedMemory(8, rng=0)
    assert [memory.store(experience(i)) for i in range(4)] == [0, 1, 2, 3]
    memory.batch_update(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]))
    assert memory.store(experience(4)) == 4
    memory.sample(1)
    np.testing.assert_array_equal(memory.ranked_slots, [4, 3, 2, 1, 0])
    np.testing.assert_array_equal(memory.ranked_keys, [-np.inf, -4, -3, -2, -1])
    np.testing.assert_array_equal(memory.abs_errors, [1, 2, 3, 4, np.inf] + [-np.inf] * 3)


def test_a_full_memory_overwrites_the_oldest_and_ranks_it_first():
    memory = filled_memory(RankBasedMemory, 4)
    memory.batch_update(np.arange(4), np.array([4.0, 3.0, 2.0, 1.0]))
    assert memory.store(experience(4)) == 0  # overwrites slot 0, which ranked first
    memory.refresh_ranks()
    np.testing.assert_array_equal(memory.ranked_slots, [0, 1, 2, 3])
    np.testing.assert_array_equal(memory.ranked_keys, [-np.inf, -3, -2, -1])
    assert len(memory) == 4


def test_batch_update_last_duplicate_wins_and_ranks_follow():
    memory = filled_memory(RankBasedMemory, 4)
    memory.batch_update(np.array([0, 1, 2, 3, 0]), np.array([5.0, 1.0, 2.0, 3.0, 0.5]))
    np.testing.assert_array_equal(memory.abs_errors, [0.5, 1.0, 2.0, 3.0])
    memory.refresh_ranks()
    np.testing.assert_array_equal(memory.ranked_slots, [3, 2, 1, 0])


def test_ranks_stay_sorted_through_many_stores_and_updates():
    # Against a from-scratch sort after every step: slots holding a transition, largest |delta|
    # first, keys -|delta|.
    rng = np.random.default_rng(3)
    memory = RankBasedMemory(50, rng=1)
    for step in range(300):
        memory.store(experience(step))
        if step % 7 == 6:
            slots, _, _ = memory.sample(16)
            errors = rng.exponential(1.0, 16).round(1)  # ties too
            memory.batch_update(slots, errors)
        memory.refresh_ranks()
        held = memory.storage.held_slots()
        assert sorted(memory.ranked_slots.tolist()) == held.tolist()
        np.testing.assert_array_equal(memory.ranked_keys, -memory.abs_errors[memory.ranked_slots])
        keys = memory.ranked_keys
        assert (keys[:-1] <= keys[1:]).all()  # ascending (not np.diff: -inf - -inf is NaN)


def test_rank_based_sampling_frequencies_and_weights():
    memory = filled_memory(RankBasedMemory, 6, alpha=0.7, beta=0.5, beta_increment=0.0, rng=7)
    errors = np.array([0.3, 5.0, 0.1, 2.0, 0.2, 1.0])  # ranks 4, 1, 6, 2, 5, 3
    memory.batch_update(np.arange(6), errors)
    ranks = np.array([4, 1, 6, 2, 5, 3])
    probabilities = ranks**-0.7 / (np.arange(1, 7) ** -0.7).sum()
    counts = np.zeros(6)
    for _ in range(1000):
        slots, _, is_weights = memory.sample(64)  # no tree: the slots are sample's indices
        assert is_weights.dtype == np.float32
        counts += np.bincount(slots, minlength=6)
        weights = (6 * probabilities) ** -0.5
        np.testing.assert_allclose(is_weights, weights[slots] / weights.max(), rtol=1e-6)
    # 64,000 draws: each frequency's standard error is below 0.002.
    np.testing.assert_allclose(counts / counts.sum(), probabilities, atol=0.01)


def test_alpha_zero_samples_uniformly_with_weights_one():
    memory = filled_memory(RankBasedMemory, 5, alpha=0.0, rng=2)
    memory.batch_update(np.arange(5), np.array([9.0, 0.0, 1.0, 3.0, 0.5]))
    slots, _, is_weights = memory.sample(5000)
    np.testing.assert_array_equal(is_weights, 1.0)
    np.testing.assert_allclose(np.bincount(slots, minlength=5) / 5000, 0.2, atol=0.02)


def test_beta_grows_to_one_and_stops():
    memory = filled_memory(RankBasedMemory, 4, beta=0.9, beta_increment=0.04)
    betas = [memory.sample(2) and memory.beta for _ in range(4)]
    np.testing.assert_allclose(betas, [0.94, 0.98, 1.0, 1.0])




def test_sampling_probabilities_sum_to_one_and_follow_the_ranks():
    memory = RankBasedMemory(8, rng=0)
    for i in range(4):
        memory.store(experience(i))
    memory.batch_update(np.array([0, 1, 2, 3]), np.array([0.3, 0.1, 0.4, 0.2]))
    for slots, probabilities in (memory.sampling_probabilities(), memory.sampling_probabilities()):
        np.testing.assert_array_equal(slots, [2, 0, 3, 1])  # largest |delta| first
        expected = np.arange(1, 5) ** -0.7  # P(rank j) proportional to j^-alpha
        np.testing.assert_allclose(probabilities, expected / expected.sum())
    # A copy: changing it changes nothing in the memory.
    slots, _ = memory.sampling_probabilities()
    slots[:] = 0
    np.testing.assert_array_equal(memory.ranked_slots, [2, 0, 3, 1])
    empty_slots, empty_probabilities = RankBasedMemory(4).sampling_probabilities()
    assert empty_slots.size == 0 and empty_probabilities.size == 0


def test_a_frame_store_drops_the_transitions_it_breaks_from_the_ranks():
    # Stacks of 2 frames in a ring of 4: the ring holds the last two transitions.
    stacks = frame_stacks(8)
    memory = RankBasedMemory(4, storage=FrameStackStorage(4), rng=0)
    slots = [memory.store((stacks[i], i, 1.0, stacks[i + 1], False)) for i in range(6)]
    assert slots == [1, 2, 3, 0, 1, 2]
    memory.refresh_ranks()
    assert sorted(memory.ranked_slots.tolist()) == [1, 2]
    np.testing.assert_array_equal(memory.abs_errors[[0, 3]], -np.inf)
    slots, (states, actions, *_), _ = memory.sample(200)
    assert set(slots.tolist()) == {1, 2}
    np.testing.assert_array_equal(states, stacks[actions])
    # An update for a broken slot is skipped: it stays out of the ranks.
    memory.batch_update(np.array([0, 1]), np.array([5.0, 0.5]))
    memory.refresh_ranks()
    assert memory.abs_errors[0] == -np.inf
    np.testing.assert_array_equal(memory.ranked_slots, [2, 1])  # slot 2 is still unseen


def test_memory_bad_input_raises_and_changes_nothing():
    with pytest.raises(ValueError, match="empty memory"):
        RankBasedMemory(4).sample(2)
    memory = filled_memory(RankBasedMemory, 4)
    memory.batch_update(np.arange(4), np.array([0.1, 0.2, 0.3, 0.4]))
    before = snapshot(memory)
    for bad in (np.nan, np.inf, -0.5):
        with pytest.raises(ValueError, match=names_bad("absolute TD error", bad)):
            memory.batch_update(np.array([0, 1]), np.array([0.1, bad]))
    with pytest.raises(ValueError, match=r"^slot must be in 0\.\.3, got 4$"):
        memory.batch_update(np.array([4]), np.array([0.1]))
    with pytest.raises(ValueError, match=r"^slot must be in 0\.\.3, got -1$"):
        memory.batch_update(np.array([0, -1]), np.array([0.1, 0.1]))
    with pytest.raises(ValueError, match=re.escape(
            "got 2 indices (slot) but 1 values (absolute TD error)")):
        memory.batch_update(np.array([0, 1]), np.array([0.1]))
    with pytest.raises(ValueError, match="each slot must be an integer, got dtype float64"):
        memory.batch_update(np.array([0.0]), np.array([0.1]))
    assert states_equal(snapshot(memory), before)
    for n in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="batch size must be an integer >= 1"):
            memory.sample(n)
    for name, value in (("alpha", -1.0), ("beta", 1.5), ("beta_increment", -0.1),
                        ("gamma", 1.5), ("n_step", 0), ("capacity", 0)):
        arguments = {"capacity": 4, name: value}
        with pytest.raises(ValueError, match=f"{name} must .*got {value!r}"):
            RankBasedMemory(**arguments)
    with pytest.raises(ValueError, match="storage capacity 4 differs from memory capacity 8"):
        RankBasedMemory(8, storage=TransitionStorage(4))


def test_store_refuses_a_transition_that_is_not_finite_or_has_a_bad_action_and_writes_nothing():
    memory = RankBasedMemory(4, rng=0)
    for i in range(6):  # full, wrapped around: the next store overwrites the oldest, slot 2
        memory.store(experience(i))
    before = snapshot(memory)
    state, nan_state = np.full(3, 9.0, np.float32), np.array([1.0, np.nan, 2.0], np.float32)
    refused = [
        ((state, 0, np.nan, state, False), "reward must be a finite number, got nan"),
        ((state, 0, None, state, False), "reward must be a finite number, got None"),
        ((nan_state, 0, 1.0, state, False), "^state must be finite, got nan"),
        ((state, 0, 1.0, state * np.inf, False), "next_state must be finite, got inf"),
        ((state, -1, 1.0, state, False), "action must be an integer >= 0, got -1"),
        ((state, True, 1.0, state, False), "action must be an integer, got True"),
        ((state, 1, 1.0, state, 0.5), "done must be True or False, got 0.5"),
    ]
    for transition, message in refused:
        with pytest.raises(ValueError, match=message):
            memory.store(transition)
        assert states_equal(snapshot(memory), before), transition
    assert memory.store((state, np.int32(1), np.float32(0.5), state, 1)) == 2


def test_seeded_memories_repeat():
    first, second = (filled_memory(RankBasedMemory, 50, capacity=64, rng=5) for _ in range(2))
    for _ in range(3):
        (first_idx, _, first_weights), (second_idx, _, second_weights) = (first.sample(8),
                                                                          second.sample(8))
        np.testing.assert_array_equal(first_idx, second_idx)
        np.testing.assert_array_equal(first_weights, second_weights)
        first.batch_update(first_idx, np.abs(np.sin(first_idx)))
        second.batch_update(second_idx, np.abs(np.sin(second_idx)))
