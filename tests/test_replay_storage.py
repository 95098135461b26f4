"""Tests for replay_storage.py: FrameStackStorage on random and real Atari episodes, alone and
inside every replay variant that takes one (TransitionStorage is tested through the memories,
here and in test_per.py, the tests' reservoir among them)."""

from __future__ import annotations

import io

import gymnasium
import numpy as np
import pytest
from gymnasium.wrappers import FrameStackObservation
from memory_helpers import experience, holds_frames, registered_memories, save_and_load

from atari_wrappers import ChannelsLast, make_env
from d3qn_utils.checks import check_indices, first_bad_pair, first_outside
from d3qn_utils.replay_storage import (
    FrameStackStorage,
    ReplayStorage,
    SlotStorage,
    TransitionStorage,
)

PONG = "PongNoFrameskip-v4"
FRAME_SHAPE = (84, 84)
STACK = 4


# --- FrameStackStorage


class RandomEpisodesEnv(gymnasium.Env):
    """Distinct random frames and short random episodes that end terminated or truncated."""

    def __init__(self, max_length: int = 9) -> None:
        self.observation_space = gymnasium.spaces.Box(0, 255, FRAME_SHAPE, np.uint8)
        self.action_space = gymnasium.spaces.Discrete(6)
        self.max_length = max_length

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.remaining = int(self.np_random.integers(1, self.max_length + 1))
        return self._frame(), {}

    def step(self, action):
        self.remaining -= 1
        ended = self.remaining == 0
        terminated = ended and bool(self.np_random.integers(2))
        reward = float(self.np_random.integers(-1, 2))
        return self._frame(), reward, terminated, ended and not terminated, {}

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 256, FRAME_SHAPE, dtype=np.uint8)


def collect(env: gymnasium.Env, steps: int, seed: int) -> list[tuple]:
    """(state, action, reward, next_state, terminated, episode_start) for each step of a run."""
    rng = np.random.default_rng(seed)
    transitions = []
    obs, _ = env.reset(seed=seed)
    episode_start = True
    for _ in range(steps):
        action = int(rng.integers(env.action_space.n))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        transitions.append((obs, action, reward, next_obs, terminated, episode_start))
        episode_start = terminated or truncated
        obs = env.reset()[0] if episode_start else next_obs
    return transitions


def fill_and_check(storage: FrameStackStorage, transitions: list[tuple]) -> dict[int, int]:
    """Add every transition, checking the storage against a plain list of full stacks.

    Returns {slot: index into transitions} of what the storage holds at the end. Checks, after
    every add: freed slots held a transition, exactly the expected transitions are held (those
    whose frames are among the last `capacity` frames written: one frame per step of an episode,
    four more at its start), and each held slot returns exactly the stacks that were added.
    """
    held: dict[int, int] = {}
    frames_written = 0
    first_frame = []  # index of the oldest frame each transition reads, in write order
    for index, (state, action, reward, next_state, done, episode_start) in enumerate(transitions):
        slot, freed = storage.add((state, action, reward, next_state, done))
        assert freed.dtype == np.int64 and slot not in freed
        for freed_slot in freed.tolist():
            assert freed_slot in held, f"slot {freed_slot} was freed but held nothing"
            del held[freed_slot]
        held[slot] = index
        if episode_start:
            first_frame.append(frames_written)
            frames_written += STACK + 1
        else:
            first_frame.append(frames_written - STACK)
            frames_written += 1
        oldest_kept = frames_written - storage.capacity
        expected = {i for i in range(index + 1) if first_frame[i] >= oldest_kept}
        assert set(held.values()) == expected
        assert sorted(held) == np.flatnonzero(storage.holds_transition).tolist()
        assert len(storage) == len(held)
        assert storage.written == min(frames_written, storage.capacity)
        if index % 7 == 0 or index == len(transitions) - 1:
            assert_storage_matches(storage, held, transitions)
    return held


def assert_storage_matches(storage, held: dict[int, int], transitions: list[tuple]) -> None:
    """get() every held slot and compare with the full stacks that were added."""
    slots = np.array(sorted(held), dtype=np.int64)
    states, actions, rewards, next_states, dones = storage.get(slots)
    assert states.dtype == np.uint8 and next_states.dtype == np.uint8
    for row, slot in enumerate(slots.tolist()):
        state, action, reward, next_state, done, _ = transitions[held[slot]]
        np.testing.assert_array_equal(states[row], state)
        np.testing.assert_array_equal(next_states[row], next_state)
        assert (actions[row], rewards[row], dones[row]) == (action, reward, done)


