"""What the replay-memory tests share: small transitions, frame stacks, memories filled with
them, and copies of a memory's state to compare."""

import io
import re

import numpy as np


def experience(i: int) -> tuple:
    """Transition number i: 3-float states filled with i, action i % 2, reward i."""
    state = np.full(3, i, dtype=np.float32)
    return state, i % 2, float(i), state + 1, i % 3 == 0


def filled_memory(kind: type, n: int, **kwargs) -> object:
    """A memory of class `kind` (capacity n unless given) holding transitions 0..n-1."""
    memory = kind(kwargs.pop("capacity", n), rng=kwargs.pop("rng", 0), **kwargs)
    for i in range(n):
        memory.store(experience(i))
    return memory


def frame_stacks(count: int, stack: int = 2) -> np.ndarray:
    """`count` uint8 stacks of `stack` 2x2 frames, one episode: stack i + 1 is stack i shifted by
    one frame (frames are filled with 1, 2, 3, ...)."""
    frames = np.arange(1, count + stack, dtype=np.uint8)[:, None, None] * np.ones((1, 2, 2),
                                                                               np.uint8)
    return np.stack([np.stack(frames[i:i + stack], axis=-1) for i in range(count)])


def snapshot(memory: object) -> dict[str, np.ndarray]:
    """`memory.state_dict()` copied: its arrays are views of the live memory."""
    return {key: np.array(value, copy=True) for key, value in memory.state_dict().items()}


def states_equal(first: dict, second: dict) -> bool:
    return first.keys() == second.keys() and all(
        np.array_equal(first[key], second[key]) for key in first)


def save_and_load(arrays: dict) -> dict:
    """`arrays` through an .npz file in memory, as a checkpoint stores them."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as saved:
        return dict(saved)


def names_bad(name: str, value: float) -> str:
    """The regex of the message refusing `value` for `name`: "<name> must be finite and >= 0,
    got <value>", the value as Python writes it (nan, inf, -1.0)."""
    return rf"{name} must be finite and >= 0, got {re.escape(repr(float(value)))}$"


def array_bytes(*holders: object) -> int:
    """Bytes of the numpy arrays the objects hold as attributes, alone or in tuples."""
    arrays = [item for holder in holders for value in vars(holder).values()
              for item in (value if isinstance(value, tuple) else (value,))
              if isinstance(item, np.ndarray)]
    return sum(array.nbytes for array in arrays)
