"""Tests for priority_figure.py: the replay statistics by hand, then watching real memories,
every replay variant (d3qn_agent.REPLAY_MEMORIES and the tests' reservoir, which is not a ring)."""


import numpy as np
import pytest
from conftest import DATA
from matplotlib.figure import Figure
from memory_helpers import ReservoirMemory, experience, registered_memories, save_and_load

from d3qn_utils.agent_checkpoint import FORMAT
from d3qn_utils.atomic_files import read_arrays
from d3qn_utils.priority_figure import AGE_BINS, PriorityFigure, age_bins
from PER import Memory, UniformMemory

MEMORIES = registered_memories()  # every replay variant, by name
PRIORITIZED = {kind: memory for kind, memory in MEMORIES.items() if memory.PRIORITIZED}


def store(memory, stats: PriorityFigure, transition: tuple) -> None:
    """Store as the agent's `remember` does, telling the statistics."""
    stats.note_store(memory.store(transition))


def sample(memory, stats: PriorityFigure, n: int) -> np.ndarray:
    """Sample as the agent's `replay` does, telling the statistics; return `sample`'s indices."""
    indices, _, _ = memory.sample(n)
    stats.note_sample(memory.slots_of(indices), len(memory))
    return indices


def test_age_bins_are_powers_of_two_by_hand():
    ages = np.array([0, 1, 2, 3, 6, 7, 14, 15, 2**50])
    np.testing.assert_array_equal(age_bins(ages), [0, 1, 1, 2, 2, 3, 3, 4, AGE_BINS - 1])


def test_replay_statistics_by_hand():
    stats = PriorityFigure(4, batch_size=1)
    for slot in (0, 1, 2):
        stats.note_store(slot)
    # Three transitions, the newest in slot 2 (age 0), the oldest in slot 0 (age 2).
    stats.note_sample(np.array([2, 2, 0]), held=3)
    np.testing.assert_array_equal(stats.replay_counts, [1, 0, 2, 0])
    np.testing.assert_array_equal(stats.ages(np.array([0, 1, 2])), [2, 1, 0])
    np.testing.assert_array_equal(stats.replays_by_age[:3], [2, 1, 0])  # ages 0 | 1-2 | 3-6
    # One transition of age 0 and two of ages 1-2 were in the memory; uniform replay draws
    # 3 / 3 = 1 per transition.
    np.testing.assert_array_equal(stats.exposure_by_age[:3], [1, 2, 0])
    np.testing.assert_array_equal(stats.uniform_replays_by_age[:3], [1, 2, 0])
    assert stats.replays_by_age.sum() == 3 and stats.exposure_by_age.sum() == 3
    # A fourth transition, one the memory dropped (None: nothing changes), then one that
    # overwrites slot 0: its count starts again.
    stats.note_store(3)
    stats.note_store(None)
    assert stats.stores == 4
    np.testing.assert_array_equal(stats.replay_counts, [1, 0, 2, 0])
    np.testing.assert_array_equal(stats.ages(np.array([0, 1, 2, 3])), [3, 2, 1, 0])
    stats.note_store(0)
    assert stats.stores == 5
    np.testing.assert_array_equal(stats.replay_counts, [0, 0, 2, 0])
    np.testing.assert_array_equal(stats.ages(np.array([0, 1, 2, 3])), [0, 3, 2, 1])
    stats.note_sample(np.array([1, 1]), held=4)  # age 3, memory of 4: ages 0 | 1-2 | 3
    np.testing.assert_array_equal(stats.replays_by_age[:3], [2, 1, 2])
    np.testing.assert_array_equal(stats.exposure_by_age[:3], [2, 4, 1])
    np.testing.assert_allclose(stats.uniform_replays_by_age[:3], [1.5, 3.0, 0.5])