@pytest.mark.parametrize("padding_type", ["reset", "zero"])
def test_storage_returns_the_added_stacks_across_episodes_and_wrap_around(padding_type):
    env = ChannelsLast(FrameStackObservation(RandomEpisodesEnv(), STACK, padding_type=padding_type))
    transitions = collect(env, steps=400, seed=1)
    starts = sum(t[5] for t in transitions)
    storage = FrameStackStorage(capacity=37)
    held = fill_and_check(storage, transitions)
    assert starts > 40 and storage.written == 37  # many episodes, wrapped many times
    assert any(transitions[i][4] for i in held.values())  # terminated ones are held too
    assert storage.get(np.array([], dtype=np.int64))[0].shape == (0, 84, 84, STACK)


def test_storage_at_the_smallest_capacity_keeps_the_last_transition():
    env = ChannelsLast(FrameStackObservation(RandomEpisodesEnv(), STACK))
    held = fill_and_check(FrameStackStorage(capacity=STACK + 1), collect(env, steps=60, seed=3))
    assert list(held.values()) == [59]


@pytest.mark.parametrize(
    ("env_id", "keywords"),
    [
        (PONG, {"max_episode_steps": 40}),  # truncated episodes
        ("ALE/Breakout-v5", {"terminal_on_life_loss": True}),  # terminated episodes
    ],
)
def test_storage_with_the_real_env(env_id, keywords):
    env = make_env(env_id, **keywords)
    transitions = collect(env, steps=250, seed=4)
    env.close()
    assert sum(t[5] for t in transitions) >= 3
    storage = FrameStackStorage(capacity=61)
    fill_and_check(storage, transitions)


def test_state_dict_round_trip_through_npz():
    env = ChannelsLast(FrameStackObservation(RandomEpisodesEnv(), STACK))
    transitions = collect(env, steps=80, seed=5)
    storage = FrameStackStorage(capacity=29)
    held = fill_and_check(storage, transitions[:50])
    buffer = io.BytesIO()
    np.savez(buffer, **storage.state_dict())
    buffer.seek(0)
    restored = FrameStackStorage(capacity=29)
    with np.load(buffer) as arrays:
        restored.load_state_dict(dict(arrays))
    assert len(restored) == len(storage) and restored.written == storage.written
    assert_storage_matches(restored, held, transitions)
    # Both go on identically, including recognising the pending next state as a continuation.
    for state, action, reward, next_state, done, _ in transitions[50:]:
        experience = (state, action, reward, next_state, done)
        (slot_a, freed_a), (slot_b, freed_b) = storage.add(experience), restored.add(experience)
        assert slot_a == slot_b
        np.testing.assert_array_equal(freed_a, freed_b)
    np.testing.assert_array_equal(storage.holds_transition, restored.holds_transition)


def test_state_dict_of_an_empty_storage_round_trips():
    restored = FrameStackStorage(capacity=10)
    restored.load_state_dict(FrameStackStorage(capacity=10).state_dict())
    assert len(restored) == 0 and restored.written == 0


def good_experience() -> tuple:
    """A valid transition: frames filled with 0..4, next_state is state shifted by one frame."""
    frames = np.broadcast_to(np.arange(STACK + 1, dtype=np.uint8), (84, 84, STACK + 1))
    return frames[..., :-1].copy(), 1, 0.0, frames[..., 1:].copy(), False


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (0, np.zeros((84, 84, STACK), np.float32), "uint8"),
        (3, np.zeros((84, 84, STACK + 1), np.uint8), "shape"),
        (3, np.zeros((84, 84, STACK), np.uint8), "shifted"),
    ],
)
def test_add_rejects_frames_it_cannot_store(field, value, message):
    # The memory's check_transition checks the action, reward and done on the way in.
    experience = list(good_experience())
    experience[field] = value
    with pytest.raises(ValueError, match=message):
        FrameStackStorage(capacity=10).add(tuple(experience))


