"""Tests for PER.py (`SumTree`, `Memory`, `UniformMemory`), the memories' `check_fits` and
Ape-X's `BlockMemory.store_block`: small trees checked by hand, the compiled walks against
their Python form and a from-scratch reference, then statistics with fixed seeds; what every
replay variant must do (d3qn_agent.REPLAY_MEMORIES and the tests' reservoir) runs for each.
rank_based.py's memory is tested in test_rank_based.py, checkpoints of every memory in
test_memory_state.py."""

import functools
import re

import numpy as np
import pytest
from memory_helpers import (
    array_bytes,
    experience,
    filled_memory,
    frame_stacks,
    holds_frames,
    names_bad,
    registered_memories,
    snapshot,
    states_equal,
)

from ape_x.replay import BlockMemory
from d3qn_utils import replay_memory
from d3qn_utils.replay_storage import FrameStackStorage, StorageSpec, TransitionStorage
from PER import Memory, SumTree, UniformMemory, _get_leaves, _update_leaves

MEMORIES = registered_memories()  # every replay variant, by name


def filled_tree(priorities: list[float]) -> SumTree:
    """A tree of len(priorities) leaves holding `priorities`, left to right by slot."""
    tree = SumTree(len(priorities))
    n = len(priorities)
    tree.update_batch(np.arange(n) + n - 1, np.array(priorities, dtype=np.float64))
    return tree


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


def test_an_empty_tree_has_no_total_and_an_infinite_minimum():
    tree = SumTree(4)
    np.testing.assert_array_equal(tree.tree, np.zeros(7))
    np.testing.assert_array_equal(tree.mins, np.full(7, np.inf))
    assert tree.total_priority == 0.0
    assert tree.min_priority == np.inf


def test_capacity_4_leaf_at_segment_boundaries():
    # Leaf ranges: [0, 1) [1, 3) [3, 6) [6, 10]; a boundary belongs to the leaf on its right.
    tree = filled_tree([1, 2, 3, 4])
    expected = {0.0: 3, 0.999: 3, 1.0: 4, 2.999: 4, 3.0: 5, 5.999: 5, 6.0: 6, 10.0: 6}
    leaves, priorities = tree.get_leaves(np.array(list(expected)))
    np.testing.assert_array_equal(leaves, list(expected.values()))
    np.testing.assert_array_equal(priorities, [1, 1, 2, 2, 3, 3, 4, 4])
    assert leaves.dtype == np.int64 and priorities.dtype == np.float64
    leaves, priorities = tree.get_leaves(3.5)  # a scalar is a batch of one
    assert leaves.tolist() == [5] and priorities.tolist() == [3.0]


def test_capacity_5_uneven_tree():
    # 9 nodes; leaves 4..8 hold slots 0..4. Leaves 7 and 8 hang one level deeper, under node 3:
    #             15
    #        10        5
    #      9    1    2   3
    #     4 5
    tree = filled_tree([1, 2, 3, 4, 5])
    np.testing.assert_array_equal(tree.tree, [15, 10, 5, 9, 1, 2, 3, 4, 5])
    np.testing.assert_array_equal(tree.mins, [1, 1, 2, 4, 1, 2, 3, 4, 5])
    # Left to right the leaves are 7, 8, 4, 5, 6 with ranges [0,4) [4,9) [9,10) [10,12) [12,15].
    expected = {0.0: 7, 3.999: 7, 4.0: 8, 8.999: 8, 9.0: 4, 9.5: 4, 10.0: 5, 12.0: 6, 15.0: 6}
    leaves, priorities = tree.get_leaves(np.array(list(expected)))
    np.testing.assert_array_equal(leaves, list(expected.values()))
    np.testing.assert_array_equal(priorities, tree.tree[leaves])
    np.testing.assert_array_equal(priorities, np.array([1, 2, 3, 4, 5])[leaves - 4])


def test_update_batch_matches_single_updates_and_last_duplicate_wins():
    tree = filled_tree([1, 2, 3, 4, 5])
    tree.update_batch(np.array([4, 8, 4, 6]), np.array([10.0, 0.5, 7.0, 0.0]))
    # Leaf 4 gets its last value 7; leaf 6 becomes empty.
    np.testing.assert_array_equal(tree.tree[4:], [7, 2, 0, 4, 0.5])
    np.testing.assert_array_equal(tree.tree[:4], [13.5, 11.5, 2, 4.5])
    np.testing.assert_array_equal(tree.mins, [0.5, 0.5, 2, 0.5, 7, 2, np.inf, 4, 0.5])
    assert tree.min_priority == 0.5  # the empty leaf does not count
    single = filled_tree([1, 2, 3, 4, 5])
    for leaf, priority in ((4, 10.0), (8, 0.5), (4, 7.0), (6, 0.0)):
        single.update(leaf, priority)
    np.testing.assert_array_equal(single.tree, tree.tree)
    np.testing.assert_array_equal(single.mins, tree.mins)


def test_the_tree_turns_slots_into_leaves_and_back():
    # Capacity 4: slots 0..3 are nodes 3..6 (the docstring's drawing); capacity 5: nodes 4..8.
    tree = SumTree(4)
    np.testing.assert_array_equal(tree.leaf_index(np.arange(4)), [3, 4, 5, 6])
    np.testing.assert_array_equal(tree.slot(np.array([6, 3, 5])), [3, 0, 2])
    assert tree.leaf_index(2) == 5 and list(tree.leaves) == [3, 4, 5, 6]
    tree = SumTree(5)
    np.testing.assert_array_equal(tree.leaf_index(np.arange(5)), [4, 5, 6, 7, 8])
    np.testing.assert_array_equal(tree.slot(tree.leaf_index(np.arange(5))), np.arange(5))


def test_update_batch_returns_the_highest_priority_it_wrote():
    tree = filled_tree([1, 2, 3, 4])
    assert tree.update_batch(np.array([3, 4]), np.array([0.5, 0.25])) == 0.5
    assert tree.update_batch(np.array([6, 6]), np.array([7.0, 0.0])) == 7.0  # not what stays
    assert tree.update_batch(np.zeros(0, np.int64), np.zeros(0)) == 0.0


