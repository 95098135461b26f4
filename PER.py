"""Prioritized Experience Replay (Schaul et al., ICLR 2016, arXiv:1511.05952): the tutorial's
memory, `SumTree` and `Memory`, then `UniformMemory`, plain replay behind the same interface.

Proportional prioritization, in the paper's notation: transition i has priority
p_i = |delta_i| + epsilon (here, as in the tutorial, capped at `abs_err_upper` = 1; epsilon = 0.01
and the cap are the tutorial's values, the paper gives neither), is drawn with probability
P(i) = p_i^alpha / sum_k p_k^alpha, and its loss is scaled by the importance-sampling weight
w_i = (N * P(i))^-beta / max_j w_j (the paper leaves open whether j runs over the batch or the
memory; here, as in OpenAI Baselines, over every stored transition: the one of smallest priority),
which undoes the bias of drawing it more (or less) often than uniform replay would. The sum tree
holds the numerators p_i^alpha, so drawing by P(i) is one walk down it. Below, as in the
tutorial's code, "priority" names such a leaf value, p_i^alpha:
`SumTree`'s priorities, its `min_priority` and `Memory.max_priority` are p^alpha, and the paper's
p_i appears only in `Memory.leaf_priorities`.

Tutorial -> here: `PER_e`, `PER_a`, `PER_b`, `PER_b_increment_per_sampling` and
`absolute_error_upper` are `Memory`'s arguments `epsilon`, `alpha`, `beta`, `beta_increment`
and `abs_err_upper` (the tutorial's values by default; the agent computes `beta_increment` so
that beta reaches 1 by the end of its run: docs/changes_from_the_tutorial.md, β's growth).
`SumTree.update`, `total_priority` and `Memory.store`, `sample`, `batch_update` keep their
names; `get_leaf` is `get_leaves`, a batch of values at a time. The tutorial's `SumTree.add`
wrote the transition into `tree.data`; here a storage
(d3qn_utils/replay_storage.py) holds the transitions, each image frame once, and `store` gives
the slot's leaf (`leaf_index`) its priority with `update`.

Streams: with N_ENVS environments the storage's slots are split into N streams, one per
environment, each a ring of about capacity / N neighbouring slots (`Segments` in replay_storage.py).
`store(experience, stream=i)` writes environment i's transition into its own ring, so an n-step
return or a frame stack follows one environment's episode; the sum tree spans every slot, so a
draw picks by P(i) over all the streams at once. With one environment there is one stream, the
whole ring.

The walks up and down the tree are the tutorial's loops, fixed and compiled by numba (a
just-in-time compiler of Python loops to machine code: `_update_leaf`, `_get_leaves`): what you
read is what runs, a whole batch per call.
"""

from __future__ import annotations

from typing import ClassVar

import numba
import numpy as np

from d3qn_utils.checks import (
    added_keys,
    check_indices,
    check_integer,
    check_non_negative,
    check_saved_value,
    check_transition,
    is_integer,
    saved_array,
    with_added_keys,
)
from d3qn_utils.replay_memory import NOT_SAVED, ReplayMemory
from d3qn_utils.replay_storage import ReplayStorage, check_priorities_held, saved_storage


