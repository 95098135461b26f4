"""Prioritized Experience Replay (Schaul et al. 2015, arXiv:1511.05952).

The tutorial's two classes, rewritten for speed and correctness:

- `SumTree`: a binary tree whose leaves hold priorities and whose inner nodes hold the sum of their
  children, so that "find the transition at cumulative priority v" costs O(log n).
- `Memory`: the prioritized replay memory the agent talks to. Proportional prioritization
  (p = (|delta| + e)^a) goes through the `SumTree`; the rank-based variant (p = 1/rank) keeps the
  transitions ordered by |delta|.

Next to them, `UniformMemory` has the same interface with plain uniform sampling, so the agent can
switch between the two with one flag. Both memories keep the transitions themselves in a storage
from `replay_storage.py` (`TransitionStorage` unless given another, such as the Atari
`FrameStackStorage`), and tell an optional observer (`ReplayObserver`, such as
`priority_figure.ReplayStatistics`) of every store and sample.

Every batch operation takes whole numpy arrays: there is no Python loop per sampled transition.

Tutorial -> this file. The code uses the names on the right; the hyperparameters are `Memory`'s
constructor arguments, with the tutorial's values as defaults, instead of class constants:

    PER_e                                  -> Memory.epsilon
    PER_a                                  -> Memory.alpha
    PER_b                                  -> Memory.beta
    PER_b_increment_per_sampling           -> Memory.beta_increment
    absolute_error_upper                   -> Memory.abs_err_upper
    SumTree.add / update / get_leaf / total_priority / data_pointer / tree / data    (kept)
    Memory.store / sample / batch_update                                              (kept)

`SumTree.tree` numbers its nodes as the tutorial draws them (root 0, children 2i+1 and 2i+2), so
tree indices, such as the tree_idx that `sample` returns, mean the same in both.

What changed behind the kept names:

- `SumTree.update` recomputes every sum above the leaf from its two children instead of adding
  the change to it, so rounding errors never accumulate; `update_batch` sets a batch in one call.
- `SumTree.get_leaf` never returns an empty leaf, and a value on the boundary of two leaves
  selects the later one; `find` searches a whole batch of values in one compiled call.
- `Memory.store`: the highest priority ever given is kept as priorities change, O(1), instead of
  a scan of all the leaves, O(N). A transition with NaN or inf, or an action that is not an
  integer in range, is refused (ValueError) before anything is written.
- `Memory.sample`: the stratified sampling is vectorized (one value per segment, all drawn at
  once); it returns the importance-sampling weights too, as (tree_idx, batch, is_weights), with
  the batch as arrays; slots not filled yet are never sampled.
- `Memory.batch_update`: the tutorial's priority formula over the whole batch at once; slots that
  no longer hold a transition (a frame store's overwritten frames) are skipped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Protocol

import numba
import numpy as np

from replay_storage import (
    NO_SLOTS,
    TransitionStorage,
    check_block,
    check_block_values,
    check_capacity,
    check_saved_value,
    check_transition,
    require,
)

NO_SLOTS_HELD = np.zeros(0, dtype=bool)  # `SumTree._set_leaves` without a storage: write every leaf
TOP = 1023  # the nodes of the 10 levels nearest the root, where a batch's walks up the tree meet


def as_generator(rng: np.random.Generator | int | None) -> np.random.Generator:
    """A numpy Generator: `rng` itself, or a new one seeded with `rng` (None: fresh entropy)."""
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def replay_bytes_per_slot(state_shape: tuple[int, ...], state_dtype: Any, kind: str) -> int:
    """Bytes per slot of a full replay memory as the agents build it, for refusing a size that
    cannot fit before allocating it: image stacks (3-d states) in a `FrameStackStorage` (one
    uint8 frame, an int64 action, a float32 reward, done and holds flags), other states in a
    `TransitionStorage` (state and next state, the agents' int64 actions and float64 rewards,
    done and holds flags), plus the priorities of `kind`: "uniform" none, "proportional" the
    sum and min trees (two float64 nodes a slot each) and `SumTree.data` (a pointer a slot),
    "rank-based" four float64 or int64 arrays and a flag. tests/test_per.py measures it."""
    state_bytes = math.prod(state_shape) * np.dtype(state_dtype).itemsize
    if len(state_shape) == 3:
        transition = state_bytes // state_shape[-1] + 8 + 4 + 1 + 1
    else:
        transition = 2 * state_bytes + 8 + 8 + 1 + 1
    return transition + {"uniform": 0, "proportional": 5 * 8, "rank-based": 4 * 8 + 1}[kind]


def check_leaves(
    tree_indices: Any, values: Any, capacity: int, name: str = "absolute TD error"
) -> tuple[np.ndarray, np.ndarray]:
    """(tree indices, values) as flat int64 / float64 arrays of one length, or ValueError naming
    the first index that is not a leaf or the first `name` value that is NaN, infinite or
    negative. One compiled pass checks the batch (~0.3 us for 32)."""
    leaves = np.asarray(tree_indices)
    if leaves.dtype.kind not in "iu":
        raise ValueError(f"tree indices must be integers, got dtype {leaves.dtype}")
    leaves = leaves.astype(np.int64, copy=False).reshape(-1)
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if values.shape != leaves.shape:
        raise ValueError(f"got {len(leaves)} tree indices but {len(values)} errors")
    first_leaf, last_leaf = capacity - 1, 2 * capacity - 2
    bad = _first_invalid(leaves, values, first_leaf, last_leaf)
    if bad >= 0 and not first_leaf <= leaves[bad] <= last_leaf:
        raise ValueError(f"tree index {leaves[bad]} is not a leaf (leaves are "
                         f"{first_leaf}..{last_leaf})")
    if bad >= 0:
        raise ValueError(f"{name} must be finite and >= 0, got {values[bad]!r}")
    return leaves, values


def _check_non_negative(name: str, values: np.ndarray) -> None:
    """Raise ValueError naming the first NaN, infinite or negative entry of `values`."""
    # Two reductions are the cheap test (NaN fails both comparisons); find the culprit only then.
    if values.size and not (values.min() >= 0 and values.max() < np.inf):
        bad = ~np.isfinite(values) | (values < 0)
        raise ValueError(f"{name} must be finite and >= 0, got {values[bad][0]!r}")


class SumTree:
    """Sum tree over `capacity` priorities, in one float64 array `tree` of 2*capacity - 1 nodes.

    Node i has children 2i+1 and 2i+2 and parent (i-1)//2, the leaves are the last `capacity`
    nodes and are filled left to right, each inner node holds the sum of its two children, so the
    root holds the total::

                  0            <- total_priority
                /   \\
              1       2
             / \\     / \\
            3   4   5   6      <- leaves (capacity = 4): data index = tree index - (capacity - 1)

    `data` holds one payload per leaf for the tutorial's `add`/`get_leaf` API; `Memory` keeps its
    transitions in a storage instead and uses only the priorities.

    The walks up and down the tree are the tutorial's loops, compiled with numba and run over a
    whole batch per call, so a batch costs one call instead of a Python loop per transition.
    After a leaf changes, every node above it is recomputed as the sum of its two children (not
    shifted by the change), so rounding errors never accumulate, however many updates. A second
    array of the same shape and numbering, `mins`, holds the minimum of each subtree (empty leaves
    count as +inf), which makes `min_priority`, needed for the importance-sampling weights, O(1).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = check_capacity(capacity)
        self.tree = np.zeros(2 * self.capacity - 1)
        self.mins = np.full(2 * self.capacity - 1, np.inf)
        self.data = np.full(self.capacity, None, dtype=object)
        self.data_pointer = 0
        # A batch update recomputes a node near the root once per level, however many of the
        # batch's leaves lie below it: `_queued[i]` is the last pass that queued node i < TOP.
        self._queued = np.zeros(TOP, dtype=np.int64)
        self._passes = 0

    @property
    def total_priority(self) -> float:
        """Sum of all priorities (the root node). O(1)."""
        return float(self.tree[0])

    @property
    def min_priority(self) -> float:
        """Smallest non-zero leaf priority, +inf while every leaf is zero. O(1)."""
        return float(self.mins[0])

    def add(self, priority: float, data: Any) -> None:
        """Write `data` with `priority` at the next leaf (the oldest, once full). O(log n)."""
        self.data[self.data_pointer] = data
        self.update(self.data_pointer + self.capacity - 1, priority)
        self.data_pointer = (self.data_pointer + 1) % self.capacity

    def update(self, tree_index: int, priority: float) -> None:
        """Set the priority of the leaf at `tree_index` and fix the sums above it. O(log n)."""
        if not isinstance(tree_index, (int, np.integer)) or isinstance(tree_index, bool):
            raise ValueError(f"tree index must be an integer, got {tree_index!r}")
        if not self.capacity - 1 <= tree_index <= 2 * self.capacity - 2:
            raise ValueError(
                f"tree index {tree_index} is not a leaf "
                f"(leaves are {self.capacity - 1}..{2 * self.capacity - 2})"
            )
        if not 0 <= priority < np.inf:
            raise ValueError(f"priority must be finite and >= 0, got {priority!r}")
        _set_leaf(self.tree, self.mins, int(tree_index), float(priority))

    def update_batch(self, tree_indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set many leaf priorities, in order: a leaf named twice keeps its last. O(k log n).

        The tree is left unchanged when any index is not a leaf or any priority is NaN, infinite
        or negative.
        """
        shape = np.shape(tree_indices)
        priorities = np.broadcast_to(np.asarray(priorities, dtype=np.float64), shape)
        leaves, priorities = check_leaves(tree_indices, priorities, self.capacity, "priority")
        self._set_leaves(leaves, priorities)

    def _set_leaves(self, leaves: np.ndarray, priorities: np.ndarray,
                    holds: np.ndarray = NO_SLOTS_HELD) -> float:
        """`update_batch` for arguments already checked; with `holds` (a bool per data index),
        leaves whose slot holds nothing are skipped. Returns the largest priority written."""
        self._passes, largest = _set_leaves(
            self.tree, self.mins, self._queued, self._passes, leaves,
            np.ascontiguousarray(priorities), holds, self.capacity - 1)
        return largest

    def get_leaf(self, v: float) -> tuple[int, float, Any]:
        """Leaf at cumulative priority v in [0, total]: (tree index, priority, data). O(log n)."""
        leaf_indices, priorities, data = self.get_leaves(np.array([v], dtype=np.float64))
        return int(leaf_indices[0]), float(priorities[0]), data[0]

    def get_leaves(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorised `get_leaf`: (tree indices, priorities, data) for k values. O(k log n).

        Value v selects the leaf whose cumulative range [sum of leaves before it, + its priority)
        contains v, searching left to right as the tree is drawn. Values at or beyond the total
        select the last non-empty leaf; empty (zero-priority) leaves are never returned.
        """
        leaf_indices = self.find(values)
        return leaf_indices, self.tree[leaf_indices], self.data[leaf_indices - (self.capacity - 1)]

    def find(self, values: np.ndarray) -> np.ndarray:
        """Tree indices of the leaves at cumulative priorities `values` (no payload). O(k log n)."""
        values = np.asarray(values, dtype=np.float64).ravel()
        _check_non_negative("value", values)
        if not self.tree[0] > 0:
            raise ValueError(f"cannot search an empty sum tree (total priority {self.tree[0]!r})")
        return _find_leaves(self.tree, self.capacity, values)


@numba.njit(cache=True)
def _set_leaf(sums, mins, node, priority):  # pragma: no cover (compiled)
    """Write `priority` at leaf `node`, then recompute the sums and minima of the nodes above."""
    sums[node] = priority
    mins[node] = priority if priority > 0 else np.inf
    while node > 0:
        node = (node - 1) // 2
        left = 2 * node + 1
        sums[node] = sums[left] + sums[left + 1]
        mins[node] = min(mins[left], mins[left + 1])


@numba.njit(cache=True)
def _set_leaves(  # pragma: no cover (compiled)
    sums, mins, queued, passes, leaves, priorities, holds, first_leaf
):
    """Write `priorities` at the `leaves` (in order: a leaf named twice keeps its last; with a
    non-empty `holds`, only leaves i with holds[i - first_leaf]), then recompute the nodes above
    them level by level. Returns (passes, largest priority written).

    All the batch's walks advance one level per pass, so the cache misses of different walks
    overlap, and a node near the root (i < TOP, where walks meet) is recomputed once per pass
    however many walks reach it. A node is recomputed again whenever a child of it was, so it
    ends as the sum of its final children, exactly as one walk per leaf leaves it.
    """
    frontier = np.empty(leaves.size, dtype=np.int64)  # nodes whose parents are due
    count = 0
    largest = 0.0
    for k in range(leaves.size):
        node = leaves[k]
        if holds.size and not holds[node - first_leaf]:
            continue
        sums[node] = priorities[k]
        mins[node] = priorities[k] if priorities[k] > 0 else np.inf
        largest = max(largest, priorities[k])
        frontier[count] = node
        count += 1
    while count > 0:  # recompute the parents of the frontier, which become the next frontier
        passes += 1
        queued_next = 0
        for j in range(count):
            node = frontier[j]
            if node == 0:
                continue
            parent = (node - 1) // 2
            if parent < TOP:
                if queued[parent] == passes:
                    continue
                queued[parent] = passes
            left = 2 * parent + 1
            sums[parent] = sums[left] + sums[left + 1]
            mins[parent] = min(mins[left], mins[left + 1])
            frontier[queued_next] = parent
            queued_next += 1
        count = queued_next
    return passes, largest


@numba.njit(cache=True)
def _first_invalid(leaves, values, first_leaf, last_leaf):  # pragma: no cover (compiled)
    """Index of the first leaf outside first_leaf..last_leaf or value that is NaN, infinite or
    negative; -1 if there is none."""
    for k in range(leaves.size):
        if not (first_leaf <= leaves[k] <= last_leaf and 0.0 <= values[k] < np.inf):
            return k
    return -1


@numba.njit(cache=True)
def _find_leaves(sums, capacity, values):  # pragma: no cover (compiled)
    """Tree indices of the leaves at cumulative priorities `values`."""
    leaves = np.empty(values.size, dtype=np.int64)
    for k in range(values.size):
        v = values[k]
        node = 0
        while node < capacity - 1:  # inner nodes are 0 .. capacity - 2
            left = 2 * node + 1
            # Go right when v is past the left subtree, unless the right one is empty: then v
            # overshot the total (a value at the end, or rounding), and the last leaf is left.
            # Every node visited so has a positive sum, so the leaf found is never empty.
            if v >= sums[left] and sums[left + 1] > 0:
                v -= sums[left]
                node = left + 1
            else:
                node = left
        leaves[k] = node
    return leaves


class ReplayObserver(Protocol):
    """What a replay memory tells its observer, such as `priority_figure.ReplayStatistics`.

    The memory calls these as it stores and samples, with storage slots (a slot is its leaf's
    tree index - (capacity - 1)), and ignores what they return: observing changes nothing in the
    memory, so a seeded run is the same with or without an observer.
    """

    def note_store(self, slot: int) -> None:
        """A new transition went into `slot` (`store`)."""

    def note_stores(self, slots: np.ndarray) -> None:
        """New transitions went into `slots`, oldest first (`Memory.store_block`)."""

    def note_sample(self, slots: np.ndarray, size: int) -> None:
        """`slots` were drawn, repeats included, from a memory of `size` transitions (`sample`)."""


class ReplayMemory:
    """What both memories share: the storage, the random generator, the observer, checkpoints."""

    kind = ""  # "uniform", "proportional" or "rank-based": a checkpoint must match

    def __init__(
        self,
        capacity: int,
        storage: TransitionStorage | None,
        rng: np.random.Generator | int | None,
        n_step: int = 1,
        gamma: float = 0.99,
        observer: ReplayObserver | None = None,
        action_count: int | None = None,
    ) -> None:
        self.capacity = check_capacity(capacity)
        if action_count is not None and (isinstance(action_count, bool) or not isinstance(
                action_count, int | np.integer) or action_count < 1):
            raise ValueError(f"action_count must be an integer >= 1 or None, got {action_count!r}")
        self.action_count = action_count
        if isinstance(n_step, bool) or not isinstance(n_step, int | np.integer) or n_step < 1:
            raise ValueError(f"n_step must be an integer >= 1, got {n_step!r}")
        _check_range("gamma", gamma, 0.0, 1.0)
        self.n_step = int(n_step)
        self.gamma = float(gamma)
        self.storage = storage if storage is not None else TransitionStorage(self.capacity)
        if self.storage.capacity != self.capacity:
            raise ValueError(
                f"storage capacity {self.storage.capacity} differs from memory capacity "
                f"{self.capacity}"
            )
        self.rng = as_generator(rng)
        self.observer = observer

    def __len__(self) -> int:
        return len(self.storage)

    def _note_store(self, slot: int) -> None:
        if self.observer is not None:
            self.observer.note_store(slot)

    def _note_sample(self, slots: np.ndarray) -> None:
        if self.observer is not None:
            self.observer.note_sample(slots, len(self))

    def held_slots(self) -> np.ndarray:
        """The slots that hold a transition. O(capacity)."""
        return np.flatnonzero(self.storage.holds_transition)

    def n_step_batch(self, slots: np.ndarray) -> tuple[np.ndarray, ...]:
        """The n-step transitions that start in `slots`, as the batch `sample` returns.

        (states, actions, rewards, next_states, dones, discounts): rewards are the discounted sums
        r_t + gamma r_t+1 + ... over the k <= n_step transitions that follow slot t in its episode,
        next_states the state after the k-th, dones whether it terminated, and discounts gamma^k,
        the factor in front of Q(next_state). A chain stops early at a termination, at a time-limit
        truncation (bootstrapping from the last state seen) and at the newest transition. With
        n_step = 1 this is the stored transition and discounts are gamma.
        Cost O(n_step * len(slots)), vectorized over the batch.
        """
        rewards, dones = self.storage.rewards_and_dones(slots)
        returns = rewards.astype(np.float64)
        dones = dones.astype(bool)
        last = slots.copy()
        steps = np.ones(len(slots), dtype=np.int64)
        ongoing = ~dones
        for k in range(1, self.n_step):
            ongoing[ongoing] = self.storage.next_in_episode(last[ongoing])
            if not ongoing.any():
                break
            last[ongoing] = (last[ongoing] + 1) % self.capacity
            step_rewards, step_dones = self.storage.rewards_and_dones(last[ongoing])
            returns[ongoing] += self.gamma**k * step_rewards
            dones[ongoing] = step_dones
            steps[ongoing] += 1
            ongoing[ongoing] = ~step_dones
        states, actions, _, next_states, _ = self.storage.get(slots, last)
        discounts = (self.gamma**steps).astype(np.float32)
        return states, actions, returns, next_states, dones, discounts

    def state_dict(self) -> dict[str, np.ndarray]:
        """The whole memory as plain numpy arrays (for `np.savez`, loadable without pickle).

        The observer is not part of it: whoever made the observer saves it (the replay statistics
        have their own `state_dict`).
        """
        arrays = {f"storage.{key}": value for key, value in self.storage.state_dict().items()}
        arrays["kind"] = np.array(self.kind)
        arrays["rng"] = np.array(json.dumps(self.rng.bit_generator.state))
        return arrays

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore what `state_dict` returned. ValueError naming what does not fit.

        Keys it does not know are ignored, such as the "stats.*" replay statistics that older
        checkpoints saved with the memory.
        """
        self._check_kind(arrays)
        require(arrays, ("rng",), "replay memory")
        prefix = "storage."
        self.storage.load_state_dict(
            {key[len(prefix) :]: value for key, value in arrays.items() if key.startswith(prefix)}
        )
        try:
            self.rng.bit_generator.state = json.loads(arrays["rng"].item())
        except (TypeError, ValueError, KeyError) as error:
            raise ValueError(f"saved random generator state is unusable: {error}") from error

    def _check_kind(self, arrays: dict[str, np.ndarray]) -> None:
        require(arrays, ("kind",), "replay memory")
        check_saved_value(arrays, "kind", self.kind)


class UniformMemory(ReplayMemory):
    """Replay memory with uniform sampling and `Memory`'s interface (the agent's USE_PER=False).

    `sample` returns importance-sampling weights of one and `batch_update` only checks its input,
    so the agent runs one code path for both memories.
    """

    kind = "uniform"

    def __init__(
        self,
        capacity: int,
        storage: TransitionStorage | None = None,
        rng: np.random.Generator | int | None = None,
        n_step: int = 1,
        gamma: float = 0.99,
        observer: ReplayObserver | None = None,
        action_count: int | None = None,
    ) -> None:
        super().__init__(capacity, storage, rng, n_step, gamma, observer, action_count)

    def store(self, experience: tuple) -> None:
        """Add one (state, action, reward, next_state, done) transition. O(1). ValueError
        naming the field, and nothing written, for a transition `check_transition` refuses."""
        slot, _ = self.storage.add(check_transition(experience, self.action_count))
        self._note_store(slot)

    def sample(self, n: int) -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray]:
        """n transitions drawn uniformly with replacement: (tree_idx, batch, ones). O(n)."""
        _check_sample(n, len(self))
        holds = self.storage.holds_transition
        slots = self.rng.integers(0, self.storage.written, size=n)
        # A storage may have written slots without a transition (frame stacks): draw those again.
        empty = ~holds[slots]
        while empty.any():
            slots[empty] = self.rng.integers(0, self.storage.written, size=int(empty.sum()))
            empty = ~holds[slots]
        self._note_sample(slots)
        tree_idx = slots + (self.capacity - 1)
        return tree_idx, self.n_step_batch(slots), np.ones(n, dtype=np.float32)

    def sampling_probabilities(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots holding a transition, P(i) = 1 / their number). O(capacity)."""
        slots = self.held_slots()
        return slots, np.full(len(slots), 1.0 / max(len(slots), 1))

    def batch_update(self, tree_idx: np.ndarray, abs_errors: np.ndarray) -> None:
        """Check the arguments like `Memory.batch_update`; uniform sampling ignores priorities."""
        check_leaves(tree_idx, abs_errors, self.capacity)