@pytest.mark.parametrize("kind", MEMORIES.values(), ids=MEMORIES)
def test_statistics_count_every_store_and_draw_of_each_memory(kind):
    stats = PriorityFigure(64, batch_size=8)
    memory = kind(64, rng=1)
    stored = []  # the transitions the memory kept when given them, in order
    for i in range(100):  # wraps around (a reservoir drops some)
        slot = memory.store(experience(i))
        stats.note_store(slot)
        stored += [] if slot is None else [i]
    draws = 0
    for _ in range(50):
        tree_idx = sample(memory, stats, 8)
        draws += 8
        memory.batch_update(tree_idx, np.full(8, 0.5))
    assert stats.stores == len(stored) and stats.stores <= 100
    assert stats.replay_counts.sum() <= draws  # draws of overwritten transitions are forgotten
    assert stats.replays_by_age.sum() == draws
    assert stats.uniform_replays_by_age.sum() == pytest.approx(draws)
    assert stats.exposure_by_age.sum() == 50 * 64
    # Each held transition's age: the transitions stored after it (a ring's are 0 .. 63).
    held = memory.storage.held_slots()
    given = memory.storage.get(held)[0][:, 0].astype(int)
    expected = len(stored) - 1 - np.searchsorted(stored, given)
    np.testing.assert_array_equal(stats.ages(held), expected)


def test_a_memory_that_is_not_a_ring_is_counted_by_the_ages_it_holds():
    # A reservoir keeps a sample of everything it was given, not the newest transitions: the
    # ages it holds are not a ring's 0 .. size - 1, and the figure takes them from the slots
    # `store` returned.
    stats = PriorityFigure(32, batch_size=8, ring=ReservoirMemory.WRITES_RING)
    memory = ReservoirMemory(32, rng=0)
    stored: list[int] = []
    exposure, replays = np.zeros(AGE_BINS), np.zeros(AGE_BINS, np.int64)

    def ages_of(given: np.ndarray) -> np.ndarray:
        return len(stored) - 1 - np.searchsorted(stored, given.astype(int))

    for i in range(400):
        slot = memory.store(experience(i))
        stats.note_store(slot)
        stored += [] if slot is None else [i]
        if i >= 31 and i % 10 == 0:
            indices, (states, *_), _ = memory.sample(8)
            stats.note_sample(memory.slots_of(indices), len(memory))
            held = memory.storage.get(memory.storage.held_slots())[0][:, 0]
            exposure += np.bincount(age_bins(ages_of(held)), minlength=AGE_BINS)
            replays += np.bincount(age_bins(ages_of(states[:, 0])), minlength=AGE_BINS)
    np.testing.assert_array_equal(stats.exposure_by_age, exposure)
    np.testing.assert_array_equal(stats.replays_by_age, replays)
    np.testing.assert_allclose(stats.uniform_replays_by_age, exposure * 8 / 32)
    # A ring of 32 holds ages 0 .. 31, none of bins 6 and up; the reservoir does.
    assert exposure[6:].sum() > 0
    # What a checkpoint keeps gives the same counts on.
    restored = PriorityFigure(32, batch_size=8, ring=False)
    restored.load_state_dict(save_and_load(stats.state_dict()))
    slots = memory.slots_of(memory.sample(8)[0])
    for figure in (stats, restored):
        figure.note_sample(slots, len(memory))
    np.testing.assert_array_equal(restored.exposure_by_age, stats.exposure_by_age)


RINGS = {kind: memory for kind, memory in MEMORIES.items() if memory.WRITES_RING}


@pytest.mark.parametrize("kind", RINGS.values(), ids=RINGS)
def test_a_ring_s_ages_by_formula_are_those_its_slots_hold(kind):
    # WRITES_RING lets the figure count a ring's ages as 0 .. size - 1 without reading its slots:
    # the counts are those of reading them, while it fills and once it wraps.
    by_formula, by_slots = PriorityFigure(32, 8), PriorityFigure(32, 8, ring=False)
    memory = kind(32, rng=0)
    for i in range(100):
        slot = memory.store(experience(i))
        for figure in (by_formula, by_slots):
            figure.note_store(slot)
        if i >= 7:
            slots = memory.slots_of(memory.sample(8)[0])
            for figure in (by_formula, by_slots):
                figure.note_sample(slots, len(memory))
    np.testing.assert_array_equal(by_formula.exposure_by_age, by_slots.exposure_by_age)
    assert by_formula.exposure_by_age[6:].sum() == 0  # a ring of 32 holds ages 0 .. 31 (bin 5)


