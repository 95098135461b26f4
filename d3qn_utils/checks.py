"""The checks on what enters a replay memory, on the sizes of a run (its memory, batch and
networks, before any is allocated), on a batch larger than a memory can hold, on saved state and
on a game's actions and observations: each returns the value or raises ValueError naming the bad
value (a field of a transition, an index, a saved array, an action or observation space)."""

from __future__ import annotations

import math
import numbers
import sys
from argparse import Namespace
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numba
import numpy as np

FIELDS = ("state", "action", "reward", "next_state", "done")
FLOAT_MAX = sys.float_info.max  # the largest finite float: "finite and >= 0" is [0, FLOAT_MAX]


def is_integer(value: Any) -> bool:
    """An integer (numpy's too) that is not a bool: True is an int to Python, not to a user."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_integer(name: str, value: Any, minimum: int) -> int:
    """`value` as an int, or ValueError naming `name` unless it is an integer >= `minimum`."""
    if not is_integer(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def discrete_actions(env_name: str, action_space: Any) -> int:
    """The number of actions of `env_name`'s `action_space`; ValueError unless it is discrete (a
    Q-network has one output per action)."""
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"{env_name} has action space {action_space}; DQN needs a discrete one")
    return int(action_space.n)


def box_observations(env_name: str, observation_space: Any) -> tuple[int, ...]:
    """The shape of `env_name`'s observations; ValueError unless they are a `Box` of numbers (a
    Q-network reads an array: not a tuple of values, Blackjack's, nor one index, Taxi's)."""
    if not isinstance(observation_space, gym.spaces.Box):
        raise ValueError(f"{env_name} has observation space {observation_space}; this agent "
                         "needs Box observations (an array of numbers)")
    return tuple(observation_space.shape)


def check_batch_fits(batch_size: int, memory_size: int, storage: Any,
                     state_shape: tuple[int, ...], streams: int) -> None:
    """ValueError unless `memory_size` slots of `storage` (a `StorageSpec`), in one stream per
    environment, hold at least `batch_size` transitions: a run would never train. A stream of s
    slots holds at most s - (m - 1), m the fewest slots one stream needs (a frame stack's older
    frames and an episode's last next state take slots of their own)."""
    held = memory_size - streams * (storage.min_capacity(state_shape) - 1)
    if batch_size > held:
        raise ValueError(f"BATCH_SIZE ({batch_size}) must not exceed the {held:,} transitions "
                         f"that MEMORY_SIZE ({memory_size:,}) slots of a "
                         f"{storage.storage_class.__name__} hold in N_ENVS ({streams}) streams")


def check_run_fits(config: Namespace, memory_class: Any, storage: Any,
                   state_shape: tuple[int, ...], state_dtype: Any, actions: int,
                   other_bytes_per_slot: int) -> None:
    """ValueError, before a run of `config` allocates its replay memory or builds its networks,
    for the first size that cannot work, in this order: MEMORY_SIZE slots of `memory_class` in
    `storage` (a `StorageSpec`) too few for N_ENVS streams or too many for this machine, with the
    caller's `other_bytes_per_slot` (`ReplayMemory.check_fits`); a BATCH_SIZE larger than they
    hold (`check_batch_fits`); a HIDDEN_UNITS whose networks for states of `state_shape` and
    `actions` Q-values would not fit (`network_size.check_mlp_fits`)."""
    # Imported here: network_size imports replay_memory, which imports this module.
    from d3qn_utils.network_size import check_mlp_fits

    memory_class.check_fits(config.memory_size, storage, state_shape, state_dtype,
                            other_bytes_per_slot, streams=config.n_envs)
    check_batch_fits(config.batch_size, config.memory_size, storage, state_shape, config.n_envs)
    check_mlp_fits(state_shape, config.hidden_units, actions, config.dueling, config.batch_size)


def require(arrays: dict[str, np.ndarray], keys: Sequence[str], what: str) -> None:
    """ValueError naming the keys of a saved `what` that `arrays` lacks."""
    missing = [key for key in keys if key not in arrays]
    if missing:
        raise ValueError(f"saved {what} lacks {missing}")


def added_keys(part: type) -> dict[str, Any]:
    """The `ADDED_KEYS` of class `part` and of its bases, a class's own over its bases': a subclass
    that adds keys keeps those its bases added."""
    return {key: value for cls in reversed(part.__mro__)
            for key, value in vars(cls).get("ADDED_KEYS", {}).items()}


def with_added_keys(saved: dict[str, Any], added: dict[str, Any]) -> dict[str, Any]:
    """`saved`, a part's state from a checkpoint, with the keys `added` to the part after the
    checkpoint's format (its `added_keys`) that it lacks, at their values for such a checkpoint."""
    return {**added, **saved}


def saved_array(arrays: dict[str, np.ndarray], key: str, shape: tuple[int, ...],
                dtype: Any = np.float64) -> np.ndarray:
    """The saved `key` as an array of `dtype`; ValueError unless it has `shape`."""
    array = np.array(arrays[key], dtype=dtype)
    if array.shape != shape:
        raise ValueError(f"saved {key} has shape {array.shape}, expected {shape}")
    return array


def check_saved_value(arrays: dict[str, np.ndarray], key: str, expected: Any) -> None:
    """ValueError unless the saved `key` equals `expected` (e.g. the capacity)."""
    saved = arrays[key].item()
    if saved != expected:
        raise ValueError(f"saved {key} is {saved!r}, but this memory has {expected!r}")


def check_experience(experience: Any) -> Sequence:
    """`experience` itself, or ValueError unless it is a sequence of the five `FIELDS`."""
    if not isinstance(experience, Sequence) or len(experience) != len(FIELDS):
        raise ValueError(f"experience must be a tuple {FIELDS}, got {experience!r:.200}")
    return experience


def check_transition(experience: Any) -> Sequence:
    """`experience` itself if it may enter a replay memory, else ValueError naming the first bad
    field and its value (finite states and reward, an integer action >= 0, a bool done): a NaN would
    poison every TD target it is drawn into, and through the priorities the sum tree."""
    state, action, reward, next_state, done = check_experience(experience)
    if type(action) is not int and not is_integer(action):  # an int first: the cheap test
        value = np.asarray(action)  # a 0-d integer array is an action too
        if value.ndim or value.dtype.kind not in "iu":
            raise ValueError(f"action must be an integer, got {action!r:.100}")
        action = value.item()
    if action < 0:
        raise ValueError(f"action must be an integer >= 0, got {action!r}")
    if type(reward) is not float:
        value = np.asarray(reward)
        if value.ndim or value.dtype.kind not in "biuf":
            raise ValueError(f"reward must be a finite number, got {reward!r:.100}")
        reward = float(value)
    if not math.isfinite(reward):
        raise ValueError(f"reward must be a finite number, got {reward!r}")
    for name, value in (("state", state), ("next_state", next_state)):
        array = value if type(value) is np.ndarray else np.asarray(value)
        if not finite_numbers(array):
            if array.dtype.kind != "f":
                raise ValueError(f"{name} must hold numbers, got dtype {array.dtype}")
            bad = array[~np.isfinite(array)][0]
            raise ValueError(f"{name} must be finite, got {bad.item()!r}")
    if type(done) is not bool and not isinstance(done, np.bool_):
        value = np.asarray(done)
        if value.ndim or value.dtype.kind not in "biuf" or value.item() not in (0, 1):
            raise ValueError(f"done must be True or False, got {done!r:.100}")
    return experience


def check_block(transitions: Any, capacity: int) -> list[np.ndarray]:
    """The five columns of a block as arrays of one length k in 1..capacity, each row one that
    `check_transition` accepts: tested at once, row by row only to name the first bad one."""
    columns = [np.asarray(column) for column in check_experience(transitions)]
    lengths = [len(column) if column.ndim else 0 for column in columns]
    if len(set(lengths)) != 1:
        raise ValueError(f"the block's {FIELDS} have different lengths {lengths}")
    if not 1 <= lengths[0] <= capacity:
        raise ValueError(f"a block must hold 1..{capacity} transitions (the capacity), "
                         f"got {lengths[0]}")
    states, actions, rewards, next_states, dones = columns
    if actions.dtype.kind not in "iu":
        raise ValueError(f"actions must be integers, got dtype {actions.dtype}")
    if ((actions < 0).any() or not all(map(finite_numbers, (rewards, states, next_states)))
            or (dones.dtype.kind != "b" and ((dones != 0) & (dones != 1)).any())):
        # Python scalars where numpy's would be: a message shows 3, not np.int64(3).
        scalars = (column.tolist() if column.ndim == 1 else column for column in columns)
        for index, row in enumerate(zip(*scalars, strict=True)):
            try:
                check_transition(row)
            except ValueError as error:
                raise ValueError(f"{error} (transition {index} of the block)") from None
    return columns


def finite_numbers(values: np.ndarray) -> bool:
    """Whether the array `values` holds numbers, all finite (compiled test of a float array)."""
    kind = values.dtype.kind
    return kind in "biu" or (kind == "f" and all_finite(values))


@numba.njit(cache=True)
def all_finite(values: np.ndarray) -> bool:  # pragma: no cover (compiled)
    """Whether every element of the float array `values` is finite (compiled: cheap for a few)."""
    for value in values.flat:  # noqa: SIM110 (numba compiles a loop, not all() of a generator)
        if not math.isfinite(value):
            return False
    return True


def check_range(name: str, value: float, low: float, high: float) -> float:
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")
    return float(value)


@numba.njit(cache=True)
def first_outside(values: np.ndarray, low: float, high: float) -> int:  # pragma: no cover
    """Index of the first element of 1-D `values` outside [low, high] (NaN always is), or -1."""
    for i in range(values.size):
        if not low <= values[i] <= high:
            return i
    return -1


def check_non_negative(name: str, values: np.ndarray) -> None:
    """ValueError naming the first NaN, infinite or negative entry of the 1-D float `values`."""
    bad = first_outside(values, 0.0, FLOAT_MAX)
    if bad >= 0:
        raise ValueError(f"{name} must be finite and >= 0, got {float(values[bad])!r}")


@numba.njit(cache=True)
def first_bad_pair(indices: np.ndarray, low: int, high: int, values: np.ndarray
                   ) -> int:  # pragma: no cover (compiled)
    """Position of the first pair whose index is outside [low, high] or whose value is NaN,
    infinite or negative, or -1: one pass over both 1-D arrays."""
    for i in range(indices.size):
        if not (low <= indices[i] <= high and 0.0 <= values[i] <= FLOAT_MAX):
            return i
    return -1


def check_indices(indices: Any, values: Any, valid: range, index_name: str = "tree index",
                  value_name: str = "absolute TD error") -> tuple[np.ndarray, np.ndarray]:
    """(indices, values) as flat int64 / float64 arrays; ValueError naming the first index
    outside `valid` or the first NaN, infinite or negative value (the first bad pair's index
    before its value). O(k), one compiled pass."""
    array = np.asarray(indices)
    if array.dtype.kind not in "iu":
        raise ValueError(f"each {index_name} must be an integer, got dtype {array.dtype}")
    indices = array.astype(np.int64, copy=False).ravel()
    values = np.asarray(values, dtype=np.float64).ravel()
    if values.shape != indices.shape:
        raise ValueError(f"got {len(indices)} indices ({index_name}) but {len(values)} values "
                         f"({value_name})")
    bad = first_bad_pair(indices, valid.start, valid.stop - 1, values)
    if bad < 0:
        return indices, values
    if not valid.start <= indices[bad] < valid.stop:
        raise ValueError(f"{index_name} must be in {valid.start}..{valid.stop - 1}, got "
                         f"{indices[bad]}")
    raise ValueError(f"{value_name} must be finite and >= 0, got {float(values[bad])!r}")
