"""Replay storages: where a replay memory keeps the transitions themselves.

`ReplayStorage` is what a memory may ask of its storage; a memory never reads a storage's arrays.
Its memory checked each transition (checks.py); a storage checks only shapes, and frames' dtype
and shift. `TransitionStorage` keeps one row per transition (vector states) and can also replace
the transition of a chosen slot (`SlotStorage`, for a memory that decides where a transition
goes); `FrameStackStorage` keeps each uint8 frame once (Atari: one 84x84 frame a slot, not two
stacks of four; `bytes_per_slot` counts it), written in order only, since neighbouring slots
share frames. `StorageSpec` is a storage class with its options before any storage exists: what
a game family gives, sized (`ReplayMemory.check_fits`) before a run allocates one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from d3qn_utils.checks import FIELDS, check_integer, check_saved_value, require

NO_SLOTS = np.zeros(0, dtype=np.int64)
SLOT_ARRAYS = ("actions", "rewards", "dones", "holds_transition")  # FrameStackStorage's per slot


@runtime_checkable
class ReplayStorage(Protocol):
    """A ring of `capacity` slots that replay memories keep their transitions in: what a memory
    may ask of it. A transition is (state, action, reward, next_state, done); slots are numbered
    0 .. capacity - 1 and the first `written` of them were written at least once."""

    capacity: int
    written: int

    def __len__(self) -> int:
        """The transitions held. O(1)."""

    @staticmethod
    def bytes_per_slot(state_shape: tuple[int, ...], state_dtype: Any, **options: Any) -> int:
        """Bytes per slot of a full storage of these states, made with these keyword `options`
        (the constructor's)."""

    @staticmethod
    def min_capacity(state_shape: tuple[int, ...], **options: Any) -> int:
        """The fewest slots that can hold a transition of these states, with these `options`."""

    def add(self, experience: tuple) -> tuple[int, np.ndarray]:
        """Store one transition at the ring's next slot: (its slot, the slots that stopped
        holding a transition because of it)."""

    def add_block(self, columns: Sequence[np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Store k transitions (five columns of length k) as `add` would one by one, yielding
        (slots written, slots freed) as they go."""

    def holds(self, slots: np.ndarray) -> np.ndarray:
        """Whether each slot holds a transition (bool array). O(k)."""

    def held_slots(self) -> np.ndarray:
        """The slots that hold a transition, ascending. O(capacity)."""

    def get(self, slots: np.ndarray, last_slots: np.ndarray | None = None
            ) -> tuple[np.ndarray, ...]:
        """(states, actions, rewards, next_states, dones) of `slots`, which must hold
        transitions; with `last_slots`, the next_states of those (the end of n-step chains)."""

    def rewards_and_dones(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rewards and dones of `slots`. O(k)."""

    def next_in_episode(self, slots: np.ndarray) -> np.ndarray:
        """Whether slot + 1 holds the transition that followed slot's in its episode."""

    def state_dict(self) -> dict[str, np.ndarray]:
        """The storage as plain arrays."""

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Take back what `state_dict` gave; ValueError if it does not fit this storage."""


@runtime_checkable
class SlotStorage(ReplayStorage, Protocol):
    """A `ReplayStorage` that can also replace the transition of a chosen slot, for a memory
    that decides itself where a transition goes (reservoir sampling, say)."""

    def put(self, slot: int, experience: tuple) -> None:
        """Replace the transition of `slot`, a slot written before. O(state size)."""


class TransitionStorage:
    """One row per transition in five numpy arrays, typed by the first `add`; a ring."""

    def __init__(self, capacity: int) -> None:
        self.capacity = check_integer("capacity", capacity, 1)
        self.holds_transition = np.zeros(self.capacity, dtype=bool)
        self.written = 0  # slots written at least once
        self.write_pointer = 0
        self.fields: tuple[np.ndarray, ...] | None = None

    def __len__(self) -> int:
        return self.written

    @staticmethod
    def bytes_per_slot(state_shape: tuple[int, ...], state_dtype: Any) -> int:
        """Bytes per slot of a full storage: two states, int64 action, float64 reward, 2 flags."""
        return 2 * math.prod(state_shape) * np.dtype(state_dtype).itemsize + 8 + 8 + 1 + 1

    @staticmethod
    def min_capacity(state_shape: tuple[int, ...]) -> int:
        """One slot holds a whole transition."""
        return 1

    def columns(self) -> tuple[np.ndarray, ...]:
        """The five fields of the written rows, in slot order: a block as `add_block` takes it."""
        return tuple(field[: self.written] for field in self.fields)

    def add(self, experience: tuple) -> tuple[int, np.ndarray]:
        """Store one (state, action, reward, next_state, done); return its slot, none freed."""
        self._check_shapes([(np.shape(value), np.asarray(value).dtype) for value in experience])
        return self._put(self.write_pointer, experience, 1), NO_SLOTS

    def add_block(self, columns: Sequence[np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Store k transitions, five columns of length k, as `add` would one by one, in one write;
        yield (their slots, none freed) once. O(k). ValueError, nothing stored, for a bad shape."""
        self._check_shapes([(column.shape[1:], column.dtype) for column in columns])
        k = len(columns[0])
        yield self._put((self.write_pointer + np.arange(k)) % self.capacity, columns, k), NO_SLOTS

    def put(self, slot: int, experience: tuple) -> None:
        """Replace the transition of `slot`, one written before; the ring's next slot stays.
        ValueError, nothing written, for another slot or a bad shape."""
        if not 0 <= slot < self.written:
            raise ValueError(f"slot {slot} was never written (written: {self.written})")
        self._check_shapes([(np.shape(value), np.asarray(value).dtype) for value in experience])
        for field, value in zip(self.fields, experience, strict=True):
            field[slot] = value

    def _put(self, slots: int | np.ndarray, values: Sequence[Any], count: int) -> int | np.ndarray:
        """Write the `count` transitions `values` (a row, or columns) to `slots`, the next ones;
        return `slots`."""
        for field, value in zip(self.fields, values, strict=True):
            field[slots] = value
        self.holds_transition[slots] = True
        self.write_pointer = (self.write_pointer + count) % self.capacity
        self.written = min(self.written + count, self.capacity)
        return slots

    def _check_shapes(self, fields: list[tuple[tuple[int, ...], np.dtype]]) -> None:
        """Allocate the arrays on the first write; ValueError naming a field of another shape."""
        if self.fields is None:
            self.fields = tuple(np.zeros((self.capacity, *shape), dtype=dtype)
                                for shape, dtype in fields)
        for name, field, (shape, _) in zip(FIELDS, self.fields, fields, strict=True):
            if shape != field.shape[1:]:
                raise ValueError(f"{name} has shape {shape}, but the memory holds "
                                 f"{field.shape[1:]}")

    def get(self, slots: np.ndarray, last_slots: np.ndarray | None = None
            ) -> tuple[np.ndarray, ...]:
        """(states, actions, rewards, next_states, dones) of `slots`; with `last_slots`, the
        next_states of those (the end of an n-step chain)."""
        states, actions, rewards, next_states, dones = self.fields
        ends = slots if last_slots is None else last_slots
        return states[slots], actions[slots], rewards[slots], next_states[ends], dones[slots]

    def holds(self, slots: np.ndarray) -> np.ndarray:
        return self.holds_transition[slots]

    def held_slots(self) -> np.ndarray:
        return np.flatnonzero(self.holds_transition)

    def rewards_and_dones(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.fields[2][slots], self.fields[4][slots]

    def next_in_episode(self, slots: np.ndarray) -> np.ndarray:
        """Whether slot+1 holds the transition after slot's, in its episode. O(n * state size)."""
        following = (slots + 1) % self.capacity
        same = self.fields[0][following] == self.fields[3][slots]  # its state, slot's next_state
        same = same.all(axis=tuple(range(1, same.ndim)))
        return same & self.holds_transition[following] & (following != self.write_pointer)

    def state_dict(self) -> dict[str, np.ndarray]:
        """This storage as plain arrays (the written rows only)."""
        return {"capacity": np.array(self.capacity), "written": np.array(self.written),
                "write_pointer": np.array(self.write_pointer),
                **dict(zip(FIELDS, self.columns() if self.fields else (), strict=False))}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore what `state_dict` returned. ValueError if it does not fit this storage."""
        require(arrays, ("capacity", "written", "write_pointer"), "transition storage")
        check_saved_value(arrays, "capacity", self.capacity)
        written = int(arrays["written"])
        if not 0 <= written <= self.capacity:
            raise ValueError(f"saved written={written} is outside 0..{self.capacity}")
        self.fields = None
        if written:
            require(arrays, FIELDS, "transition storage")
            rows = [np.asarray(arrays[name]) for name in FIELDS]
            if any(len(row) != written for row in rows):
                raise ValueError(f"saved fields do not all have {written} rows")
            self._check_shapes([(row.shape[1:], row.dtype) for row in rows])  # allocates
            for field, row in zip(self.fields, rows, strict=True):
                field[:written] = row
        self.written = written
        self.write_pointer = int(arrays["write_pointer"]) % self.capacity
        self.holds_transition[:] = np.arange(self.capacity) < written


class FrameStackStorage:
    """Replay storage for stacked frames that keeps every frame once, as uint8.

    A ring of `capacity` slots. Each slot holds one frame (the newest frame of some observation)
    and the action, reward and done of the transition that starts at that observation. The stack
    of slot k is the frames of slots k-S+1 .. k (S = stack size, mod capacity); its next state is
    the stack of slot k+1. With S = 4, one episode written from slot 10 on looks like:

        slot:     10   11   12   13   14   15   ...  13+T  14+T
        frame:    p0   p1   p2   o0   o1   o2   ...  oT-1  oT
        holds:    -    -    -    t0   t1   t2   ...  tT-1   -
                  '-- prefix --'                          '-- last next state

    where o0 is the newest frame of the reset observation, p0..p2 are its three older frames
    (whatever `FrameStackObservation` padded with), t_i is the transition from observation i to
    i+1, and transition t_i reads slots 10+i .. 14+i. An `add` whose state equals the previous
    next_state writes one slot, any other S+1, so padding at episode starts comes back exactly
    and no earlier episode's frame leaks into a stack. Writing slot w breaks the transitions of
    slots w .. w+S-1 (`add` reports them freed). `stack_axis`: -1, Atari's frames stacked on
    the last axis; None, MinAtar's single frames (S = 1).
    """

    def __init__(self, capacity: int, stack_axis: int | None = -1) -> None:
        self.capacity = check_integer("capacity", capacity, 2)
        if stack_axis is not None and stack_axis != -1:
            raise ValueError(f"stack_axis must be -1 (the last axis) or None, got {stack_axis!r}")
        self.stack_axis = None if stack_axis is None else -1
        self.holds_transition = np.zeros(self.capacity, dtype=bool)
        self.written = 0
        self.actions = np.zeros(self.capacity, dtype=np.int64)
        self.rewards = np.zeros(self.capacity, dtype=np.float32)
        self.dones = np.zeros(self.capacity, dtype=bool)
        # Set by the first add (or load_state_dict), once the states' shape is known:
        self.frames: np.ndarray | None = None  # (capacity, *frame_shape) uint8
        self.state_shape: tuple[int, ...] | None = None
        self.stack_size = 0  # frames per stacked state
        self._next_slot = 0  # the slot the next frame is written to
        self._pending_slot = -1  # slot of the last next_state's newest frame (-1: none)
        self._pending_stack: np.ndarray | None = None  # copy of that next_state, to compare
        self._count = 0  # slots that hold a transition, kept so len() is O(1)

    def __len__(self) -> int:
        return self._count

    @staticmethod
    def bytes_per_slot(state_shape: tuple[int, ...], state_dtype: Any,
                       stack_axis: int | None = -1) -> int:
        """Bytes per slot of a full storage: one frame (a whole state without `stack_axis`),
        int64 action, float32 reward, 2 flags."""
        frames_per_state = 1 if stack_axis is None else state_shape[-1]
        frame = math.prod(state_shape) * np.dtype(state_dtype).itemsize // frames_per_state
        return frame + 8 + 4 + 1 + 1

    @staticmethod
    def min_capacity(state_shape: tuple[int, ...], stack_axis: int | None = -1) -> int:
        """A stack's frames plus its next state's newest frame; two slots without `stack_axis`."""
        return 2 if stack_axis is None else state_shape[-1] + 1

    def add(self, experience: tuple) -> tuple[int, np.ndarray]:
        """Store one transition of uint8 states, next_state being state shifted by one frame:
        its slot and the slots that stopped holding one. ValueError, nothing stored, if bad."""
        state, action, reward, next_state, done = experience
        state, next_state = np.asarray(state), np.asarray(next_state)
        self._check_frames(state, next_state)
        newest = self._frames(next_state)[-1]
        if self._pending_stack is not None and np.array_equal(self._pending_stack, state):
            slot = self._pending_slot  # same episode: the state's frames are in the ring
            freed = self._write([newest])
        else:
            slot = (self._next_slot + self.stack_size - 1) % self.capacity
            freed = self._write([*self._frames(state), newest])
        self.actions[slot] = action
        self.rewards[slot] = reward
        self.dones[slot] = done
        self.holds_transition[slot] = True
        self._count += 1
        self._pending_slot = (slot + 1) % self.capacity
        self._pending_stack = next_state.copy()
        return slot, freed[freed != slot]

    def add_block(self, columns: Sequence[np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """`add` each transition (each shares the frames of the one before), yielding ([its slot],
        the slots it freed); one `add` refuses raises after those before it. O(k * frame size)."""
        for experience in zip(*columns, strict=True):
            slot, freed = self.add(experience)
            yield np.array([slot]), freed

    def get(self, slots: np.ndarray, last_slots: np.ndarray | None = None
            ) -> tuple[np.ndarray, ...]:
        """As `TransitionStorage.get`; a slot that holds no transition raises ValueError."""
        slots = self._checked_slots(slots)
        ends = slots if last_slots is None else self._checked_slots(last_slots)
        return (self._stacks(slots), self.actions[slots], self.rewards[slots],
                self._stacks((ends + 1) % self.capacity), self.dones[slots])

    def holds(self, slots: np.ndarray) -> np.ndarray:
        return self.holds_transition[slots]

    def held_slots(self) -> np.ndarray:
        return np.flatnonzero(self.holds_transition)

    def rewards_and_dones(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.rewards[slots], self.dones[slots]

    def next_in_episode(self, slots: np.ndarray) -> np.ndarray:
        """As `TransitionStorage.next_in_episode`: whether slot+1 holds a transition. O(n)."""
        return self.holds_transition[(slots + 1) % self.capacity]

    def _checked_slots(self, slots: np.ndarray) -> np.ndarray:
        """`slots`, or ValueError naming those outside the ring or holding no transition (their
        frames may be other transitions' by now)."""
        if slots.size and (slots.min() < 0 or slots.max() >= self.capacity):
            raise ValueError(f"slots must be in [0, {self.capacity}), got {slots}")
        missing = slots[~self.holds_transition[slots]]
        if missing.size:
            raise ValueError(f"slots {missing} hold no transition")
        return slots

    def state_dict(self) -> dict[str, np.ndarray]:
        """This storage as plain arrays (the written slots' frames only)."""
        frames = self.frames[: self.written] if self.frames is not None else np.zeros(0, np.uint8)
        return {"capacity": np.array(self.capacity),
                "stack_axis": np.array([] if self.stack_axis is None else [-1], np.int64),
                "state_shape": np.array(self.state_shape or (), np.int64),
                "written": np.array(self.written), "next_slot": np.array(self._next_slot),
                "frames": frames, "pending_slot": np.array(self._pending_slot),
                **{name: getattr(self, name).copy() for name in SLOT_ARRAYS}}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore what `state_dict` returned; the capacity must match this storage's."""
        require(arrays, ("capacity", "stack_axis", "state_shape", "next_slot", "pending_slot",
                         "written", "frames", *SLOT_ARRAYS), "frame stack storage")
        check_saved_value(arrays, "capacity", self.capacity)
        written = int(arrays["written"])
        shape = tuple(int(n) for n in arrays["state_shape"])
        frames = np.asarray(arrays["frames"])
        if not 0 <= written <= self.capacity or (shape and frames.shape[0] != written):
            raise ValueError(f"saved written={written} does not match frames {frames.shape}")
        saved_axis = np.asarray(arrays["stack_axis"]).reshape(-1).tolist()  # [] for None
        if saved_axis not in ([], [-1]):
            raise ValueError(f"saved stack_axis {saved_axis} is neither [-1] nor [] (none)")
        self.stack_axis = -1 if saved_axis else None
        self.frames, self.state_shape, self._pending_stack = None, None, None
        if shape:
            self._allocate(shape)
            self.frames[:written] = frames
        self.written = written
        self._next_slot = int(arrays["next_slot"])
        self._pending_slot = int(arrays["pending_slot"])
        if self._pending_slot >= 0:
            self._pending_stack = self._stacks(np.array([self._pending_slot]))[0]
        for name in SLOT_ARRAYS:
            getattr(self, name)[:] = arrays[name]
        self._count = int(self.holds_transition.sum())

    def _check_frames(self, state: np.ndarray, next_state: np.ndarray) -> None:
        """ValueError naming a state that is not uint8 frames of the shape, or a next_state that
        is not state shifted by one frame; allocate on the first transition."""
        shape = state.shape if self.state_shape is None else self.state_shape
        for name, value in (("state", state), ("next_state", next_state)):
            if value.dtype != np.uint8:
                raise ValueError(f"{name} must be uint8 frames, got dtype {value.dtype}")
            if value.shape != shape:
                raise ValueError(f"{name} shape {value.shape} != expected {shape}")
        first = self.state_shape is None  # the first transition sets the shape: check capacity
        if first and self.capacity < self.min_capacity(shape, self.stack_axis):
            raise ValueError(f"capacity {self.capacity} cannot hold one stack of {shape[-1]} "
                             "frames plus its next frame")
        # Contiguous copies first (np.array): compared in one pass, not through strided views.
        if not np.array_equal(np.array(self._frames(state)[1:]),
                              np.array(self._frames(next_state)[:-1])):
            raise ValueError("next_state must be state shifted by one frame along the last axis "
                             "(as frame stacking produces)")
        if first:
            self._allocate(shape)

    def _allocate(self, state_shape: tuple[int, ...]) -> None:
        """Allocate the frame ring (np.zeros: untouched pages take no memory)."""
        self.state_shape = tuple(state_shape)
        frame_shape = state_shape if self.stack_axis is None else state_shape[:-1]
        self.frames = np.zeros((self.capacity, *frame_shape), dtype=np.uint8)
        self.stack_size = 1 if self.stack_axis is None else state_shape[-1]

    def _frames(self, stacks: np.ndarray) -> list[np.ndarray]:
        """Views of the frames of `stacks` (a state, or a batch of them), oldest first."""
        if self.stack_axis is None:
            return [stacks]
        return [stacks[..., i] for i in range(stacks.shape[-1])]

    def _stacks(self, slots: np.ndarray) -> np.ndarray:
        """The stacked observations whose newest frames are in `slots`, shape (n, *state_shape)."""
        if self.stack_axis is None:
            return self.frames[slots]
        stacks = np.empty((len(slots), *self.state_shape), dtype=np.uint8)
        # One gather per frame position, each written straight into its place: no transpose after.
        for position, frames in enumerate(self._frames(stacks)):
            frames[...] = self.frames[(slots + position - self.stack_size + 1) % self.capacity]
        return stacks

    def _write(self, frames: list[np.ndarray]) -> np.ndarray:
        """Write `frames` to the next slots; return the slots whose transitions this broke."""
        start = self._next_slot
        span = min(len(frames) + self.stack_size - 1, self.capacity)
        readers = (start + np.arange(span)) % self.capacity
        broken = readers[self.holds_transition[readers]]
        self.holds_transition[broken] = False
        self._count -= broken.size
        for offset, frame in enumerate(frames):
            self.frames[(start + offset) % self.capacity] = frame
        self._next_slot = (start + len(frames)) % self.capacity
        self.written = min(self.written + len(frames), self.capacity)
        return broken.astype(np.int64)


@dataclasses.dataclass(frozen=True)
class StorageSpec:
    """A storage class and the keyword options it is made with, before any storage exists (a
    game family's). It answers a storage's size without allocating one, so that
    `ReplayMemory.check_fits` can refuse a memory first; `spec(capacity)` makes the storage."""

    storage_class: type[ReplayStorage] = TransitionStorage
    # The constructor's keyword options beside capacity: FrameStackStorage's stack_axis.
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __call__(self, capacity: int) -> ReplayStorage:
        """A new empty storage of `capacity` slots."""
        return self.storage_class(capacity, **self.options)

    def bytes_per_slot(self, state_shape: tuple[int, ...], state_dtype: Any) -> int:
        """Bytes per slot of a full storage of these states."""
        return self.storage_class.bytes_per_slot(state_shape, state_dtype, **self.options)

    def min_capacity(self, state_shape: tuple[int, ...]) -> int:
        """The fewest slots that can hold a transition of these states."""
        return self.storage_class.min_capacity(state_shape, **self.options)