def test_a_rejected_experience_leaves_the_storage_unchanged():
    storage = FrameStackStorage(capacity=10)
    state, action, reward, _, done = good_experience()
    with pytest.raises(ValueError, match="shifted"):
        storage.add((state, action, reward, state, done))
    assert storage.state_shape is None and storage.written == 0 and len(storage) == 0
    slot, _ = storage.add(good_experience())
    with pytest.raises(ValueError, match="shifted"):
        storage.add((state, action, reward, state, done))
    assert storage.written == STACK + 1 and len(storage) == 1
    np.testing.assert_array_equal(storage.get(np.array([slot]))[3][0], good_experience()[3])


def test_later_experiences_must_keep_the_first_shape():
    storage = FrameStackStorage(capacity=10)
    storage.add(good_experience())
    small = np.zeros((42, 42, STACK), np.uint8)
    with pytest.raises(ValueError, match="shape"):
        storage.add((small, 0, 0.0, small, False))


def test_capacity_must_fit_one_stack_and_its_next_frame():
    with pytest.raises(ValueError, match="capacity 4"):
        FrameStackStorage(capacity=4).add(good_experience())
    for capacity in (1, 2.0, True):
        with pytest.raises(ValueError, match=f"capacity must be an integer >= 2, got {capacity}"):
            FrameStackStorage(capacity=capacity)
    # Frames stacked last (Atari's) or single frames (MinAtar's): the stacks this repository has.
    with pytest.raises(ValueError, match=r"stack_axis must be -1 .* or None, got 0"):
        FrameStackStorage(capacity=10, stack_axis=0)


def test_get_refuses_slots_without_a_transition():
    storage = FrameStackStorage(capacity=10)
    slot, _ = storage.add(good_experience())
    with pytest.raises(ValueError, match="hold no transition"):
        storage.get(np.array([slot + 1]))
    with pytest.raises(ValueError, match="slots must be in"):
        storage.get(np.array([10]))


def test_load_state_dict_refuses_another_capacity_and_names_missing_arrays():
    arrays = FrameStackStorage(capacity=10).state_dict()
    with pytest.raises(ValueError, match="saved capacity is 10, but this memory has 11"):
        FrameStackStorage(capacity=11).load_state_dict(arrays)
    del arrays["frames"], arrays["dones"]
    with pytest.raises(ValueError, match=r"saved frame stack storage lacks \['frames', 'dones'\]"):
        FrameStackStorage(capacity=10).load_state_dict(arrays)


def test_load_state_dict_refuses_another_stack_axis_and_changes_nothing():
    # Atari's stacks (-1) and MinAtar's single frames (None) read their frames differently: a
    # storage keeps its own axis and refuses another game's, before anything changes.
    stacked = FrameStackStorage(capacity=10)
    stacked.add(good_experience())
    single = FrameStackStorage(capacity=10, stack_axis=None)
    single.add(good_experience())
    for storage, other, saved, own in ((stacked, single, r"\[\]", r"\[-1\]"),
                                       (single, stacked, r"\[-1\]", r"\[\]")):
        before = {key: value.copy() for key, value in storage.state_dict().items()}
        with pytest.raises(ValueError, match=f"saved stack_axis {saved} differs from this "
                                             f"storage's {own}"):
            storage.load_state_dict(other.state_dict())
        after = storage.state_dict()
        assert before.keys() == after.keys()
        assert all(np.array_equal(before[key], after[key]) for key in before)
    arrays = stacked.state_dict()
    with pytest.raises(ValueError, match=r"saved stack_axis \[0\] differs from this storage's"):
        FrameStackStorage(capacity=10).load_state_dict({**arrays, "stack_axis": np.array([0])})
    FrameStackStorage(capacity=10).load_state_dict(arrays)  # its own axis loads


# --- FrameStackStorage inside PER.py's memories


class RecordingStorage(FrameStackStorage):
    """FrameStackStorage that remembers what its last add returned, for the test's bookkeeping."""

    def add(self, experience, stream=0):
        self.last_add = super().add(experience, stream)
        return self.last_add


MEMORIES = registered_memories()  # every replay variant, by name
FRAME_MEMORIES = [kind for kind, memory in MEMORIES.items() if holds_frames(memory)]


def make_memory(kind: str, storage: FrameStackStorage, n_step: int = 1, gamma: float = 0.99):
    return MEMORIES[kind](storage.capacity, storage=storage, rng=0, n_step=n_step, gamma=gamma)


