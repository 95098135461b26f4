"""The priority figure: who gets replayed, and at what age, beside uniform replay."""

from __future__ import annotations

import bisect
from typing import Any, ClassVar

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from d3qn_utils.atomic_files import atomic_file
from d3qn_utils.checks import added_keys, require, saved_array, with_added_keys
from d3qn_utils.replay_storage import Segments, stream_values

# Replay statistics bin a transition's age (transitions of its stream stored after it) by powers
# of two: bin k holds ages 2^k - 1 .. 2^(k+1) - 2, so bin 0 is the newest transition alone.
AGE_BINS = 40
AGE_BIN_LOW = 2.0 ** np.arange(AGE_BINS) - 1.0  # first age in each bin
AGE_BIN_HIGH = 2.0 ** np.arange(1, AGE_BINS + 1) - 1.0  # first age past each bin
PRIORITY_HISTORY_EVERY = 50  # gradient steps between the figure's beta / IS-weight points
RECENT_BATCHES = 20  # batches whose IS weights the figure shows


def age_bins(ages: np.ndarray) -> np.ndarray:
    """The `AGE_BINS` bin of each age (int >= 0): floor(log2(age + 1)), capped at the last."""
    _, exponents = np.frexp(np.asarray(ages, dtype=np.float64) + 1.0)  # x = m 2^e, m in [0.5, 1)
    return np.minimum(exponents - 1, AGE_BINS - 1)