def _check_sample(n: Any, size: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"batch size must be a positive integer, got {n!r}")
    if size == 0:
        raise ValueError("cannot sample from an empty memory: store transitions first")


class Memory(ReplayMemory):
    """Prioritized replay memory (Schaul et al. 2015), with the tutorial's names.

    Proportional variant (default): p_i = min(|delta_i| + epsilon, abs_err_upper) ** alpha, kept in
    a `SumTree`. Sampling is stratified: [0, total) is cut into n equal segments and one value is
    drawn uniformly in each, so a batch spreads over the whole distribution P(i) = p_i / sum_k p_k.

    Rank-based variant (rank_based=True): p_i = 1 / rank(i), rank 1 being the largest |delta|, and
    P(i) = p_i ** alpha / sum_k p_k ** alpha. The transitions are kept exactly sorted by |delta|
    (an O(N) merge before a sample that follows new errors, all in numpy), and the strata are the
    n equal-probability segments of that fixed rank distribution. The paper uses alpha=0.7 and
    beta=0.5 for this variant.

    Both: a new transition gets the highest priority so far, so it is replayed at least once
    soon; importance-sampling weights w_i = (N * P(i)) ** -beta / max_j w_j, the max over the
    whole memory, so weights lie in (0, 1]; beta grows by beta_increment per `sample`, up to 1.
    """

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_increment: float = 0.001,
        epsilon: float = 0.01,
        abs_err_upper: float = 1.0,
        rank_based: bool = False,
        storage: TransitionStorage | None = None,
        rng: np.random.Generator | int | None = None,
        n_step: int = 1,
        gamma: float = 0.99,
        observer: ReplayObserver | None = None,
        action_count: int | None = None,
    ) -> None:
        """An empty memory of `capacity` slots; ValueError naming an argument out of range.

        Args:
            capacity: transitions held; once full, each new one overwrites the oldest.
            alpha: the tutorial's PER_a: how much the priorities shape sampling, 0 being uniform.
            beta: the tutorial's PER_b: the importance-sampling exponent at the start.
            beta_increment: the tutorial's PER_b_increment_per_sampling: added to beta at every
                `sample`, until beta reaches 1.
            epsilon: the tutorial's PER_e: added to every |delta|, so that no transition's
                priority is 0 (proportional variant).
            abs_err_upper: the tutorial's absolute_error_upper: |delta| + epsilon is clipped to
                it (proportional variant).
            rank_based: p = 1 / rank instead of the proportional priorities.
            storage: where the transitions live (`replay_storage`), with this capacity;
                default a new `TransitionStorage`.
            rng: the random generator of the strata, or its seed.
            n_step, gamma: the sampled batch holds n-step returns (see `n_step_batch`).
            observer: told of every store and sample (`ReplayObserver`), or None.
            action_count: the actions are 0..action_count - 1; a store of another is refused
                (None: any integer >= 0).
        """
        super().__init__(capacity, storage, rng, n_step, gamma, observer, action_count)
        _check_range("alpha", alpha, 0.0, np.inf)
        _check_range("beta", beta, 0.0, 1.0)
        _check_range("beta_increment", beta_increment, 0.0, 1.0)
        if not epsilon > 0 or not np.isfinite(epsilon):
            raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
        if not abs_err_upper > 0:
            raise ValueError(f"abs_err_upper must be > 0, got {abs_err_upper!r}")
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.beta_increment = float(beta_increment)
        self.epsilon = float(epsilon)
        self.abs_err_upper = float(abs_err_upper)
        self.rank_based = bool(rank_based)
        self.kind = "rank-based" if self.rank_based else "proportional"
        if self.rank_based:
            self._init_ranks()
        else:
            self.tree = SumTree(self.capacity)
            # New transitions enter as if their error were the clip value (or 1 when unclipped).
            self.max_priority = min(1.0, self.abs_err_upper) ** self.alpha

    def store(self, experience: tuple) -> None:
        """Add one (state, action, reward, next_state, done) with the maximum priority. O(log N).

        A transition `check_transition` refuses (NaN or inf in a state or the reward, an action
        that is not an integer in 0..action_count - 1, ...) raises ValueError naming the field
        and its value, before anything is written: a full memory keeps its oldest transition.
        """
        slot, freed = self.storage.add(check_transition(experience, self.action_count))
        self._note_store(slot)
        if self.rank_based:
            self._abs_errors[freed] = -np.inf
            self._abs_errors[slot] = np.inf
            self._mark_stale(np.append(freed, slot))
            return
        if freed.size:
            self.tree.update_batch(freed + (self.capacity - 1), 0.0)
        self.tree.update(slot + self.capacity - 1, self.max_priority)

    def sample(self, n: int) -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray]:
        """Draw n transitions by priority: (tree_idx, batch, is_weights).

        tree_idx are the leaves to pass back to `batch_update`; batch is (states, actions,
        rewards, next_states, dones, discounts) with leading dimension n (see `n_step_batch`; the
        TD target is rewards + discounts * (1 - dones) * Q(next_states)); is_weights is float32
        (n,).
        Cost O(n log N) proportional; rank-based adds an O(N) merge when priorities changed.
        """
        _check_sample(n, len(self))
        self.beta = min(1.0, self.beta + self.beta_increment)
        strata = (np.arange(n) + self.rng.random(n)) / n
        if self.rank_based:
            slots, is_weights = self._sample_ranks(strata)
        else:
            leaves = self.tree.find(strata * self.tree.total_priority)
            slots = leaves - (self.capacity - 1)
            # (N P_i)^-beta / (N P_min)^-beta = (p_i / p_min)^-beta: N and the total cancel.
            is_weights = (self.tree.tree[leaves] / self.tree.min_priority) ** -self.beta
        self._note_sample(slots)
        tree_idx = slots + (self.capacity - 1)
        return tree_idx, self.n_step_batch(slots), is_weights.astype(np.float32)

    def batch_update(self, tree_idx: np.ndarray, abs_errors: np.ndarray) -> None:
        """Give the sampled transitions new priorities from their absolute TD errors. O(k log N).

        NaN, infinite or negative errors raise ValueError and change nothing. Slots that no longer
        hold a transition (overwritten frames) are skipped; a slot named twice takes its last error.
        """
        leaves, errors = check_leaves(tree_idx, abs_errors, self.capacity)
        if self.rank_based:
            slots = leaves - (self.capacity - 1)
            live = self.storage.holds_transition[slots]
            self._abs_errors[slots[live]] = errors[live]
            self._mark_stale(slots[live])
            return
        priorities = self._priorities(errors)
        largest = self.tree._set_leaves(leaves, priorities, self.storage.holds_transition)
        self.max_priority = max(self.max_priority, largest)

    def _priorities(self, abs_errors: np.ndarray) -> np.ndarray:
        """p = min(|delta| + epsilon, abs_err_upper)^alpha (the tutorial's PER_e and PER_a), in
        one new array."""
        priorities = abs_errors + self.epsilon
        return np.power(np.minimum(priorities, self.abs_err_upper, out=priorities), self.alpha,
                        out=priorities)

    def sampling_probabilities(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots holding a transition, their sampling probabilities P(i)). O(capacity)."""
        if self.rank_based:
            self._refresh_ranks()
            weights = np.diff(self._rank_cdf[: len(self._ranked_slots)], prepend=0.0)
            return self._ranked_slots.copy(), weights / max(weights.sum(), 1e-300)
        slots = self.held_slots()
        priorities = self.tree.tree[slots + (self.capacity - 1)]
        return slots, priorities / max(self.tree.total_priority, 1e-300)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The memory, its priorities and beta as plain numpy arrays (see `ReplayMemory`)."""
        arrays = super().state_dict()
        arrays["alpha"] = np.array(self.alpha)
        arrays["beta"] = np.array(self.beta)
        if self.rank_based:
            self._refresh_ranks()
            arrays["abs_errors"] = self._abs_errors
            arrays["ranked_slots"] = self._ranked_slots
            arrays["ranked_keys"] = self._ranked_keys
        else:
            arrays["tree.sums"] = self.tree.tree
            arrays["tree.mins"] = self.tree.mins
            arrays["max_priority"] = np.array(self.max_priority)
        return arrays

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore what `state_dict` returned. ValueError naming what does not fit."""
        self._check_kind(arrays)
        require(arrays, ("alpha", "beta"), "prioritized memory")
        if self.rank_based:
            keys = ("abs_errors", "ranked_slots", "ranked_keys")
        else:
            keys = ("tree.sums", "tree.mins", "max_priority")
        require(arrays, keys, f"{self.kind} memory")
        check_saved_value(arrays, "alpha", self.alpha)
        super().load_state_dict(arrays)
        self.beta = float(arrays["beta"])
        if self.rank_based:
            self._abs_errors = _saved_array("abs_errors", arrays["abs_errors"], (self.capacity,))
            self._ranked_slots = np.asarray(arrays["ranked_slots"], dtype=np.int64)
            self._ranked_keys = np.asarray(arrays["ranked_keys"], dtype=np.float64)
            self._stale_slots.clear()
        else:
            self.tree.tree[:] = _saved_tree(arrays, "tree.sums", self.capacity)
            self.tree.mins[:] = _saved_tree(arrays, "tree.mins", self.capacity)
            self.max_priority = float(arrays["max_priority"])

    # Block insertion, for Ape-X (apex.py) ---------------------------------------------------
    # apex.py's shared replay stores whole blocks with priorities its actors computed; the
    # agent itself uses only store, sample and batch_update above.

    def store_block(
        self, transitions: Sequence[Any], abs_errors: np.ndarray, context: int = 0
    ) -> np.ndarray:
        """Add k consecutive transitions with the priorities their sender computed; return the
        k slots that hold them. O(k log N).

        For distributed replay (Ape-X, `apex.py`): an actor computes the |TD errors| of its own
        transitions, so they enter with a measured priority instead of the maximum. `transitions`
        is (states, actions, rewards, next_states, dones) with leading dimension k, in the order
        they happened; `abs_errors` are the |TD errors| of the first k - `context`, turned into
        priorities as `batch_update` does. The last `context` transitions are stored only so
        that the n-step chains of the others run through to their end (the sender sends them
        again at the head of its next block): they get priority 0 and are never sampled.

        Bad input (lengths, shapes, NaN, infinite or negative errors, a transition that `store`
        would refuse) raises ValueError and changes nothing. The storage takes the block in one
        vectorized write when it has `add_block`; `FrameStackStorage`, which must see each
        transition to share its frames, takes it one `add` at a time, and a transition it rejects
        (a next state that is not its state shifted by a frame) raises after the ones before it
        were stored (with their priorities).
        """
        columns = check_block(transitions, self.capacity)
        check_block_values(columns, self.action_count)
        k = len(columns[0])
        if isinstance(context, bool) or not isinstance(context, int | np.integer) or not (
                0 <= context < k):
            raise ValueError(f"context must be an integer in 0..{k - 1} for a block of {k}, "
                             f"got {context!r}")
        errors = np.asarray(abs_errors, dtype=np.float64).ravel()
        if errors.size != k - context:
            raise ValueError(f"got {errors.size} errors for a block of {k} transitions with "
                             f"{context} of context (expected {k - context})")
        _check_non_negative("absolute TD error", errors)
        if self.rank_based:
            # |delta| decides the rank; -inf marks a slot that is never ranked nor sampled.
            values = np.concatenate([errors, np.full(context, -np.inf)])
        else:
            values = np.concatenate([self._priorities(errors), np.zeros(context)])
        # (slots, new values) in the order they were written: freed slots, then the new ones.
        writes: list[tuple[np.ndarray, np.ndarray]] = []
        try:
            if hasattr(self.storage, "add_block"):
                slots, freed = self.storage.add_block(columns)
                writes += [(freed, self._empty_value(len(freed))), (slots, values)]
            else:
                for i, experience in enumerate(zip(*columns, strict=True)):
                    slot, freed = self.storage.add(experience)
                    writes += [(freed, self._empty_value(len(freed))),
                               (np.array([slot]), values[i:i + 1])]
        finally:
            if writes:
                self._write_priorities(writes)
        return np.concatenate([slots for slots, _ in writes[1::2]]).astype(np.int64)

    def _empty_value(self, n: int) -> np.ndarray:
        """What n slots that no longer hold a transition get: priority 0, or rank-based -inf."""
        return np.full(n, -np.inf if self.rank_based else 0.0)

    def _write_priorities(self, writes: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """Apply `store_block`'s writes in order (a slot written twice keeps its last value)."""
        slots = np.concatenate([slots for slots, _ in writes]).astype(np.int64)
        values = np.concatenate([values for _, values in writes])
        if self.observer is not None:
            self.observer.note_stores(np.concatenate([slots for slots, _ in writes[1::2]]))
        if not self.rank_based:
            largest = self.tree._set_leaves(slots + (self.capacity - 1), values)  # last wins
            self.max_priority = max(self.max_priority, largest)
            return
        _, last = np.unique(slots[::-1], return_index=True)  # last occurrence of each slot
        keep = len(slots) - 1 - last
        self._abs_errors[slots[keep]] = values[keep]
        self._mark_stale(slots[keep])

    # Rank-based variant ---------------------------------------------------------------------

    def _init_ranks(self) -> None:
        # |delta| per slot: +inf for unseen transitions (they rank first), -inf for empty slots.
        self._abs_errors = np.full(self.capacity, -np.inf)
        # Slots holding transitions, largest |delta| first, and their keys (-|delta|, ascending).
        self._ranked_slots = NO_SLOTS
        self._ranked_keys = np.zeros(0)
        self._stale = np.zeros(self.capacity, dtype=bool)
        self._stale_slots: list[np.ndarray] = []
        # Cumulative unnormalised probabilities of ranks 1..capacity: sum_{r <= j} r^-alpha.
        self._rank_cdf = np.cumsum(np.arange(1, self.capacity + 1, dtype=np.float64) ** -self.alpha)

    def _mark_stale(self, slots: np.ndarray) -> None:
        self._stale_slots.append(slots)

    def _refresh_ranks(self) -> None:
        """Move the slots whose error changed to their sorted place. O(N + k log k)."""
        if not self._stale_slots:
            return
        stale = np.unique(np.concatenate(self._stale_slots))
        self._stale_slots.clear()
        self._stale[stale] = True
        keep = ~self._stale[self._ranked_slots]
        self._stale[stale] = False
        ranked_slots, ranked_keys = self._ranked_slots[keep], self._ranked_keys[keep]
        # Ranked: slots that hold a transition, except store_block's context (|delta| = -inf).
        stale = stale[self.storage.holds_transition[stale] & (self._abs_errors[stale] > -np.inf)]
        keys = -self._abs_errors[stale]
        order = np.argsort(keys, kind="stable")
        stale, keys = stale[order], keys[order]
        positions = np.searchsorted(ranked_keys, keys, side="left")
        self._ranked_slots = np.insert(ranked_slots, positions, stale)
        self._ranked_keys = np.insert(ranked_keys, positions, keys)

    def _sample_ranks(self, strata: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._refresh_ranks()
        size = len(self._ranked_slots)
        cdf = self._rank_cdf[:size]
        ranks = np.minimum(np.searchsorted(cdf, strata * cdf[-1], side="right"), size - 1)
        # P(rank j) = j^-alpha / S, P_min = N^-alpha / S, so w_j / w_max = (j / N)^(alpha beta).
        is_weights = ((ranks + 1) / size) ** (self.alpha * self.beta)
        return self._ranked_slots[ranks], is_weights


def _saved_array(key: str, saved: Any, shape: tuple[int, ...]) -> np.ndarray:
    """`saved`, the checkpoint's `key`, as a float64 array; ValueError unless it has `shape`."""
    array = np.array(saved, dtype=np.float64)
    if array.shape != shape:
        raise ValueError(f"saved {key} has shape {array.shape}, expected {shape}")
    return array


def _saved_tree(arrays: dict[str, np.ndarray], key: str, capacity: int) -> np.ndarray:
    """The checkpoint's sum or min tree `key`: 2*capacity - 1 nodes, numbered as `SumTree` does.

    Checkpoints from before the tree was counted from 0 hold 2*capacity elements, a never-used one
    in front of the root; it is dropped.
    """
    nodes = np.asarray(arrays[key])
    if nodes.shape == (2 * capacity,):
        nodes = nodes[1:]
    return _saved_array(key, nodes, (2 * capacity - 1,))


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")
