"""`FrameStackStorage`'s work on stacked observations (d3qn_utils/replay_storage.py), as numpy
reads it and, for 4-frame stacks (Atari's), a faster way to the same results.

A stack of S frames is stored as S frames in S slots; a batch of n stacks, shape (n, H, W, S),
takes frame p of stack i from slot `stack_slots[i, p]`. `stacks_by_position` is that as numpy
reads it: one gather per position p, written into the strided view out[..., p]. Writing one byte
in every S is slow in numpy (Pong's draw of 32 stacks of 84x84x4 spent most of its time there),
so `gather_stacks` builds the S = 4 case in one pass compiled by numba: the 4 bytes of a pixel's
stack packed into one uint32 word and written at once. Both give the same array (the tests
compare them); other stack sizes take the numpy path.

Each stored transition's next state must be its state shifted by one frame:
`shifted_by_one_frame` compares a 4-frame stack's pixels as uint32 words, in one pass; other
stacks take `frames_shifted_by_one`, the frames copied out and compared (the tests check that
both answer alike).
"""

from __future__ import annotations

import math
import sys

import numba
import numpy as np

PACKED_STACK_SIZE = 4  # frames per stack that `gather_stacks` packs into one uint32 per pixel


def gather_stacks(frames: np.ndarray, stack_slots: np.ndarray) -> np.ndarray:
    """The stacks whose frames are in `stack_slots` (n, S), oldest first: shape
    (n, *frames.shape[1:], S), out[i, ..., p] = frames[stack_slots[i, p]]. uint8 `frames` (one
    frame a row), slots in range."""
    if (stack_slots.shape[1] == PACKED_STACK_SIZE and frames.dtype == np.uint8
            and frames.flags.c_contiguous and sys.byteorder == "little"):
        pixels = math.prod(frames.shape[1:])
        stacks = np.empty((len(stack_slots), *frames.shape[1:], PACKED_STACK_SIZE), np.uint8)
        # Little-endian: the word's lowest byte is the stack's first (oldest) frame.
        words = stacks.reshape(len(stack_slots), pixels * PACKED_STACK_SIZE).view(np.uint32)
        _pack_four(frames.reshape(len(frames), pixels), stack_slots.astype(np.int64), words)
        return stacks
    return stacks_by_position(frames, stack_slots)


def stacks_by_position(frames: np.ndarray, stack_slots: np.ndarray) -> np.ndarray:
    """`gather_stacks` as numpy reads it: one gather per frame position, each written straight
    into its place (no transpose after)."""
    stacks = np.empty((len(stack_slots), *frames.shape[1:], stack_slots.shape[1]), frames.dtype)
    for position in range(stack_slots.shape[1]):
        stacks[..., position] = frames[stack_slots[:, position]]
    return stacks


def shifted_by_one_frame(state: np.ndarray, next_state: np.ndarray) -> bool:
    """Whether frames 1.. of `state` are frames ..S-2 of `next_state` (S frames stacked on the
    last axis): two uint8 arrays of one shape. A 4-frame stack is one uint32 word a pixel, the
    oldest frame in its lowest byte: state's top 3 bytes against next_state's low 3."""
    if (state.shape[-1] == PACKED_STACK_SIZE and sys.byteorder == "little"
            and state.flags.c_contiguous and next_state.flags.c_contiguous):
        words, next_words = state.view(np.uint32), next_state.view(np.uint32)
        return np.array_equal(words >> 8, next_words & 0x00FFFFFF)
    return frames_shifted_by_one(state, next_state)


def frames_shifted_by_one(state: np.ndarray, next_state: np.ndarray) -> bool:
    """`shifted_by_one_frame` as numpy reads it: contiguous copies of the frames first, compared
    in one pass (not through strided views)."""
    return np.array_equal(np.array(np.moveaxis(state, -1, 0)[1:]),
                          np.array(np.moveaxis(next_state, -1, 0)[:-1]))


@numba.njit(cache=True)
def _pack_four(frames, stack_slots, words):  # pragma: no cover (compiled)
    """words[i, j] = pixel j of the frames of stack_slots[i, 0..3], the first in the lowest
    byte: on a little-endian machine, the bytes of stack i's pixel j in stack order."""
    for i in range(stack_slots.shape[0]):
        first, second = frames[stack_slots[i, 0]], frames[stack_slots[i, 1]]
        third, fourth = frames[stack_slots[i, 2]], frames[stack_slots[i, 3]]
        row = words[i]
        for j in range(row.size):
            row[j] = (np.uint32(first[j]) | (np.uint32(second[j]) << 8)
                      | (np.uint32(third[j]) << 16) | (np.uint32(fourth[j]) << 24))