class PriorityFigure:
    """The priority figure and its data. Who gets replayed: counts per slot and, per age bin over
    all samples, `replays_by_age` (measured), `exposure_by_age` (transitions of that age in the
    memory) and `uniform_replays_by_age` (uniform replay's expectation, over the transitions
    each stream holds); the last RECENT_BATCHES batches' IS
    weights; (step, beta, least and mean IS weight) every PRIORITY_HISTORY_EVERY gradient steps.
    A transition's age is the transitions of its stream (its environment's, `streams` of them,
    each in its segment of the memory's slots as `Segments` lays them out) stored after it,
    counted from the slot `store` returned for it (`note_store`); one stream's are all the
    transitions stored after it. The ages the memory holds are, with `ring` (the memory's
    WRITES_RING), each stream's ring's: 0 .. held - 1 of the transitions it holds, else read slot
    by slot (a reservoir). O(batch + streams) per replay of a ring (O(capacity) of another),
    O(log streams) per store, no random numbers, so watching does not change a run."""

    BYTES_PER_SLOT = 16  # replay_counts and stored_at
    COUNTERS = ("replay_counts", "stored_at", "stores", "replays_by_age", "exposure_by_age",
                "uniform_replays_by_age")  # saved as "stats.<name>"; "stores" per stream
    # Keys added to `state_dict` since checkpoint format 2, with the value that means what a
    # checkpoint written before each did (d3qn_utils/agent_checkpoint.py).
    ADDED_KEYS: ClassVar[dict[str, np.ndarray]] = {}

    def __init__(self, capacity: int, batch_size: int, ring: bool = True,
                 streams: int = 1) -> None:
        self.replay_counts = np.zeros(capacity, dtype=np.int64)
        self.stored_at = np.zeros(capacity, dtype=np.int64)  # its stream's stores before it
        segments = Segments(capacity, streams, 1)
        self.streams, self.starts, self.sizes = segments.streams, segments.starts, segments.sizes
        self._start_slots = self.starts.tolist()  # for bisect: one store, a few comparisons
        # The transitions stored in each stream: Python ints, which a store counts fastest.
        self.stream_stores = [0] * self.streams
        self.replays_by_age = np.zeros(AGE_BINS, dtype=np.int64)
        self.exposure_by_age = np.zeros(AGE_BINS)
        self.uniform_replays_by_age = np.zeros(AGE_BINS)
        self.history: list[tuple[int, float, float, float]] = []
        self.recent_is_weights = np.ones((RECENT_BATCHES, batch_size), np.float32)
        self.recent_batches = 0  # batches written to recent_is_weights (a ring)
        self.ring = ring  # each stream holds its newest: one of each age below the count it holds

    def note_store(self, slot: int | None) -> None:
        """A transition went into `slot`; None (the memory dropped it) changes nothing."""
        if slot is None:  # indexing with None would write every slot
            return
        stream = bisect.bisect_right(self._start_slots, slot) - 1 if self.streams > 1 else 0
        self.stored_at[slot] = self.stream_stores[stream]
        self.replay_counts[slot] = 0
        self.stream_stores[stream] += 1

    @property
    def stores(self) -> int:
        """The transitions stored, in all streams."""
        return sum(self.stream_stores)

    def note_sample(self, slots: np.ndarray, held: int | np.ndarray) -> None:
        """Count `slots`, drawn from a memory holding `held` transitions in each stream (an
        int: one stream's; `ReplayMemory.held_per_stream`). O(len(slots) + streams)."""
        held_per_stream = np.array(held, dtype=np.int64).reshape(-1)
        if held_per_stream.shape != (self.streams,):
            raise ValueError(f"held must give the transitions held in each of the "
                             f"{self.streams} streams, got {held!r}")
        np.add.at(self.replay_counts, slots, 1)
        self.replays_by_age += np.bincount(age_bins(self.ages(slots)), minlength=AGE_BINS)
        in_memory = self.held_by_age(held_per_stream)
        self.exposure_by_age += in_memory
        self.uniform_replays_by_age += in_memory * (len(slots) / int(held_per_stream.sum()))

    def note_replay(self, slots: np.ndarray, held: int | np.ndarray, step: int,
                    last_gradient_step: int, beta: float, is_weights: np.ndarray) -> None:
        """Note one `replay` call: `slots` drawn from the `held` transitions of each stream (as
        `note_sample` takes them), one row of `is_weights` per gradient step up to
        `last_gradient_step`. O(len(slots) + streams)."""
        self.note_sample(slots, held)
        first = last_gradient_step - len(is_weights) + 1
        for gradient_step, weights in enumerate(is_weights, start=first):
            self.recent_is_weights[self.recent_batches % RECENT_BATCHES] = weights
            self.recent_batches += 1
            if gradient_step % PRIORITY_HISTORY_EVERY == 0:
                self.history.append((step, beta, float(weights.min()), float(weights.mean())))

    def ages(self, slots: np.ndarray) -> np.ndarray:
        """Age of the transitions in `slots`: transitions of its stream stored after each one."""
        streams = np.searchsorted(self.starts, slots, side="right") - 1
        return np.array(self.stream_stores)[streams] - 1 - self.stored_at[slots]

    def held_by_age(self, held: np.ndarray) -> np.ndarray:
        """The transitions per age bin of a memory holding `held[i]` in stream i, those of the
        `held[i]` slots of its segment stored last: of a ring one of each age 0 .. held[i] - 1,
        O(AGE_BINS * streams); else the ages of those slots, O(capacity) (a slot never stored
        counts as the oldest, so it is left out)."""
        if self.ring:
            by_stream = np.minimum(AGE_BIN_HIGH, held[:, np.newaxis]) - AGE_BIN_LOW
            return np.clip(by_stream, 0.0, None).sum(axis=0)
        counts = np.zeros(AGE_BINS, dtype=np.int64)
        for start, size, count in zip(self.starts.tolist(), self.sizes.tolist(), held.tolist(),
                                      strict=True):
            if count:
                ages = self.ages(np.arange(start, start + size))
                counts += np.bincount(age_bins(np.partition(ages, count - 1)[:count]),
                                      minlength=AGE_BINS)
        return counts.astype(np.float64)

    def data(self, memory: Any) -> dict[str, Any]:
        """What the figure shows about `memory`: N * P(i) of each transition, the |delta| = 0
        floor (proportional PER), replay rates by age bin, the streams the ages count in.
        O(capacity)."""
        _, probabilities = memory.sampling_probabilities()
        size = len(probabilities)
        floor = epsilon = None
        if (zero_error := memory.zero_error_floor()) is not None:
            floor, epsilon = zero_error[0] * size, zero_error[1]
        seen = self.exposure_by_age > 0
        return {"relative_probabilities": probabilities * size, "floor": floor,
                "epsilon": epsilon, "age_low": AGE_BIN_LOW[seen], "age_high": AGE_BIN_HIGH[seen],
                "replay_rate": self.replays_by_age[seen] / self.exposure_by_age[seen],
                "uniform_rate": self.uniform_replays_by_age[seen] / self.exposure_by_age[seen],
                "streams": self.streams}

    def draw(self, path: str, memory: Any, title: str) -> bool:
        """Save the figure of `memory` to `path`; False before the first batch."""
        if not self.recent_batches:
            return False
        recent = self.recent_is_weights[:min(self.recent_batches, RECENT_BATCHES)]
        draw_priority_figure(path, self.data(memory), self.history, recent, title)
        return True

    def state_dict(self) -> dict[str, np.ndarray]:
        """The counters ("stats.<name>"; "stats.stores" one value per stream, a scalar for one
        stream), history and recent weights for a checkpoint, uncopied."""
        return {**{f"stats.{name}": np.asarray(getattr(self, name)) for name in self.COUNTERS},
                "stats.stores": stream_values(np.array(self.stream_stores)),
                "history": np.array(self.history, dtype=np.float64).reshape(-1, 4),
                "recent_is_weights": self.recent_is_weights,
                "recent_batches": np.array(self.recent_batches)}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Take back what `state_dict` gave; ValueError naming what is missing or misshapen.
        Streams saved with one count of stores for all (`ages_by_stream`) get their own."""
        arrays = with_added_keys(arrays, added_keys(type(self)))
        current = self.state_dict()
        require(arrays, list(current), "priority figure")
        if self.streams > 1 and np.ndim(arrays["stats.stores"]) == 0:
            arrays = {**arrays, **self.ages_by_stream(arrays)}
        saved = {key: saved_array(arrays, key, value.shape, value.dtype)
                 for key, value in current.items() if key != "history"}  # any length
        self.stream_stores = saved.pop("stats.stores").reshape(-1).tolist()
        for key, value in saved.items():
            setattr(self, key.removeprefix("stats."), value if value.ndim else value.item())
        self.history = [(int(step), float(beta), float(smallest), float(mean))
                        for step, beta, smallest, mean in np.asarray(arrays["history"])]

    def ages_by_stream(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """"stats.stored_at" and "stats.stores" per stream from those of a figure of several
        streams saved with one count of stores for all of them (before ages were counted per
        stream): each stream's slots numbered in the order they were stored. A ring's stream
        holds its newest transitions, and a slot that holds none was stored before them, so each
        held transition gets the age counting per stream gives it. A tie at 0 (never stored, or
        stored first of all) puts the lowest slot last: a stream fills from its start. The sums
        counted before stay as they were."""
        stored_at = saved_array(arrays, "stats.stored_at", self.stored_at.shape, np.int64)
        by_stream = np.empty_like(stored_at)
        for start, size in zip(self._start_slots, self.sizes.tolist(), strict=True):
            order = np.lexsort((-np.arange(size), stored_at[start:start + size]))
            by_stream[start + order] = np.arange(size)
        return {"stats.stored_at": by_stream, "stats.stores": self.sizes.copy()}

    @staticmethod
    def format_1_state(memory: dict[str, np.ndarray], progress: dict[str, Any]
                       ) -> dict[str, np.ndarray]:
        """The `state_dict` of a format-1 checkpoint, popped out of `memory` (memory.npz: the
        counters) and `progress` (progress.json: the rest); KeyError or ValueError if missing."""
        state = {key: memory.pop(key) for key in list(memory) if key.startswith("stats.")}
        state["history"] = np.array(progress.pop("priority_history"),
                                    dtype=np.float64).reshape(-1, 4)
        state["recent_is_weights"] = np.array(progress.pop("recent_is_weights"), np.float32)
        state["recent_batches"] = np.array(progress.pop("recent_batches"))
        return state


def draw_priority_figure(path: str, data: dict[str, Any],
                         history: list[tuple[int, float, float, float]],
                         recent_is_weights: np.ndarray, title: str) -> None:
    """Four panels on what prioritized replay does, saved atomically to `path`."""
    figure = Figure(figsize=(13, 8.5), layout="constrained")
    figure.suptitle(title, fontsize=11)
    (probability_axes, weight_axes), (beta_axes, age_axes) = figure.subplots(2, 2)

    relative = data["relative_probabilities"]
    low, high = relative.min(initial=1.0), relative.max(initial=1.0)
    edges = np.geomspace(low * 0.999, high * 1.001, 41) if high > low * 1.01 else \
        np.array([low * 0.9, high * 1.1])
    counts, _ = np.histogram(relative, edges)
    mass, _ = np.histogram(relative, edges, weights=relative)
    probability_axes.stairs(100 * counts / max(counts.sum(), 1), edges, fill=True, alpha=0.4,
                            color="tab:gray", label="share of the transitions")
    probability_axes.stairs(100 * mass / max(mass.sum(), 1e-300), edges, color="tab:red",
                            linewidth=2, label="share of the sampling probability they hold")
    probability_axes.axvline(1.0, color="black", linestyle="--", label="uniform replay (1)")
    if data["floor"] is not None:
        probability_axes.axvline(data["floor"], color="tab:blue", linestyle=":",
                                 label=f"|δ| = 0: only ε = {data['epsilon']:g} left")
    probability_axes.set(xscale="log", ylabel="% (per bin)",
                         xlabel="N·P(i): a transition's sampling probability relative to uniform")
    ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)
             if edges[0] <= t <= edges[-1]]
    probability_axes.set_xticks(ticks, [f"{t:g}" for t in ticks])
    probability_axes.xaxis.set_minor_formatter(NullFormatter())
    probability_axes.set_title(f"Priorities of the {len(relative):,} transitions in the memory "
                               "at the end\nmost are replayed less often than uniform replay "
                               "would, a few much more", fontsize=10)
    probability_axes.legend(fontsize=8)

    weights = recent_is_weights.ravel()
    weight_axes.hist(weights, bins=np.linspace(0.0, 1.0, 41), color="tab:purple", alpha=0.7)
    beta = history[-1][1] if history else float("nan")
    weight_axes.set(xlim=(0.0, 1.02), ylabel="samples",
                    xlabel="importance-sampling weight w_i = (N·P(i))^-β / max_j w_j")
    weight_axes.set_title(f"IS weights of the last {len(recent_is_weights)} batches (β = "
                          f"{beta:.2f})\nthe most often replayed transitions count the least "
                          "in the loss", fontsize=10)

    if history:
        steps, betas, smallest, mean = (np.array(column) for column in zip(*history, strict=True))
        beta_axes.plot(steps, betas, color="black", label="β (annealed to 1)")
        beta_axes.plot(steps, mean, color="tab:purple", alpha=0.8, label="mean IS weight")
        beta_axes.plot(steps, smallest, color="tab:purple", alpha=0.4, linewidth=0.8,
                       label="smallest IS weight in the batch")
        beta_axes.legend(fontsize=8, loc="center right")
    beta_axes.set(ylim=(0.0, 1.05), xlabel="environment step")
    beta_axes.set_title("β over the run\nas β grows to 1, the IS weights undo more of the "
                        "sampling bias", fontsize=10)
    beta_axes.grid(alpha=0.3)

    if len(data["age_low"]):
        # Measured over uniform replay's expectation, so the memory's growth during the run
        # (which changes every transition's uniform chance) cancels out.
        age_edges = np.append(data["age_low"], data["age_high"][-1]) + 1.0
        ratio = data["replay_rate"] / np.maximum(data["uniform_rate"], 1e-300)
        age_axes.stairs(ratio, age_edges, baseline=None, color="tab:red", linewidth=2,
                        label="measured")
        age_axes.axhline(1.0, color="black", linestyle="--", label="uniform replay")
        age_axes.set(xscale="log", ylim=(0.0, max(1.5, 1.1 * ratio.max())))
        age_axes.legend(fontsize=8)
    stored_after = "transitions its environment stored" if data["streams"] > 1 else \
        "transitions stored"
    age_axes.set(xlabel=f"age + 1 ({stored_after} after it, log bins)",
                 ylabel="replays relative to uniform replay")
    age_axes.set_title("How often transitions were replayed, by their age\nnew ones enter at "
                       "top priority: replayed soon, later less often", fontsize=10)
    age_axes.grid(alpha=0.3, which="both")
    with atomic_file(path) as temporary:
        figure.savefig(temporary, dpi=90)