def n_step_reference(transitions: list[tuple], start: int, held: set[int], n_step: int,
                     gamma: float) -> tuple[float, np.ndarray, bool, float]:
    """(return, next_state, done, discount) of the n-step chain from transitions[start].

    Written from the definition: follow the run's own transition list while the episode goes on
    and the next transition is still held, for at most n_step transitions.
    """
    total, index = 0.0, start
    for k in range(n_step):
        _, _, reward, next_state, done, _ = transitions[index]
        total += gamma**k * reward
        following = index + 1
        if (done or k == n_step - 1 or following == len(transitions)
                or transitions[following][5] or following not in held):
            return total, next_state, done, gamma ** (k + 1)
        index = following
    raise AssertionError("unreachable")


@pytest.mark.parametrize("n_step", [1, 3])
@pytest.mark.parametrize("kind", FRAME_MEMORIES)
def test_memories_sample_only_complete_correct_transitions(kind, n_step):
    env = ChannelsLast(FrameStackObservation(RandomEpisodesEnv(), STACK))
    transitions = collect(env, steps=300, seed=6)
    storage = RecordingStorage(capacity=37)
    gamma = 0.9
    memory = make_memory(kind, storage, n_step, gamma)
    errors_rng = np.random.default_rng(7)
    held: dict[int, int] = {}
    for index, (state, action, reward, next_state, done, _) in enumerate(transitions):
        memory.store((state, action, reward, next_state, done))
        slot, freed = storage.last_add
        for freed_slot in freed.tolist():
            del held[freed_slot]
        held[slot] = index
        assert len(memory) == len(held)
        indices, batch, is_weights = memory.sample(16)
        slots = memory.slots_of(indices)
        assert all(slot in held for slot in slots.tolist()), "sampled a freed or empty slot"
        states, actions, rewards, next_states, dones, discounts = batch
        assert states.shape == next_states.shape == (16, 84, 84, STACK)
        assert is_weights.dtype == np.float32 and np.all((is_weights > 0) & (is_weights <= 1))
        held_indices = set(held.values())
        for row, slot in enumerate(slots.tolist()):
            state, action, *_ = transitions[held[slot]]
            n_step_return, next_state, done, discount = n_step_reference(
                transitions, held[slot], held_indices, n_step, gamma)
            np.testing.assert_array_equal(states[row], state)
            np.testing.assert_array_equal(next_states[row], next_state)
            assert (actions[row], dones[row]) == (action, done)
            assert rewards[row] == pytest.approx(n_step_return, rel=1e-6)
            assert discounts[row] == pytest.approx(discount, rel=1e-6)
        # Large errors make stale priorities matter: a freed slot left with one would be drawn.
        memory.batch_update(indices, errors_rng.uniform(0, 5, size=16))


@pytest.mark.parametrize("kind", MEMORIES)
def test_every_memory_samples_only_what_its_slots_hold(kind):
    # Given more transitions than it has slots, each memory draws every row from a slot that
    # holds the transition `store` last put there (a ring's newest, a reservoir's kept ones).
    memory = MEMORIES[kind](16, rng=0)
    in_slot: dict[int, int] = {}
    for i in range(60):
        slot = memory.store(experience(i))
        if slot is not None:
            in_slot[slot] = i
        indices, (states, actions, rewards, next_states, dones, _), _ = memory.sample(8)
        for row, slot in enumerate(memory.slots_of(indices).tolist()):
            state, action, reward, next_state, done = experience(in_slot[slot])
            np.testing.assert_array_equal(states[row], state)
            np.testing.assert_array_equal(next_states[row], next_state)
            assert (actions[row], rewards[row], dones[row]) == (action, reward, done)
        memory.batch_update(indices, np.abs(np.sin(indices + i)))
    assert len(in_slot) == len(memory) == 16


def test_first_outside_finds_the_first_value_out_of_range_nan_included():
    assert first_outside(np.array([3, 4, 6]), 3, 6) == -1  # both bounds inside
    assert first_outside(np.array([3, 7, 2]), 3, 6) == 1
    assert first_outside(np.zeros(0), 0.0, 1.0) == -1
    for bad in (np.nan, np.inf, -1e-300):
        assert first_outside(np.array([0.0, 1.0, bad, np.nan]), 0.0, 1e308) == 2


