"""Ape-X's replay (apex.py): one Ray actor holding the shared prioritized memory, a `BlockMemory`,
that actors fill with blocks and the learner samples; it also paces both sides and is the run's
bookkeeping hub (env steps, episodes, published weights, (re)starts).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from d3qn_utils.checks import check_block, check_non_negative, is_integer
from d3qn_utils.games import storage_spec
from PER import Memory

IDLE_SLEEP = 0.005  # seconds a paced learner or actor waits before asking the replay again


class BlockMemory(Memory):
    """`PER.Memory` that also takes an actor's block of transitions with the priorities the actor
    measured (`store_block`): the Ape-X replay's memory."""

    def store_block(self, transitions: tuple, abs_errors: np.ndarray, context: int = 0
                    ) -> np.ndarray:
        """Add k consecutive transitions with the priorities their actor computed; return the k
        slots that hold them. O(k log N).

        An actor computes the |TD errors| of its own transitions, so they enter with a measured
        priority instead of the maximum. `transitions` is (states, actions, rewards, next_states,
        dones) with leading dimension k, in the order they happened; `abs_errors` are the |TD
        errors| of the first k - `context`, turned into priorities as `batch_update` does. The
        last `context` transitions are stored only so that the n-step chains of the others run
        through to their end (the actor sends them again at the head of its next block): they get
        priority 0 and are never sampled. Slots the block frees get 0; a slot written twice keeps
        its last priority. The block's last transition ends its chain (`end_episode`): the
        blocks of all actors go to one stream, so the next block is another actor's, or this
        actor's next one, which opens with the context again or a new episode. An actor ends a
        block where its episode ends (terminated or truncated): every episode's end is marked.

        Bad input (lengths, shapes, NaN, infinite or negative errors, a transition that `store`
        would refuse) raises ValueError and changes nothing, but for a frame storage's refusal of
        a next state that is not its state shifted by a frame: the transitions before it (a frame
        storage adds one at a time) stay, with their priorities.
        """
        columns = check_block(transitions, self.capacity)
        k = len(columns[0])
        if not is_integer(context) or not 0 <= context < k:
            raise ValueError(f"context must be an integer in 0..{k - 1} for a block of {k}, "
                             f"got {context!r}")
        errors = np.asarray(abs_errors, dtype=np.float64).ravel()
        if errors.size != k - context:
            raise ValueError(f"got {errors.size} errors for a block of {k} transitions with "
                             f"{context} of context (expected {k - context})")
        check_non_negative("absolute TD error", errors)
        priorities = np.concatenate([self.leaf_priorities(errors), np.zeros(context)])
        writes: list[tuple[np.ndarray, np.ndarray]] = []  # (slots, priorities), in write order
        stored = 0
        try:
            for slots, freed in self.storage.add_block(columns):
                writes += [(freed, np.zeros(len(freed))),
                           (slots, priorities[stored:stored + len(slots)])]
                stored += len(slots)
        finally:  # one tree update for the block: far cheaper than one per transition
            if writes:
                self.end_episode()  # no chain runs on into the next block
                leaves = np.concatenate([slots for slots, _ in writes]).astype(np.int64)
                values = np.concatenate([values for _, values in writes])
                self.write_priorities(self.tree.leaf_index(leaves), values)
        return np.concatenate([slots for slots, _ in writes[1::2]]).astype(np.int64)


