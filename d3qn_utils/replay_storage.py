"""Replay storages: where a replay memory keeps the transitions themselves.

`ReplayStorage` is what a memory may ask of its storage; a memory never reads a storage's arrays.
Its memory checked each transition (checks.py); a storage checks only shapes, and frames' dtype
and shift. `TransitionStorage` keeps one row per transition (vector states) and can also replace
the transition of a chosen slot (`SlotStorage`, for a memory that decides where a transition
goes); `FrameStackStorage` keeps each uint8 frame once (Atari: one 84x84 frame a slot, not two
stacks of four; `bytes_per_slot` counts it), written in order only, since neighbouring slots
share frames. Each learns from its caller where a stream's episode ended (`end_episode`), so an
n-step chain stops there whatever the next state is. Each keeps `streams` rings in one
(`Segments`: one contiguous segment per environment), so that a chain of transitions or a stack
of frames never joins two environments. `StorageSpec` is a storage class with its options before
any storage exists: what a game family gives, sized (`ReplayMemory.check_fits`) before a run
allocates one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from d3qn_utils.checks import (
    FIELDS,
    check_integer,
    check_saved_value,
    is_integer,
    require,
    saved_array,
)
from d3qn_utils.frame_stacks import gather_stacks, shifted_by_one_frame

NO_SLOTS = np.zeros(0, dtype=np.int64)
# TransitionStorage's columns of one number each, whatever type the environment gives them in.
SCALAR_DTYPES = {"action": np.int64, "reward": np.float64, "done": np.bool_}
SLOT_ARRAYS = ("actions", "rewards", "dones", "holds_transition")  # FrameStackStorage's per slot


@runtime_checkable
class ReplayStorage(Protocol):
    """A ring of `capacity` slots that replay memories keep their transitions in: what a memory
    may ask of it. A transition is (state, action, reward, next_state, done); slots are numbered
    0 .. capacity - 1, and `written` of them were written at least once. The ring is `streams`
    rings, one per environment, each a contiguous segment of slots (`Segments`)."""

    capacity: int
    written: int
    streams: int

    def __len__(self) -> int:
        """The transitions held. O(1)."""

    @staticmethod
    def bytes_per_slot(state_shape: tuple[int, ...], state_dtype: Any, **options: Any) -> int:
        """Bytes per slot of a full storage of these states, made with these keyword `options`
        (the constructor's)."""

    @staticmethod
    def min_capacity(state_shape: tuple[int, ...], **options: Any) -> int:
        """The fewest slots that can hold a transition of these states, with these `options`:
        a stream's (`StorageSpec.min_capacity` counts the streams)."""

    def add(self, experience: tuple, stream: int = 0) -> tuple[int, np.ndarray]:
        """Store one transition at the next slot of `stream`'s ring: (its slot, the slots that
        stopped holding a transition because of it)."""

    def add_block(self, columns: Sequence[np.ndarray], stream: int = 0
                  ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Store k transitions (five columns of length k) as `add` would one by one, yielding
        (slots written, slots freed) as they go."""

    def segment(self, stream: int) -> range:
        """The slots `stream` owns; ValueError naming a stream it does not have."""

    def successor(self, slots: np.ndarray) -> np.ndarray:
        """The slot after each slot in its stream's ring (where the next transition went)."""

    def written_slots(self, indices: np.ndarray | None = None) -> np.ndarray:
        """The slots written at least once numbered `indices` (0 .. written - 1; all of them,
        ascending, by default): slot i itself for one stream."""

    def holds(self, slots: np.ndarray) -> np.ndarray:
        """Whether each slot holds a transition (bool array). O(k).

        len() counts the slots that hold a transition, so at capacity every slot holds one: a
        full vector memory, whose rows are replaced, never freed. A frame memory never gets
        there (its last next state's frame, and Atari's older frames of a stack, sit in slots
        that hold none), and a frame slot drawn for a batch can be freed before its priorities
        are updated (Ape-X's actors store while its learner trains; d3qn_agent.py stores nothing
        in between): `batch_update` gives such a slot's leaf priority 0."""

    def held_slots(self) -> np.ndarray:
        """The slots that hold a transition, ascending. O(capacity)."""

    def held_per_stream(self) -> np.ndarray:
        """The transitions each stream holds, in stream order. O(streams)."""

    def get(self, slots: np.ndarray, last_slots: np.ndarray | None = None
            ) -> tuple[np.ndarray, ...]:
        """(states, actions, rewards, next_states, dones) of `slots`, which must hold
        transitions; with `last_slots`, the next_states of those (the end of n-step chains)."""

    def rewards_and_dones(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rewards and dones of `slots`. O(k)."""

    def next_in_episode(self, slots: np.ndarray) -> np.ndarray:
        """Whether each slot's `successor` holds the transition that followed slot's in its
        episode."""

    def end_episode(self, stream: int = 0) -> None:
        """`stream`'s newest transition is its episode's last (terminated or truncated): no
        chain of `next_in_episode` runs past it, whatever the next transition's state."""

    def state_dict(self) -> dict[str, np.ndarray]:
        """The storage as plain arrays."""

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Take back what `state_dict` gave; ValueError if it does not fit this storage."""

    def saved_holds(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """Whether each slot holds a transition in `arrays`, a `state_dict` of this storage's
        capacity and streams, before `load_state_dict` takes it (a memory's load checks its own
        parts against it first); ValueError for a saved part of another shape."""


@runtime_checkable
class SlotStorage(ReplayStorage, Protocol):
    """A `ReplayStorage` that can also replace the transition of a chosen slot, for a memory
    that decides itself where a transition goes (reservoir sampling, say)."""

    def put(self, slot: int, experience: tuple) -> None:
        """Replace the transition of `slot`, a slot written before. O(state size)."""


class Segments:
    """The streams of a storage's ring of `capacity` slots: stream i (one environment's
    transitions) owns the contiguous slots [i*C//N, (i+1)*C//N) of C slots and N streams, a ring
    of its own, so that an n-step chain or a frame stack, which follow a stream's slots, never
    joins two environments. One stream is the whole ring. `min_size`: the fewest slots a stream
    may have (ValueError naming the capacity and the streams for fewer)."""

    def __init__(self, capacity: int, streams: int, min_size: int) -> None:
        self.streams = check_integer("streams", streams, 1)
        if capacity // self.streams < min_size:
            raise ValueError(f"capacity {capacity} cannot hold {self.streams} streams of at "
                             f"least {min_size} slots each (it gives each "
                             f"{capacity // self.streams})")
        bounds = np.arange(self.streams + 1) * capacity // self.streams
        self.starts, self.sizes = bounds[:-1], np.diff(bounds)
        self.next = self.starts.copy()  # each stream's next slot to write
        self.written = np.zeros(self.streams, dtype=np.int64)  # of each, slots written once
        self.total_written = 0  # their sum, kept so that a storage's len() is O(1)

    def check(self, stream: Any) -> int:
        """`stream` as an int, or ValueError naming it unless it is one of the streams."""
        if not is_integer(stream) or not 0 <= stream < self.streams:
            raise ValueError(f"stream must be an integer in 0..{self.streams - 1} (one per "
                             f"environment), got {stream!r}")
        return int(stream)

    def segment(self, stream: int) -> range:
        """The slots `stream` owns; ValueError naming another stream."""
        start = int(self.starts[self.check(stream)])
        return range(start, start + int(self.sizes[stream]))

    def stream_of(self, slots: np.ndarray | int) -> np.ndarray:
        """The stream that owns each slot. O(k log N)."""
        return np.searchsorted(self.starts, slots, side="right") - 1

    def shift(self, slots: np.ndarray | int, offsets: np.ndarray | int,
              streams: np.ndarray | int | None = None) -> np.ndarray:
        """The slots `offsets` after `slots` (before, for negative ones) in their streams'
        rings; `streams`: theirs, when known. One stream: (slots + offsets) % capacity."""
        if streams is None:
            streams = self.stream_of(slots)
        starts = self.starts[streams]
        return starts + (slots - starts + offsets) % self.sizes[streams]

    def ahead(self, stream: int, count: int) -> np.ndarray:
        """The `count` slots of `stream`'s ring from its next slot on, in write order."""
        return self.shift(self.next[stream], np.arange(count), stream)

    def advance(self, stream: int, count: int) -> int:
        """Move `stream`'s next slot `count` slots on, counting them written; the slot it was."""
        slot = int(self.next[stream])
        self.next[stream] = self.shift(slot, count, stream)
        written = min(int(self.written[stream]) + count, int(self.sizes[stream]))
        self.total_written += written - int(self.written[stream])
        self.written[stream] = written
        return slot

    def was_written(self, slot: int) -> bool:
        """Whether `slot`, a slot of the ring, was written at least once."""
        stream = int(self.stream_of(slot))
        return slot - int(self.starts[stream]) < int(self.written[stream])

    def written_slots(self, indices: np.ndarray | None = None) -> np.ndarray:
        """The slots written at least once numbered `indices` (0 .. total_written - 1, each
        stream's from its start, stream after stream; all of them, ascending, by default). One
        stream: the indices themselves. O(k log N)."""
        if indices is None:
            indices = np.arange(self.total_written)
        ends = np.cumsum(self.written)
        streams = np.searchsorted(ends, indices, side="right")
        return self.starts[streams] + indices - (ends - self.written)[streams]

    def written_rows(self, array: np.ndarray) -> np.ndarray:
        """The rows of `array` (one per slot) of the written slots, in `written_slots`' order: a
        view while those are the first slots (one stream, or each stream before the last written
        one full), else a copy. A checkpoint of a large frame ring makes no copy of it."""
        partly = np.flatnonzero(self.written < self.sizes)  # streams not full
        if not partly.size or not self.written[partly[0] + 1:].any():
            return array[: self.total_written]
        return np.concatenate([array[start:start + count] for start, count
                               in zip(self.starts.tolist(), self.written.tolist(), strict=True)])

    def state_dict(self, written_key: str, next_key: str) -> dict[str, np.ndarray]:
        """The number of streams and each stream's slots written and next slot, under these
        keys; one stream's as scalars (`stream_values`)."""
        return {"streams": np.array(self.streams), written_key: stream_values(self.written),
                next_key: stream_values(self.next)}

    def load_state_dict(self, arrays: dict[str, np.ndarray], written_key: str,
                        next_key: str) -> None:
        """Take back what `state_dict` gave; ValueError, nothing changed, where `checked_state`
        refuses it."""
        self.written, self.next = self.checked_state(arrays, written_key, next_key)
        self.total_written = int(self.written.sum())

    def checked_state(self, arrays: dict[str, np.ndarray], written_key: str, next_key: str
                      ) -> tuple[np.ndarray, np.ndarray]:
        """The saved slots written and next slot of each stream, unless (ValueError) `arrays`
        has another number of streams, a count of written slots outside a stream's size, a next
        slot that is not the one after the written slots of a stream not full (they are written
        in order), or a full stream's next slot outside its segment."""
        check_saved_streams(arrays, self.streams)
        written = saved_stream_values(arrays, written_key, self.streams)
        next_slots = saved_stream_values(arrays, next_key, self.streams)
        if ((written < 0) | (written > self.sizes)).any():
            raise ValueError(f"saved {written_key}={stream_values(written)} is outside "
                             f"0..{stream_values(self.sizes)} (slots per stream)")
        filling = written < self.sizes
        if (next_slots[filling] != self.starts[filling] + written[filling]).any():
            raise ValueError(f"saved {next_key}={stream_values(next_slots)} disagrees with "
                             f"{written_key}={stream_values(written)}: a stream not full writes "
                             f"next at its start {stream_values(self.starts)} + {written_key}")
        # A full stream's next slot may be any of its own, none of another stream's.
        outside = np.flatnonzero((next_slots < self.starts)
                                 | (next_slots >= self.starts + self.sizes))
        if outside.size:
            i = int(outside[0])
            raise ValueError(f"saved {next_key}={stream_values(next_slots)} lies outside its "
                             f"stream's segment: stream {i}'s next slot {next_slots[i]} is not "
                             f"in its slots {self.starts[i]}..{self.starts[i] + self.sizes[i] - 1}")
        return written, next_slots


class StreamRings:
    """What a storage answers from its `Segments` (`segments`): its streams, the slots written,
    a stream's slots and a slot's successor."""

    segments: Segments

    @property
    def streams(self) -> int:
        """The streams (environments) whose transitions this storage keeps apart."""
        return self.segments.streams

    @property
    def written(self) -> int:
        """Slots written at least once. O(1)."""
        return self.segments.total_written

    def segment(self, stream: int) -> range:
        """The slots `stream` owns; ValueError naming a stream this storage does not have."""
        return self.segments.segment(stream)

    def successor(self, slots: np.ndarray) -> np.ndarray:
        """The slot after each of `slots` in its stream's ring. O(k log N)."""
        return self.segments.shift(slots, 1)

    def written_slots(self, indices: np.ndarray | None = None) -> np.ndarray:
        """`Segments.written_slots`: slot i itself for one stream."""
        return self.segments.written_slots(indices)


def stream_values(values: np.ndarray) -> np.ndarray:
    """Per-stream `values` as a state_dict saves them: one stream's as a scalar (the keys and
    shapes of a memory saved before it had streams), else one value per stream."""
    return np.array(values[0]) if len(values) == 1 else np.array(values)


def saved_stream_values(arrays: dict[str, np.ndarray], key: str, streams: int) -> np.ndarray:
    """The saved per-stream `key` (`stream_values`) as an int64 array of `streams` values;
    ValueError for another count."""
    values = np.array(arrays[key], dtype=np.int64).reshape(-1)  # a copy: shares nothing
    if values.size != streams:
        raise ValueError(f"saved {key} has {values.size} values for {streams} streams")
    return values


def saved_storage(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The storage's part of a memory's `state_dict` (its "storage.*" keys), as the storage's
    `state_dict` gave it."""
    return {key.removeprefix("storage."): value for key, value in arrays.items()
            if key.startswith("storage.")}


def check_priorities_held(key: str, priorities: np.ndarray, holds: np.ndarray) -> None:
    """ValueError naming `key` if a slot with a positive saved priority (one per slot) holds no
    transition (`holds`): a draw would land on it. Zero over a held slot is allowed (Ape-X
    stores context transitions at priority 0)."""
    empty = np.flatnonzero((priorities > 0) & ~holds)
    if empty.size:
        raise ValueError(f"saved {key} gives slots {empty[:10].tolist()} a positive priority, "
                         "but they hold no transition")


def check_held_slots_written(holds: np.ndarray, pending_slots: np.ndarray,
                             written: np.ndarray, segments: Segments) -> None:
    """ValueError naming holds_transition if a saved frame slot holding a transition (`holds`,
    one per slot) lies beyond its stream's `written` count, whose frames were never saved, or
    at a stream's pending slot (`pending_slots`, -1: none), whose frame the next add overwrites
    without freeing a transition."""
    slots = np.arange(len(holds))
    streams = segments.stream_of(slots)
    unwritten = np.flatnonzero(holds & (slots - segments.starts[streams] >= written[streams]))
    if unwritten.size:
        raise ValueError(f"saved holds_transition marks slots {unwritten[:10].tolist()} as "
                         "holding a transition, but their streams never wrote them")
    pending = pending_slots[pending_slots >= 0]
    held_pending = pending[holds[pending]]
    if held_pending.size:
        raise ValueError(f"saved holds_transition marks pending slots {held_pending.tolist()} as "
                         "holding a transition, but a pending slot holds only its stream's "
                         "newest next-state frame")


def check_ranking(ranked_slots: np.ndarray, ranked_keys: np.ndarray, abs_errors: np.ndarray,
                  holds: np.ndarray) -> None:
    """ValueError naming the key unless a saved rank-based ranking is of distinct slots that
    hold a transition (`holds`, one per slot), all of them, keyed by their negated |TD errors|
    in `abs_errors`."""
    capacity = len(holds)
    if ranked_slots.ndim != 1 or ranked_keys.shape != ranked_slots.shape:
        raise ValueError(f"saved ranked_slots {ranked_slots.shape} and ranked_keys "
                         f"{ranked_keys.shape} are not one key per ranked slot")
    if ranked_slots.size and (ranked_slots.min() < 0 or ranked_slots.max() >= capacity):
        raise ValueError(f"saved ranked_slots must be in [0, {capacity})")
    if np.unique(ranked_slots).size != ranked_slots.size:
        raise ValueError("saved ranked_slots names a slot more than once")
    empty = ranked_slots[~holds[ranked_slots]]
    if empty.size:
        raise ValueError(f"saved ranked_slots ranks slots {empty[:10].tolist()}, which hold no "
                         "transition")
    # A held slot left out would never be drawn again: nothing adds it back but a new error.
    held = int(holds.sum())
    if ranked_slots.size != held:
        raise ValueError(f"saved ranked_slots ranks {ranked_slots.size} slots, but {held} hold a "
                         "transition")
    if not np.array_equal(ranked_keys, -abs_errors[ranked_slots]):
        raise ValueError("saved ranked_keys are not the ranked slots' -abs_errors")


def check_saved_streams(arrays: dict[str, np.ndarray], streams: int) -> None:
    """ValueError naming both unless the saved "streams" is `streams`."""
    saved = int(np.asarray(arrays["streams"]))
    if saved != streams:
        raise ValueError(f"the saved replay memory was made for N_ENVS {saved} (one stream per "
                         f"environment), this one for {streams}")


class TransitionStorage(StreamRings):
    """One row per transition in five numpy arrays, typed by the first `add`; `streams` rings
    (`Segments`), one by default."""

    def __init__(self, capacity: int, streams: int = 1) -> None:
        self.capacity = check_integer("capacity", capacity, 1)
        self.segments = Segments(self.capacity, streams, self.min_capacity(()))
        self.holds_transition = np.zeros(self.capacity, dtype=bool)
        # Whether the slot's transition was its episode's last (`end_episode`): a chain stops.
        self.episode_ends = np.zeros(self.capacity, dtype=bool)
        self.fields: tuple[np.ndarray, ...] | None = None

    def __len__(self) -> int:
        return self.written

    @staticmethod
    def bytes_per_slot(state_shape: tuple[int, ...], state_dtype: Any) -> int:
        """Bytes per slot of a full storage: two states, int64 action, float64 reward, 3 flags
        (done, holds a transition, ends its episode)."""
        return 2 * math.prod(state_shape) * np.dtype(state_dtype).itemsize + 8 + 8 + 1 + 1 + 1

    @staticmethod
    def min_capacity(state_shape: tuple[int, ...]) -> int:
        """One slot holds a whole transition."""
        return 1

    def columns(self) -> tuple[np.ndarray, ...]:
        """The five fields of the written rows, in slot order: a block as `add_block` takes it."""
        return tuple(self.segments.written_rows(field) for field in self.fields)

    def add(self, experience: tuple, stream: int = 0) -> tuple[int, np.ndarray]:
        """Store one (state, action, reward, next_state, done) in `stream`; return its slot, none
        freed. ValueError, nothing stored, for a bad shape or stream."""
        stream = self.segments.check(stream)
        self._check_shapes([(np.shape(value), np.asarray(value).dtype) for value in experience])
        return self._put(int(self.segments.next[stream]), experience, stream, 1), NO_SLOTS

    def add_block(self, columns: Sequence[np.ndarray], stream: int = 0
                  ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Store k transitions, five columns of length k, as `add` would one by one, in one write;
        yield (their slots, none freed) once. O(k). ValueError, nothing stored, for a bad shape
        or stream."""
        stream = self.segments.check(stream)
        self._check_shapes([(column.shape[1:], column.dtype) for column in columns])
        k = len(columns[0])
        yield self._put(self.segments.ahead(stream, k), columns, stream, k), NO_SLOTS

    def put(self, slot: int, experience: tuple) -> None:
        """Replace the transition of `slot`, one written before; the ring's next slot stays.
        The transition joins no chain: neither it nor the one before it in the ring continues
        into the next slot. ValueError, nothing written, for another slot or a bad shape."""
        if not (0 <= slot < self.capacity and self.segments.was_written(slot)):
            raise ValueError(f"slot {slot} was never written (written: {self.written})")
        self._check_shapes([(np.shape(value), np.asarray(value).dtype) for value in experience])
        for field, value in zip(self.fields, experience, strict=True):
            field[slot] = value
        self.episode_ends[[slot, int(self.segments.shift(slot, -1))]] = True

    def _put(self, slots: int | np.ndarray, values: Sequence[Any], stream: int, count: int
             ) -> int | np.ndarray:
        """Write the `count` transitions `values` (a row, or columns) to `slots`, the next ones
        of `stream`; return `slots`."""
        for field, value in zip(self.fields, values, strict=True):
            field[slots] = value
        self.holds_transition[slots] = True
        self.episode_ends[slots] = False  # until `end_episode` says otherwise
        self.segments.advance(stream, count)
        return slots

    def _check_shapes(self, fields: list[tuple[tuple[int, ...], np.dtype]]) -> None:
        """Allocate the arrays on the first write, the states typed as the first one's, the
        action, reward and done as `SCALAR_DTYPES` (so a first reward of 0 does not make the
        rewards integers); ValueError naming a field of another shape."""
        if self.fields is None:
            self.fields = tuple(
                np.zeros((self.capacity, *shape), dtype=SCALAR_DTYPES.get(name, dtype))
                for name, (shape, dtype) in zip(FIELDS, fields, strict=True))
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

    def held_per_stream(self) -> np.ndarray:
        """Each stream's slots written: a written slot holds its transition for good (a row is
        replaced, never freed). O(streams)."""
        return self.segments.written.copy()

    def rewards_and_dones(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.fields[2][slots], self.fields[4][slots]

    def next_in_episode(self, slots: np.ndarray) -> np.ndarray:
        """Whether the slot after each in its stream holds the transition after slot's, in its
        episode: slot's did not end its episode (`end_episode`), and the next slot holds one,
        not yet overwritten by the stream's newest. O(n log N)."""
        streams = self.segments.stream_of(slots)
        following = self.segments.shift(slots, 1, streams)
        return (~self.episode_ends[slots] & self.holds_transition[following]
                & (following != self.segments.next[streams]))

    def end_episode(self, stream: int = 0) -> None:
        """Mark `stream`'s newest transition its episode's last (none written: nothing to mark);
        ValueError naming a stream this storage lacks."""
        stream = self.segments.check(stream)
        if self.segments.written[stream]:
            self.episode_ends[self.segments.shift(self.segments.next[stream], -1, stream)] = True

    @classmethod
    def episode_ends_by_state(cls, saved: dict[str, np.ndarray],
                              goes_on: Callable[[int, np.ndarray], bool]) -> np.ndarray:
        """The `episode_ends` of `saved`, a `state_dict` written before the ends were recorded
        (checkpoint format 3), told by states alone as that code told them: whether each written
        slot's transition ended its episode, in `state_dict`'s order. It did where the state in
        the slot after it in its stream is not its next_state; a stream's newest, unless
        `goes_on(stream, its next_state)`, whether its environment's next transition starts from
        that state. O(capacity * state size)."""
        storage = cls(int(saved["capacity"]), int(saved["streams"]))
        written = int(np.sum(saved["written"]))
        storage.load_state_dict({**saved, "episode_ends": np.zeros(written, dtype=bool)})
        ends = np.zeros(storage.capacity, dtype=bool)
        if storage.fields is None:
            return ends[:0]
        slots = np.arange(storage.capacity)
        following = storage.successor(slots)
        same = storage.fields[0][following] == storage.fields[3][slots]  # state, next_state
        ends[:] = ~same.all(axis=tuple(range(1, same.ndim)))
        for stream in range(storage.streams):
            if storage.segments.written[stream]:
                newest = int(storage.segments.shift(storage.segments.next[stream], -1, stream))
                ends[newest] = not goes_on(stream, storage.fields[3][newest])
        return storage.segments.written_rows(ends).copy()

    def saved_holds(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """As `ReplayStorage.saved_holds`: the written slots, each stream's first ones."""
        require(arrays, ("written",), "transition storage")
        written = saved_stream_values(arrays, "written", self.streams)
        slots = np.arange(self.capacity)
        streams = self.segments.stream_of(slots)
        return slots - self.segments.starts[streams] < written[streams]

    def state_dict(self) -> dict[str, np.ndarray]:
        """This storage as plain arrays (the written rows only, stream after stream)."""
        return {"capacity": np.array(self.capacity),
                **self.segments.state_dict("written", "write_pointer"),
                **dict(zip(FIELDS, self.columns() if self.fields else (), strict=False)),
                "episode_ends": self.segments.written_rows(self.episode_ends).copy()}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore what `state_dict` returned. ValueError if it does not fit this storage (its
        capacity, its streams), checked before anything changes."""
        require(arrays, ("capacity", "streams", "written", "write_pointer", "episode_ends"),
                "transition storage")
        check_saved_value(arrays, "capacity", self.capacity)
        check_saved_streams(arrays, self.streams)
        written = int(saved_stream_values(arrays, "written", self.streams).sum())
        episode_ends = np.asarray(arrays["episode_ends"], dtype=bool)
        if episode_ends.shape != (written,):
            raise ValueError(f"saved episode_ends has shape {episode_ends.shape}, not "
                             f"({written},) (one per written slot)")
        rows = []
        if written:
            require(arrays, FIELDS, "transition storage")
            rows = [np.asarray(arrays[name]) for name in FIELDS]
            if any(len(row) != written for row in rows):
                raise ValueError(f"saved fields do not all have {written} rows")
        self.segments.load_state_dict(arrays, "written", "write_pointer")
        self.fields = None
        if rows:
            self._check_shapes([(row.shape[1:], row.dtype) for row in rows])  # allocates
            slots = self.written_slots()
            for field, row in zip(self.fields, rows, strict=True):
                field[slots] = row
        self.holds_transition[:] = False
        self.holds_transition[self.written_slots()] = True
        self.episode_ends[:] = False
        self.episode_ends[self.written_slots()] = episode_ends


class FrameStackStorage(StreamRings):
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
    and no earlier episode's frame leaks into a stack; after `end_episode` (its episode ended)
    the next `add` writes S+1 slots whatever its state. Writing slot w breaks the transitions of
    slots w .. w+S-1 (`add` reports them freed). `stack_axis`: -1, Atari's frames stacked on
    the last axis; None, MinAtar's single frames (S = 1). With `streams` (`Segments`), each
    stream is such a ring in its own segment, "mod capacity" being within the segment, with its
    own previous next_state: each environment's frames are stored once, as with one. Rewards
    are float32 (`TransitionStorage`'s float64): frame games' rewards are small integers (Atari's
    signs, MinAtar's 0 .. 10), which float32 holds exactly.
    """

    def __init__(self, capacity: int, stack_axis: int | None = -1, streams: int = 1) -> None:
        self.capacity = check_integer("capacity", capacity, 2)
        if stack_axis is not None and stack_axis != -1:
            raise ValueError(f"stack_axis must be -1 (the last axis) or None, got {stack_axis!r}")
        self.stack_axis = None if stack_axis is None else -1
        self.segments = Segments(self.capacity, streams, 2)  # the shape's minimum: first add
        self.holds_transition = np.zeros(self.capacity, dtype=bool)
        self.actions = np.zeros(self.capacity, dtype=np.int64)
        self.rewards = np.zeros(self.capacity, dtype=np.float32)
        self.dones = np.zeros(self.capacity, dtype=bool)
        # Set by the first add (or load_state_dict), once the states' shape is known:
        self.frames: np.ndarray | None = None  # (capacity, *frame_shape) uint8
        self.state_shape: tuple[int, ...] | None = None
        self.stack_size = 0  # frames per stacked state
        # Per stream: the slot of its last next_state's newest frame (-1: none, or its episode
        # ended) and a copy of that next_state, to compare (allocated with the frames).
        self._pending_slots = np.full(self.streams, -1, dtype=np.int64)
        self._pending_stacks: np.ndarray | None = None  # (streams, *state_shape) uint8
        self._held = [0] * self.streams  # each stream's slots that hold a transition

    def __len__(self) -> int:
        """The transitions held: O(streams)."""
        return sum(self._held)

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

    def add(self, experience: tuple, stream: int = 0) -> tuple[int, np.ndarray]:
        """Store one transition of uint8 states in `stream`, next_state being state shifted by
        one frame: its slot and the slots that stopped holding one. ValueError, nothing stored,
        if bad."""
        state, action, reward, next_state, done = experience
        stream = self.segments.check(stream)
        state, next_state = np.asarray(state), np.asarray(next_state)
        self._check_frames(state, next_state)
        newest = self._frames(next_state)[-1]
        if (self._pending_slots[stream] >= 0
                and np.array_equal(self._pending_stacks[stream], state)):
            slot = int(self._pending_slots[stream])  # same episode: its frames are in the ring
            freed = self._write([newest], stream)
        else:
            slot = int(self.segments.shift(self.segments.next[stream], self.stack_size - 1,
                                           stream))
            freed = self._write([*self._frames(state), newest], stream)
        self.actions[slot] = action
        self.rewards[slot] = reward
        self.dones[slot] = done
        self.holds_transition[slot] = True
        self._held[stream] += 1
        self._pending_slots[stream] = self.segments.shift(slot, 1, stream)
        self._pending_stacks[stream] = next_state
        return slot, freed[freed != slot]

    def add_block(self, columns: Sequence[np.ndarray], stream: int = 0
                  ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """`add` each transition to `stream` (each shares the frames of the one before),
        yielding ([its slot], the slots it freed); one `add` refuses raises after those before
        it. O(k * frame size)."""
        for experience in zip(*columns, strict=True):
            slot, freed = self.add(experience, stream)
            yield np.array([slot]), freed

    def get(self, slots: np.ndarray, last_slots: np.ndarray | None = None
            ) -> tuple[np.ndarray, ...]:
        """As `TransitionStorage.get`; a slot that holds no transition raises ValueError."""
        slots = self._checked_slots(slots)
        ends = slots if last_slots is None else self._checked_slots(last_slots)
        return (self._stacks(slots), self.actions[slots], self.rewards[slots],
                self._stacks(self.successor(ends)), self.dones[slots])

    def holds(self, slots: np.ndarray) -> np.ndarray:
        return self.holds_transition[slots]

    def held_slots(self) -> np.ndarray:
        return np.flatnonzero(self.holds_transition)

    def held_per_stream(self) -> np.ndarray:
        return np.array(self._held)

    def rewards_and_dones(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.rewards[slots], self.dones[slots]

    def next_in_episode(self, slots: np.ndarray) -> np.ndarray:
        """As `TransitionStorage.next_in_episode`: whether the slot after each in its stream
        holds a transition (an episode's last next state is a frame that holds none). O(n)."""
        return self.holds_transition[self.successor(slots)]

    def end_episode(self, stream: int = 0) -> None:
        """`stream`'s newest transition ended its episode: the next `add` to it writes its
        state's frames anew, whatever that state, so no transition follows it in the ring.
        ValueError naming a stream this storage lacks."""
        self._pending_slots[self.segments.check(stream)] = -1

    def _checked_slots(self, slots: np.ndarray) -> np.ndarray:
        """`slots`, or ValueError naming those outside the ring or holding no transition (their
        frames may be other transitions' by now)."""
        if slots.size and (slots.min() < 0 or slots.max() >= self.capacity):
            raise ValueError(f"slots must be in [0, {self.capacity}), got {slots}")
        missing = slots[~self.holds_transition[slots]]
        if missing.size:
            raise ValueError(f"slots {missing} hold no transition")
        return slots

    def saved_holds(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """As `ReplayStorage.saved_holds`: the saved holds_transition."""
        require(arrays, ("holds_transition",), "frame stack storage")
        return saved_array(arrays, "holds_transition", (self.capacity,), bool)

    def state_dict(self) -> dict[str, np.ndarray]:
        """This storage as plain arrays (the written slots' frames only, stream after stream)."""
        frames = (self.segments.written_rows(self.frames) if self.frames is not None
                  else np.zeros(0, np.uint8))
        return {"capacity": np.array(self.capacity),
                "stack_axis": np.array([] if self.stack_axis is None else [-1], np.int64),
                "state_shape": np.array(self.state_shape or (), np.int64),
                **self.segments.state_dict("written", "next_slot"),
                "frames": frames, "pending_slot": stream_values(self._pending_slots),
                **{name: getattr(self, name).copy() for name in SLOT_ARRAYS}}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore what `state_dict` returned; the capacity, the stack axis and the streams must
        match this storage's, each slot array have a value per slot, each pending slot be -1
        or the slot before its stream's next, and each slot holding a transition be written and
        not pending (ValueError naming the key, nothing changed)."""
        require(arrays, ("capacity", "stack_axis", "state_shape", "streams", "next_slot",
                         "pending_slot", "written", "frames", *SLOT_ARRAYS),
                "frame stack storage")
        check_saved_value(arrays, "capacity", self.capacity)
        check_saved_streams(arrays, self.streams)
        written = int(saved_stream_values(arrays, "written", self.streams).sum())
        pending_slots = saved_stream_values(arrays, "pending_slot", self.streams)
        shape = tuple(int(n) for n in arrays["state_shape"])
        frames = np.asarray(arrays["frames"])
        if not 0 <= written <= self.capacity or (shape and frames.shape[0] != written):
            raise ValueError(f"saved written={written} does not match frames {frames.shape}")
        saved_axis = np.asarray(arrays["stack_axis"]).reshape(-1).tolist()  # [] for None
        axis = [] if self.stack_axis is None else [-1]
        if saved_axis != axis:  # another game's frames: its stacks would be read wrong
            raise ValueError(f"saved stack_axis {saved_axis} differs from this storage's {axis} "
                             "([-1]: frames stacked on the last axis, []: none)")
        slot_arrays = {name: saved_array(arrays, name, (self.capacity,), getattr(self, name).dtype)
                       for name in SLOT_ARRAYS}
        # A stream's pending slot holds the newest frame of its last next state: the slot
        # before its next one, or -1 (none, or its episode ended). Another would stack frames
        # of other slots, or of another stream, onto the next transition.
        stream_written, next_slots = self.segments.checked_state(arrays, "written", "next_slot")
        streams = np.arange(self.streams)
        stray = (pending_slots != -1) & (pending_slots
                                          != self.segments.shift(next_slots, -1, streams))
        if stray.any():
            i = int(np.flatnonzero(stray)[0])
            raise ValueError(f"saved pending_slot={stream_values(pending_slots)} disagrees with "
                             f"next_slot={stream_values(next_slots)}: stream {i}'s pending slot "
                             f"{pending_slots[i]} is neither -1 nor the slot before its next slot")
        check_held_slots_written(slot_arrays["holds_transition"], pending_slots, stream_written,
                                 self.segments)
        self.segments.load_state_dict(arrays, "written", "next_slot")
        self.frames, self.state_shape, self._pending_stacks = None, None, None
        if shape:
            self._allocate(shape)
            self.frames[self.written_slots()] = frames
            pending = pending_slots >= 0
            self._pending_stacks[pending] = self._stacks(pending_slots[pending])
        self._pending_slots = pending_slots
        for name, values in slot_arrays.items():
            getattr(self, name)[:] = values
        self._held = np.add.reduceat(self.holds_transition, self.segments.starts,
                                     dtype=np.int64).tolist()

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
        stream_slots = self.capacity // self.streams  # the smallest stream's
        if first and stream_slots < self.min_capacity(shape, self.stack_axis):
            room = (f"capacity {self.capacity}" if self.streams == 1 else
                    f"capacity {self.capacity} over {self.streams} streams ({stream_slots} "
                    "slots each)")
            raise ValueError(f"{room} cannot hold one stack of {shape[-1]} frames plus its "
                             "next frame")
        # Whole states (no stack axis) have no frames to shift.
        if self.stack_axis is not None and not shifted_by_one_frame(state, next_state):
            raise ValueError("next_state must be state shifted by one frame along the last axis "
                             "(as frame stacking produces)")
        if first:
            self._allocate(shape)

    def _allocate(self, state_shape: tuple[int, ...]) -> None:
        """Allocate the frame ring (np.zeros: untouched pages take no memory) and the streams'
        last next states."""
        self.state_shape = tuple(state_shape)
        frame_shape = state_shape if self.stack_axis is None else state_shape[:-1]
        self.frames = np.zeros((self.capacity, *frame_shape), dtype=np.uint8)
        self._pending_stacks = np.zeros((self.streams, *state_shape), dtype=np.uint8)
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
        slots = np.asarray(slots)
        # Each stack's S slots, oldest first, in its stream's ring: (n, S).
        stack_slots = self.segments.shift(slots[:, None], np.arange(1 - self.stack_size, 1),
                                          self.segments.stream_of(slots)[:, None])
        return gather_stacks(self.frames, stack_slots)

    def _write(self, frames: list[np.ndarray], stream: int) -> np.ndarray:
        """Write `frames` to the next slots of `stream`; return the slots whose transitions this
        broke."""
        span = min(len(frames) + self.stack_size - 1, int(self.segments.sizes[stream]))
        readers = self.segments.ahead(stream, span)
        broken = readers[self.holds_transition[readers]]
        self.holds_transition[broken] = False
        self._held[stream] -= broken.size  # `readers` are the stream's own slots
        for slot, frame in zip(readers.tolist(), frames, strict=False):
            self.frames[slot] = frame
        self.segments.advance(stream, len(frames))
        return broken.astype(np.int64)


@dataclasses.dataclass(frozen=True)
class StorageSpec:
    """A storage class and the keyword options it is made with, before any storage exists (a
    game family's). It answers a storage's size without allocating one, so that
    `ReplayMemory.check_fits` can refuse a memory first; `spec(capacity, streams)` makes the
    storage."""

    storage_class: type[ReplayStorage] = TransitionStorage
    # The constructor's keyword options beside capacity: FrameStackStorage's stack_axis.
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __call__(self, capacity: int, streams: int = 1) -> ReplayStorage:
        """A new empty storage of `capacity` slots in `streams` rings (one per environment)."""
        return self.storage_class(capacity, streams=streams, **self.options)

    def bytes_per_slot(self, state_shape: tuple[int, ...], state_dtype: Any) -> int:
        """Bytes per slot of a full storage of these states."""
        return self.storage_class.bytes_per_slot(state_shape, state_dtype, **self.options)

    def min_capacity(self, state_shape: tuple[int, ...], streams: int = 1) -> int:
        """The fewest slots that can hold a transition of these states in each of `streams`
        streams (stream i gets capacity * (i + 1) // streams - capacity * i // streams slots,
        at least capacity // streams)."""
        return streams * self.storage_class.min_capacity(state_shape, **self.options)