def test_first_bad_pair_finds_the_first_index_or_value_out_of_range():
    assert first_bad_pair(np.array([3, 6]), 3, 6, np.array([0.0, 1e308])) == -1
    assert first_bad_pair(np.array([3, 7, 2]), 3, 6, np.zeros(3)) == 1
    assert first_bad_pair(np.array([3, 4, 9]), 3, 6, np.array([0.0, np.nan, 0.0])) == 1
    for bad in (np.nan, np.inf, -1e-300):
        assert first_bad_pair(np.array([3, 3, 3]), 3, 6, np.array([0.0, 1.0, bad])) == 2
    assert first_bad_pair(np.zeros(0, np.int64), 0, 3, np.zeros(0)) == -1


def test_check_indices_names_the_first_bad_index_or_value():
    leaves, values = check_indices(np.array([[3], [6]], dtype=np.uint32), [0.0, 2.5], range(3, 7))
    assert leaves.dtype == np.int64 and values.dtype == np.float64
    np.testing.assert_array_equal(leaves, [3, 6])
    with pytest.raises(ValueError, match=r"^tree index must be in 3\.\.6, got 7$"):
        check_indices(np.array([3, 7, 2]), [0.0, 0.0, 0.0], range(3, 7))
    with pytest.raises(ValueError, match=r"^priority must be finite and >= 0, got -2\.0$"):
        check_indices(np.array([3, 4]), [1.0, -2.0], range(3, 7), value_name="priority")
    # The first bad pair decides: its index, then its value.
    with pytest.raises(ValueError, match=r"^slot must be in 0\.\.3, got 4$"):
        check_indices(np.array([0, 4]), [0.0, np.nan], range(4), "slot")
    with pytest.raises(ValueError, match=r"^absolute TD error must be finite and >= 0, got nan$"):
        check_indices(np.array([0, 1, 9]), [0.0, np.nan, 0.0], range(4), "slot")


def test_both_storages_offer_what_a_memory_may_ask():
    # Every member of the protocol, on both storages; only TransitionStorage writes a chosen slot.
    members = [name for name in vars(ReplayStorage) if not name.startswith("_")]
    assert {"add", "holds", "held_slots", "get", "capacity", "written"} <= {
        *members, *ReplayStorage.__annotations__}
    for storage in (TransitionStorage(4), FrameStackStorage(4)):
        assert isinstance(storage, ReplayStorage)
        for name in members:
            assert callable(getattr(storage, name)), name
    assert isinstance(TransitionStorage(4), SlotStorage)
    assert not isinstance(FrameStackStorage(4), SlotStorage)


def test_a_transition_storage_replaces_a_chosen_slot_and_keeps_its_ring():
    storage = TransitionStorage(4)
    for i in range(3):
        storage.add(experience(i))
    storage.put(1, experience(7))
    states, actions, rewards, next_states, dones = storage.get(np.arange(3))
    np.testing.assert_array_equal(states[:, 0], [0, 7, 2])
    np.testing.assert_array_equal(next_states[:, 0], [1, 8, 3])
    assert rewards.tolist() == [0.0, 7.0, 2.0] and actions.tolist() == [0, 1, 0]
    assert dones.tolist() == [True, False, False]
    assert storage.written == 3 and len(storage) == 3
    slot, freed = storage.add(experience(3))  # the ring goes on where it was
    assert slot == 3 and freed.size == 0
    np.testing.assert_array_equal(storage.holds(np.array([0, 3])), [True, True])
    np.testing.assert_array_equal(storage.held_slots(), [0, 1, 2, 3])
    assert storage.add(experience(4))[0] == 0
    for slot in (4, -1):
        with pytest.raises(ValueError, match=f"slot {slot} was never written"):
            storage.put(slot, experience(9))
    with pytest.raises(ValueError, match=r"state has shape \(2,\)"):
        storage.put(0, (np.zeros(2, np.float32), 0, 0.0, np.zeros(2, np.float32), False))
    assert storage.get(np.array([0]))[0][0, 0] == 4  # nothing written