def test_update_batch_broadcasts_one_priority_to_every_leaf():
    tree = filled_tree([1, 2, 3, 4])
    tree.update_batch(np.array([3, 5]), 0.0)
    np.testing.assert_array_equal(tree.tree, [6, 2, 4, 0, 2, 0, 4])
    assert tree.min_priority == 2


@pytest.mark.parametrize("capacity", [1, 2, 3, 5, 7, 64, 100, 1000, 1025])
def test_batch_update_is_bit_identical_to_one_walk_per_leaf(capacity):
    # Every node must end exactly as the tutorial's leaf-by-leaf walk leaves it, in trees with
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


def in_order_leaves(capacity: int, node: int = 0) -> list[int]:
    """The leaves below `node` left to right, as `get_leaves` searches them (an in-order walk:
    with a capacity that is not a power of two the leaves hang at two depths, so tree-index
    order is not left-to-right order)."""
    if node >= capacity - 1:
        return [node]
    return in_order_leaves(capacity, 2 * node + 1) + in_order_leaves(capacity, 2 * node + 2)


def rebuilt(capacity: int, leaf_priorities: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sums, mins) of a tree built from scratch over `leaf_priorities` (by slot): the leaves
    copied, then every inner node from capacity - 2 down to 0 from its two children."""
    sums = np.zeros(2 * capacity - 1)
    mins = np.full(2 * capacity - 1, np.inf)
    sums[capacity - 1:] = leaf_priorities
    mins[capacity - 1:] = np.where(leaf_priorities > 0, leaf_priorities, np.inf)
    for node in range(capacity - 2, -1, -1):
        sums[node] = sums[2 * node + 1] + sums[2 * node + 2]
        mins[node] = min(mins[2 * node + 1], mins[2 * node + 2])
    return sums, mins


@pytest.mark.parametrize("capacity", [1, 2, 3, 5, 7, 64, 100, 1025])
def test_compiled_walks_equal_their_python_form_and_a_reference(capacity):
    rng = np.random.default_rng(100 + capacity)
    tree = SumTree(capacity)
    leaf_priorities = np.zeros(capacity)  # the reference: last write wins, by slot
    order = np.array(in_order_leaves(capacity))
    assert sorted(order) == list(range(capacity - 1, 2 * capacity - 1))
    for batch in range(25):
        leaves = rng.integers(capacity - 1, 2 * capacity - 1, size=rng.integers(1, 200))
        # Duplicates for sure (a leaf named again later in the batch, with another priority),
        # and zero priorities: emptied leaves.
        leaves = np.concatenate([leaves, rng.choice(leaves, size=rng.integers(1, 20))])
        priorities = rng.exponential(1.0, leaves.size) * (rng.random(leaves.size) < 0.8)
        if batch == 10:
            priorities[:] = 0.0  # empty what the batch names: maybe the whole tree
        python_tree, python_mins = tree.tree.copy(), tree.mins.copy()
        _update_leaves.py_func(python_tree, python_mins, leaves, priorities)
        tree.update_batch(leaves, priorities)
        for leaf, priority in zip(leaves.tolist(), priorities.tolist(), strict=True):
            leaf_priorities[leaf - (capacity - 1)] = priority
        sums, mins = rebuilt(capacity, leaf_priorities)
        np.testing.assert_array_equal(tree.tree, sums)  # bit for bit
        np.testing.assert_array_equal(tree.tree, python_tree)
        np.testing.assert_array_equal(tree.mins, mins)
        np.testing.assert_array_equal(tree.mins, python_mins)

        total = tree.total_priority
        if not total > 0:
            with pytest.raises(ValueError, match="empty sum tree"):
                tree.get_leaves(np.zeros(1))
            continue
        values = rng.uniform(0.0, total, size=500)
        # The boundaries too, and values past the total: the compiled and Python walks agree
        # on them (the cumsum reference below does not look there).
        values = np.concatenate([values, np.cumsum(tree.tree[order]), [total, total * 2]])
        found, found_priorities = tree.get_leaves(values)
        np.testing.assert_array_equal(found, _get_leaves.py_func(tree.tree, capacity, values))
        np.testing.assert_array_equal(found_priorities, tree.tree[found])
        assert (found_priorities > 0).all()  # never an empty leaf
        # Reference: leaf j (left to right) covers [cum[j-1], cum[j]); away from the edges the
        # tree's sums and a flat cumsum round alike.
        cum = np.cumsum(leaf_priorities[order - (capacity - 1)])
        inside = values[values < total]
        edges = np.concatenate([[0.0], cum])
        nearest = np.abs(inside[:, None] - edges[None, :]).min(axis=1)
        clear = inside[nearest > 1e-9]
        assert clear.size > 0
        expected = order[np.searchsorted(cum, clear, side="right")]
        np.testing.assert_array_equal(tree.get_leaves(clear)[0], expected)


def test_search_never_returns_an_empty_leaf():
    tree = SumTree(8)
    tree.update_batch(np.array([7, 8, 9]), np.array([1.0, 2.0, 3.0]))
    # At or past the total, and with rounding pushed to the edge: the last filled leaf, 9.
    leaves, priorities = tree.get_leaves(np.array([6.0, 6.0 + 1e-12, np.nextafter(6.0, 7.0)]))
    np.testing.assert_array_equal(leaves, [9, 9, 9])
    np.testing.assert_array_equal(priorities, [3.0, 3.0, 3.0])
    tree.update(8, 0.0)
    leaves, _ = tree.get_leaves(np.linspace(0, tree.total_priority, 101))
    assert set(leaves.tolist()) == {7, 9}


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
    np.testing.assert_array_equal(tree.tree[inner],
                                  tree.tree[2 * inner + 1] + tree.tree[2 * inner + 2])
    assert tree.min_priority == leaves.min()
    # Empty most leaves again: searches still find only non-empty ones.
    tree.update_batch(np.arange(capacity - 1, 2 * capacity - 11), 0.0)
    found, priorities = tree.get_leaves(rng.uniform(0, tree.total_priority, size=10_000))
    assert (tree.tree[found] > 0).all() and (priorities > 0).all()
    assert set(found.tolist()) <= set(range(2 * capacity - 11, 2 * capacity - 1))


@pytest.mark.parametrize("capacity", [0, -3, 2.5, "8", True])
def test_bad_capacity(capacity):
    with pytest.raises(ValueError, match="capacity"):
        SumTree(capacity)
    for memory in MEMORIES.values():
        with pytest.raises(ValueError, match="capacity"):
            memory(capacity)


def test_sum_tree_bad_input_leaves_tree_unchanged():
    tree = filled_tree([1, 2, 3, 4])
    before, mins_before = tree.tree.copy(), tree.mins.copy()
    with pytest.raises(ValueError, match=names_bad("priority", np.nan)):
        tree.update_batch(np.array([3, 4]), np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match=names_bad("priority", np.inf)):
        tree.update_batch(np.array([3, 4]), np.array([np.inf, 1.0]))
    with pytest.raises(ValueError, match=names_bad("priority", -2.0)):
        tree.update(5, -2.0)
    with pytest.raises(ValueError, match=r"^tree index must be in 3\.\.6, got 2$"):
        tree.update_batch(np.array([3, 2]), np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match=r"^tree index must be an integer in 3\.\.6, got 7$"):
        tree.update(7, 1.0)
    with pytest.raises(ValueError, match=r"tree index must be an integer in 3\.\.6, got 3\.0"):
        tree.update(3.0, 1.0)
    with pytest.raises(ValueError, match=r"tree index must be an integer in 3\.\.6, got True"):
        tree.update(True, 1.0)
    with pytest.raises(ValueError, match="each tree index must be an integer, got dtype float64"):
        tree.update_batch(np.array([3.0]), np.array([1.0]))
    with pytest.raises(ValueError, match=names_bad("value", -1.0)):
        tree.get_leaves(np.array([0.5, -1.0]))
    with pytest.raises(ValueError, match=names_bad("value", np.nan)):
        tree.get_leaves(np.array([np.nan]))
    np.testing.assert_array_equal(tree.tree, before)
    np.testing.assert_array_equal(tree.mins, mins_before)
    empty = r"cannot search an empty sum tree \(total 0\.0\)"
    with pytest.raises(ValueError, match=empty):
        SumTree(4).get_leaves(np.array([0.0]))


def test_every_public_sum_tree_method_is_one_the_memory_uses(monkeypatch):
    # A public method or property of SumTree that the agent's memory never calls is dead API:
    # enumerated from the class, so that a new one fails here until Memory uses it.
    public = sorted(name for name in vars(SumTree) if not name.startswith("_"))
    assert public  # leaf_index, slot, update, update_batch, get_leaves, total_priority, ...
    called: set[str] = set()

    def recorded(name: str, function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            called.add(name)
            return function(*args, **kwargs)
        return wrapper

    for name in public:
        attribute = vars(SumTree)[name]
        if isinstance(attribute, property):
            monkeypatch.setattr(SumTree, name, property(recorded(name, attribute.fget)))
        else:
            assert callable(attribute), f"SumTree.{name} is neither a method nor a property"
            monkeypatch.setattr(SumTree, name, recorded(name, attribute))

    # A frame store: once the ring wraps, a store overwrites frames of older transitions, whose
    # leaves `store` empties (update_batch) before it gives the new one its priority (update).
    stacks = frame_stacks(12)
    memory = Memory(6, storage=FrameStackStorage(6), rng=0)
    for i in range(len(stacks) - 1):
        memory.store((stacks[i], i % 2, 1.0, stacks[i + 1], False))
    assert called == {"leaf_index", "update", "update_batch"}
    tree_idx, _, _ = memory.sample(4)
    memory.batch_update(tree_idx, np.full(4, 0.3))
    assert called == set(public), f"never called: {sorted(set(public) - called)}"


# Memory: storage, priorities, importance-sampling weights ---------------------------------------


def test_store_returns_the_slot_and_wraps_around():
    memory, uniform = Memory(4, rng=0), UniformMemory(4, rng=0)
    assert [memory.store(experience(i)) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    assert [uniform.store(experience(i)) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    # The overwritten slots' leaves got the new transitions' priority; nothing else moved.
    np.testing.assert_array_equal(memory.tree.tree[3:], np.full(4, 1.0))
    np.testing.assert_array_equal(memory.storage.get(np.arange(4))[0][:, 0], [4, 5, 2, 3])


def test_batch_fields_keep_their_types():
    memory = filled_memory(Memory, 5)
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
    slots, (_, _, rewards, next_states, dones, discounts), _ = memory.sample(draws)
    rows = zip(rewards.tolist(), next_states[:, 0].tolist(), dones.tolist(), discounts.tolist(),
               strict=True)
    return dict(zip(slots.tolist(), rows, strict=True))


def test_n_step_returns_by_hand():
    # gamma = 1/2, n = 3. Episode A terminates after three steps; episode B is truncated after
    # two (its last transition is not done; the caller says its episode ended); C is running.
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
        if episode is not episodes[-1]:
            memory.end_episode()
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


@pytest.mark.parametrize("kind", MEMORIES.values(), ids=MEMORIES)
def test_n_step_returns_through_each_memory_s_sample(kind):
    # The same chains through sample: each sampled slot's batch row is its n-step return.
    memory = kind(4, rng=0, n_step=2, gamma=0.5)
    for state, reward, done in [(0, 1.0, False), (1, 2.0, True), (5, 4.0, False)]:
        memory.store((np.array([state], np.float32), 0, reward, np.array([state + 1],
                      np.float32), done))
    indices, (states, _, rewards, next_states, dones, discounts), _ = memory.sample(200)
    expected = {0: (2.0, 2.0, True, 0.25), 1: (2.0, 2.0, True, 0.5), 2: (4.0, 6.0, False, 0.5)}
    slots = memory.slots_of(indices)
    assert set(slots.tolist()) == {0, 1, 2}
    for row, slot in enumerate(slots.tolist()):
        got = (rewards[row], next_states[row, 0], bool(dones[row]), float(discounts[row]))
        assert got == expected[slot]
        assert states[row, 0] == [0, 1, 5][slot]


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
    for memory in MEMORIES.values():
        with pytest.raises(ValueError, match="n_step must be an integer >= 1"):
            memory(4, n_step=n_step)


@pytest.mark.parametrize("kind", MEMORIES.values(), ids=MEMORIES)
def test_partly_filled_memory_samples_only_filled_slots(kind):
    memory = filled_memory(kind, 3, capacity=100)
    assert len(memory) == 3
    for _ in range(50):
        indices, (states, *_), _ = memory.sample(32)
        slots = memory.slots_of(indices)
        assert set(slots.tolist()) <= {0, 1, 2}
        np.testing.assert_array_equal(states[:, 0], slots)


def test_wrap_around_keeps_the_newest_transitions():
    memory = filled_memory(Memory, 6, capacity=4)
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
    assert memory.max_priority == pytest.approx(5.01)


def test_priority_formula_and_clipping():
    memory = filled_memory(Memory, 4, alpha=0.5, epsilon=0.01, abs_err_upper=1.0)
    errors = np.array([0.0, 0.15, 3.0, 0.99])
    np.testing.assert_allclose(memory.leaf_priorities(errors), np.sqrt([0.01, 0.16, 1.0, 1.0]))
    memory.batch_update(np.array([3, 4, 5, 6]), errors)
    np.testing.assert_allclose(memory.tree.tree[3:], np.sqrt([0.01, 0.16, 1.0, 1.0]))
    np.testing.assert_array_equal(memory.tree.tree[3:], memory.leaf_priorities(errors))


def test_batch_update_writes_through_the_trees_own_batch_update(monkeypatch):
    # What the learner reads is what runs: the memory gives the tree its new priorities through
    # SumTree.update_batch, the tutorial's update for a batch.
    calls = []
    update_batch = SumTree.update_batch

    def counted(tree, *args):
        calls.append(args)
        return update_batch(tree, *args)

    monkeypatch.setattr(SumTree, "update_batch", counted)
    memory = filled_memory(Memory, 4)
    errors = np.array([0.5, 0.25])
    memory.batch_update(np.array([3, 4]), errors)
    assert len(calls) == 1
    np.testing.assert_array_equal(memory.tree.tree[3:5], memory.leaf_priorities(errors))


def reference_batch_update(memory: Memory, tree_idx: np.ndarray, abs_errors: np.ndarray
                           ) -> tuple[np.ndarray, np.ndarray, float]:
    """(sums, mins, max_priority) after `batch_update` as the docstring says it, leaf by leaf:
    min(|delta| + epsilon, abs_err_upper)^alpha where the slot holds a transition, else 0."""
    sums, mins = memory.tree.tree.copy(), memory.tree.mins.copy()
    highest = memory.max_priority
    # numpy's power, as the memory's (Python's may round the last bit otherwise).
    priorities = np.minimum(abs_errors + memory.epsilon, memory.abs_err_upper) ** memory.alpha
    for leaf, priority in zip(tree_idx.tolist(), priorities.tolist(), strict=True):
        if not memory.storage.holds(memory.tree.slot(leaf)):
            priority = 0.0
        _update_leaves.py_func(sums, mins, np.array([leaf]), np.array([priority]))
        highest = max(highest, priority)
    return sums, mins, highest


@pytest.mark.parametrize("storage", ["full", "filling", "frames"])
def test_batch_update_equals_its_readable_form(storage):
    # A full vector memory (every slot holds a transition, so none is looked up), one still
    # filling, and frame stacks whose stores free drawn slots before their update comes back.
    rng = np.random.default_rng(3)
    stacks = frame_stacks(200)
    memory = Memory(16, alpha=0.7, abs_err_upper=2.0, rng=1,
                    storage=FrameStackStorage(16) if storage == "frames" else None)
    stored = 16 if storage == "full" else 9
    for i in range(stored if storage != "frames" else 40):
        memory.store((stacks[i], 0, 1.0, stacks[i + 1], False) if storage == "frames"
                     else experience(i))
    freed = 0  # updates for slots freed since they were drawn
    for i in range(40, 70):
        tree_idx, _, _ = memory.sample(8)
        if storage == "frames":  # frees some of the slots just drawn
            memory.store((stacks[i], 0, 1.0, stacks[i + 1], False))
        # Duplicates, and errors beyond the cap.
        tree_idx = np.concatenate([tree_idx, tree_idx[:3]])
        abs_errors = rng.exponential(1.0, tree_idx.size) * 2
        sums, mins, highest = reference_batch_update(memory, tree_idx, abs_errors)
        freed += np.count_nonzero(sums[tree_idx] == 0)
        memory.batch_update(tree_idx, abs_errors)
        np.testing.assert_array_equal(memory.tree.tree, sums)
        np.testing.assert_array_equal(memory.tree.mins, mins)
        assert memory.max_priority == highest
    assert (len(memory) == 16) == (storage == "full")
    assert (freed > 0) == (storage == "frames")


def test_batch_update_last_duplicate_wins():
    memory = filled_memory(Memory, 4, alpha=1.0, epsilon=0.5, abs_err_upper=10.0)
    memory.batch_update(np.array([3, 4, 3]), np.array([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(memory.tree.tree[3:], [3.5, 2.5, 1.0, 1.0])


@pytest.mark.parametrize(("alpha", "abs_err_upper"), [(1.0, 1.0), (0.6, 10.0)])
def test_importance_sampling_weights_match_the_paper(alpha, abs_err_upper):
    memory = filled_memory(Memory, 5, alpha=alpha, beta=0.4, beta_increment=0.1, epsilon=0.5,
                           abs_err_upper=abs_err_upper)
    memory.batch_update(np.arange(4, 9), np.array([0.5, 1.5, 0.0, 2.0, 9.0]))
    tree_idx, _, is_weights = memory.sample(50)
    assert memory.beta == pytest.approx(0.5)
    p = np.minimum(np.array([1.0, 2.0, 0.5, 2.5, 9.5]), abs_err_upper)  # |delta| + 0.5, capped
    probabilities = p**alpha / (p**alpha).sum()  # P(i) = p_i^alpha / sum_k p_k^alpha
    weights = (5 * probabilities) ** -0.5  # w_i = (N P(i))^-beta, normalised by the largest
    expected = weights[tree_idx - 4] / weights.max()
    np.testing.assert_allclose(is_weights, expected, rtol=1e-6)
    assert is_weights.max() <= 1.0


def test_beta_grows_to_one_and_stops():
    memory = filled_memory(Memory, 4, beta=0.9, beta_increment=0.04)
    betas = [memory.sample(2) and memory.beta for _ in range(4)]
    np.testing.assert_allclose(betas, [0.94, 0.98, 1.0, 1.0])


def test_proportional_sampling_frequencies_match_probabilities():
    memory = filled_memory(Memory, 6, alpha=0.7, abs_err_upper=100.0, rng=42)
    errors = np.array([0.0, 0.5, 1.0, 2.0, 4.0, 8.0])
    memory.batch_update(np.arange(5, 11), errors)
    priorities = (errors + 0.01) ** 0.7
    counts = np.zeros(6)
    for _ in range(1000):
        tree_idx, _, _ = memory.sample(64)
        counts += np.bincount(tree_idx - 5, minlength=6)
    # 64,000 draws: each frequency's standard error is below 0.002.
    np.testing.assert_allclose(counts / counts.sum(), priorities / priorities.sum(), atol=0.01)


def test_sampling_probabilities_sum_to_one_and_follow_the_priorities():
    memory = filled_memory(Memory, 4, capacity=8)
    memory.batch_update(np.array([7, 8, 9, 10]), np.array([0.0, 0.09, 0.24, 0.49]))
    slots, probabilities = memory.sampling_probabilities()
    np.testing.assert_array_equal(slots, [0, 1, 2, 3])
    priorities = np.array([0.01, 0.1, 0.25, 0.5]) ** 0.6  # (|delta| + 0.01)^alpha
    np.testing.assert_allclose(probabilities, priorities / priorities.sum())
    uniform = UniformMemory(8)
    for i in range(3):
        uniform.store(experience(i))
    slots, probabilities = uniform.sampling_probabilities()
    np.testing.assert_array_equal(slots, [0, 1, 2])
    np.testing.assert_allclose(probabilities, [1 / 3] * 3)


def test_memory_bad_input_raises_and_changes_nothing():
    with pytest.raises(ValueError, match="empty memory"):
        Memory(4).sample(2)
    memory = filled_memory(Memory, 4)
    before = snapshot(memory)
    for bad in (np.nan, np.inf, -0.5):
        with pytest.raises(ValueError, match=names_bad("absolute TD error", bad)):
            memory.batch_update(np.array([3, 4]), np.array([0.1, bad]))
    with pytest.raises(ValueError, match=r"^tree index must be in 3\.\.6, got 9$"):
        memory.batch_update(np.array([9]), np.array([0.1]))
    with pytest.raises(ValueError, match=re.escape(
            "got 2 indices (tree index) but 1 values (absolute TD error)")):
        memory.batch_update(np.array([3, 4]), np.array([0.1]))
    assert states_equal(snapshot(memory), before)
    for n in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="batch size must be an integer >= 1"):
            memory.sample(n)
    with pytest.raises(ValueError, match=r"state has shape \(2,\), but the memory holds \(3,\)"):
        memory.store((np.zeros(2, np.float32), 0, 0.0, np.zeros(2, np.float32), False))
    with pytest.raises(ValueError, match="experience"):
        memory.store((1, 2, 3))
    assert states_equal(snapshot(memory), before)
    for name, value in (("alpha", -1.0), ("beta", 1.5), ("beta_increment", -0.1),
                        ("epsilon", 0.0), ("epsilon", np.inf), ("abs_err_upper", 0),
                        ("gamma", 1.5)):
        with pytest.raises(ValueError, match=f"{name} must .*got {value!r}"):
            Memory(4, **{name: value})


@pytest.mark.parametrize("kind", MEMORIES)
def test_store_refuses_a_transition_that_is_not_finite_or_has_a_bad_action_and_writes_nothing(
        kind):
    memory = MEMORIES[kind](4, rng=0)
    for i in range(6):  # full: a ring's next store overwrites the oldest, slot 2
        memory.store(experience(i))
    before = snapshot(memory)
    state, nan_state = np.full(3, 9.0, np.float32), np.array([1.0, np.nan, 2.0], np.float32)
    refused = [
        ((state, 0, np.nan, state, False), "reward must be a finite number, got nan"),
        ((state, 0, -np.inf, state, False), "reward must be a finite number, got -inf"),
        ((state, 0, None, state, False), "reward must be a finite number, got None"),
        ((nan_state, 0, 1.0, state, False), "^state must be finite, got nan"),
        ((state, 0, 1.0, state * np.inf, False), "next_state must be finite, got inf"),
        ((state, -1, 1.0, state, False), "action must be an integer >= 0, got -1"),
        ((state, 1.7, 1.0, state, False), "action must be an integer, got 1.7"),
        ((state, True, 1.0, state, False), "action must be an integer, got True"),
        ((state, "1", 1.0, state, False), "action must be an integer, got '1'"),
        ((state, 1, 1.0, state, 0.5), "done must be True or False, got 0.5"),
        ((state, 1, 1.0, ["a", "b", "c"], False), "next_state must hold numbers"),
    ]
    for transition, message in refused:
        with pytest.raises(ValueError, match=message):
            memory.store(transition)
        assert states_equal(snapshot(memory), before), transition
    # Integers of every kind, numpy floats and 0 / 1 for done are fine.
    slots = [memory.store((state, np.int32(1), np.float32(0.5), state, 1)),
             memory.store((state, np.array(0), 2, state, np.bool_(False)))]
    assert slots == ([2, 3] if kind != "reservoir" else [3, 2])  # the reservoir's seeded draws
    assert (memory.storage.get(np.array(slots))[0] == 9).all()


def test_a_frame_memory_refuses_a_negative_action_and_writes_nothing():
    stacks = frame_stacks(7)
    memory = Memory(4, storage=FrameStackStorage(4), rng=0)
    for i in range(5):
        memory.store((stacks[i], i % 3, 1.0, stacks[i + 1], False))
    before = snapshot(memory)
    with pytest.raises(ValueError, match="action must be an integer >= 0, got -1"):
        memory.store((stacks[5], -1, 1.0, stacks[6], False))
    assert states_equal(snapshot(memory), before)


def test_a_frame_store_empties_the_leaves_of_the_transitions_it_breaks():
    # Stacks of 2 frames in a ring of 4: a transition reads 3 slots (its two frames and the next
    # state's new one), so the ring holds the last two. Each store of the same episode writes
    # one frame and breaks the transition that read it; its leaf is emptied, never sampled.
    stacks = frame_stacks(8)
    memory = Memory(4, storage=FrameStackStorage(4), rng=0)
    slots = [memory.store((stacks[i], i, 1.0, stacks[i + 1], False)) for i in range(6)]
    assert slots == [1, 2, 3, 0, 1, 2]
    tree, all_slots = memory.tree, np.arange(4)
    holds = memory.storage.holds(all_slots)
    np.testing.assert_array_equal(holds, [False, True, True, False])
    np.testing.assert_array_equal(tree.tree[tree.leaf_index(all_slots)] > 0, holds)
    tree_idx, (states, actions, *_), _ = memory.sample(200)
    assert set(tree.slot(tree_idx).tolist()) == {1, 2} and set(actions.tolist()) == {4, 5}
    np.testing.assert_array_equal(states, stacks[actions])
    # An update for a broken slot is skipped: its leaf stays empty.
    memory.batch_update(tree.leaf_index(np.array([0, 1])), np.array([5.0, 5.0]))
    assert tree.tree[tree.leaf_index(0)] == 0.0
    assert tree.tree[tree.leaf_index(1)] == pytest.approx(1.0)
    assert set(tree.slot(memory.sample(100)[0]).tolist()) == {1, 2}


ATARI_FRAMES = StorageSpec(FrameStackStorage)  # (84, 84, 4) stacks: one frame a slot
MINATAR_STATES = StorageSpec(FrameStackStorage, {"stack_axis": None})  # a whole state a slot


@pytest.mark.parametrize(("kind", "storage", "state_shape"), [
    pytest.param(kind, storage, state_shape, id=f"{kind}-{name}")
    for kind, memory in MEMORIES.items()
    for name, storage, state_shape in [("vector", StorageSpec(), (4,)),
                                       ("frame stacks", ATARI_FRAMES, (10, 10, 4)),
                                       ("minatar", MINATAR_STATES, (10, 10, 4))]
    if storage.storage_class is not FrameStackStorage or holds_frames(memory)])
def test_replay_bytes_per_slot_is_what_a_full_memory_holds(kind, storage, state_shape):
    # Filled as the agents fill it, one episode: float32 vectors, uint8 stacks of 4 frames or
    # MinAtar's uint8 states of 4 channels (the same arrays, kept whole), Python int actions,
    # float rewards, bool dones; a sample lets the rank-based memory rank every slot.
    capacity = 4096
    frames = np.random.default_rng(0).integers(0, 256, (capacity + 4, 10, 10), dtype=np.uint8)
    memory_class = MEMORIES[kind]
    memory = memory_class(capacity, storage=storage(capacity), rng=0)
    for i in range(capacity):
        if state_shape == (4,):
            state, next_state = np.full(4, i, np.float32), np.full(4, i + 1, np.float32)
        else:
            state = np.stack(frames[i:i + 4], axis=-1)
            next_state = np.stack(frames[i + 1:i + 5], axis=-1)
        memory.store((state, i % 2, 1.0, next_state, False))
    memory.sample(32)
    if kind == "rank-based":
        assert len(memory.ranked_slots) == len(memory)
    holders = [memory, memory.storage, *([memory.tree] if kind == "proportional" else [])]
    measured = array_bytes(*holders) / capacity
    dtype = np.dtype(np.float32 if state_shape == (4,) else np.uint8)
    estimate = memory_class.bytes_per_slot(storage, state_shape, dtype)
    # The proportional estimate counts 2 * capacity tree nodes where there are 2 * capacity - 1
    # (16 bytes in all). What else stays is a few fixed arrays (a pending stack): < 3 bytes a
    # slot here, nothing for the millions of slots the estimate is for.
    missing = 16 / capacity if kind == "proportional" else 0
    assert 0 <= measured + missing - estimate < 3


@pytest.mark.parametrize(("size", "storage", "state_shape", "dtype", "kind", "needs"), [
    # per slot: state and next state (16 + 16), action 8, reward 8, three flags, sum and min
    # trees (32), and the 16 bytes the caller keeps beside it: 99
    (10_000_000, StorageSpec(), (4,), np.float32, "proportional", None),  # 0.92 GiB
    (20_000_000, StorageSpec(), (4,), np.float32, "proportional", "1.8 GiB (99 bytes"),
    (16_000_000, StorageSpec(), (4,), np.float32, "uniform", None),  # 67 bytes a slot: 1.00 GiB
    (20_000_000, StorageSpec(), (4,), np.float32, "rank-based", "1.9 GiB (100 bytes"),  # 33 ranks
    # one 84 x 84 frame, action 8, reward 4, two flags, trees 32, the caller's 16: 7,118
    (150_000, ATARI_FRAMES, (84, 84, 4), np.uint8, "proportional", None),  # 0.994 GiB
    (200_000, ATARI_FRAMES, (84, 84, 4), np.uint8, "proportional", "1.3 GiB (7118 bytes"),
    # MinAtar keeps a whole 10 x 10 x 4 state a slot (400), 14 more, trees 32, the caller's 16:
    # 462 (counted as one 100-byte frame, it would be 162 and 2,500,000 slots would fit)
    (2_000_000, MINATAR_STATES, (10, 10, 4), np.uint8, "proportional", None),  # 0.86 GiB
    (2_500_000, MINATAR_STATES, (10, 10, 4), np.uint8, "proportional", "1.1 GiB (462 bytes"),
])
def test_a_replay_memory_that_cannot_fit_is_refused_before_it_is_allocated(
        monkeypatch, size, storage, state_shape, dtype, kind, needs):
    monkeypatch.setattr(replay_memory, "machine_memory_bytes", lambda: 2**30)
    memory = MEMORIES[kind]
    if needs is None:
        memory.check_fits(size, storage, state_shape, dtype, 16)
        return
    with pytest.raises(ValueError) as refused:
        memory.check_fits(size, storage, state_shape, dtype, 16)
    assert str(refused.value) == (
        f"MEMORY_SIZE (--memory-size) {size:,} needs a replay memory of {needs} per transition "
        f"of {state_shape} {np.dtype(dtype)} states, {kind} replay), more than this machine's "
        "1.0 GiB")
    monkeypatch.setattr(replay_memory, "machine_memory_bytes", lambda: None)  # the system won't say
    memory.check_fits(size, storage, state_shape, dtype, 16)


@pytest.mark.parametrize(("storage", "state_shape", "fewest"), [
    (StorageSpec(), (4,), 1),
    (ATARI_FRAMES, (84, 84, 4), 5),  # a stack of 4 frames and its next state's newest
    (MINATAR_STATES, (10, 10, 4), 2),  # a state and its next state, channels not stacked
    (StorageSpec(FrameStackStorage), (1, 5, 1), 2),  # a new family's single-frame images
])
def test_a_memory_must_hold_one_transition_of_its_storage(storage, state_shape, fewest):
    with pytest.raises(ValueError, match=re.escape(
            f"MEMORY_SIZE (--memory-size) must be at least {fewest} for {state_shape} states "
            f"in a {storage.storage_class.__name__}, got {fewest - 1}")):
        Memory.check_fits(fewest - 1, storage, state_shape, np.uint8)
    Memory.check_fits(fewest, storage, state_shape, np.uint8)
    # The storage that `fewest` slots make holds a transition, sampled back.
    memory = Memory(fewest, storage=storage(fewest), rng=0)
    state = np.zeros(state_shape, np.uint8)
    next_state = state.copy()
    next_state.flat[-1] = 1  # the newest frame (last axis) changes
    memory.store((state, 1, 1.0, next_state, False))
    np.testing.assert_array_equal(memory.sample(1)[1][3][0], next_state)


# UniformMemory and storage -----------------------------------------------------------------------


def test_uniform_memory_has_the_same_interface():
    memory = UniformMemory(8, rng=3)
    for i in range(5):
        memory.store(experience(i))
    # No tree here: `sample` returns the slots themselves to pass back to `batch_update`.
    slots, (states, *_), is_weights = memory.sample(1000)
    np.testing.assert_array_equal(memory.slots_of(slots), slots)
    np.testing.assert_array_equal(states[:, 0], slots)
    np.testing.assert_array_equal(is_weights, 1.0)
    assert is_weights.dtype == np.float32
    counts = np.bincount(slots, minlength=5)
    np.testing.assert_allclose(counts / 1000, 0.2, atol=0.05)
    memory.batch_update(slots, np.zeros(1000))
    with pytest.raises(ValueError, match=names_bad("absolute TD error", np.nan)):
        memory.batch_update(slots[:1], np.array([np.nan]))
    with pytest.raises(ValueError, match=r"^slot must be in 0\.\.7, got 8$"):
        memory.batch_update(np.array([8]), np.array([0.0]))
    with pytest.raises(ValueError, match="empty memory"):
        UniformMemory(4).sample(1)


def test_uniform_memory_draws_only_slots_that_hold_a_transition():
    # A frame store has written slots without a transition: those are drawn again.
    stacks = frame_stacks(8)
    memory = UniformMemory(4, storage=FrameStackStorage(4), rng=0)
    for i in range(6):
        memory.store((stacks[i], i, 1.0, stacks[i + 1], False))
    slots, (states, actions, *_), _ = memory.sample(300)
    assert set(slots.tolist()) == {1, 2}  # the ring holds the last two
    np.testing.assert_array_equal(states, stacks[actions])


@pytest.mark.parametrize("make", MEMORIES.values(), ids=MEMORIES)
def test_seeded_memories_repeat(make):
    first, second = make(64, rng=5), make(64, rng=5)
    for i in range(50):
        first.store(experience(i))
        second.store(experience(i))
    for _ in range(3):
        (first_idx, first_batch, first_weights) = first.sample(8)
        (second_idx, second_batch, second_weights) = second.sample(8)
        np.testing.assert_array_equal(first_idx, second_idx)
        np.testing.assert_array_equal(first_weights, second_weights)
        for one, other in zip(first_batch, second_batch, strict=True):
            np.testing.assert_array_equal(one, other)
        first.batch_update(first_idx, np.abs(np.sin(first_idx)))
        second.batch_update(second_idx, np.abs(np.sin(second_idx)))


def test_storage_capacity_must_match():
    for memory in MEMORIES.values():
        with pytest.raises(ValueError, match="storage capacity 4 differs from memory capacity 8"):
            memory(8, storage=TransitionStorage(4))


# Blocks with their own priorities (Ape-X actors, ape_x.replay.BlockMemory.store_block) ------------


def block(first: int, k: int, done_at: int | None = None) -> tuple[np.ndarray, ...]:
    """k consecutive transitions of one episode, states first .. first + k - 1 (as `experience`)."""
    states = np.arange(first, first + k, dtype=np.float32)[:, None].repeat(3, axis=1)
    dones = np.arange(first, first + k) == done_at
    rewards = np.arange(first, first + k, dtype=np.float64)
    return states, np.arange(k) % 2, rewards, states + 1, dones


def test_store_block_enters_with_the_given_priorities_and_context_is_never_sampled():
    memory = BlockMemory(8, alpha=0.5, epsilon=0.01, abs_err_upper=1.0, rng=0, n_step=3,
                         gamma=0.5)
    slots = memory.store_block(block(0, 5), np.array([0.0, 0.24, 3.0]), context=2)
    np.testing.assert_array_equal(slots, [0, 1, 2, 3, 4])
    assert slots.dtype == np.int64
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


def test_a_block_s_last_transition_ends_its_chains_even_when_the_next_block_starts_there():
    # An actor's episode cut by its time limit (not done) ends its block; the next block, whose
    # first state is that episode's last next state (a reset may give it), is a new episode.
    memory = BlockMemory(16, rng=0, n_step=3, gamma=0.5)
    memory.store_block(block(0, 3), np.ones(3))
    memory.store_block(block(3, 3), np.ones(3))  # starts from state 3, the first's last next
    _, _, returns, next_states, _, discounts = memory.n_step_batch(np.arange(6))
    np.testing.assert_array_equal(returns[:3], [0 + 1 / 2 + 2 / 4, 1 + 2 / 2, 2])
    np.testing.assert_array_equal(next_states[:3, 0], [3, 3, 3])
    np.testing.assert_array_equal(discounts, np.float32([1 / 8, 1 / 4, 1 / 2] * 2))


def test_store_block_matches_store_then_batch_update():
    errors = np.abs(np.sin(np.arange(6)))
    blocked = BlockMemory(16, rng=4)
    blocked.store_block(block(0, 6), errors)
    stepped = BlockMemory(16, rng=4)
    for row in zip(*block(0, 6), strict=True):
        stepped.store(row)
    stepped.batch_update(np.arange(15, 21), errors)
    np.testing.assert_array_equal(blocked.tree.tree, stepped.tree.tree)
    np.testing.assert_array_equal(blocked.tree.mins, stepped.tree.mins)
    (got_idx, _, got_weights), (idx, _, weights) = blocked.sample(8), stepped.sample(8)
    np.testing.assert_array_equal(got_idx, idx)
    np.testing.assert_array_equal(got_weights, weights)


def test_store_block_wraps_around_and_evicts_the_oldest():
    memory = BlockMemory(8, rng=0)
    np.testing.assert_array_equal(
        memory.store_block(block(0, 6), np.full(6, 0.5)), [0, 1, 2, 3, 4, 5])
    slots = memory.store_block(block(100, 5), np.full(4, 2.0), context=1)
    np.testing.assert_array_equal(slots, [6, 7, 0, 1, 2])
    states = memory.storage.get(np.arange(8))[0][:, 0]
    np.testing.assert_array_equal(states, [102, 103, 104, 3, 4, 5, 100, 101])
    # |delta| = 2 is clipped to abs_err_upper = 1 before the power alpha = 0.6; context gets 0.
    np.testing.assert_allclose(memory.tree.tree[7:], [1.0, 1.0, 0.0] + [0.51**0.6] * 3 + [1.0] * 2)
    assert memory.max_priority == 1.0


def test_store_block_through_a_frame_store_rebuilds_the_stacks():
    memory = BlockMemory(16, storage=FrameStackStorage(16), rng=0)
    stacks = frame_stacks(6)  # (6, 2, 2, 2)
    transitions = (stacks[:5], np.arange(5), np.ones(5), stacks[1:], np.zeros(5, bool))
    slots = memory.store_block(transitions, np.full(4, 0.5), context=1)
    # The frame store takes the block one transition at a time; the context leaf is empty.
    assert len(slots) == 5
    leaves = memory.tree.tree[memory.tree.leaf_index(slots)]
    np.testing.assert_array_equal(leaves[:4], np.full(4, 0.51**0.6))
    assert leaves[4] == 0.0
    _, (states, actions, _, next_states, _, _), _ = memory.sample(100)
    assert set(actions) == {0, 1, 2, 3}
    np.testing.assert_array_equal(states, stacks[actions])
    np.testing.assert_array_equal(next_states, stacks[actions + 1])


def test_store_block_through_a_frame_store_empties_the_transitions_it_breaks():
    # A block that runs once round a ring of 4 (stacks of 2 frames) overwrites frames of its
    # own first transitions: their leaves end empty, whatever priority they entered with.
    memory = BlockMemory(4, storage=FrameStackStorage(4), rng=0)
    stacks = frame_stacks(5)
    transitions = (stacks[:4], np.arange(4), np.ones(4), stacks[1:], np.zeros(4, bool))
    slots = memory.store_block(transitions, np.full(4, 0.5))
    np.testing.assert_array_equal(slots, [1, 2, 3, 0])
    holds = memory.storage.holds(np.arange(4))
    np.testing.assert_array_equal(memory.tree.tree[memory.tree.leaf_index(np.arange(4))] > 0,
                                  holds)
    np.testing.assert_array_equal(memory.storage.held_slots(), [0, 3])  # the block's last two


def test_store_block_bad_input_raises_and_changes_nothing():
    memory = BlockMemory(8, rng=0)
    memory.store_block(block(0, 2), np.ones(2))
    before = snapshot(memory)
    bad_calls = [
        ((block(0, 3), np.ones(2)), {}, "got 2 errors for a block of 3"),
        ((block(0, 3), np.ones(2)), {"context": 3}, "context must be an integer in 0..2"),
        ((block(0, 3), np.ones(2)), {"context": True}, "context must be an integer in 0..2"),
        ((block(0, 3), np.array([0.1, np.nan, 0.2])), {},
         names_bad("absolute TD error", np.nan)),
        ((block(0, 3), np.array([0.1, -1.0, 0.2])), {},
         names_bad("absolute TD error", -1.0)),
        ((block(0, 9), np.ones(9)), {}, "1..8 transitions"),
        (((np.zeros((3, 3)), np.zeros(2), np.zeros(3), np.zeros((3, 3)), np.zeros(3)),
          np.ones(3)), {}, r"different lengths \[3, 2, 3, 3, 3\]"),
        (((np.zeros((2, 4)), np.zeros(2, int), np.zeros(2), np.zeros((2, 4)), np.zeros(2)),
          np.ones(2)), {}, r"state has shape \(4,\), but the memory holds \(3,\)"),
    ]
    for args, kwargs, message in bad_calls:
        with pytest.raises(ValueError, match=message):
            memory.store_block(*args, **kwargs)
        assert states_equal(snapshot(memory), before), message
    assert len(memory) == 2
    assert memory.store_block(block(5, 1), np.ones(1)).tolist() == [2]  # the next slot, as before


def test_store_block_refuses_a_block_with_one_bad_transition_and_writes_nothing():
    memory = BlockMemory(8, rng=0)
    memory.store_block(block(0, 8), np.ones(8))  # full: a next block overwrites the oldest
    before = snapshot(memory)

    def with_bad(field: int, value: object) -> tuple:
        columns = [np.array(column) for column in block(100, 4)]
        columns[field] = columns[field].astype(np.result_type(columns[field], value))
        columns[field][2] = value
        return tuple(columns)

    refused = [
        (with_bad(2, np.nan), "reward must be a finite number, got nan \\(transition 2 of the "
                              "block\\)"),
        (with_bad(0, np.inf), "^state must be finite, got inf \\(transition 2"),
        (with_bad(3, -np.inf), "next_state must be finite, got -inf \\(transition 2"),
        (with_bad(1, -1), "action must be an integer >= 0, got -1 \\(transition 2"),
        (with_bad(1, 0.5), "actions must be integers, got dtype float64"),
        (with_bad(4, 3), "done must be True or False, got 3 \\(transition 2"),
    ]
    for transitions, message in refused:
        with pytest.raises(ValueError, match=message):
            memory.store_block(transitions, np.ones(4))
        assert states_equal(snapshot(memory), before), message