def test_uniform_memory_replays_every_age_at_the_uniform_rate():
    stats = PriorityFigure(256, batch_size=64)
    memory = UniformMemory(256, rng=3)
    for i in range(256):
        store(memory, stats, experience(i))
    for _ in range(400):
        sample(memory, stats, 64)
    old = slice(4, 8)  # ages 15 .. 254: 16 to 128 transitions per bin, 1,600 draws or more
    np.testing.assert_allclose(stats.replays_by_age[old], stats.uniform_replays_by_age[old],
                               rtol=0.1)
    np.testing.assert_allclose(stats.uniform_replays_by_age[old] / stats.exposure_by_age[old],
                               64 / 256)


@pytest.mark.parametrize("kind", PRIORITIZED.values(), ids=PRIORITIZED)
def test_prioritized_memory_replays_new_transitions_more_than_uniform_would(kind):
    stats = PriorityFigure(256, batch_size=4)
    memory = kind(256, rng=3)
    for i in range(1024):
        store(memory, stats, experience(i))
        tree_idx = sample(memory, stats, 4)
        memory.batch_update(tree_idx, np.full(4, 1e-3))  # replayed ones lose their priority
    rate = stats.replays_by_age / np.maximum(stats.exposure_by_age, 1)
    uniform_rate = stats.uniform_replays_by_age / np.maximum(stats.exposure_by_age, 1)
    # Proportional: the newest transition has priority 1 against ~0.067 for the replayed ones:
    # a share of about 1 / (1 + 255 * 0.067) = 5.5% of each draw once the memory is full, ~14
    # times uniform replay's 1/256 (less while it fills: 7.9 times over the whole run).
    # Rank-based: it ranks first, 1 / sum_r r^-0.7 = 6.7% of each draw.
    assert rate[0] > 5 * uniform_rate[0]
    assert rate[6] < uniform_rate[6]  # ages 63 .. 126: replayed already, so below uniform


def test_the_priority_figure_survives_a_checkpoint():
    figure = PriorityFigure(16, batch_size=4)
    memory = Memory(16, rng=0)
    for i in range(20):
        figure.note_store(memory.store(experience(i)))
        tree_idx, _, is_weights = memory.sample(8)
        figure.note_replay(memory.slots_of(tree_idx), len(memory), step=i,
                           last_gradient_step=2 * i + 1, beta=0.5,
                           is_weights=is_weights.reshape(2, 4))
    arrays = save_and_load(figure.state_dict())
    restored = PriorityFigure(16, batch_size=4)
    restored.load_state_dict(arrays)
    for key, value in figure.state_dict().items():
        np.testing.assert_array_equal(restored.state_dict()[key], value)
    assert restored.history == figure.history and len(figure.history) == 1  # gradient step 0
    assert restored.recent_batches == figure.recent_batches == 40
    bad = dict(arrays, **{"stats.replay_counts": np.zeros(3, dtype=np.int64)})
    with pytest.raises(ValueError, match=r"stats.replay_counts has shape \(3,\)"):
        PriorityFigure(16, batch_size=4).load_state_dict(bad)
    with pytest.raises(ValueError, match=r"saved recent_is_weights has shape \(20, 4\), expected "
                                         r"\(20, 8\)"):
        PriorityFigure(16, batch_size=8).load_state_dict(arrays)


