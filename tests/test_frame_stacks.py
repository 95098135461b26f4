"""d3qn_utils/frame_stacks.py: the compiled gather of 4-frame stacks gives exactly the arrays of
the readable numpy one, alone and in a frame-stack memory's draws over one stream and several."""

from __future__ import annotations

import numpy as np
import pytest

from d3qn_utils import frame_stacks, replay_storage
from d3qn_utils.frame_stacks import (
    frames_shifted_by_one,
    gather_stacks,
    shifted_by_one_frame,
    stacks_by_position,
)
from d3qn_utils.replay_storage import FrameStackStorage
from PER import Memory

FRAME_SHAPE = (7, 5)  # odd sides: no row or word boundary lines up by chance


def random_frames(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, *FRAME_SHAPE), dtype=np.uint8)


def test_the_packed_gather_gives_each_stacks_frames_in_order():
    frames = random_frames(30)
    stack_slots = np.random.default_rng(1).integers(0, 30, (9, 4))
    stacks = gather_stacks(frames, stack_slots)
    assert stacks.shape == (9, *FRAME_SHAPE, 4) and stacks.dtype == np.uint8
    expected = np.stack([frames[stack_slots[:, p]] for p in range(4)], axis=-1)
    np.testing.assert_array_equal(stacks, expected)
    np.testing.assert_array_equal(stacks, stacks_by_position(frames, stack_slots))
    assert gather_stacks(frames, stack_slots[:0]).shape == (0, *FRAME_SHAPE, 4)


@pytest.mark.parametrize("stack_size", [1, 2, 3, 5])
def test_other_stack_sizes_take_the_numpy_gather(stack_size):
    frames = random_frames(12)
    stack_slots = np.random.default_rng(2).integers(0, 12, (6, stack_size))
    expected = np.stack([frames[stack_slots[:, p]] for p in range(stack_size)], axis=-1)
    np.testing.assert_array_equal(gather_stacks(frames, stack_slots), expected)


def filled_memory(streams: int) -> Memory:
    """A 3-step proportional memory of 4-frame stacks in `streams` streams, given episodes of
    1..9 random frames in each stream in turn (streams at their own pace, rings wrapped)."""
    rng = np.random.default_rng(3)
    capacity = 40 * streams
    memory = Memory(capacity, storage=FrameStackStorage(capacity, streams=streams), rng=0,
                    n_step=3, gamma=0.9)
    stacks: list[np.ndarray | None] = [None] * streams
    left = [0] * streams
    for step in range(150 * streams):
        stream = step % streams
        if step % 5 == 4 and stream > 0:  # the others step less often than stream 0
            continue
        if stacks[stream] is None:
            stacks[stream] = np.moveaxis(rng.integers(0, 256, (4, *FRAME_SHAPE), np.uint8), 0,
                                         -1).copy()
            left[stream] = int(rng.integers(1, 10))
        frame = rng.integers(0, 256, (*FRAME_SHAPE, 1), np.uint8)
        next_stack = np.concatenate([stacks[stream][..., 1:], frame], axis=-1)
        left[stream] -= 1
        memory.store((stacks[stream], int(rng.integers(3)), float(rng.normal()), next_stack,
                      left[stream] == 0 and step % 3 == 0), stream)
        stacks[stream] = None if left[stream] == 0 else next_stack
    return memory


@pytest.mark.parametrize("streams", [1, 3])
def test_a_memory_draws_the_same_batches_with_the_packed_gather_as_with_numpys(streams,
                                                                               monkeypatch):
    memory = filled_memory(streams)
    packed_calls = []
    pack_four = frame_stacks._pack_four
    monkeypatch.setattr(frame_stacks, "_pack_four",
                        lambda *arrays: packed_calls.append(1) or pack_four(*arrays))
    rng_state, beta = memory.rng.bit_generator.state, memory.beta
    packed = memory.sample(64)
    assert packed_calls  # the compiled path gathered this batch
    memory.rng.bit_generator.state, memory.beta = rng_state, beta
    monkeypatch.setattr(replay_storage, "gather_stacks", stacks_by_position)
    readable = memory.sample(64)
    np.testing.assert_array_equal(packed[0], readable[0])
    for packed_column, readable_column in zip(packed[1], readable[1], strict=True):
        np.testing.assert_array_equal(packed_column, readable_column)
    states, next_states = packed[1][0], packed[1][3]
    assert states.shape == (64, *FRAME_SHAPE, 4) and next_states.shape == states.shape


def shifted_pair(stack_size: int, seed: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """A random stack of `stack_size` frames and the next one, shifted by a new frame."""
    frames = random_frames(stack_size + 1, seed)
    return (np.ascontiguousarray(np.moveaxis(frames[:-1], 0, -1)),
            np.ascontiguousarray(np.moveaxis(frames[1:], 0, -1)))


@pytest.mark.parametrize("stack_size", [4, 3, 1])
def test_the_shift_check_finds_each_changed_shared_byte_as_numpys(stack_size):
    state, next_state = shifted_pair(stack_size)
    assert shifted_by_one_frame(state, next_state) and frames_shifted_by_one(state, next_state)
    for frame in range(stack_size):
        for changed, other in ((state, next_state), (next_state, state)):
            broken = changed.copy()
            broken[3, 2, frame] ^= 0x80  # a high bit: it would cross into the next byte if shifted
            pair = (broken, other) if changed is state else (other, broken)
            # Only frames both stacks share count: state's first and next_state's last do not.
            shared = frame > 0 if changed is state else frame < stack_size - 1
            assert shifted_by_one_frame(*pair) is not shared
            assert frames_shifted_by_one(*pair) is not shared


def test_the_shift_check_of_strided_stacks_takes_numpys_path():
    state, next_state = shifted_pair(4)
    wide, wide_next = np.tile(state, (1, 2, 1)), np.tile(next_state, (1, 2, 1))
    assert shifted_by_one_frame(wide[:, ::2], wide_next[:, ::2])  # not contiguous
    wide[0, 2, 1] += 1
    assert not shifted_by_one_frame(wide[:, ::2], wide_next[:, ::2])


def test_a_frame_storage_refuses_a_next_state_not_shifted_by_one_frame_and_stores_nothing():
    storage = FrameStackStorage(12)
    state, next_state = shifted_pair(4)
    storage.add((state, 1, 0.0, next_state, False))
    bad = next_state.copy()
    bad[0, 0, 1] ^= 1  # next_state's frame 1 is state's frame 2
    with pytest.raises(ValueError, match="next_state must be state shifted by one frame"):
        storage.add((next_state, 0, 1.0, np.concatenate([bad[..., 1:], bad[..., :1]], -1),
                     False))
    assert len(storage) == 1 and storage.written == 5
