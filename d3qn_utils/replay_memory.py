"""`ReplayMemory`: what PER.py's `Memory` and `UniformMemory` and rank_based.py's
`RankBasedMemory` share, and the interface the agent and the priority figure use. A replay
variant is a subclass: its name, the name's part in a run's files, then `store`, `sample` and
`batch_update` (the tutorial's interface), `sampling_probabilities` (the priority figure) and
`alpha` and `beta`; one lacking any of them fails when it is made. d3qn_agent.py's
REPLAY_MEMORIES lists the variants, and `replay_variant` says which one the flags pick."""

from __future__ import annotations

import abc
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from d3qn_utils.checks import (
    added_keys,
    check_indices,
    check_integer,
    check_range,
    check_saved_value,
    require,
    with_added_keys,
)
from d3qn_utils.replay_storage import (
    ReplayStorage,
    StorageSpec,
    TransitionStorage,
    check_saved_streams,
)

# The replay variant (a memory's `kind`, its key in d3qn_agent.REPLAY_MEMORIES) that each pair of
# flags (USE_PER, PER_RANK_BASED) picks: the agent's memory, the rank-based preset (settings.py)
# and a study's variants (benchmarks/study.py) all ask `replay_variant`. A registered variant
# takes over a pair with one entry here.
VARIANT_PICKS: dict[tuple[bool, bool], str] = {
    (True, False): "proportional", (True, True): "rank-based",
    (False, False): "uniform", (False, True): "uniform"}  # --no-per --rank-based: uniform


def replay_variant(use_per: bool, rank_based: bool) -> str:
    """The name of the replay memory the flags pick: PER's `Memory` unless they say otherwise."""
    return VARIANT_PICKS[bool(use_per), bool(rank_based)]


def variant_flags(kind: str) -> tuple[bool, bool]:
    """The first (USE_PER, PER_RANK_BASED) that picks the variant `kind`; ValueError if none."""
    for flags, picked in VARIANT_PICKS.items():
        if picked == kind:
            return flags
    raise ValueError(f"no flags pick replay variant {kind!r}; picked: "
                     f"{sorted(set(VARIANT_PICKS.values()))}")


# What a checkpoint of format 4 or older means by the prioritized memories' "beta_increment", a
# key it lacks (their ADDED_KEYS): not saved, so the memory keeps its own (`load_beta_increment`).
NOT_SAVED = np.array(np.nan)