def test_priority_figure_before_the_first_batch_draws_nothing_and_says_so(tmp_path):
    figure = PriorityFigure(8, batch_size=4)
    path = tmp_path / "priorities.png"
    assert figure.draw(str(path), Memory(8, rng=0), "t") is False
    assert not path.exists()
    figure.note_store(0)
    figure.note_replay(np.array([0]), 1, step=1, last_gradient_step=0, beta=0.4,
                       is_weights=np.ones((1, 4), np.float32))
    memory = Memory(8, rng=0)
    memory.store((np.zeros(2, np.float32), 0, 1.0, np.zeros(2, np.float32), False))
    assert figure.draw(str(path), memory, "t") is True
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_one_stream_counts_one_ring_of_every_transition_stored():
    # One stream (N_ENVS 1): a transition's age is every transition stored after it, and the
    # memory holds one of each age below its size: the counters and what they save are those.
    figure = PriorityFigure(32, batch_size=8)
    memory = Memory(32, rng=0)
    stored_at, counts = np.zeros(32, np.int64), np.zeros(32, np.int64)
    replays, exposure, uniform = np.zeros(AGE_BINS, np.int64), np.zeros(AGE_BINS), np.zeros(
        AGE_BINS)
    for i in range(100):
        slot = memory.store(experience(i))
        figure.note_store(slot)
        stored_at[slot], counts[slot] = i, 0
        if i >= 7:
            slots = memory.slots_of(memory.sample(8)[0])
            figure.note_sample(slots, memory.held_per_stream())
            np.add.at(counts, slots, 1)
            replays += np.bincount(age_bins(i - stored_at[slots]), minlength=AGE_BINS)
            held = np.bincount(age_bins(np.arange(len(memory))), minlength=AGE_BINS)
            exposure += held
            uniform += held * (8 / len(memory))
    assert memory.held_per_stream().tolist() == [32]
    state = figure.state_dict()
    expected = {"stats.replay_counts": counts, "stats.stored_at": stored_at,
                "stats.stores": np.array(100), "stats.replays_by_age": replays,
                "stats.exposure_by_age": exposure, "stats.uniform_replays_by_age": uniform}
    for key, value in expected.items():
        assert state[key].shape == value.shape and state[key].dtype == value.dtype, key
        np.testing.assert_array_equal(state[key], value)


def test_one_stream_loads_and_saves_the_arrays_of_a_checkpoint_unchanged():
    # The step-400 checkpoint of tests/test_checkpoint_format.py's newest fixture, one
    # environment: its priority_figure.npz comes back key for key, dtype, shape and value.
    saved = read_arrays(DATA / f"checkpoint_format_{FORMAT}" / "step-0000000400" /
                        "priority_figure.npz")
    figure = PriorityFigure(500, batch_size=16)
    figure.load_state_dict(dict(saved))
    again = save_and_load(figure.state_dict())
    assert list(again) == list(saved)
    for key, value in saved.items():
        assert again[key].dtype == value.dtype and again[key].shape == value.shape, key
        np.testing.assert_array_equal(again[key], value)


def three_streams() -> PriorityFigure:
    """A figure of 7 slots in 3 streams, segments [0, 2), [2, 4) and [4, 7), given eight
    stores in turn: stream 0 in slots 0, 1, 0 (a ring of 2), stream 1 in slot 2, stream 2 in
    slots 4, 5, 6, 4 (a ring of 3)."""
    figure = PriorityFigure(7, batch_size=3, streams=3)
    np.testing.assert_array_equal(figure.starts, [0, 2, 4])
    np.testing.assert_array_equal(figure.sizes, [2, 2, 3])
    for slot in (0, 4, 2, 1, 5, 6, 0, 4):
        figure.note_store(slot)
    return figure


