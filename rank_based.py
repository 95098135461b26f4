"""The PER paper's rank-based variant (Schaul et al., ICLR 2016, section 3.3), `PER_RANK_BASED`.

Transition i has priority p_i = 1 / rank(i), rank 1 being the largest |delta|, and is drawn with
probability P(i) = p_i^alpha / sum_k p_k^alpha. Unlike proportional PER it ignores how large the
errors are, only their order, so an outlier cannot take over the batch. The paper tuned it with
alpha 0.7 and beta 0.5 (d3qn_utils/settings.py's rank-based preset).

`RankBasedMemory` has `PER.Memory`'s interface. It keeps the transitions exactly sorted by
|delta| (an O(N) merge before a sample that follows new errors, all in numpy), and its strata are
the n equal-probability segments of the fixed rank distribution, found by a binary search of its
cumulative sum.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from d3qn_utils.checks import (
    added_keys,
    check_saved_value,
    check_transition,
    saved_array,
    with_added_keys,
)
from d3qn_utils.replay_memory import NOT_SAVED, ReplayMemory
from d3qn_utils.replay_storage import NO_SLOTS, ReplayStorage, check_ranking, saved_storage


class RankBasedMemory(ReplayMemory):
    """Rank-based prioritized replay with `PER.Memory`'s interface (`store`, `sample`,
    `batch_update`): a new transition ranks first until its error is known; importance-sampling
    weights w_i = (N * P(i))^-beta / max_j w_j; beta grows by `beta_increment` per `sample`."""

    kind = "rank-based"
    RUN_SUFFIX, PRIORITIZED = "_PERrank", True
    BYTES_PER_SLOT = 4 * 8 + 1  # abs_errors, ranked_slots, ranked_keys, _rank_cdf; _stale
    ADDED_KEYS: ClassVar[dict[str, np.ndarray]] = {"beta_increment": NOT_SAVED}

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.7,
        beta: float = 0.5,
        beta_increment: float = 0.001,
        storage: ReplayStorage | None = None,
        rng: np.random.Generator | int | None = None,
        n_step: int = 1,
        gamma: float = 0.99,
    ) -> None:
        super().__init__(capacity, storage, rng, n_step, gamma)
        self.set_exponents(alpha, beta, beta_increment)
        # |delta| per slot: +inf for unseen transitions (they rank first), -inf for empty slots.
        self.abs_errors = np.full(self.capacity, -np.inf)
        # Slots holding transitions, largest |delta| first, and their keys (-|delta|, ascending).
        self.ranked_slots = NO_SLOTS
        self.ranked_keys = np.zeros(0)
        self._stale = np.zeros(self.capacity, dtype=bool)
        self._stale_slots: list[np.ndarray] = []
        # Cumulative unnormalised probabilities of ranks 1..capacity: sum_{r <= j} r^-alpha.
        self._rank_cdf = np.cumsum(np.arange(1, self.capacity + 1, dtype=np.float64) ** -self.alpha)

    def store(self, experience: tuple, stream: int = 0) -> int:
        """Add one (state, action, reward, next_state, done) to `stream`, ranked first; return
        its slot. ValueError naming the field, and nothing written, for a transition that
        `check_transition` refuses."""
        slot, freed = self.storage.add(check_transition(experience), stream)
        self.abs_errors[freed] = -np.inf
        self.abs_errors[slot] = np.inf
        self.mark_stale(np.append(freed, slot))
        return slot

    def sample(self, n: int) -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray]:
        """Draw n transitions by rank: (slots, batch, is_weights), as `PER.Memory.sample`, the
        slots where it returns tree indices (there is no tree here). O(n log N), plus an O(N)
        merge when priorities changed since the last sample."""
        self.check_sample_size(n)
        self.beta = min(1.0, self.beta + self.beta_increment)
        strata = (np.arange(n) + self.rng.random(n)) / n
        self.refresh_ranks()
        size = len(self.ranked_slots)
        cdf = self._rank_cdf[:size]
        ranks = np.minimum(np.searchsorted(cdf, strata * cdf[-1], side="right"), size - 1)
        # P(rank j) = j^-alpha / S, P_min = N^-alpha / S, so w_j / w_max = (j / N)^(alpha beta).
        is_weights = ((ranks + 1) / size) ** (self.alpha * self.beta)
        slots = self.ranked_slots[ranks]
        return slots, self.n_step_batch(slots), is_weights.astype(np.float32)

    def batch_update(self, slots: np.ndarray, abs_errors: np.ndarray) -> None:
        """Re-rank the sampled transitions by their new |TD errors|, as `PER.Memory.batch_update`
        (same checks; overwritten slots skipped; a slot named twice takes its last error)."""
        slots, errors = self.check_slots(slots, abs_errors)
        live = self.storage.holds(slots)
        self.abs_errors[slots[live]] = errors[live]
        self.mark_stale(slots[live])

    def sampling_probabilities(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots holding a transition, their sampling probabilities P(i)). O(capacity)."""
        self.refresh_ranks()
        weights = np.diff(self._rank_cdf[: len(self.ranked_slots)], prepend=0.0)
        return self.ranked_slots.copy(), weights / max(weights.sum(), 1e-300)

    def mark_stale(self, slots: np.ndarray) -> None:
        """Note that `slots` changed |delta|: the next sample moves them to their rank."""
        self._stale_slots.append(slots)

    def refresh_ranks(self) -> None:
        """Move the slots whose error changed to their sorted place. O(N + k log k)."""
        if not self._stale_slots:
            return
        stale = np.unique(np.concatenate(self._stale_slots))
        self._stale_slots.clear()
        self._stale[stale] = True
        keep = ~self._stale[self.ranked_slots]
        self._stale[stale] = False
        ranked_slots, ranked_keys = self.ranked_slots[keep], self.ranked_keys[keep]
        # Ranked: slots that hold a transition (freed ones have |delta| = -inf).
        stale = stale[self.storage.holds(stale) & (self.abs_errors[stale] > -np.inf)]
        keys = -self.abs_errors[stale]
        order = np.argsort(keys, kind="stable")
        stale, keys = stale[order], keys[order]
        positions = np.searchsorted(ranked_keys, keys, side="left")
        self.ranked_slots = np.insert(ranked_slots, positions, stale)
        self.ranked_keys = np.insert(ranked_keys, positions, keys)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The memory as plain arrays (`ReplayMemory.state_dict`), with alpha, beta and its
        growth, the errors and the ranking (brought up to date first)."""
        self.refresh_ranks()
        return {**super().state_dict(), "alpha": np.array(self.alpha),
                "beta": np.array(self.beta), "beta_increment": np.array(self.beta_increment),
                "abs_errors": self.abs_errors,
                "ranked_slots": self.ranked_slots, "ranked_keys": self.ranked_keys}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Take back what `state_dict` gave; ValueError naming what does not fit (another kind,
        capacity or alpha, a ranking that is not of distinct held slots keyed by their errors),
        checked before anything changes."""
        arrays = with_added_keys(arrays, added_keys(type(self)))
        self.check_state(arrays, ("alpha", "beta", "abs_errors", "ranked_slots", "ranked_keys"))
        check_saved_value(arrays, "alpha", self.alpha)
        abs_errors = saved_array(arrays, "abs_errors", (self.capacity,))
        ranked_slots = np.asarray(arrays["ranked_slots"], dtype=np.int64)
        ranked_keys = np.asarray(arrays["ranked_keys"], dtype=np.float64)
        check_ranking(ranked_slots, ranked_keys, abs_errors,
                      self.storage.saved_holds(saved_storage(arrays)))
        super().load_state_dict(arrays)
        self.beta = float(arrays["beta"])
        self.load_beta_increment(arrays["beta_increment"])
        self.abs_errors = abs_errors
        self.ranked_slots, self.ranked_keys = ranked_slots, ranked_keys
        self._stale_slots.clear()  # the saved ranking was up to date
