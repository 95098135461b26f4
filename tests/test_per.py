"""Tests for PER.py: small trees checked by hand, then statistics with fixed seeds."""

import io

import numpy as np
import pytest

from PER import Memory, SumTree, UniformMemory, replay_bytes_per_slot
from replay_storage import FrameStackStorage, TransitionStorage


def filled_tree(priorities: list[float]) -> SumTree:
    tree = SumTree(len(priorities))
    for data, priority in enumerate(priorities):
        tree.add(priority, f"d{data}")
    return tree


def experience(i: int) -> tuple:
    state = np.full(3, i, dtype=np.float32)
    return state, i % 2, float(i), state + 1, i % 3 == 0


def filled_memory(n: int, **kwargs) -> Memory:
    memory = Memory(kwargs.pop("capacity", n), rng=kwargs.pop("rng", 0), **kwargs)
    for i in range(n):
        memory.store(experience(i))
    return memory


def with_each_memory_kind(capacity: int) -> pytest.MarkDecorator:
    """Run the test once per kind of memory: its argument `make(observer)` builds one of
    `capacity` slots."""
    return pytest.mark.parametrize("make", [
        lambda observer: UniformMemory(capacity, rng=1, observer=observer),
        lambda observer: Memory(capacity, rng=1, observer=observer),
        lambda observer: Memory(capacity, rng=1, rank_based=True, observer=observer),
    ], ids=["uniform", "proportional", "rank"])


