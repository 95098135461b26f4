"""What the replay-memory tests share: small transitions, frame stacks, memories filled with
them, copies of a memory's state to compare, and the replay variants to check: d3qn_agent's
REPLAY_MEMORIES with a reservoir-sampling memory registered, a variant defined here."""

import contextlib
import io
import re
from collections.abc import Iterator

import numpy as np
import pytest

from d3qn_utils.checks import check_transition
from d3qn_utils.replay_memory import ReplayMemory
from d3qn_utils.replay_storage import (
    FrameStackStorage,
    SlotStorage,
    saved_stream_values,
    stream_values,
)
from PER import UniformMemory


class ReservoirMemory(UniformMemory):
    """Uniform replay over a reservoir (Vitter's Algorithm R) per stream: once a stream's
    segment of slots is full, its i-th transition replaces a uniformly drawn slot of the segment
    with probability size / i, so the memory holds a uniform sample of every transition given
    to each stream instead of the newest ones."""

    kind = "reservoir"
    RUN_SUFFIX = "_reservoir"
    WRITES_RING = False

    def __init__(self, capacity: int, storage: SlotStorage | None = None, **options) -> None:
        super().__init__(capacity, storage, **options)
        if not isinstance(self.storage, SlotStorage):
            raise ValueError("a reservoir writes the slots it draws: it needs a SlotStorage")
        self.seen = np.zeros(self.streams, dtype=np.int64)  # transitions given to each stream

    def store(self, experience: tuple, stream: int = 0) -> int | None:
        """The transition's slot, or None when the draw drops it (`ReplayMemory.store`); a
        transition `check_transition` refuses, or a stream the memory lacks, changes nothing,
        not even the odds."""
        experience = check_transition(experience)
        segment = self.storage.segment(stream)
        self.seen[stream] += 1
        if self.seen[stream] <= len(segment):
            return super().store(experience, stream)
        slot = int(self.rng.integers(self.seen[stream]))
        if slot >= len(segment):
            return None
        self.storage.put(segment[slot], experience)
        return segment[slot]

    def state_dict(self) -> dict[str, np.ndarray]:
        """The memory's state and how many transitions each stream was given (the draws' odds)."""
        return {**super().state_dict(), "seen": stream_values(self.seen)}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        self.check_state(arrays, ("seen",))
        seen = saved_stream_values(arrays, "seen", self.streams)
        super().load_state_dict(arrays)
        self.seen = seen


def registered_memories() -> dict[str, type[ReplayMemory]]:
    """d3qn_agent.REPLAY_MEMORIES with `ReservoirMemory` registered in a copy: every variant the
    memory tests check, by name."""
    from d3qn_agent import REPLAY_MEMORIES

    return {**REPLAY_MEMORIES, ReservoirMemory.kind: ReservoirMemory}


def holds_frames(memory: type[ReplayMemory]) -> bool:
    """Whether a memory of this class can keep its transitions in a `FrameStackStorage` (a
    reservoir cannot: it writes the slots it draws)."""
    try:
        memory(4, storage=FrameStackStorage(4))
    except ValueError:
        return False
    return True


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


@contextlib.contextmanager
def picked(kind: str) -> Iterator[None]:
    """While open, the agent's flags (`variant_flags(kind)`) pick `kind`, a variant of
    `registered_memories()`: a shipped one by its own flags; the reservoir by taking over the
    proportional memory's pair (a real variant would add a flag to settings.D3QN_FLAGS and a pair
    to VARIANT_PICKS)."""
    import d3qn_agent
    from d3qn_utils import replay_memory

    if kind in d3qn_agent.REPLAY_MEMORIES:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(d3qn_agent.REPLAY_MEMORIES, kind, registered_memories()[kind])
        patch.setitem(replay_memory.VARIANT_PICKS, (True, False), kind)
        yield