def test_three_streams_count_each_transition_s_age_in_its_own_stream_by_hand():
    figure = three_streams()
    assert figure.stream_stores == [3, 1, 4] and figure.stores == 8
    # Stream 0 stored 3: slot 0 the last (age 0), slot 1 the one before (age 1). Stream 1: slot
    # 2 (age 0). Stream 2 stored 4: slot 4 the last (0), slot 6 the third (1), slot 5 the
    # second (2). Counted over all streams, slot 5 would be 4 old and slot 1 5.
    held = np.array([0, 1, 2, 4, 5, 6])
    np.testing.assert_array_equal(figure.ages(held), [0, 1, 0, 0, 2, 1])
    # The streams hold 2, 1 and 3: ages 0, 1 | 0 | 0, 1, 2, so 3 of age 0 and 3 of ages 1-2.
    figure.note_sample(np.array([1, 5, 6]), [2, 1, 3])  # ages 1, 2, 1: all of bin 1
    np.testing.assert_array_equal(figure.replays_by_age[:3], [0, 3, 0])
    np.testing.assert_array_equal(figure.exposure_by_age[:3], [3, 3, 0])
    np.testing.assert_allclose(figure.uniform_replays_by_age[:3], [1.5, 1.5, 0])  # 3 draws of 6
    np.testing.assert_array_equal(figure.replay_counts, [0, 1, 0, 0, 0, 1, 1])
    assert figure.data(Memory(7, rng=0))["streams"] == 3
    # A memory that is not a ring has its ages read slot by slot, each stream's newest held.
    slot_by_slot = three_streams()
    slot_by_slot.ring = False
    np.testing.assert_array_equal(slot_by_slot.held_by_age(np.array([2, 1, 3]))[:3], [3, 3, 0])
    np.testing.assert_array_equal(slot_by_slot.held_by_age(np.array([1, 0, 2]))[:3], [2, 1, 0])
    # One count for three streams is refused, naming it.
    with pytest.raises(ValueError, match=r"each of the 3 streams, got 6"):
        figure.note_sample(np.array([0]), 6)
    # Saved: one count of stores per stream (one stream's is a scalar, as before streams).
    state = save_and_load(figure.state_dict())
    assert state["stats.stores"].tolist() == [3, 1, 4]
    restored = PriorityFigure(7, batch_size=3, streams=3)
    restored.load_state_dict(state)
    np.testing.assert_array_equal(restored.ages(held), figure.ages(held))


def test_streams_saved_with_one_count_of_stores_load_with_each_stream_s_ages():
    # A figure of several streams saved while it counted every stream's stores together: the
    # slot of each store in the order of all stores, "stats.stores" one scalar.
    figure = three_streams()
    older = {**save_and_load(figure.state_dict()), "stats.stores": np.array(8),
             "stats.stored_at": np.array([6, 3, 2, 0, 7, 4, 5])}
    restored = PriorityFigure(7, batch_size=3, streams=3)
    restored.load_state_dict(older)
    held = np.array([0, 1, 2, 4, 5, 6])
    np.testing.assert_array_equal(restored.ages(held), figure.ages(held))
    for each in (figure, restored):  # and both go on alike: stream 1 stores in slot 3
        each.note_store(3)
    np.testing.assert_array_equal(restored.ages(np.append(held, 3)),
                                  figure.ages(np.append(held, 3)))
    # The sums counted before come back as saved.
    np.testing.assert_array_equal(restored.exposure_by_age, figure.exposure_by_age)


def test_the_age_axis_says_which_transitions_an_age_counts(tmp_path, monkeypatch):
    labels, savefig = [], Figure.savefig

    def save_noting_the_label(figure: Figure, *args, **kwargs) -> None:
        labels.append(figure.axes[3].get_xlabel())  # the bottom right panel's: ages
        savefig(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", save_noting_the_label)
    memory = Memory(7, rng=0)
    memory.store(experience(0))
    one_stream = PriorityFigure(7, batch_size=3)
    one_stream.note_store(0)
    for figure in (one_stream, three_streams()):
        figure.note_replay(np.array([0]), [1] * figure.streams, step=1, last_gradient_step=0,
                           beta=0.4, is_weights=np.ones((1, 3), np.float32))
        assert figure.draw(str(tmp_path / "priorities.png"), memory, "t")
    assert labels == ["age + 1 (transitions stored after it, log bins)",
                      "age + 1 (transitions its environment stored after it, log bins)"]
