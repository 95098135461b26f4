"""A replay memory as plain numpy arrays, for checkpoints (checkpoint.py): `memory_state` and
`load_memory_state`, for PER.py's `Memory` and `UniformMemory` and rank_based.py's
`RankBasedMemory`. The arrays go to an `.npz` file that loads without pickle.

Keys: "storage.*" (the storage's own `state_dict`), "kind", "rng" (the generator's state as
JSON); prioritized memories add "alpha" and "beta", proportional ones the trees ("tree.sums",
"tree.mins") and "max_priority", rank-based ones "abs_errors", "ranked_slots" and "ranked_keys".
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from d3qn_utils.replay_storage import check_saved_value, require

PRIORITY_KEYS = {
    "uniform": (),
    "proportional": ("alpha", "beta", "tree.sums", "tree.mins", "max_priority"),
    "rank-based": ("alpha", "beta", "abs_errors", "ranked_slots", "ranked_keys"),
}


def memory_state(memory: Any) -> dict[str, np.ndarray]:
    """The whole memory, its priorities and beta as plain numpy arrays."""
    arrays = {f"storage.{key}": value for key, value in memory.storage.state_dict().items()}
    arrays["kind"] = np.array(memory.kind)
    arrays["rng"] = np.array(json.dumps(memory.rng.bit_generator.state))
    if memory.kind != "uniform":
        arrays["alpha"] = np.array(memory.alpha)
        arrays["beta"] = np.array(memory.beta)
    if memory.kind == "proportional":
        arrays["tree.sums"] = memory.tree.tree
        arrays["tree.mins"] = memory.tree.mins
        arrays["max_priority"] = np.array(memory.max_priority)
    elif memory.kind == "rank-based":
        memory.refresh_ranks()
        arrays["abs_errors"] = memory.abs_errors
        arrays["ranked_slots"] = memory.ranked_slots
        arrays["ranked_keys"] = memory.ranked_keys
    return arrays


def load_memory_state(memory: Any, arrays: dict[str, np.ndarray]) -> None:
    """Restore what `memory_state` returned into `memory`, which must be of the same kind and
    capacity (and alpha). ValueError naming what does not fit. Keys it does not know are
    ignored, such as the "stats.*" replay statistics older checkpoints saved with the memory."""
    require(arrays, ("kind",), "replay memory")
    check_saved_value(arrays, "kind", memory.kind)
    require(arrays, ("rng", *PRIORITY_KEYS[memory.kind]), f"{memory.kind} memory")
    if memory.kind != "uniform":
        check_saved_value(arrays, "alpha", memory.alpha)
    prefix = "storage."
    storage = {key[len(prefix):]: value for key, value in arrays.items() if key.startswith(prefix)}
    require(storage, ("capacity",), "replay storage")
    check_saved_value(storage, "capacity", memory.capacity)
    if memory.kind == "proportional":  # checked before anything is written
        sums = saved_tree(arrays, "tree.sums", memory.capacity)
        mins = saved_tree(arrays, "tree.mins", memory.capacity)
    elif memory.kind == "rank-based":
        abs_errors = saved_array("abs_errors", arrays["abs_errors"], (memory.capacity,))
    memory.storage.load_state_dict(storage)
    try:
        memory.rng.bit_generator.state = json.loads(arrays["rng"].item())
    except (TypeError, ValueError, KeyError) as error:
        raise ValueError(f"saved random generator state is unusable: {error}") from error
    if memory.kind != "uniform":
        memory.beta = float(arrays["beta"])
    if memory.kind == "proportional":
        memory.tree.tree[:] = sums
        memory.tree.mins[:] = mins
        memory.max_priority = float(arrays["max_priority"])
    elif memory.kind == "rank-based":
        memory.abs_errors = abs_errors
        memory.ranked_slots = np.asarray(arrays["ranked_slots"], dtype=np.int64)
        memory.ranked_keys = np.asarray(arrays["ranked_keys"], dtype=np.float64)
        memory.forget_stale()


def saved_array(key: str, saved: Any, shape: tuple[int, ...]) -> np.ndarray:
    """`saved`, the checkpoint's `key`, as a float64 array; ValueError unless it has `shape`."""
    array = np.array(saved, dtype=np.float64)
    if array.shape != shape:
        raise ValueError(f"saved {key} has shape {array.shape}, expected {shape}")
    return array


def saved_tree(arrays: dict[str, np.ndarray], key: str, capacity: int) -> np.ndarray:
    """The checkpoint's sum or min tree `key`: 2*capacity - 1 nodes, numbered as `SumTree` does.

    Checkpoints from before the tree was counted from 0 hold 2*capacity elements, a never-used one
    in front of the root; it is dropped.
    """
    nodes = np.asarray(arrays[key])
    if nodes.shape == (2 * capacity,):
        nodes = nodes[1:]
    return saved_array(key, nodes, (2 * capacity - 1,))