class Replay:
    """The shared prioritized replay, as one Ray actor, plus the run's bookkeeping hub.

    Holds a `BlockMemory` (a `PER.Memory`: proportional, fixed beta) and, per slot, the
    insertion number of the transition in it, so that a priority update for a transition that
    has meanwhile been overwritten (the oldest go first) is dropped instead of landing on its
    successor. It also keeps the reference to the newest published weights (a few bytes; the
    weights themselves stay in the object store), and the env steps, episode returns and
    (re)starts the actors report.
    """

    BYTES_PER_SLOT = 8  # `stamps`, beside the memory's own (Memory.check_fits)

    def __init__(self, config: argparse.Namespace) -> None:
        self.config = config
        storage = storage_spec(config.env_name)(config.memory_size)
        self.memory = BlockMemory(config.memory_size, alpha=config.per_alpha,
                                  beta=config.per_beta, beta_increment=0.0, storage=storage,
                                  rng=np.random.default_rng([config.seed, 1]),
                                  n_step=config.n_step, gamma=config.gamma)
        self.stamps = np.full(config.memory_size, -1, dtype=np.int64)
        self.inserted = 0
        self.env_steps = np.zeros(config.num_actors, dtype=np.int64)
        self.starts = np.zeros(config.num_actors, dtype=np.int64)
        self.episodes: list[tuple[int, int, float]] = []  # (actor, env steps then, return)
        self.weights: tuple[int, list] | None = None
        self.stopping = False
        self.updates = 0  # priority updates received: one per learner update

    def add_block(self, actor: int, transitions: tuple, abs_errors: np.ndarray, context: int,
                  new_steps: int, returns: list[float]) -> str:
        """Insert an actor's block with its priorities; answer as `pace` does."""
        slots = self.memory.store_block(transitions, abs_errors, context)
        self.stamps[slots] = self.inserted + np.arange(len(slots))
        self.inserted += len(slots)
        self.env_steps[actor] += new_steps
        total = int(self.env_steps.sum())
        self.episodes += [(actor, total, float(score)) for score in returns]
        return self.pace()

    def pace(self) -> str:
        """"stop" once the run ends; "wait" while the actors are more than a margin ahead of
        UPDATES_PER_STEP learner updates per env step (so on a small machine the learner gets
        the cores its share of updates needs); else "go"."""
        if self.stopping:
            return "stop"
        config = self.config
        margin = config.learning_starts + 2 * config.num_actors * config.block_size
        ahead = self.env_steps.sum() * config.updates_per_step - self.updates
        if config.updates_per_step and ahead > margin * config.updates_per_step:
            return "wait"
        return "go"

    def sample(self, n: int) -> tuple:
        """(tree_idx, stamps, batch, is_weights, env steps collected) of n prioritized draws."""
        tree_idx, batch, is_weights = self.memory.sample(n)
        stamps = self.stamps[self.memory.slots_of(tree_idx)]
        return tree_idx, stamps, batch, is_weights, int(self.env_steps.sum())

    def update_priorities(self, tree_idx: np.ndarray, stamps: np.ndarray,
                          abs_errors: np.ndarray) -> None:
        """New priorities from the learner, for the sampled transitions still in the memory."""
        current = self.stamps[self.memory.slots_of(tree_idx)] == stamps
        self.memory.batch_update(tree_idx[current], abs_errors[current])
        self.updates += 1

    def publish(self, version: int, weights: list) -> None:
        """Keep [reference] to the learner's newest weights (the list keeps Ray from fetching)."""
        self.weights = (version, weights)

    def latest_weights(self, version_held: int) -> tuple[int, list] | None:
        """(version, [reference]) of the newest weights, or None if `version_held` is it."""
        if self.weights is None or self.weights[0] == version_held:
            return None
        return self.weights

    def actor_started(self, actor: int) -> int:
        """Count a (re)start of `actor`; return its number of starts."""
        self.starts[actor] += 1
        return int(self.starts[actor])

    def collected(self) -> int:
        """Env steps collected by all actors."""
        return int(self.env_steps.sum())

    def status(self, episodes_seen: int) -> dict[str, Any]:
        """Counters for the progress line, and the episodes reported after the first
        `episodes_seen` ones."""
        return {"env_steps": self.env_steps.tolist(), "size": len(self.memory),
                "starts": self.starts.tolist(), "episodes": self.episodes[episodes_seen:]}

    def stop(self) -> None:
        """Answer "stop" to the next block of every actor, so that each one returns."""
        self.stopping = True