class SumTree:
    """Sum tree over `capacity` priorities (p_i^alpha), in a float64 array `tree` of 2*capacity - 1
    nodes.

    Node i has children 2i+1 and 2i+2 and parent (i-1)//2, the leaves are the last `capacity`
    nodes, and each inner node holds the sum of its two children, so the root holds the total::

                  0            <- total_priority
                /   \\
              1       2
             / \\     / \\
            3   4   5   6      <- leaves (capacity = 4): slot = tree index - (capacity - 1)

    After a leaf changes, every node above it is recomputed as the sum of its two children (not
    shifted by the change, as the tutorial did), so rounding errors never accumulate, however
    many updates. `mins`, of the same shape and numbering, holds the minimum of each subtree
    (empty leaves count as +inf), which makes `min_priority`, needed for the importance-sampling
    weights, O(1).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = check_integer("capacity", capacity, 1)
        self.tree = np.zeros(2 * self.capacity - 1)
        self.mins = np.full(2 * self.capacity - 1, np.inf)
        self.leaves = range(self.capacity - 1, 2 * self.capacity - 1)  # their tree indices

    def leaf_index(self, slots: int | np.ndarray) -> int | np.ndarray:
        """The tree index of each slot's leaf: the tutorial's `data_pointer + capacity - 1`."""
        return slots + (self.capacity - 1)

    def slot(self, tree_indices: np.ndarray) -> np.ndarray:
        """The slot of each leaf (tree index): the tutorial's `leaf_index - capacity + 1`."""
        return tree_indices - (self.capacity - 1)

    def update(self, tree_index: int, priority: float) -> None:
        """Set the priority of the leaf at `tree_index` and fix the sums above it. O(log n)."""
        if not is_integer(tree_index) or int(tree_index) not in self.leaves:
            raise ValueError(f"tree index must be an integer in {self.leaves.start}.."
                             f"{self.leaves.stop - 1}, got {tree_index!r}")
        if not 0 <= priority < np.inf:
            raise ValueError(f"priority must be finite and >= 0, got {float(priority)!r}")
        _update_leaf(self.tree, self.mins, int(tree_index), float(priority))

    def update_batch(self, tree_indices: np.ndarray, priorities: np.ndarray | float) -> float:
        """`update` for k leaves, in order: a leaf named twice keeps its last. Returns the
        highest priority written (0 for none), which `Memory` keeps. O(k log n).

        The tree is left unchanged when any index is not a leaf or any priority is NaN, infinite
        or negative. A float for `priorities` goes to every leaf.
        """
        if isinstance(priorities, float):  # `store` passes 0.0 for every slot it freed
            priorities = np.full(np.shape(tree_indices), priorities)
        leaves, priorities = check_indices(tree_indices, priorities, self.leaves, "tree index",
                                           "priority")
        return _update_leaves(self.tree, self.mins, leaves, priorities)

    def get_leaves(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tutorial's `get_leaf` for k values: (tree indices, priorities). O(k log n).

        Value v selects the leaf whose cumulative range [sum of leaves before it, + its priority)
        contains v, searching left to right as the tree is drawn. Values at or beyond the total
        select the last non-empty leaf; empty (zero-priority) leaves are never returned.
        """
        values = np.asarray(values, dtype=np.float64).ravel()
        check_non_negative("value", values)
        if not self.tree[0] > 0:
            raise ValueError(f"cannot search an empty sum tree (total {self.total_priority})")
        leaves = _get_leaves(self.tree, self.capacity, values)
        return leaves, self.tree[leaves]

    @property
    def total_priority(self) -> float:
        """Sum of all priorities (the root node). O(1)."""
        return float(self.tree[0])

    @property
    def min_priority(self) -> float:
        """Smallest non-zero leaf priority (p^alpha), +inf while every leaf is zero. O(1)."""
        return float(self.mins[0])


@numba.njit(cache=True)
def _update_leaf(tree, mins, node, priority):  # pragma: no cover (compiled)
    """The tutorial's `update` walk to the root, as fixed: each node recomputed from its two
    children (the tutorial adds the change to each parent, which lets rounding drift) and its
    minimum kept beside it."""
    tree[node] = priority
    mins[node] = priority if priority > 0 else np.inf
    while node > 0:
        node = (node - 1) // 2
        tree[node] = tree[2 * node + 1] + tree[2 * node + 2]
        mins[node] = min(mins[2 * node + 1], mins[2 * node + 2])


@numba.njit(cache=True)
def _update_leaves(tree, mins, leaves, priorities):  # pragma: no cover (compiled)
    """`_update_leaf` for each leaf in turn; returns the highest priority written (0 for none)."""
    highest = 0.0
    for k in range(leaves.size):
        _update_leaf(tree, mins, leaves[k], priorities[k])
        highest = max(highest, priorities[k])
    return highest


@numba.njit(cache=True)
def _get_leaves(tree, capacity, values):  # pragma: no cover (compiled)
    """The tutorial's `get_leaf` walk down from the root, for each value in turn, as fixed: left
    while v falls in the left subtree, else right with the left subtree's sum taken off v, but
    never into an empty right subtree (the tutorial's walk sent a v that rounding put past the
    total into the empty leaves of a memory not yet full); a v on a border goes right."""
    leaves = np.empty(values.size, dtype=np.int64)
    for k in range(values.size):
        v = values[k]
        node = 0
        while node < capacity - 1:  # inner nodes are 0 .. capacity - 2
            left = 2 * node + 1
            # Go right when v is past the left subtree, unless the right one is empty: then v
            # overshot the total (a value at the end, or rounding), and the last leaf is left.
            # Every node visited so has a positive sum, so the leaf found is never empty.
            if v >= tree[left] and tree[left + 1] > 0:
                v -= tree[left]
                node = left + 1
            else:
                node = left
        leaves[k] = node
    return leaves


class Memory(ReplayMemory):
    """Prioritized replay memory (proportional variant), with the tutorial's names.

    A new transition gets the highest priority ever given (OpenAI Baselines' reading of
    Algorithm 1's p_t = max_{i<t} p_i; the tutorial's is the largest priority held when it
    arrives), so it is likely drawn soon after.
    Sampling is stratified: [0, total) is cut into n equal segments and one value drawn in each,
    so a batch spreads over the whole distribution P(i) (rounding can give the total itself,
    which `get_leaves` sends to the last non-empty leaf). beta grows by `beta_increment` per
    `sample`, up to 1. rank_based.py has the paper's other variant, p_i = 1 / rank(i).
    """

    kind = "proportional"
    RUN_SUFFIX, PRIORITIZED = "_PER", True
    BYTES_PER_SLOT = 2 * 2 * 8  # sum and min trees: two float64 nodes a slot each
    ADDED_KEYS: ClassVar[dict[str, np.ndarray]] = {"beta_increment": NOT_SAVED}

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_increment: float = 0.001,
        epsilon: float = 0.01,
        abs_err_upper: float = 1.0,
        storage: ReplayStorage | None = None,
        rng: np.random.Generator | int | None = None,
        n_step: int = 1,
        gamma: float = 0.99,
    ) -> None:
        """An empty memory of `capacity` slots; ValueError naming an argument out of range.

        Args:
            capacity: transitions held; once a stream's ring is full, each new transition
                overwrites that stream's oldest (with one stream, the memory's oldest).
            alpha: the tutorial's PER_a: how much the priorities shape sampling, 0 being uniform.
            beta: the tutorial's PER_b: the importance-sampling exponent at the start.
            beta_increment: the tutorial's PER_b_increment_per_sampling.
            epsilon: the tutorial's PER_e: added to every |delta|, so no priority is 0.
            abs_err_upper: the tutorial's absolute_error_upper: |delta| + epsilon is clipped to it.
            storage: where the transitions live (d3qn_utils/replay_storage.py), with this capacity;
                default a new `TransitionStorage`.
            rng: the random generator of the strata, or its seed.
            n_step, gamma: the sampled batch holds n-step returns (`n_step_batch`).
        """
        super().__init__(capacity, storage, rng, n_step, gamma)
        self.set_exponents(alpha, beta, beta_increment)
        if not epsilon > 0 or not np.isfinite(epsilon):
            raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
        if not abs_err_upper > 0:
            raise ValueError(f"abs_err_upper must be > 0, got {abs_err_upper!r}")
        self.epsilon = float(epsilon)
        self.abs_err_upper = float(abs_err_upper)
        self.tree = SumTree(self.capacity)
        # The highest p^alpha ever given, O(1); it never falls: OpenAI Baselines' reading of
        # Algorithm 1's p_t = max_{i<t} p_i for new transitions. The tutorial took the max over
        # the current leaves, which falls when the largest is lowered. Before any error:
        # min(1, clip)^alpha.
        self.max_priority = min(1.0, self.abs_err_upper) ** self.alpha

    def store(self, experience: tuple, stream: int = 0) -> int:
        """Add one (state, action, reward, next_state, done) with the maximum priority, in the
        stream (its own ring of slots) of environment `stream` (0 with one environment); return
        its slot. O(log N).

        A transition `check_transition` refuses (NaN or inf in a state or the reward, an action
        that is not an integer >= 0, ...) raises ValueError naming the field and its value,
        before anything is written: a full memory keeps its oldest transition.
        """
        slot, freed = self.storage.add(check_transition(experience), stream)
        # Atari's and MinAtar's frames are kept once each (FrameStackStorage): a new frame can
        # overwrite a frame of a stored transition, which then cannot be drawn, so its leaf goes
        # to 0. Vector states (CartPole) are stored whole, one row each: `freed` is always empty.
        if freed.size:
            self.tree.update_batch(self.tree.leaf_index(freed), 0.0)
        self.tree.update(self.tree.leaf_index(slot), self.max_priority)
        return slot

    def sample(self, n: int) -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray]:
        """Draw n transitions by priority: (tree_idx, batch, is_weights). O(n log N).

        tree_idx are the leaves to pass back to `batch_update`; batch is (states, actions,
        rewards, next_states, dones, discounts), each of leading dimension n (`n_step_batch`);
        is_weights are float32 (n,). Slots not filled yet have priority 0: never drawn.
        """
        self.check_sample_size(n)
        self.beta = min(1.0, self.beta + self.beta_increment)
        strata = (np.arange(n) + self.rng.random(n)) / n  # one value in each of n segments
        tree_idx, priorities = self.tree.get_leaves(strata * self.tree.total_priority)
        # w_i / max_j w_j = (N P(i))^-beta / (N P_min)^-beta = (p_i^alpha / p_min^alpha)^-beta.
        is_weights = (priorities / self.tree.min_priority) ** -self.beta
        return tree_idx, self.n_step_batch(self.tree.slot(tree_idx)), is_weights.astype(np.float32)

    def batch_update(self, tree_idx: np.ndarray, abs_errors: np.ndarray) -> None:
        """Give the sampled transitions new priorities from their |TD errors|. O(k log N).

        NaN, infinite or negative errors raise ValueError and change nothing. Slots that no
        longer hold a transition (overwritten frames) get priority 0, so they are never drawn; a
        slot named twice takes its last error.
        """
        tree_idx, abs_errors = check_indices(tree_idx, abs_errors, self.tree.leaves)
        priorities = self.leaf_priorities(abs_errors)
        # A frame memory (Atari, MinAtar, Ape-X) can free a drawn slot before its update: its
        # leaf stays 0 (`storage.holds`; a full vector memory skips this)
        if len(self.storage) < self.capacity:
            priorities *= self.storage.holds(self.tree.slot(tree_idx))
        self.write_priorities(tree_idx, priorities)

    def write_priorities(self, tree_idx: np.ndarray, priorities: np.ndarray) -> None:
        """Give the leaves `tree_idx` the priorities (p^alpha) `priorities`, in order, and keep
        the highest ever given. O(k log N)."""
        self.max_priority = max(self.max_priority, self.tree.update_batch(tree_idx, priorities))

    def leaf_priorities(self, abs_errors: np.ndarray) -> np.ndarray:
        """The leaves' priorities p^alpha, p = min(|delta| + epsilon, abs_err_upper): the
        tutorial's PER_e, absolute_error_upper and PER_a, for a batch."""
        return np.minimum(abs_errors + self.epsilon, self.abs_err_upper) ** self.alpha

    # ---- Beyond the tutorial: what the priority figure shows, what a checkpoint holds ----
    def sampling_probabilities(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots holding a transition, their P(i) = p_i^alpha / sum_k p_k^alpha). O(N)."""
        slots = self.storage.held_slots()
        return slots, self.tree.tree[self.tree.leaf_index(slots)] / self.tree.total_priority

    def slots_of(self, tree_idx: np.ndarray) -> np.ndarray:
        """The storage slots of the leaves `sample` returned."""
        return self.tree.slot(np.asarray(tree_idx))

    def zero_error_floor(self) -> tuple[float, float] | None:
        """(P(i) of a transition whose |delta| is 0, epsilon): epsilon^alpha / total."""
        total = self.tree.total_priority
        return (self.epsilon**self.alpha / total, self.epsilon) if total > 0 else None

    def state_dict(self) -> dict[str, np.ndarray]:
        """`ReplayMemory.state_dict` with alpha, beta and its growth, the trees and the highest
        priority."""
        return {**super().state_dict(), "alpha": np.array(self.alpha),
                "beta": np.array(self.beta), "beta_increment": np.array(self.beta_increment),
                "tree.sums": self.tree.tree, "tree.mins": self.tree.mins,
                "max_priority": np.array(self.max_priority)}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Take back what `state_dict` gave; ValueError naming what does not fit (kind, capacity,
        alpha, a priority over a slot that holds no transition), before anything changes."""
        arrays = with_added_keys(arrays, added_keys(type(self)))
        self.check_state(arrays, ("alpha", "beta", "tree.sums", "tree.mins", "max_priority"))
        check_saved_value(arrays, "alpha", self.alpha)
        sums = saved_array(arrays, "tree.sums", self.tree.tree.shape)
        mins = saved_array(arrays, "tree.mins", self.tree.mins.shape)
        check_priorities_held("tree.sums", sums[self.tree.leaves],
                              self.storage.saved_holds(saved_storage(arrays)))
        super().load_state_dict(arrays)
        self.beta = float(arrays["beta"])
        self.load_beta_increment(arrays["beta_increment"])
        self.tree.tree[:], self.tree.mins[:] = sums, mins
        self.max_priority = float(arrays["max_priority"])