class ReplayMemoryType(abc.ABCMeta):
    """The class of the replay memories: an abstract method left out fails when a memory is made
    (`abc`), and so does an attribute of `ReplayMemory.ATTRIBUTES` that its `__init__` (or its
    class) did not set, or an empty `kind`."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        memory = super().__call__(*args, **kwargs)
        missing = [name for name in cls.ATTRIBUTES if not hasattr(memory, name)]
        if missing or not cls.kind:
            raise TypeError(f"replay memory {cls.__name__} lacks "
                            f"{', '.join(missing) or 'a kind (its name)'}: every variant has "
                            f"{', '.join(cls.ATTRIBUTES)} and a kind (ReplayMemory)")
        return memory


class ReplayMemory(metaclass=ReplayMemoryType):
    """A replay memory's storage, rng, n-step batches, blocks, saved state and size, and what
    each variant must add: `store`, `sample`, `batch_update`, `sampling_probabilities`, `alpha`
    and `beta`."""

    kind = ""  # the variant's name, said once: its REPLAY_MEMORIES key, a checkpoint's "kind"
    RUN_SUFFIX = ""  # what it adds to a run's file names (DDQN_CartPole-v1_Dueling_PER): unique
    PRIORITIZED = False  # it draws by priority: takes PER_ALPHA and PER_BETA, "<kind> PER" in logs
    BYTES_PER_SLOT = 0  # the memory's own arrays per slot, beside its storage's
    # Each transition goes to its storage's next slot, so the memory holds the newest ones: the
    # priority figure counts their ages as a ring's. False for a memory that writes its slots in
    # another order (a reservoir): the figure then reads the ages slot by slot.
    WRITES_RING = True
    # Keys added to `state_dict` since checkpoint format 2, with the value that means what a
    # checkpoint written before each did (d3qn_utils/agent_checkpoint.py); a subclass's own
    # ADDED_KEYS add to these (checks.added_keys).
    ADDED_KEYS: ClassVar[dict[str, np.ndarray]] = {
        "storage.streams": np.array(1)}  # one stream: a memory saved before streams
    # What the agent and the priority figure read of every memory, set by its `__init__` or its
    # class: the exponents of P(i) = p_i^alpha / sum_k p_k^alpha and of the IS weights.
    ATTRIBUTES: ClassVar[tuple[str, ...]] = ("alpha", "beta")
    alpha: float
    beta: float

    def __init__(self, capacity: int, storage: ReplayStorage | None = None,
                 rng: np.random.Generator | int | None = None, n_step: int = 1,
                 gamma: float = 0.99) -> None:
        """An empty memory of `capacity` slots in `storage` (default a new `TransitionStorage`),
        drawing with `rng` (or its seed); its batches hold `n_step` returns discounted by
        `gamma` (`n_step_batch`). It keeps the storage's `streams`: one per environment, each
        transition stored in its own (`store`'s `stream`). ValueError naming an argument out of
        range."""
        self.capacity = check_integer("capacity", capacity, 1)
        self.n_step = check_integer("n_step", n_step, 1)
        self.gamma = check_range("gamma", gamma, 0.0, 1.0)
        self.storage = storage if storage is not None else TransitionStorage(self.capacity)
        if self.storage.capacity != self.capacity:
            raise ValueError(f"storage capacity {self.storage.capacity} differs from memory "
                             f"capacity {self.capacity}")
        self.streams = self.storage.streams
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)

    def __len__(self) -> int:
        return len(self.storage)

    def held_per_stream(self) -> np.ndarray:
        """The transitions each stream holds, in stream order (`len` for one stream): what the
        priority figure's ages need. O(streams): each storage keeps the counts."""
        return self.storage.held_per_stream()

    @classmethod
    def bytes_per_slot(cls, storage: StorageSpec, state_shape: tuple[int, ...],
                       state_dtype: Any) -> int:
        """Bytes per slot of a full memory of this class in `storage`, the storage's included."""
        return storage.bytes_per_slot(state_shape, state_dtype) + cls.BYTES_PER_SLOT

    @classmethod
    def check_fits(cls, size: int, storage: StorageSpec, state_shape: tuple[int, ...],
                   state_dtype: Any, other_bytes_per_slot: int = 0, streams: int = 1) -> None:
        """ValueError, before allocating, if `size` slots of this class in `storage` cannot hold
        a transition of these states in each of `streams` streams (N_ENVS) or, with the caller's
        `other_bytes_per_slot`, would not fit in this machine's memory (numpy's zeroed arrays
        take memory only as they fill: a run would fail late)."""
        minimum = storage.min_capacity(state_shape, streams)
        if size < minimum:
            per_stream = (f" with N_ENVS (--n-envs) {streams} (each environment's stream needs "
                          f"{minimum // streams} of them)" if streams > 1 else "")
            raise ValueError(f"MEMORY_SIZE (--memory-size) must be at least {minimum} for "
                             f"{tuple(state_shape)} states in a "
                             f"{storage.storage_class.__name__}{per_stream}, got {size}")
        per_slot = cls.bytes_per_slot(storage, state_shape, state_dtype) + other_bytes_per_slot
        machine = machine_memory_bytes()
        if machine and size * per_slot > machine:
            raise ValueError(f"MEMORY_SIZE (--memory-size) {size:,} needs a replay memory of "
                             f"{size * per_slot / 2**30:,.1f} GiB ({per_slot} bytes per "
                             f"transition of {tuple(state_shape)} {np.dtype(state_dtype)} "
                             f"states, {cls.kind} replay), more than this machine's "
                             f"{machine / 2**30:,.1f} GiB")

    @abc.abstractmethod
    def store(self, experience: tuple, stream: int = 0) -> int | None:
        """Keep one (state, action, reward, next_state, done) of environment `stream`'s stream:
        the slot written, or None when the memory drops the transition (a reservoir may); the
        agent's report ignores None. ValueError naming the field, and nothing written, for a
        transition `check_transition` refuses, or naming a stream the memory lacks."""

    def end_episode(self, stream: int = 0) -> None:
        """The transition last stored in `stream` ended its episode (terminated or truncated):
        no n-step return runs past it, whatever the state the stream's next transition starts
        from (a reset may give the state a truncated episode ended in). ValueError naming a
        stream the memory lacks."""
        self.storage.end_episode(stream)

    @abc.abstractmethod
    def sample(self, n: int) -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray]:
        """Draw n transitions: (indices for `batch_update` and `slots_of`, the `n_step_batch` of
        their slots, float32 importance-sampling weights (n,)); ValueError for a bad n or an
        empty memory (`check_sample_size`)."""

    @abc.abstractmethod
    def batch_update(self, indices: np.ndarray, abs_errors: np.ndarray) -> None:
        """Take the |TD errors| of the transitions `sample` returned as `indices`, in order (a
        transition named twice keeps its last); ValueError, nothing changed, for an index
        outside the memory or an error that is NaN, infinite or negative."""

    @abc.abstractmethod
    def sampling_probabilities(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots holding a transition, the probability P(i) that a draw picks each): the
        priority figure's."""

    def set_exponents(self, alpha: float, beta: float, beta_increment: float) -> None:
        """Set alpha, beta and beta's growth per `sample`; ValueError naming one out of range."""
        self.alpha = check_range("alpha", alpha, 0.0, np.inf)
        self.beta = check_range("beta", beta, 0.0, 1.0)
        self.set_beta_increment(beta_increment)

    def set_beta_increment(self, beta_increment: float) -> None:
        """Set beta's growth per `sample` (none for uniform replay); ValueError unless in [0, 1]."""
        self.beta_increment = check_range("beta_increment", beta_increment, 0.0, 1.0)

    def load_beta_increment(self, saved: np.ndarray) -> None:
        """Take back beta's growth from a `state_dict`: NOT_SAVED (a checkpoint of format 4 or
        older) keeps this memory's own, which the agent sets for the run's budget."""
        if not np.isnan(saved):
            self.set_beta_increment(float(saved))

    def check_sample_size(self, n: Any) -> None:
        """ValueError unless n is a positive integer and the memory holds a transition."""
        check_integer("batch size", n, 1)
        if len(self) == 0:
            raise ValueError("cannot sample from an empty memory: store transitions first")

    def check_slots(self, slots: np.ndarray, abs_errors: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
        """`batch_update`'s arguments as flat int64 slots and float64 errors; ValueError naming
        the first slot outside the memory or the first NaN, infinite or negative error. O(k)."""
        return check_indices(slots, abs_errors, range(self.capacity), "slot")

    def slots_of(self, indices: np.ndarray) -> np.ndarray:
        """The storage slots of the indices `sample` returned: here they are the slots
        (`PER.Memory`'s are its sum tree's leaves)."""
        return np.asarray(indices)

    @classmethod
    def title(cls) -> str:
        """The variant in a run's first line: "proportional PER", "uniform replay"."""
        return f"{cls.kind} {'PER' if cls.PRIORITIZED else 'replay'}"

    def describe(self) -> str:
        """The memory in a figure's title: "proportional replay (alpha 0.6)"."""
        return f"{self.kind} replay (alpha {self.alpha:g})"

    def zero_error_floor(self) -> tuple[float, float] | None:
        """(P(i) of a transition with |delta| = 0, epsilon) for `PER.Memory`; None here."""
        return None

    def state_dict(self) -> dict[str, np.ndarray]:
        """The memory as plain arrays (no pickle): kind, "storage.*" and the rng as JSON."""
        return {**{f"storage.{key}": value for key, value in self.storage.state_dict().items()},
                "kind": np.array(self.kind),
                "rng": np.array(json.dumps(self.rng.bit_generator.state))}

    def check_state(self, arrays: dict[str, np.ndarray], keys: Sequence[str] = ()) -> None:
        """ValueError unless `arrays` is a `state_dict` of this kind, capacity and number of
        streams, with `keys`."""
        arrays = with_added_keys(arrays, added_keys(type(self)))
        require(arrays, ("kind",), "replay memory")
        check_saved_value(arrays, "kind", self.kind)
        require(arrays, ("rng", "storage.capacity", *keys), f"{self.kind} memory")
        check_saved_value({"capacity": arrays["storage.capacity"]}, "capacity", self.capacity)
        check_saved_streams({"streams": arrays["storage.streams"]}, self.streams)

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Take back what `state_dict` gave; ValueError naming what does not fit."""
        arrays = with_added_keys(arrays, added_keys(type(self)))
        self.check_state(arrays)
        self.storage.load_state_dict({key.removeprefix("storage."): value for key, value in
                                      arrays.items() if key.startswith("storage.")})
        try:
            self.rng.bit_generator.state = json.loads(arrays["rng"].item())
        except (TypeError, ValueError, KeyError) as error:
            raise ValueError(f"saved random generator state is unusable: {error}") from error

    def block(self) -> tuple[np.ndarray, ...]:
        """The stored transitions as the five columns `BlockMemory.store_block` (Ape-X) takes, in
        slot order: the order they came in until the ring wraps (slot i holds the i-th), stream
        after stream."""
        return self.storage.get(self.storage.held_slots())

    def n_step_batch(self, slots: np.ndarray) -> tuple[np.ndarray, ...]:
        """The n-step transitions from `slots`, `sample`'s batch: (states, actions, rewards,
        next_states, dones, discounts) with rewards the discounted sum over the k <= n_step
        transitions of the episode, the state after the k-th, whether it terminated, gamma^k. A
        chain follows its stream's ring and stops at a termination, an episode's end
        (`end_episode`), the stream's newest transition. O(n_step * n)."""
        if self.n_step == 1:  # the stored transitions as they are: no chain to follow
            states, actions, rewards, next_states, dones = self.storage.get(slots)
            return (states, actions, rewards.astype(np.float64), next_states, dones.astype(bool),
                    np.full(len(slots), self.gamma, dtype=np.float32))
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
            last[ongoing] = self.storage.successor(last[ongoing])
            step_rewards, step_dones = self.storage.rewards_and_dones(last[ongoing])
            returns[ongoing] += self.gamma**k * step_rewards
            dones[ongoing] = step_dones
            steps[ongoing] += 1
            ongoing[ongoing] = ~step_dones
        states, actions, _, next_states, _ = self.storage.get(slots, last)
        discounts = (self.gamma**steps).astype(np.float32)
        return states, actions, returns, next_states, dones, discounts


def machine_memory_bytes() -> int | None:
    """The memory this process may use: physical memory or a smaller cgroup v2 limit, or None."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        physical = None
    try:
        limit = int(Path("/sys/fs/cgroup/memory.max").read_text())
    except (OSError, ValueError):  # no cgroup v2 here, or "max": no limit
        return physical
    return limit if physical is None else min(limit, physical)