def test_a_transition_storage_types_its_columns_whatever_the_first_transition_gives():
    # An environment's first reward of 0 (an int), an int32 action and an integer done must not
    # type the columns: a later reward of 0.5 is kept as 0.5, not cut to 0.
    storage = TransitionStorage(3)
    state = np.zeros(2, np.float32)
    storage.add((state, np.int32(1), 0, state, 0))
    storage.add((state, 2, 0.5, state, True))
    states, actions, rewards, _, dones = storage.get(np.arange(2))
    assert (rewards.tolist(), actions.tolist(), dones.tolist()) == ([0.0, 0.5], [1, 2],
                                                                    [False, True])
    assert (actions.dtype, rewards.dtype, dones.dtype, states.dtype) == (
        np.int64, np.float64, np.bool_, np.float32)


# --- Episode ends, recorded where the caller says, not guessed from states


def truncated_then_reset_to_its_last_state(frames: bool) -> list[tuple[tuple, bool]]:
    """(transition, whether its episode ended with it): an episode of two steps cut by a time
    limit (not done), then a new one whose reset state equals that episode's last next_state,
    as a reset may give. Rewards 1, 2, then 100, 200. Vectors: float32 (2,); frames: uint8
    stacks of two 1x1 frames, each next state its state shifted by one frame."""
    def state(*values: int) -> np.ndarray:
        if frames:
            return np.array(values, np.uint8).reshape(1, 1, 2)
        return np.array(values, np.float32)

    return [((state(0, 1), 0, 1.0, state(1, 2), False), False),
            ((state(1, 2), 1, 2.0, state(2, 3), False), True),  # truncated
            ((state(2, 3), 2, 100.0, state(3, 4), False), False),  # reset to the last state
            ((state(3, 4), 0, 200.0, state(4, 5), False), False)]


@pytest.mark.parametrize("frames", [False, True], ids=["vectors", "frame stacks"])
def test_an_n_step_return_stops_where_the_caller_said_the_episode_ended(frames):
    memory = registered_memories()["uniform"](
        8, storage=FrameStackStorage(8) if frames else TransitionStorage(8), rng=0, n_step=3,
        gamma=0.5)
    slots, transitions = [], truncated_then_reset_to_its_last_state(frames)
    for transition, ended in transitions:
        slots.append(memory.store(transition))
        if ended:
            memory.end_episode()
    _, _, returns, next_states, dones, discounts = memory.n_step_batch(np.array(slots))
    # The first episode's returns take its own rewards only (guessed from states, the first
    # would have been 1 + 2/2 + 100/4 and run on into the next episode).
    np.testing.assert_array_equal(returns, [1 + 2 / 2, 2, 100 + 200 / 2, 200])
    np.testing.assert_array_equal(discounts, np.float32([0.25, 0.5, 0.25, 0.5]))
    last_next_state = transitions[1][0][3]
    np.testing.assert_array_equal(next_states[:2], [last_next_state, last_next_state])
    assert not dones.any()
    if frames:  # the new episode's state written anew: its own stack, not the ended one's frames
        assert slots[2] - slots[1] == 3


@pytest.mark.parametrize("storage_class", [TransitionStorage, FrameStackStorage])
def test_episode_ends_survive_a_state_dict_and_an_overwritten_slot_forgets_its_end(
        storage_class):
    frames = storage_class is FrameStackStorage
    transitions = [transition for transition, _ in truncated_then_reset_to_its_last_state(frames)]
    storage = storage_class(8)
    storage.add(transitions[0])
    storage.add(transitions[1])
    storage.end_episode()  # truncated
    restored = storage_class(8)
    restored.load_state_dict(save_and_load(storage.state_dict()))
    transition = transitions[2]  # its state is the ended episode's last next_state
    slot, _ = restored.add(transition)
    restored.add(transitions[3])
    first = slot - (3 if frames else 1)  # the ended episode's last transition
    np.testing.assert_array_equal(restored.next_in_episode(np.array([first, slot])),
                                  [False, True])
    with pytest.raises(ValueError, match=r"stream must be an integer in 0\.\.0"):
        restored.end_episode(1)
    if not frames:
        ring = TransitionStorage(2)
        ring.add(transition)
        ring.end_episode()
        ring.add(transition)
        ring.add(transition)  # overwrites slot 0: a new transition, its episode not ended
        ring.add(transition)
        np.testing.assert_array_equal(ring.next_in_episode(np.array([0])), [True])