class UniformMemory(ReplayMemory):
    """Replay memory with uniform sampling and `Memory`'s interface (the agent's USE_PER=False,
    where the tutorial used a deque): `sample` returns importance-sampling weights of one and
    `batch_update` only checks its input, so the agent runs one code path for both memories.
    """

    kind = "uniform"  # and no RUN_SUFFIX: the tutorial's run names say PER only when it is on
    alpha = 0.0  # P(i) = p_i^0 / sum_k p_k^0 = 1 / N: uniform, as with alpha = 0
    beta = 0.0  # every importance-sampling weight is 1, as with beta = 0

    def store(self, experience: tuple, stream: int = 0) -> int:
        """Add one (state, action, reward, next_state, done) to the stream of environment
        `stream`; return its slot. O(1).
        ValueError naming the field, and nothing written, for a transition `check_transition`
        refuses."""
        slot, _ = self.storage.add(check_transition(experience), stream)
        return slot

    def sample(self, n: int) -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray]:
        """n transitions drawn uniformly with replacement: (slots, batch, ones), the slots where
        `Memory` returns tree indices (there is no tree here). O(n)."""
        self.check_sample_size(n)
        # The written slots, numbered 0 .. written - 1 (stream after stream: `written_slots`).
        slots = self.storage.written_slots(self.rng.integers(0, self.storage.written, size=n))
        # A storage may have written slots without a transition (frame stacks): draw those again.
        empty = ~self.storage.holds(slots)
        while empty.any():
            slots[empty] = self.storage.written_slots(
                self.rng.integers(0, self.storage.written, size=int(empty.sum())))
            empty = ~self.storage.holds(slots)
        return slots, self.n_step_batch(slots), np.ones(n, dtype=np.float32)

    def batch_update(self, slots: np.ndarray, abs_errors: np.ndarray) -> None:
        """Check the arguments like `Memory.batch_update`; uniform sampling ignores priorities."""
        self.check_slots(slots, abs_errors)

    def sampling_probabilities(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots holding a transition, their P(i) = 1 / N). O(N)."""
        slots = self.storage.held_slots()
        return slots, np.full(len(slots), 1.0 / max(len(slots), 1))

