"""Replay memories with streams, one per environment (N_ENVS): every variant (the tests'
reservoir among them), in both storages, keeps each stream's transitions in its own segment of
slots, exactly as separate one-stream memories would (n-step returns, discounts, dones, frame
stacks, next states), stores each stream's frames once, draws by P(i) over all streams at once,
saves and loads its streams, and refuses a stream, a number of streams or a capacity that does not
fit; its priority figure counts each stream's ages as a memory of its own would. With one stream a
memory is the one it was before streams, slot for slot (checked against the step-400 checkpoint
of tests/test_checkpoint_format.py, written before streams; the frame ring's one-stream layout is
tested in test_replay_storage.py)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conftest import DATA
from memory_helpers import (
    ReservoirMemory,
    array_bytes,
    holds_frames,
    registered_memories,
    save_and_load,
    snapshot,
    states_equal,
)

from d3qn_utils.atomic_files import read_arrays
from d3qn_utils.priority_figure import PriorityFigure
from d3qn_utils.replay_storage import FrameStackStorage, StorageSpec, TransitionStorage
from PER import Memory

MEMORIES = registered_memories()  # every replay variant, by name
STORAGES = {  # name: (the storage, whether its states are uint8 frames)
    "vectors": (StorageSpec(), False),
    "frame stacks": (StorageSpec(FrameStackStorage), True),  # Atari's: stacks on the last axis
    "single frames": (StorageSpec(FrameStackStorage, {"stack_axis": None}), True),  # MinAtar's
}
CASES = [pytest.param(kind, name, id=f"{kind}-{name}") for kind in MEMORIES
         for name, (_, frames) in STORAGES.items() if not frames or holds_frames(MEMORIES[kind])]
STREAMS = 3
CAPACITY = 38  # segments of 12, 13 and 13 slots
N_STEP, GAMMA = 3, 0.9
STACK = 4  # frames per stacked observation


def observation(step: int, frames: bool) -> np.ndarray:
    """The observation `step` steps into an episode, the same in every stream and episode, so
    that only the streams tell two environments' transitions apart: a float32 vector, or a
    stack of STACK 2x2 uint8 frames padded with the first at the start (FrameStackObservation's
    "reset" padding), the stack of step + 1 being this one shifted by a frame."""
    if not frames:
        return np.array([step, 0.5 * step], dtype=np.float32)
    newest = np.arange(step - STACK + 1, step + 1).clip(0) + 1
    return np.ones((2, 2, 1), np.uint8) * newest.astype(np.uint8)


class Environment:
    """Environment `index`'s transitions, one a `step`: episodes of 1..6 steps (drawn with seed
    `index`), each ending terminated or truncated, rewards naming the environment and step."""

    def __init__(self, index: int, frames: bool) -> None:
        self.index, self.frames = index, frames
        self.rng = np.random.default_rng(index)
        self.new_episode()

    def new_episode(self) -> None:
        self.t, self.length = 0, int(self.rng.integers(1, 7))
        self.terminates = bool(self.rng.integers(2))

    def step(self) -> tuple[tuple, bool]:
        """The next transition, and whether its episode ended with it."""
        t = self.t
        ended = t + 1 == self.length
        transition = (observation(t, self.frames), int(self.rng.integers(3)),
                      float(10 * self.index + t), observation(t + 1, self.frames),
                      ended and self.terminates)
        if ended:
            self.new_episode()
        else:
            self.t += 1
        return transition, ended


def vector_steps(steps: int, frames: bool) -> Iterator[tuple[int, int, tuple, bool]]:
    """(step, environment, transition, ended) as STREAMS environments stepped together give
    them, in a shuffled order each step (seed 0): environment 0 steps every step, 1 two steps in
    three, 2 one in three, so that each fills its segment at its own pace."""
    environments = [Environment(index, frames) for index in range(STREAMS)]
    order = np.random.default_rng(0)
    for step in range(steps):
        for index in order.permutation(STREAMS).tolist():
            if step % 3 < 3 - index:
                yield step, index, *environments[index].step()


def memory_of(kind: str, storage_name: str, capacity: int, streams: int = 1, rng: int = 0,
              **options) -> object:
    """A memory of variant `kind` in a storage `storage_name` of `capacity` slots, `streams`
    streams, n-step batches."""
    storage, _ = STORAGES[storage_name]
    return MEMORIES[kind](capacity, storage=storage(capacity, streams), rng=rng, n_step=N_STEP,
                          gamma=GAMMA, **options)


def filled(kind: str, storage_name: str, steps: int = 60) -> object:
    """A memory of STREAMS streams given `steps` steps of `vector_steps`."""
    memory = memory_of(kind, storage_name, CAPACITY, STREAMS)
    for _, index, transition, ended in vector_steps(steps, STORAGES[storage_name][1]):
        memory.store(transition, index)
        if ended:  # as the agent says where its environments' episodes end
            memory.end_episode(index)
    return memory


@pytest.mark.parametrize(("kind", "storage_name"), CASES)
def test_n_streams_keep_exactly_what_n_separate_one_stream_memories_keep(kind, storage_name):
    combined = memory_of(kind, storage_name, CAPACITY, STREAMS)
    assert combined.streams == STREAMS
    segments = [combined.storage.segment(index) for index in range(STREAMS)]
    assert [len(segment) for segment in segments] == [12, 13, 13]
    separate = [memory_of(kind, storage_name, len(segment)) for segment in segments]
    # A reservoir, once a stream's segment is full, draws slots with its one rng, where separate
    # memories would each draw with their own: it is given what its segments hold.
    steps = 59 if MEMORIES[kind].WRITES_RING else 12
    ends_at = Counter()
    stored = Counter()
    for step, index, transition, ended in vector_steps(steps, STORAGES[storage_name][1]):
        slot = combined.store(transition, index)
        assert slot == segments[index].start + separate[index].store(transition)
        if ended:
            combined.end_episode(index)
            separate[index].end_episode()
        ends_at[step] += ended
        stored[index] += 1
    assert max(ends_at.values()) >= 2  # episodes of two environments end at one step
    if steps == 59:
        assert stored[0] > 4 * len(segments[0]) and stored[2] > len(segments[2])  # they wrap
        # and a chain runs on from a segment's last slot to its first
        last = np.array([segment.stop - 1 for segment in segments])
        assert combined.storage.next_in_episode(last[combined.storage.holds(last)]).any()
    assert len(combined) == sum(len(memory) for memory in separate)
    assert combined.storage.written == sum(memory.storage.written for memory in separate)
    held = combined.storage.held_slots()
    for segment, memory in zip(segments, separate, strict=True):
        theirs = memory.storage.held_slots()
        np.testing.assert_array_equal(held[(held >= segment.start) & (held < segment.stop)],
                                      segment.start + theirs)
        # states, actions, n-step returns, next states, dones, discounts
        for got, expected in zip(combined.n_step_batch(segment.start + theirs),
                                 memory.n_step_batch(theirs), strict=True):
            np.testing.assert_array_equal(got, expected)
    # Chains of more than one step were followed (a memory that cut every one would pass too).
    assert (combined.n_step_batch(held)[5] < GAMMA**1.5).any()


@pytest.mark.parametrize(("kind", "storage_name"), CASES)
def test_the_priority_figure_counts_each_stream_as_a_memory_of_its_own(kind, storage_name):
    # However the streams take turns and whatever slots a frame ring's episode starts take, a
    # figure of STREAMS streams gives each held transition the age, and counts the transitions
    # held by age, that each stream's own one-stream memory's figure gives.
    combined = memory_of(kind, storage_name, CAPACITY, STREAMS)
    segments = [combined.storage.segment(index) for index in range(STREAMS)]
    separate = [memory_of(kind, storage_name, len(segment)) for segment in segments]
    ring = MEMORIES[kind].WRITES_RING
    figure = PriorityFigure(CAPACITY, 8, ring, STREAMS)
    figures = [PriorityFigure(len(segment), 8, ring) for segment in segments]
    samples = 0
    for step, index, transition, _ in vector_steps(59 if ring else 12,
                                                   STORAGES[storage_name][1]):
        figure.note_store(combined.store(transition, index))
        figures[index].note_store(separate[index].store(transition))
        held = combined.held_per_stream()
        assert held.tolist() == [len(memory) for memory in separate]
        if step % 4 == 3 and held.all():  # each stream's held transitions, drawn once
            figure.note_sample(combined.storage.held_slots(), held)
            for memory, own in zip(separate, figures, strict=True):
                own.note_sample(memory.storage.held_slots(), len(memory))
            samples += 1
    assert samples >= 2
    for segment, memory, own in zip(segments, separate, figures, strict=True):
        theirs = memory.storage.held_slots()
        np.testing.assert_array_equal(figure.ages(segment.start + theirs), own.ages(theirs))
    for counts in ("replays_by_age", "exposure_by_age"):
        np.testing.assert_array_equal(getattr(figure, counts),
                                      sum(getattr(own, counts) for own in figures))
    assert figure.exposure_by_age[1:].sum() > 0  # ages above 0 were held


def paper_probabilities(kind: str, errors: np.ndarray, alpha: float) -> np.ndarray:
    """P(i) of transitions with |TD errors| `errors` by the paper's formulas, computed here (as
    the notebook's sampling cells do), not by the memories: p_i = min(|delta_i| + 0.01, 1) for
    proportional replay, 1 / rank(i) for rank-based (rank 1 the largest), P(i) = p_i^alpha /
    sum_k p_k^alpha; 1 / N for the others (uniform, the reservoir)."""
    if kind == "proportional":
        weights = np.minimum(errors + 0.01, 1.0) ** alpha
    elif kind == "rank-based":
        ranks = np.empty(len(errors))
        ranks[np.argsort(-errors, kind="stable")] = np.arange(1, len(errors) + 1)
        weights = ranks**-alpha
    else:
        weights = np.ones(len(errors))
    return weights / weights.sum()


@pytest.mark.parametrize(("kind", "storage_name"), CASES)
def test_sampling_follows_p_i_over_all_streams_at_once(kind, storage_name):
    # Six transitions in 3 streams filled unevenly (2, 3 and 1), their errors rising across the
    # streams (the last above the proportional memory's cap of 1): each is drawn as often as the
    # paper's P(i) over all six says, at the notebook's alphas (uniform, the agent's 0.6, fully
    # proportional), its IS weight from the smallest P over every stream.
    errors_by_order = np.array([0.0, 0.05, 0.1, 0.2, 0.4, 1.5])
    alphas = (0.0, 0.6, 1.0) if MEMORIES[kind].PRIORITIZED else (None,)
    for alpha in alphas:
        options = {} if alpha is None else {"alpha": alpha}
        memory = memory_of(kind, storage_name, 24, STREAMS, rng=42, **options)  # 8 a stream
        frames = STORAGES[storage_name][1]
        for index, count in enumerate([2, 3, 1]):
            environment = Environment(index, frames)
            environment.length = 9  # one episode
            for _ in range(count):
                memory.store(environment.step()[0], index)
        slots = memory.storage.held_slots()
        assert [memory.storage.segments.stream_of(slot) for slot in slots.tolist()] == [
            0, 0, 1, 1, 1, 2]
        errors = np.zeros(24)
        errors[slots] = errors_by_order
        indices, _, _ = memory.sample(512)
        drawn = memory.slots_of(indices)
        assert set(drawn.tolist()) == set(slots.tolist())  # every error written
        memory.batch_update(indices, errors[drawn])
        expected = np.zeros(24)
        expected[slots] = paper_probabilities(kind, errors_by_order, alpha)
        held, probabilities = memory.sampling_probabilities()
        p_of = np.zeros(24)
        p_of[held] = probabilities
        np.testing.assert_allclose(p_of, expected, rtol=1e-9, atol=1e-12)
        counts = np.zeros(24)
        for _ in range(1000):
            indices, _, is_weights = memory.sample(64)
            drawn = memory.slots_of(indices)
            counts += np.bincount(drawn, minlength=24)
            # w_i / max_j w_j = (N P(i))^-beta / (N P_min)^-beta, P_min over every stream.
            np.testing.assert_allclose(
                is_weights, (expected[drawn] / expected[slots].min()) ** -memory.beta, rtol=1e-5)
        # 64,000 draws: each frequency's standard error is below 0.002.
        np.testing.assert_allclose(counts / counts.sum(), expected, atol=0.01)


def test_eight_streams_store_each_frame_once_as_one_does():
    # Many short episodes (1..6 steps, each adding a stack's frames before its first) in 8
    # streams of one storage take as many bytes per transition as in one stream, within 5%
    # (measured: 2%, from the few slots at each ring's write pointer that hold no whole
    # transition, and the episodes' lengths; 1,000-slot segments keep that small).
    bytes_per_transition = {}
    for streams in (1, 8):
        storage = FrameStackStorage(8 * 1000, streams=streams)
        environments = [Environment(index, frames=True) for index in range(streams)]
        for _ in range(8 * 2000 // streams):  # every segment wraps
            for index, environment in enumerate(environments):
                storage.add(environment.step()[0], index)
        bytes_per_transition[streams] = array_bytes(storage) / len(storage)
    assert bytes_per_transition[8] <= 1.05 * bytes_per_transition[1]
    # Neither wrote each transition as a new stack (STACK + 1 slots): frames are shared.
    assert bytes_per_transition[8] < 0.7 * (STACK + 1) * array_bytes(storage) / storage.capacity


def test_one_stream_is_the_memory_written_before_streams_slot_for_slot():
    saved = read_arrays(DATA / "checkpoint_format_2" / "step-0000000400" / "memory.npz")
    assert "storage.streams" not in saved and saved["kind"] == "proportional"
    columns = [saved[f"storage.{field}"] for field in ("state", "action", "reward",
                                                       "next_state", "done")]
    memory = Memory(500)
    slots = [memory.store(transition) for transition in zip(*columns, strict=True)]
    assert slots == list(range(400))
    state = memory.state_dict()
    # Keys added since: the streams, where episodes ended (none was said here), beta's growth.
    added = {"storage.streams": np.array(1), "storage.episode_ends": np.zeros(400, bool),
             "beta_increment": np.array(memory.beta_increment)}
    assert state.keys() == {*saved, *added} and state["storage.streams"] == 1
    for key in saved:
        if key.startswith("storage."):
            np.testing.assert_array_equal(state[key], saved[key], err_msg=key)
            assert state[key].shape == saved[key].shape, key
    # Its state loads as one stream's, and gives back what it holds.
    memory.load_state_dict({**saved, "storage.episode_ends": added["storage.episode_ends"]})
    assert states_equal(memory.state_dict(), {**saved, **added})
    # A smaller ring wraps as before: transition i in slot i % capacity.
    ring = Memory(150)
    assert [ring.store(transition) for transition in zip(*columns, strict=True)] == [
        i % 150 for i in range(400)]


@pytest.mark.parametrize(("kind", "storage_name"), CASES)
def test_a_memory_with_streams_resumes_from_its_state_and_refuses_other_streams(kind,
                                                                                 storage_name):
    memory = filled(kind, storage_name)
    arrays = save_and_load(snapshot(memory))
    assert arrays["storage.streams"] == STREAMS
    assert arrays["storage.written"].shape == (STREAMS,)  # a pointer per stream
    resumed = memory_of(kind, storage_name, CAPACITY, STREAMS, rng=1)
    resumed.load_state_dict(arrays)
    assert states_equal(snapshot(resumed), snapshot(memory))
    frames = STORAGES[storage_name][1]
    environments = [Environment(index + 10, frames) for index in range(STREAMS)]
    for step in range(20):  # each stream's next transition follows its own previous one
        index = step % STREAMS
        transition, ended = environments[index].step()
        assert resumed.store(transition, index) == memory.store(transition, index)
        if ended:
            resumed.end_episode(index)
            memory.end_episode(index)
    assert states_equal(snapshot(resumed), snapshot(memory))
    np.testing.assert_array_equal(resumed.sample(16)[0], memory.sample(16)[0])

    one_stream = memory_of(kind, storage_name, CAPACITY)
    before = snapshot(one_stream)
    with pytest.raises(ValueError, match=f"made for N_ENVS {STREAMS} .*this one for 1$"):
        one_stream.load_state_dict(arrays)
    assert states_equal(snapshot(one_stream), before)
    with pytest.raises(ValueError, match=f"made for N_ENVS 1 .*this one for {STREAMS}$"):
        resumed.load_state_dict(before)
    # A one-stream state saved before streams (no "storage.streams") loads as one stream's.
    older = {key: value for key, value in before.items() if key != "storage.streams"}
    memory_of(kind, storage_name, CAPACITY, rng=1).load_state_dict(older)
    with pytest.raises(ValueError, match=f"made for N_ENVS 1 .*this one for {STREAMS}$"):
        resumed.load_state_dict(older)


def recount(storage: object) -> list[int]:
    """The transitions each stream of `storage` holds, counted slot by slot."""
    return [int(storage.holds(np.array(storage.segment(stream))).sum())
            for stream in range(storage.streams)]


@pytest.mark.parametrize("streams", [1, STREAMS])
@pytest.mark.parametrize("storage_name", STORAGES)
def test_each_streams_held_count_is_its_recount_after_adds_wraps_frees_and_a_load(
        storage_name, streams):
    # Adds to streams drawn at random (seed 0), a vector storage's rows replaced now and then,
    # until every stream wrapped; frame rings free transitions as new episodes take slots.
    spec, frames = STORAGES[storage_name]
    storage = spec(CAPACITY, streams)
    environments = [Environment(index, frames) for index in range(streams)]
    rng = np.random.default_rng(0)
    freed = 0
    for _ in range(200):
        index = int(rng.integers(streams))
        transition, _ = environments[index].step()
        freed += storage.add(transition, index)[1].size
        if not frames and rng.random() < 0.2:
            storage.put(int(rng.choice(storage.held_slots())), transition)
        assert storage.held_per_stream().tolist() == recount(storage)
    assert storage.written == CAPACITY and (freed > 0) == frames
    loaded = spec(CAPACITY, streams)
    loaded.load_state_dict(save_and_load(storage.state_dict()))
    assert loaded.held_per_stream().tolist() == recount(loaded) == recount(storage)
    for _ in range(20):  # and the loaded storage counts on
        index = int(rng.integers(streams))
        loaded.add(environments[index].step()[0], index)
        assert loaded.held_per_stream().tolist() == recount(loaded)


def saved_after_12_steps(spec: Any, frames: bool) -> dict[str, np.ndarray]:
    """The saved state of a `spec` storage of CAPACITY slots in STREAMS streams after 12 vector
    steps (stream 0 steps every time, so it wraps; stream 2 does not)."""
    storage = spec(CAPACITY, STREAMS)
    for _, index, transition, _ in vector_steps(12, frames):
        storage.add(transition, index)
    return save_and_load(storage.state_dict())


def assert_load_refused(make: Any, arrays: dict[str, np.ndarray], message: str) -> Any:
    """A new part from `make()` refuses `arrays` with a ValueError saying `message`, and is left
    as it was; that part."""
    loaded = make()
    before = snapshot(loaded)
    with pytest.raises(ValueError, match=re.escape(message)):
        loaded.load_state_dict(arrays)
    assert states_equal(snapshot(loaded), before)
    return loaded


@pytest.mark.parametrize("storage_name", STORAGES)
def test_a_saved_next_slot_that_disagrees_with_written_is_refused(storage_name):
    # A stream not full has written its slots from its start in order, so its next slot is
    # start + written; a full stream's may be any of its slots.
    spec, frames = STORAGES[storage_name]
    pointer = "next_slot" if frames else "write_pointer"
    arrays = saved_after_12_steps(spec, frames)
    starts, sizes = np.array([0, 12, 25]), np.array([12, 13, 13])
    full = arrays["written"] == sizes
    assert full[0] and not full[2]  # stream 0 (every step) wrapped, stream 2 did not
    np.testing.assert_array_equal(arrays[pointer][~full], (starts + arrays["written"])[~full])
    for stream in np.flatnonzero(~full):
        wrong = arrays[pointer].copy()
        wrong[stream] += 1
        assert_load_refused(
            lambda: spec(CAPACITY, STREAMS), {**arrays, pointer: wrong},
            f"saved {pointer}={wrong} disagrees with written={arrays['written']}: a stream "
            f"not full writes next at its start {starts} + written")
    moved = arrays[pointer].copy()
    moved[full] = starts[full] + (moved[full] - starts[full] + 1) % sizes[full]
    moved_arrays = {**arrays, pointer: moved}
    if frames:  # a stream's pending slot is the one before its next slot: it moves along
        pending = arrays["pending_slot"].copy()
        pending[full] = starts[full] + (moved[full] - starts[full] - 1) % sizes[full]
        moved_arrays["pending_slot"] = pending
        holds = arrays["holds_transition"].copy()
        holds[pending[full]] = False  # and holds its next state's frame, not a transition
        moved_arrays["holds_transition"] = holds
    spec(CAPACITY, STREAMS).load_state_dict(moved_arrays)  # a full stream's: any


@pytest.mark.parametrize("storage_name", STORAGES)
def test_a_saved_next_slot_outside_its_streams_segment_is_refused_naming_it(storage_name):
    # Stream 0 (every step) wrapped: its next slot may be any of its slots 0..11, none other.
    spec, frames = STORAGES[storage_name]
    pointer = "next_slot" if frames else "write_pointer"
    arrays = saved_after_12_steps(spec, frames)
    assert arrays["written"][0] == 12
    for slot in (-1, 12, CAPACITY):  # before its segment, stream 1's first slot, past the ring
        wrong = arrays[pointer].copy()
        wrong[0] = slot
        assert_load_refused(
            lambda: spec(CAPACITY, STREAMS), {**arrays, pointer: wrong},
            f"saved {pointer}={wrong} lies outside its stream's segment: stream 0's next "
            f"slot {slot} is not in its slots 0..11")


@pytest.mark.parametrize(("kind", "storage_name"), CASES)
@pytest.mark.parametrize("stream", [3, -1, 1.0, True])
def test_a_stream_the_memory_lacks_is_refused_and_nothing_is_stored(kind, storage_name, stream):
    memory = filled(kind, storage_name, steps=5)
    before = snapshot(memory)
    transition = Environment(0, STORAGES[storage_name][1]).step()[0]
    with pytest.raises(ValueError, match=re.escape(
            f"stream must be an integer in 0..2 (one per environment), got {stream!r}")):
        memory.store(transition, stream)
    assert states_equal(snapshot(memory), before)


@pytest.mark.parametrize("storage", [TransitionStorage, FrameStackStorage])
def test_streams_must_be_one_or_more_and_each_must_get_its_slots(storage):
    for streams in (0, -2, 1.5):
        with pytest.raises(ValueError, match=f"streams must be an integer >= 1, got {streams}"):
            storage(8, streams=streams)
    fewest = 1 if storage is TransitionStorage else 2
    with pytest.raises(ValueError, match=re.escape(
            f"capacity {4 * fewest - 1} cannot hold 4 streams of at least {fewest} slots each "
            f"(it gives each {fewest - 1})")):
        storage(4 * fewest - 1, streams=4)
    assert [len(storage(4 * fewest, streams=4).segment(i)) for i in range(4)] == [fewest] * 4


def test_a_memory_too_small_for_its_streams_is_refused_naming_memory_size_and_n_envs():
    atari = StorageSpec(FrameStackStorage)
    assert atari.min_capacity((84, 84, 4), streams=4) == 20  # 4 x (a stack + a next frame)
    with pytest.raises(ValueError, match=re.escape(
            "MEMORY_SIZE (--memory-size) must be at least 20 for (84, 84, 4) states in a "
            "FrameStackStorage with N_ENVS (--n-envs) 4 (each environment's stream needs 5 of "
            "them), got 19")):
        Memory.check_fits(19, atari, (84, 84, 4), np.uint8, streams=4)
    Memory.check_fits(20, atari, (84, 84, 4), np.uint8, streams=4)
    # The memory of 20 slots holds a transition of each environment, sampled back.
    memory = Memory(20, storage=atari(20, streams=4), rng=0)
    for index in range(4):
        memory.store((np.zeros((84, 84, 4), np.uint8), index, 1.0,
                      np.zeros((84, 84, 4), np.uint8), False), index)
    assert len(memory) == 4
    assert set(memory.sample(64)[1][1].tolist()) == {0, 1, 2, 3}  # the actions: each stream's
    # A frame ring whose streams cannot hold a stack learns it from the first one's shape.
    storage = FrameStackStorage(16, streams=4)
    with pytest.raises(ValueError, match=re.escape(
            "capacity 16 over 4 streams (4 slots each) cannot hold one stack of 4 frames plus "
            "its next frame")):
        storage.add(Environment(0, frames=True).step()[0], 2)
    assert storage.written == 0 and storage.state_shape is None


def test_a_reservoir_keeps_a_uniform_sample_of_each_stream_in_its_segment():
    memory = ReservoirMemory(30, storage=TransitionStorage(30, streams=3), rng=0)
    for i in range(600):
        index = i % 3
        state = np.full(2, index, np.float32)  # the stream, in the state
        slot = memory.store((state, i // 3, 0.0, state, False), index)
        assert slot is None or slot in memory.storage.segment(index)
    np.testing.assert_array_equal(memory.seen, [200, 200, 200])
    states, actions, *_ = memory.storage.get(np.arange(30))
    np.testing.assert_array_equal(states[:, 0], np.repeat([0, 1, 2], 10))
    # A ring would keep each stream's last ten, 190..199; a uniform sample of 0..199 spreads.
    assert all(actions[10 * index:10 * index + 10].min() < 150 for index in range(3))


@pytest.mark.parametrize("storage_name", ["frame stacks", "single frames"])
def test_a_saved_pending_slot_other_than_the_one_before_its_next_slot_is_refused_naming_it(
        storage_name):
    # Stream 1's last next state's newest frame is in the slot before its next slot; another
    # slot there (its own, or another stream's) would stack other frames onto its next state.
    spec, _ = STORAGES[storage_name]
    arrays = saved_after_12_steps(spec, True)
    before_next = arrays["next_slot"] - 1  # no stream has wrapped to its start here
    assert arrays["pending_slot"][1] == before_next[1]
    for slot in (before_next[1] - 1, 0):  # its own earlier slot, stream 0's
        wrong = arrays["pending_slot"].copy()
        wrong[1] = slot
        assert_load_refused(
            lambda: spec(CAPACITY, STREAMS), {**arrays, "pending_slot": wrong},
            f"saved pending_slot={wrong} disagrees with next_slot={arrays['next_slot']}: "
            f"stream 1's pending slot {slot} is neither -1 nor the slot before its next slot")
    no_pending = arrays["pending_slot"].copy()
    no_pending[1] = -1  # its episode ended: the next add writes its state's frames anew
    spec(CAPACITY, STREAMS).load_state_dict({**arrays, "pending_slot": no_pending})


@pytest.mark.parametrize("storage_name", ["frame stacks", "single frames"])
def test_a_saved_held_slot_unwritten_or_pending_is_refused_naming_holds_transition(storage_name):
    # An unwritten slot has no saved frames to stack; a pending slot's frame is overwritten by
    # its stream's next add, which would not free the transition marked there.
    spec, _ = STORAGES[storage_name]
    arrays = saved_after_12_steps(spec, True)
    unwritten = 25 + int(arrays["written"][2])  # stream 2's first slot never written
    pending = int(arrays["pending_slot"][1])
    assert unwritten < CAPACITY and pending >= 0
    for slot, message in (
            (unwritten, f"saved holds_transition marks slots [{unwritten}] as holding a "
                        "transition, but their streams never wrote them"),
            (pending, f"saved holds_transition marks pending slots [{pending}] as holding a "
                      "transition, but a pending slot holds only its stream's newest next-state "
                      "frame")):
        holds = arrays["holds_transition"].copy()
        holds[slot] = True
        assert_load_refused(lambda: spec(CAPACITY, STREAMS),
                            {**arrays, "holds_transition": holds}, message)
    spec(CAPACITY, STREAMS).load_state_dict(arrays)


@pytest.mark.parametrize("name", ["holds_transition", "actions", "rewards", "dones"])
def test_a_saved_slot_array_without_one_value_per_slot_is_refused_naming_it(name):
    spec, _ = STORAGES["frame stacks"]
    arrays = saved_after_12_steps(spec, True)
    for wrong in (arrays[name][:-1], arrays[name][0]):  # a slot short; one value for all
        assert_load_refused(lambda: spec(CAPACITY, STREAMS), {**arrays, name: wrong},
                            f"saved {name} has shape {wrong.shape}, expected ({CAPACITY},)")


@pytest.mark.parametrize("storage_name", STORAGES)
def test_a_saved_positive_priority_over_a_slot_holding_nothing_is_refused_naming_tree_sums(
        storage_name):
    # After 5 steps stream 2 has written 2 of its 13 slots: the others hold nothing (nor do a
    # frame ring's prefix and pending slots). A zero over a held slot loads: Ape-X's
    # BlockMemory stores its context transitions at priority 0.
    memory = filled("proportional", storage_name, steps=5)
    arrays = save_and_load(memory.state_dict())
    holds = memory.storage.holds(np.arange(CAPACITY))
    empty, held = int(np.flatnonzero(~holds)[-1]), int(np.flatnonzero(holds)[0])
    leaf = CAPACITY - 1  # slot 0's tree index
    sums = arrays["tree.sums"].copy()
    sums[leaf + empty] = 1.0
    loaded = assert_load_refused(
        lambda: memory_of("proportional", storage_name, CAPACITY, STREAMS),
        {**arrays, "tree.sums": sums},
        f"saved tree.sums gives slots [{empty}] a positive priority, but they hold no transition")
    sums = arrays["tree.sums"].copy()
    sums[leaf + held] = 0.0
    loaded.load_state_dict({**arrays, "tree.sums": sums})
    assert loaded.tree.tree[leaf + held] == 0.0


@pytest.mark.parametrize("storage_name", ["vectors", "frame stacks"])
def test_a_saved_ranking_that_is_not_of_distinct_held_slots_keyed_by_their_errors_is_refused(
        storage_name):
    memory = filled("rank-based", storage_name, steps=5)
    memory.batch_update(memory.storage.held_slots(),
                        np.arange(len(memory.storage.held_slots()), dtype=np.float64))
    arrays = save_and_load(memory.state_dict())
    slots, keys = arrays["ranked_slots"], arrays["ranked_keys"]
    empty = int(np.flatnonzero(~memory.storage.holds(np.arange(CAPACITY)))[-1])
    twice = slots.copy()
    twice[1] = twice[0]
    unheld = slots.copy()
    unheld[0] = empty
    rekeyed = keys.copy()
    rekeyed[0] -= 1.0
    for wrong, message in (
            ({"ranked_slots": twice}, "saved ranked_slots names a slot more than once"),
            ({"ranked_slots": unheld},
             f"saved ranked_slots ranks slots [{empty}], which hold no transition"),
            ({"ranked_keys": rekeyed}, "saved ranked_keys are not the ranked slots' -abs_errors"),
            ({"ranked_keys": keys[1:]}, f"saved ranked_slots ({slots.size},) and ranked_keys "
                                        f"({slots.size - 1},) are not one key per ranked slot")):
        loaded = assert_load_refused(
            lambda: memory_of("rank-based", storage_name, CAPACITY, STREAMS), {**arrays, **wrong},
            message)
    loaded.load_state_dict(arrays)
    np.testing.assert_array_equal(loaded.ranked_slots, slots)


@pytest.mark.parametrize("storage_name", ["vectors", "frame stacks"])
def test_a_saved_ranking_that_leaves_a_held_slot_out_is_refused(storage_name):
    # Nothing ranks a left-out slot again but a new error: its transition would never be drawn.
    memory = filled("rank-based", storage_name, steps=5)
    arrays = save_and_load(memory.state_dict())
    slots, keys = arrays["ranked_slots"], arrays["ranked_keys"]
    assert slots.size == len(memory.storage.held_slots()) > 1
    assert_load_refused(
        lambda: memory_of("rank-based", storage_name, CAPACITY, STREAMS),
        {**arrays, "ranked_slots": slots[1:], "ranked_keys": keys[1:]},
        f"saved ranked_slots ranks {slots.size - 1} slots, but {slots.size} hold a transition")
