"""d3qn_utils/stack_gather.py: the compiled gather of 4-frame stacks gives exactly the arrays of
the readable numpy one, alone and in a frame-stack memory's draws over one stream and several."""

from __future__ import annotations

import numpy as np
import pytest

from d3qn_utils import replay_storage, stack_gather
from d3qn_utils.replay_storage import FrameStackStorage
from d3qn_utils.stack_gather import gather_stacks, stacks_by_position
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
    pack_four = stack_gather._pack_four
    monkeypatch.setattr(stack_gather, "_pack_four",
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