class RecordingObserver:
    """An observer that records what the memory tells it: ("store", slot), ("stores", slots),
    ("sample", slots, size), in call order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def note_store(self, slot: int) -> None:
        self.calls.append(("store", slot))

    def note_stores(self, slots: np.ndarray) -> None:
        self.calls.append(("stores", slots.tolist()))

    def note_sample(self, slots: np.ndarray, size: int) -> None:
        self.calls.append(("sample", slots.tolist(), size))


# SumTree on trees small enough to check by hand -------------------------------------------------


def test_capacity_4_node_sums():
    # Node i has children 2i+1 and 2i+2; the leaves are nodes 3..6, as the docstring draws them.
    #        10
    #      3    7
    #     1 2  3 4
    tree = filled_tree([1, 2, 3, 4])
    np.testing.assert_array_equal(tree.tree, [10, 3, 7, 1, 2, 3, 4])
    np.testing.assert_array_equal(tree.mins, [1, 1, 3, 1, 2, 3, 4])
    assert tree.total_priority == 10
    assert tree.min_priority == 1


def test_capacity_4_leaf_at_segment_boundaries():
    # Leaf ranges: [0, 1) [1, 3) [3, 6) [6, 10]; a boundary belongs to the leaf on its right.
    tree = filled_tree([1, 2, 3, 4])
    expected = {0.0: 3, 0.999: 3, 1.0: 4, 2.999: 4, 3.0: 5, 5.999: 5, 6.0: 6, 10.0: 6}
    for value, leaf in expected.items():
        assert tree.get_leaf(value)[0] == leaf, value
    assert tree.get_leaf(3.5) == (5, 3.0, "d2")


def test_capacity_5_uneven_tree():
    # 9 nodes; leaves 4..8 hold data 0..4. Leaves 7 and 8 hang one level deeper, under node 3:
    #             15
    #        10        5
    #      9    1    2   3
    #     4 5
    tree = filled_tree([1, 2, 3, 4, 5])
    np.testing.assert_array_equal(tree.tree, [15, 10, 5, 9, 1, 2, 3, 4, 5])
    np.testing.assert_array_equal(tree.mins, [1, 1, 2, 4, 1, 2, 3, 4, 5])
    # Left to right the leaves are 7, 8, 4, 5, 6 with ranges [0,4) [4,9) [9,10) [10,12) [12,15].
    expected = {0.0: 7, 3.999: 7, 4.0: 8, 8.999: 8, 9.0: 4, 9.5: 4, 10.0: 5, 12.0: 6, 15.0: 6}
    for value, leaf in expected.items():
        assert tree.get_leaf(value)[0] == leaf, value
    leaves, priorities, data = tree.get_leaves(np.array(list(expected)))
    np.testing.assert_array_equal(leaves, list(expected.values()))
    np.testing.assert_array_equal(priorities, tree.tree[leaves])
    assert list(data) == [f"d{leaf - 4}" for leaf in leaves]


def test_update_batch_matches_single_updates_and_last_duplicate_wins():
    tree = filled_tree([1, 2, 3, 4, 5])
    tree.update_batch(np.array([4, 8, 4, 6]), np.array([10.0, 0.5, 7.0, 0.0]))
    # Leaf 4 gets its last value 7; leaf 6 becomes empty.
    np.testing.assert_array_equal(tree.tree[4:], [7, 2, 0, 4, 0.5])
    np.testing.assert_array_equal(tree.tree[:4], [13.5, 11.5, 2, 4.5])
    assert tree.min_priority == 0.5  # the empty leaf does not count


@pytest.mark.parametrize("capacity", [1, 2, 3, 5, 7, 64, 100, 1000, 1025])
def test_batch_update_is_bit_identical_to_one_walk_per_leaf(capacity):
    # update_batch recomputes shared ancestors once per level instead of once per leaf; every
    # node must still end exactly as the tutorial's leaf-by-leaf walk leaves it, in trees with
    # leaves on one level or two, with duplicates, over many batches.
    rng = np.random.default_rng(capacity)
    batched, walked = SumTree(capacity), SumTree(capacity)
    for _ in range(30):
        leaves = rng.integers(capacity - 1, 2 * capacity - 1, size=rng.integers(1, 300))
        priorities = rng.exponential(1.0, leaves.size) * (rng.random(leaves.size) < 0.9)
        batched.update_batch(leaves, priorities)
        for leaf, priority in zip(leaves, priorities, strict=True):
            walked.update(int(leaf), float(priority))
        np.testing.assert_array_equal(batched.tree, walked.tree)
        np.testing.assert_array_equal(batched.mins, walked.mins)


def test_wrap_around_overwrites_oldest():
    tree = filled_tree([1, 2, 3, 4])
    tree.add(10, "new")
    assert tree.data_pointer == 1
    assert tree.get_leaf(0.0) == (3, 10.0, "new")
    assert tree.total_priority == 19


def test_search_never_returns_an_empty_leaf():
    tree = SumTree(8)
    tree.update_batch(np.array([7, 8, 9]), np.array([1.0, 2.0, 3.0]))
    # At or past the total, and with rounding pushed to the edge: the last filled leaf, 9.
    leaves = tree.find(np.array([6.0, 6.0 + 1e-12, np.nextafter(6.0, 7.0)]))
    np.testing.assert_array_equal(leaves, [9, 9, 9])
    tree.update(8, 0.0)
    assert set(tree.find(np.linspace(0, tree.total_priority, 101))) == {7, 9}


def test_no_drift_after_a_million_updates():
    rng = np.random.default_rng(1)
    capacity = 1000
    tree = SumTree(capacity)
    for _ in range(1000):
        leaves = rng.integers(capacity - 1, 2 * capacity - 1, size=1000)
        # Priorities spanning ten orders of magnitude make rounding errors as large as they get.
        tree.update_batch(leaves, 10.0 ** rng.uniform(-5, 5, size=1000))
    leaves = tree.tree[capacity - 1 :]
    assert tree.total_priority == pytest.approx(leaves.sum(), rel=1e-9)
    inner = np.arange(capacity - 1)
    np.testing.assert_allclose(
        tree.tree[inner], tree.tree[2 * inner + 1] + tree.tree[2 * inner + 2], rtol=1e-9
    )
    assert tree.min_priority == leaves.min()
    # Empty most leaves again: searches still find only non-empty ones.
    tree.update_batch(np.arange(capacity - 1, 2 * capacity - 11), 0.0)
    found = tree.find(rng.uniform(0, tree.total_priority, size=10_000))
    assert (tree.tree[found] > 0).all()


@pytest.mark.parametrize("capacity", [0, -3, 2.5, "8", True])
def test_bad_capacity(capacity):
    with pytest.raises(ValueError, match="capacity"):
        SumTree(capacity)
    with pytest.raises(ValueError, match="capacity"):
        Memory(capacity)
    with pytest.raises(ValueError, match="capacity"):
        UniformMemory(capacity)


def test_sum_tree_bad_input_leaves_tree_unchanged():
    tree = filled_tree([1, 2, 3, 4])
    before = tree.tree.copy()
    with pytest.raises(ValueError, match="nan"):
        tree.update_batch(np.array([3, 4]), np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="-2"):
        tree.update(5, -2.0)
    with pytest.raises(ValueError, match="tree index 2 is not a leaf"):
        tree.update_batch(np.array([3, 2]), np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match="-1"):
        tree.get_leaf(-1.0)
    np.testing.assert_array_equal(tree.tree, before)
    with pytest.raises(ValueError, match="empty sum tree"):
        SumTree(4).get_leaf(0.0)


# Memory: storage, priorities, importance-sampling weights ---------------------------------------


def test_batch_fields_keep_their_types():
    memory = filled_memory(5)
    tree_idx, batch, is_weights = memory.sample(4)
    states, actions, rewards, next_states, dones, discounts = batch
    assert states.shape == (4, 3) and states.dtype == np.float32
    assert actions.dtype == np.int64 and rewards.dtype == np.float64 and dones.dtype == bool
    np.testing.assert_array_equal(next_states, states + 1)
    np.testing.assert_array_equal(rewards, states[:, 0])
    np.testing.assert_array_equal(discounts, np.float32(0.99))  # gamma: one-step transitions
    assert tree_idx.shape == (4,) and is_weights.dtype == np.float32


def sampled_by_slot(memory: UniformMemory, draws: int = 300) -> dict[int, tuple]:
    """{slot: (reward, next_state[0], done, discount)} over many uniform draws."""
    tree_idx, (_, _, rewards, next_states, dones, discounts), _ = memory.sample(draws)
    rows = zip(rewards.tolist(), next_states[:, 0].tolist(), dones.tolist(), discounts.tolist(),
               strict=True)
    return dict(zip((tree_idx - (memory.capacity - 1)).tolist(), rows, strict=True))


def test_n_step_returns_by_hand():
    # gamma = 1/2, n = 3. Episode A terminates after three steps; episode B is truncated after
    # two (its last transition is not done, and the next one starts elsewhere); C is running.
    memory = UniformMemory(6, rng=0, n_step=3, gamma=0.5)
    episodes = [
        [(0, 1.0, False), (1, 2.0, False), (2, 4.0, True)],  # (state, reward, done)
        [(10, 1.0, False), (11, 1.0, False)],
        [(20, 8.0, False)],
    ]
    for episode in episodes:
        for state, reward, done in episode:
            memory.store((np.array([state], np.float32), 0, reward, np.array([state + 1],
                          np.float32), done))
    assert sampled_by_slot(memory) == {
        0: (1 + 2 / 2 + 4 / 4, 3, True, 1 / 8),  # the whole of episode A
        1: (2 + 4 / 2, 3, True, 1 / 4),
        2: (4, 3, True, 1 / 2),
        3: (1 + 1 / 2, 12, False, 1 / 4),  # B's truncation ends the sum; bootstrap from 12
        4: (1, 12, False, 1 / 2),
        5: (8, 21, False, 1 / 2),  # the newest transition: nothing follows it yet
    }
    # Wrapping around: slot 0 now continues episode C, so slot 5's chain runs on into it.
    memory.store((np.array([21], np.float32), 0, 16.0, np.array([22], np.float32), False))
    assert sampled_by_slot(memory)[5] == (8 + 16 / 2, 22, False, 1 / 4)


def test_n_step_chain_never_runs_from_the_newest_into_the_oldest_transition():
    # A cycle a -> b -> c -> a: the oldest transition starts where the newest ends, but it came
    # before it, so the newest one's return has a single step.
    memory = UniformMemory(3, rng=0, n_step=2, gamma=0.5)
    for state in range(3):
        memory.store((np.array([state], np.float32), 0, 1.0,
                      np.array([(state + 1) % 3], np.float32), False))
    assert sampled_by_slot(memory) == {
        0: (1.5, 2, False, 1 / 4), 1: (1.5, 0, False, 1 / 4), 2: (1.0, 0, False, 1 / 2)
    }


@pytest.mark.parametrize("n_step", [0, -1, 2.5, True])
def test_bad_n_step_is_rejected(n_step):
    with pytest.raises(ValueError, match="n_step"):
        Memory(4, n_step=n_step)


def test_partly_filled_memory_samples_only_filled_slots():
    memory = filled_memory(3, capacity=100)
    assert len(memory) == 3
    for _ in range(50):
        tree_idx, (states, *_), _ = memory.sample(32)
        assert set(tree_idx - 99) <= {0, 1, 2}
        np.testing.assert_array_equal(states[:, 0], tree_idx - 99)


def test_wrap_around_keeps_the_newest_transitions():
    memory = filled_memory(6, capacity=4)
    assert len(memory) == 4
    _, (states, *_), _ = memory.sample(200)
    assert set(states[:, 0]) == {2.0, 3.0, 4.0, 5.0}


def test_new_transitions_get_the_highest_priority_so_far():
    memory = Memory(8, alpha=1.0, epsilon=0.01, abs_err_upper=10.0, rng=0)
    memory.store(experience(0))
    assert memory.tree.tree[7] == 1.0  # before any error is known: as if |delta| = 1
    memory.batch_update(np.array([7]), np.array([5.0]))
    memory.store(experience(1))
    assert memory.tree.tree[8] == pytest.approx(5.01)
    memory.batch_update(np.array([7, 8]), np.array([0.1, 0.2]))
    memory.store(experience(2))
    assert memory.tree.tree[9] == pytest.approx(5.01)  # the maximum ever seen, not current


def test_priority_formula_and_clipping():
    memory = filled_memory(4, alpha=0.5, epsilon=0.01, abs_err_upper=1.0)
    memory.batch_update(np.array([3, 4, 5, 6]), np.array([0.0, 0.15, 3.0, 0.99]))
    np.testing.assert_allclose(memory.tree.tree[3:], np.sqrt([0.01, 0.16, 1.0, 1.0]))


def test_importance_sampling_weights_match_the_paper():
    memory = filled_memory(5, alpha=1.0, beta=0.4, beta_increment=0.1, epsilon=0.5)
    memory.batch_update(np.arange(4, 9), np.array([0.5, 1.5, 0.0, 2.0, 9.0]))
    tree_idx, _, is_weights = memory.sample(50)
    assert memory.beta == pytest.approx(0.5)
    priorities = np.array([1.0, 2.0, 0.5, 2.5, 1.0])  # |delta| + 0.5, clipped at 1.0 upper
    priorities = np.minimum(priorities, 1.0)
    probabilities = priorities / priorities.sum()
    weights = (5 * probabilities) ** -0.5
    expected = weights[tree_idx - 4] / weights.max()
    np.testing.assert_allclose(is_weights, expected, rtol=1e-6)
    assert is_weights.max() <= 1.0


def test_beta_grows_to_one_and_stops():
    memory = filled_memory(4, beta=0.9, beta_increment=0.04)
    betas = [memory.sample(2) and memory.beta for _ in range(4)]
    np.testing.assert_allclose(betas, [0.94, 0.98, 1.0, 1.0])


def test_proportional_sampling_frequencies_match_probabilities():
    memory = filled_memory(6, alpha=0.7, abs_err_upper=100.0, rng=42)
    errors = np.array([0.0, 0.5, 1.0, 2.0, 4.0, 8.0])
    memory.batch_update(np.arange(5, 11), errors)
    priorities = (errors + 0.01) ** 0.7
    counts = np.zeros(6)
    for _ in range(1000):
        tree_idx, _, _ = memory.sample(64)
        counts += np.bincount(tree_idx - 5, minlength=6)
    # 64,000 draws: each frequency's standard error is below 0.002.
    np.testing.assert_allclose(counts / counts.sum(), priorities / priorities.sum(), atol=0.01)


def test_rank_based_sampling_frequencies_and_weights():
    memory = filled_memory(6, rank_based=True, alpha=0.7, beta=0.5, beta_increment=0.0, rng=7)
    errors = np.array([0.3, 5.0, 0.1, 2.0, 0.2, 1.0])  # ranks 4, 1, 6, 2, 5, 3
    memory.batch_update(np.arange(5, 11), errors)
    ranks = np.array([4, 1, 6, 2, 5, 3])
    probabilities = ranks**-0.7 / (np.arange(1, 7) ** -0.7).sum()
    counts = np.zeros(6)
    for _ in range(1000):
        tree_idx, _, is_weights = memory.sample(64)
        counts += np.bincount(tree_idx - 5, minlength=6)
        weights = (6 * probabilities) ** -0.5
        np.testing.assert_allclose(is_weights, weights[tree_idx - 5] / weights.max(), rtol=1e-6)
    np.testing.assert_allclose(counts / counts.sum(), probabilities, atol=0.01)


def test_rank_based_new_transitions_rank_first():
    memory = filled_memory(4, capacity=8, rank_based=True, rng=0)
    memory.batch_update(np.arange(7, 11), np.array([1.0, 2.0, 3.0, 4.0]))
    memory.store(experience(4))
    memory.sample(1)
    assert memory._ranked_slots[0] == 4
    np.testing.assert_array_equal(memory._ranked_slots[1:], [3, 2, 1, 0])


def test_sampling_probabilities_sum_to_one_and_follow_the_priorities():
    memory = filled_memory(4, capacity=8)
    memory.batch_update(np.array([7, 8, 9, 10]), np.array([0.0, 0.09, 0.24, 0.49]))
    slots, probabilities = memory.sampling_probabilities()
    np.testing.assert_array_equal(slots, [0, 1, 2, 3])
    priorities = np.array([0.01, 0.1, 0.25, 0.5]) ** 0.6  # (|delta| + 0.01)^alpha
    np.testing.assert_allclose(probabilities, priorities / priorities.sum())
    ranked = Memory(8, rank_based=True, rng=0)
    for i in range(4):
        ranked.store(experience(i))
    ranked.batch_update(np.array([7, 8, 9, 10]), np.array([0.3, 0.1, 0.4, 0.2]))
    slots, probabilities = ranked.sampling_probabilities()
    np.testing.assert_array_equal(slots, [2, 0, 3, 1])  # largest |delta| first
    expected = np.arange(1, 5) ** -0.6  # P(rank j) proportional to j^-alpha
    np.testing.assert_allclose(probabilities, expected / expected.sum())
    uniform = UniformMemory(8)
    for i in range(3):
        uniform.store(experience(i))
    np.testing.assert_allclose(uniform.sampling_probabilities()[1], [1 / 3] * 3)


def test_memory_bad_input_raises_and_changes_nothing():
    with pytest.raises(ValueError, match="empty memory"):
        Memory(4).sample(2)
    memory = filled_memory(4)
    before = memory.tree.tree.copy()
    for bad in (np.nan, np.inf, -0.5):
        with pytest.raises(ValueError, match=str(bad)):
            memory.batch_update(np.array([3, 4]), np.array([0.1, bad]))
    with pytest.raises(ValueError, match="tree index 9 is not a leaf"):
        memory.batch_update(np.array([9]), np.array([0.1]))
    with pytest.raises(ValueError, match="2 tree indices but 1 errors"):
        memory.batch_update(np.array([3, 4]), np.array([0.1]))
    np.testing.assert_array_equal(memory.tree.tree, before)
    with pytest.raises(ValueError, match="batch size"):
        memory.sample(0)
    with pytest.raises(ValueError, match=r"state has shape \(2,\), but the memory holds \(3,\)"):
        memory.store((np.zeros(2, np.float32), 0, 0.0, np.zeros(2, np.float32), False))
    with pytest.raises(ValueError, match="experience"):
        memory.store((1, 2, 3))
    for name, value in (("alpha", -1.0), ("beta", 1.5), ("epsilon", 0.0), ("abs_err_upper", 0),
                        ("action_count", 0)):
        with pytest.raises(ValueError, match=name):
            Memory(4, **{name: value})


def state_dicts_equal(first: dict, second: dict) -> bool:
    return first.keys() == second.keys() and all(
        np.array_equal(first[key], second[key]) for key in first)


@pytest.mark.parametrize("kind", ["uniform", "proportional", "rank"])
def test_store_refuses_a_transition_that_is_not_finite_or_has_a_bad_action_and_writes_nothing(
        kind):
    memory = {"uniform": UniformMemory, "proportional": Memory,
              "rank": lambda *args, **kwargs: Memory(*args, rank_based=True, **kwargs),
              }[kind](4, rng=0, action_count=2)
    for i in range(6):  # full, wrapped around: the next store overwrites the oldest, slot 2
        memory.store(experience(i))
    before = memory.state_dict()
    state, nan_state = np.full(3, 9.0, np.float32), np.array([1.0, np.nan, 2.0], np.float32)
    refused = [
        ((state, 0, np.nan, state, False), "reward must be a finite number, got nan"),
        ((state, 0, -np.inf, state, False), "reward must be a finite number, got -inf"),
        ((state, 0, None, state, False), "reward must be a finite number, got None"),
        ((nan_state, 0, 1.0, state, False), "^state must be finite, got nan"),
        ((state, 0, 1.0, state * np.inf, False), "next_state must be finite, got inf"),
        ((state, -1, 1.0, state, False), r"action must be an integer in 0\.\.1, got -1"),
        ((state, 2, 1.0, state, False), r"action must be an integer in 0\.\.1, got 2"),
        ((state, 1.7, 1.0, state, False), "action must be an integer, got 1.7"),
        ((state, True, 1.0, state, False), "action must be an integer, got True"),
        ((state, "1", 1.0, state, False), "action must be an integer, got '1'"),
        ((state, 1, 1.0, state, 0.5), "done must be True or False, got 0.5"),
        ((state, 1, 1.0, ["a", "b", "c"], False), "next_state must hold numbers"),
    ]
    for transition, message in refused:
        with pytest.raises(ValueError, match=message):
            memory.store(transition)
        assert state_dicts_equal(memory.state_dict(), before), transition
    # Integers of every kind, numpy floats and 0 / 1 for done are fine.
    memory.store((state, np.int32(1), np.float32(0.5), state, 1))
    memory.store((state, np.array(0), 2, state, np.bool_(False)))
    assert (memory.storage.fields[0][[2, 3]] == 9).all()


def test_a_frame_memory_refuses_an_action_out_of_range_and_writes_nothing():
    frames = np.arange(1, 9, dtype=np.uint8)[:, None, None] * np.ones((1, 2, 2), np.uint8)
    stacks = [np.stack(frames[i:i + 2], axis=-1) for i in range(7)]
    memory = Memory(4, storage=FrameStackStorage(4), rng=0, action_count=3)
    for i in range(5):
        memory.store((stacks[i], i % 3, 1.0, stacks[i + 1], False))
    before = memory.state_dict()
    for action in (-1, 3):
        with pytest.raises(ValueError, match=f"action must be an integer in 0..2, got {action}"):
            memory.store((stacks[5], action, 1.0, stacks[6], False))
        assert state_dicts_equal(memory.state_dict(), before)


def array_bytes(*holders: object) -> int:
    """Bytes of the numpy arrays the objects hold as attributes, alone or in tuples."""
    arrays = [item for holder in holders for value in vars(holder).values()
              for item in (value if isinstance(value, tuple) else (value,))
              if isinstance(item, np.ndarray)]
    return sum(array.nbytes for array in arrays)


@pytest.mark.parametrize("kind", ["uniform", "proportional", "rank-based"])
@pytest.mark.parametrize("state_shape", [(4,), (10, 10, 4)], ids=["vector", "frames"])
def test_replay_bytes_per_slot_is_what_a_full_memory_holds(kind, state_shape):
    # Filled as the agents fill it: float32 vectors or uint8 frame stacks, Python int actions,
    # float rewards, bool dones; a sample lets the rank-based memory sort every slot.
    capacity = 4096
    frames = np.random.default_rng(0).integers(0, 256, (capacity + 4, 10, 10), dtype=np.uint8)
    storage = FrameStackStorage(capacity) if len(state_shape) == 3 else None
    make = {"uniform": UniformMemory, "proportional": Memory,
            "rank-based": lambda *args, **kwargs: Memory(*args, rank_based=True, **kwargs)}[kind]
    memory = make(capacity, storage=storage, rng=0)
    for i in range(capacity):
        if storage is None:
            state, next_state = np.full(4, i, np.float32), np.full(4, i + 1, np.float32)
        else:
            state = np.stack(frames[i:i + 4], axis=-1)
            next_state = np.stack(frames[i + 1:i + 5], axis=-1)
        memory.store((state, i % 2, 1.0, next_state, False))
    memory.sample(32)
    holders = [memory, memory.storage, *([memory.tree] if kind == "proportional" else [])]
    measured = array_bytes(*holders) / capacity
    # What stays is a few fixed arrays (the tree's queue of 1,023 nodes, a pending stack): < 3
    # bytes a slot here, nothing for the millions of slots the estimate is for.
    assert 0 <= measured - replay_bytes_per_slot(state_shape, np.dtype(
        np.float32 if storage is None else np.uint8), kind) < 3


# UniformMemory and storage -----------------------------------------------------------------------


def test_uniform_memory_has_the_same_interface():
    memory = UniformMemory(8, rng=3)
    for i in range(5):
        memory.store(experience(i))
    tree_idx, (states, *_), is_weights = memory.sample(1000)
    np.testing.assert_array_equal(states[:, 0], tree_idx - 7)
    np.testing.assert_array_equal(is_weights, 1.0)
    counts = np.bincount(tree_idx - 7, minlength=5)
    np.testing.assert_allclose(counts / 1000, 0.2, atol=0.05)
    memory.batch_update(tree_idx, np.zeros(1000))
    with pytest.raises(ValueError, match="nan"):
        memory.batch_update(tree_idx[:1], np.array([np.nan]))
    with pytest.raises(ValueError, match="empty memory"):
        UniformMemory(4).sample(1)


def test_seeded_memories_repeat():
    first, second = filled_memory(50, rng=5), filled_memory(50, rng=5)
    for _ in range(3):
        np.testing.assert_array_equal(first.sample(8)[0], second.sample(8)[0])


@with_each_memory_kind(4)
def test_observer_is_told_of_every_store_and_sample(make):
    observer = RecordingObserver()
    memory = make(observer)
    for i in range(5):  # the fifth overwrites slot 0
        memory.store(experience(i))
    with pytest.raises(ValueError, match="experience"):
        memory.store((1, 2, 3))  # rejected: nothing stored, nothing told
    tree_idx, _, _ = memory.sample(6)
    memory.batch_update(tree_idx, np.full(6, 0.5))  # priorities are not the observer's business
    stores = [("store", slot) for slot in (0, 1, 2, 3, 0)]
    assert observer.calls == [*stores, ("sample", (tree_idx - 3).tolist(), 4)]


def test_storage_capacity_must_match():
    with pytest.raises(ValueError, match="storage capacity 4 differs"):
        Memory(8, storage=TransitionStorage(4))


# Checkpoints -------------------------------------------------------------------------------------


def save_and_load(arrays: dict) -> dict:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as saved:
        return dict(saved)


@pytest.mark.parametrize(
    "make", [lambda: Memory(16), lambda: Memory(16, rank_based=True), lambda: UniformMemory(16)]
)
def test_state_dict_round_trip_continues_identically(make):
    memory = make()
    memory.rng = np.random.default_rng(9)
    for i in range(20):  # wraps around
        memory.store(experience(i))
        if i % 3 == 2:
            tree_idx, _, _ = memory.sample(4)
            memory.batch_update(tree_idx, np.abs(np.sin(tree_idx + i)))
    restored = make()
    restored.load_state_dict(save_and_load(memory.state_dict()))
    assert len(restored) == len(memory)
    assert getattr(restored, "beta", None) == getattr(memory, "beta", None)
    for _ in range(3):
        expected, got = memory.sample(8), restored.sample(8)
        np.testing.assert_array_equal(expected[0], got[0])
        for field, restored_field in zip(expected[1], got[1], strict=True):
            np.testing.assert_array_equal(field, restored_field)
        np.testing.assert_array_equal(expected[2], got[2])
        memory.store(experience(99))
        restored.store(experience(99))


def test_load_state_dict_rejects_a_mismatch():
    arrays = save_and_load(filled_memory(4, capacity=8).state_dict())
    with pytest.raises(ValueError, match="saved kind is 'proportional'"):
        Memory(8, rank_based=True).load_state_dict(arrays)
    with pytest.raises(ValueError, match="saved capacity is 8, but this memory has 16"):
        Memory(16).load_state_dict(arrays)
    with pytest.raises(ValueError, match=r"saved alpha is 0\.6"):
        Memory(8, alpha=0.7).load_state_dict(arrays)
    del arrays["tree.sums"]
    with pytest.raises(ValueError, match=r"lacks \['tree.sums'\]"):
        Memory(8).load_state_dict(arrays)


def test_checkpoints_of_the_tree_counted_from_one_still_load():
    # The tree used to count its nodes from 1, after a spare element that stayed 0 in the sums
    # and +inf in the minima: 2 * capacity elements, the root at 1. Here priorities 1, 2, 3, 4.
    arrays = save_and_load(filled_memory(4).state_dict())
    arrays["tree.sums"] = np.array([0.0, 10, 3, 7, 1, 2, 3, 4])
    arrays["tree.mins"] = np.array([np.inf, 1, 1, 3, 1, 2, 3, 4])
    memory = Memory(4, alpha=0.6, rng=0)
    memory.load_state_dict(arrays)
    np.testing.assert_array_equal(memory.tree.tree, [10, 3, 7, 1, 2, 3, 4])
    np.testing.assert_array_equal(memory.tree.mins, [1, 1, 3, 1, 2, 3, 4])
    assert memory.tree.get_leaf(6.0) == (6, 4.0, None)
    memory.batch_update(np.array([6]), np.array([0.0]))  # leaf 6 gets 0.01^0.6, the sums follow
    assert memory.tree.total_priority == pytest.approx(6 + 0.01**0.6)
    arrays["tree.sums"] = np.zeros(9)
    with pytest.raises(ValueError, match=r"saved tree.sums has shape \(9,\), expected \(7,\)"):
        Memory(4).load_state_dict(arrays)


@pytest.mark.parametrize("rank_based", [False, True])
def test_state_dict_leaves_the_observer_out_and_old_replay_statistics_are_ignored(rank_based):
    memory = filled_memory(6, capacity=8, rank_based=rank_based, observer=RecordingObserver())
    memory.sample(4)
    arrays = save_and_load(memory.state_dict())
    assert [key for key in arrays if key.startswith("stats.")] == []
    # Older checkpoints saved the replay statistics in the memory's file, as "stats.*" keys.
    arrays["stats.stores"] = np.array(6)
    arrays["stats.replay_counts"] = np.zeros(3, dtype=np.int64)  # of no use to the memory
    restored = Memory(8, rank_based=rank_based)
    restored.load_state_dict(arrays)
    for _ in range(3):
        np.testing.assert_array_equal(restored.sample(4)[0], memory.sample(4)[0])


# Blocks with their own priorities (Ape-X actors, apex.py) ---------------------------------------


def block(first: int, k: int, done_at: int | None = None) -> tuple[np.ndarray, ...]:
    """k consecutive transitions of one episode, states first .. first + k - 1 (as `experience`)."""
    states = np.arange(first, first + k, dtype=np.float32)[:, None].repeat(3, axis=1)
    dones = np.arange(first, first + k) == done_at
    rewards = np.arange(first, first + k, dtype=np.float64)
    return states, np.arange(k) % 2, rewards, states + 1, dones


def test_store_block_enters_with_the_given_priorities_and_context_is_never_sampled():
    memory = Memory(8, alpha=0.5, epsilon=0.01, abs_err_upper=1.0, rng=0, n_step=3, gamma=0.5)
    slots = memory.store_block(block(0, 5), np.array([0.0, 0.24, 3.0]), context=2)
    np.testing.assert_array_equal(slots, [0, 1, 2, 3, 4])
    # p = min(|delta| + epsilon, 1) ** alpha; the two context transitions get 0.
    np.testing.assert_allclose(memory.tree.tree[7:12], [0.1, 0.5, 1.0, 0.0, 0.0])
    assert memory.max_priority == 1.0 and len(memory) == 5
    tree_idx, (_, _, rewards, next_states, _, discounts), _ = memory.sample(500)
    assert set(tree_idx - 7) == {0, 1, 2}
    # The chains run on into the context: transition 2's 3-step return is 2 + 3/2 + 4/4.
    third = tree_idx == 9
    np.testing.assert_array_equal(rewards[third], 2 + 3 / 2 + 4 / 4)
    np.testing.assert_array_equal(next_states[third, 0], 5)
    np.testing.assert_array_equal(discounts[third], np.float32(1 / 8))


def test_store_block_matches_store_then_batch_update():
    errors = np.abs(np.sin(np.arange(6)))
    blocked = Memory(16, rng=4)
    blocked.store_block(block(0, 6), errors)
    stepped = Memory(16, rng=4)
    for row in zip(*block(0, 6), strict=True):
        stepped.store(row)
    stepped.batch_update(np.arange(15, 21), errors)
    np.testing.assert_array_equal(blocked.tree.tree, stepped.tree.tree)
    np.testing.assert_array_equal(blocked.tree.mins, stepped.tree.mins)
    (got_idx, _, got_weights), (idx, _, weights) = blocked.sample(8), stepped.sample(8)
    np.testing.assert_array_equal(got_idx, idx)
    np.testing.assert_array_equal(got_weights, weights)


def test_store_block_wraps_around_and_evicts_the_oldest():
    observer = RecordingObserver()
    memory = Memory(8, rng=0, observer=observer)
    memory.store_block(block(0, 6), np.full(6, 0.5))
    slots = memory.store_block(block(100, 5), np.full(4, 2.0), context=1)
    np.testing.assert_array_equal(slots, [6, 7, 0, 1, 2])
    states = memory.storage.fields[0][:, 0]
    np.testing.assert_array_equal(states, [102, 103, 104, 3, 4, 5, 100, 101])
    # One call per block, its slots oldest first, the context included (it was stored).
    assert observer.calls == [("stores", [0, 1, 2, 3, 4, 5]), ("stores", [6, 7, 0, 1, 2])]
    # |delta| = 2 is clipped to abs_err_upper = 1 before the power alpha = 0.6; context gets 0.
    np.testing.assert_allclose(memory.tree.tree[7:], [1.0, 1.0, 0.0] + [0.51**0.6] * 3 + [1.0] * 2)


def test_rank_based_store_block_ranks_by_the_given_errors_without_the_context():
    memory = Memory(8, rank_based=True, rng=0)
    memory.store_block(block(0, 4), np.array([0.1, 3.0, 1.0]), context=1)
    memory.sample(1)
    np.testing.assert_array_equal(memory._ranked_slots, [1, 2, 0])
    tree_idx, _, _ = memory.sample(300)
    assert 3 not in set(tree_idx - 7)


def test_store_block_through_a_frame_store_rebuilds_the_stacks():
    storage = FrameStackStorage(16)
    observer = RecordingObserver()
    memory = Memory(16, storage=storage, rng=0, observer=observer)
    frames = np.arange(1, 8, dtype=np.uint8)[:, None, None] * np.ones((1, 2, 2), np.uint8)
    stacks = np.stack([np.stack(frames[i:i + 2], axis=-1) for i in range(6)])  # (6, 2, 2, 2)
    transitions = (stacks[:5], np.arange(5), np.ones(5), stacks[1:], np.zeros(5, bool))
    slots = memory.store_block(transitions, np.full(4, 0.5), context=1)
    # The frame store takes the block one transition at a time; the observer still hears once.
    assert observer.calls == [("stores", slots.tolist())]
    _, (states, actions, _, next_states, _, _), _ = memory.sample(100)
    assert len(slots) == 5 and set(actions) == {0, 1, 2, 3}
    np.testing.assert_array_equal(states, stacks[actions])
    np.testing.assert_array_equal(next_states, stacks[actions + 1])


def test_store_block_bad_input_raises_and_changes_nothing():
    memory = Memory(8, rng=0)
    memory.store_block(block(0, 2), np.ones(2))
    before = memory.tree.tree.copy()
    bad_calls = [
        ((block(0, 3), np.ones(2)), {}, "got 2 errors for a block of 3"),
        ((block(0, 3), np.ones(2)), {"context": 3}, "context must be an integer in 0..2"),
        ((block(0, 3), np.array([0.1, np.nan, 0.2])), {}, "nan"),
        ((block(0, 3), np.array([0.1, -1.0, 0.2])), {}, "-1.0"),
        ((block(0, 9), np.ones(9)), {}, "1..8 transitions"),
        (((np.zeros((3, 3)), np.zeros(2), np.zeros(3), np.zeros((3, 3)), np.zeros(3)),
          np.ones(3)), {}, r"different lengths \[3, 2, 3, 3, 3\]"),
        (((np.zeros((2, 4)), np.zeros(2, int), np.zeros(2), np.zeros((2, 4)), np.zeros(2)),
          np.ones(2)), {}, r"state has shape \(4,\), but the memory holds \(3,\)"),
    ]
    for args, kwargs, message in bad_calls:
        with pytest.raises(ValueError, match=message):
            memory.store_block(*args, **kwargs)
    np.testing.assert_array_equal(memory.tree.tree, before)
    assert len(memory) == 2 and memory.storage.write_pointer == 2


@pytest.mark.parametrize("rank_based", [False, True])
def test_store_block_refuses_a_block_with_one_bad_transition_and_writes_nothing(rank_based):
    memory = Memory(8, rng=0, rank_based=rank_based, action_count=2)
    memory.store_block(block(0, 8), np.ones(8))  # full: a next block overwrites the oldest
    before = memory.state_dict()

    def with_bad(field: int, value: object) -> tuple:
        columns = [np.array(column) for column in block(100, 4)]
        columns[field] = columns[field].astype(np.result_type(columns[field], value))
        columns[field][2] = value
        return tuple(columns)

    refused = [
        (with_bad(2, np.nan), "reward must be finite, got nan \\(transition 2 of the block\\)"),
        (with_bad(0, np.inf), "^state must be finite, got inf \\(transition 2"),
        (with_bad(3, -np.inf), "next_state must be finite, got -inf \\(transition 2"),
        (with_bad(1, -1), "action must be an integer in 0..1, got -1 \\(transition 2"),
        (with_bad(1, 2), "action must be an integer in 0..1, got 2 \\(transition 2"),
        (with_bad(1, 0.5), "actions must be integers, got dtype float64"),
        (with_bad(4, 3), "done must be True or False, got 3 \\(transition 2"),
    ]
    for transitions, message in refused:
        with pytest.raises(ValueError, match=message):
            memory.store_block(transitions, np.ones(4))
        assert state_dicts_equal(memory.state_dict(), before), message
