"""Microseconds per replay-memory operation: PER.py against the tutorial's per-sample loops.

    python benchmarks/bench_per.py                 # capacity 2^20, as in the README
    python benchmarks/bench_per.py --capacity 65536 --rounds 3

Both memories are filled to capacity with CartPole-sized transitions first. The baseline is the
SumTree/Memory pair the tutorial describes, written here from its description: a Python loop per
sampled or updated transition, an O(N) max scan per insert, and the importance-sampling weights
computed as the code the tutorial borrows from does (an O(N) min scan over the leaves). If cpprb
(a C++ sum tree) is installed, its PrioritizedReplayBuffer is timed too.

`batch_update(n)` gives new priorities to the n slots just sampled, as a training step does: each
call samples a batch (not timed) and times the update alone, for every memory alike. A batch of
slots spread over the tree is what training updates, and what is in the cache then is what its
own sample left there. Each row is timed in `--rounds` rounds that alternate between the
memories; every round's figure goes to a results file too (`--results`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import provenance, timing
from PER import Memory

STATE_SIZE = 4  # CartPole observation
Timing = Callable[[object, int], float]  # (memory, calls) -> microseconds per call, one round
ALPHA, BETA, EPSILON, ABS_ERR_UPPER = 0.6, 0.4, 0.01, 1.0


class LoopSumTree:
    """The tutorial's sum tree: one leaf at a time, walking the tree in Python."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tree = np.zeros(2 * capacity - 1)
        self.data = np.zeros(capacity, dtype=object)
        self.data_pointer = 0

    def add(self, priority: float, data: tuple) -> None:
        tree_index = self.data_pointer + self.capacity - 1
        self.data[self.data_pointer] = data
        self.update(tree_index, priority)
        self.data_pointer = (self.data_pointer + 1) % self.capacity

    def update(self, tree_index: int, priority: float) -> None:
        change = priority - self.tree[tree_index]
        self.tree[tree_index] = priority
        while tree_index != 0:
            tree_index = (tree_index - 1) // 2
            self.tree[tree_index] += change

    def get_leaf(self, v: float) -> tuple[int, float, tuple]:
        parent = 0
        while True:
            left = 2 * parent + 1
            if left >= len(self.tree):
                break
            if v <= self.tree[left]:
                parent = left
            else:
                v -= self.tree[left]
                parent = left + 1
        return parent, self.tree[parent], self.data[parent - self.capacity + 1]


class LoopMemory:
    """The tutorial's Memory, plus the importance-sampling weights of the code it borrows from."""

    def __init__(self, capacity: int, rng: np.random.Generator) -> None:
        self.tree = LoopSumTree(capacity)
        self.beta = BETA
        self.rng = rng

    def store(self, experience: tuple) -> None:
        max_priority = np.max(self.tree.tree[-self.tree.capacity :])
        self.tree.add(max_priority if max_priority > 0 else ABS_ERR_UPPER, experience)

    def sample(self, n: int) -> tuple[np.ndarray, list, np.ndarray]:
        indices = np.empty(n, dtype=np.int32)
        weights = np.empty(n)
        minibatch = []
        segment = self.tree.tree[0] / n
        self.beta = min(1.0, self.beta + 0.001)
        min_probability = np.min(self.tree.tree[-self.tree.capacity :]) / self.tree.tree[0]
        for i in range(n):
            value = self.rng.uniform(segment * i, segment * (i + 1))
            index, priority, data = self.tree.get_leaf(value)
            weights[i] = np.power(priority / self.tree.tree[0] / min_probability, -self.beta)
            indices[i] = index
            minibatch.append(data)
        return indices, minibatch, weights

    def batch_update(self, tree_idx: np.ndarray, abs_errors: np.ndarray) -> None:
        priorities = np.power(np.minimum(abs_errors + EPSILON, ABS_ERR_UPPER), ALPHA)
        for tree_index, priority in zip(tree_idx, priorities, strict=True):
            self.tree.update(tree_index, priority)


def random_transition(rng: np.random.Generator) -> tuple:
    state = rng.random(STATE_SIZE, dtype=np.float32)
    return state, int(rng.integers(2)), 1.0, state, False


def fill_loop_memory(memory: LoopMemory, rng: np.random.Generator) -> None:
    """Fill the baseline directly: its O(N)-per-insert store would take hours at 2^20."""
    tree = memory.tree
    tree.tree[tree.capacity - 1 :] = rng.uniform(0.05, 1.0, tree.capacity)
    for node in range(tree.capacity - 2, -1, -1):
        tree.tree[node] = tree.tree[2 * node + 1] + tree.tree[2 * node + 2]
    for slot in range(tree.capacity):
        tree.data[slot] = random_transition(rng)


def time_call(call: Callable[[], object], calls: int) -> float:
    """The mean microseconds per call of `calls` calls, after one untimed call."""
    call()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def time_update(sample: Callable[[], np.ndarray], update: Callable[[np.ndarray], object],
                calls: int) -> float:
    """The mean microseconds of `update(sample())` over `calls` calls, timing the update alone:
    each call updates the batch just sampled."""
    update(sample())
    seconds = 0.0
    for _ in range(calls):
        batch = sample()
        start = time.perf_counter()
        update(batch)
        seconds += time.perf_counter() - start
    return seconds / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=2**20, help="memory size (default 2^20)")
    timing.add_rounds_argument(parser, default=5)
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args()
    timing.check_rounds(args.rounds)
    provenance.time_alone()  # no other timing shares the cores
    rng = np.random.default_rng(args.seed)

    print(f"filling both memories to capacity {args.capacity} ...", flush=True)
    memory = Memory(args.capacity, alpha=ALPHA, beta=BETA, rng=args.seed)
    for _ in range(args.capacity):
        memory.store(random_transition(rng))
    memory.batch_update(
        np.arange(args.capacity) + args.capacity - 1, rng.exponential(0.3, args.capacity)
    )
    baseline = LoopMemory(args.capacity, rng)
    fill_loop_memory(baseline, rng)

    cpprb = make_cpprb(args.capacity, rng)
    transition = random_transition(rng)
    # (operation, its timing on our memory or the loop baseline, its timing on cpprb); each
    # timing takes (memory, calls) and returns microseconds per call in one round.
    rows: list[tuple[str, Timing, Timing]] = [(
        "store",
        lambda m, calls: time_call(lambda: m.store(transition), calls),
        lambda b, calls: time_call(lambda: b.add(**cpprb_args(transition)), calls),
    )]
    for n in (32, 256):
        rows.append((
            f"sample({n})",
            lambda m, calls, n=n: time_call(lambda: m.sample(n), calls),
            lambda b, calls, n=n: time_call(lambda: b.sample(n, beta=BETA), calls),
        ))
    for n in (32, 256):
        errors = rng.exponential(0.3, n)
        rows.append((
            f"batch_update({n})",
            lambda m, calls, n=n, errors=errors: time_update(
                lambda: m.sample(n)[0], lambda idx: m.batch_update(idx, errors), calls),
            lambda b, calls, n=n, errors=errors: time_update(
                lambda: b.sample(n, beta=BETA)["indexes"],
                lambda idx: b.update_priorities(idx, errors + EPSILON), calls),
        ))

    header = f"{'operation':<18}{'PER.py us':>12}{'loop us':>12}{'speed-up':>10}"
    print(header + (f"{'cpprb us':>12}{'PER.py/cpprb':>14}" if cpprb else ""))
    measured: dict = {"capacity": args.capacity, "rounds": args.rounds,
                      "cpprb": importlib.metadata.version("cpprb") if cpprb else None,
                      "microseconds": {}}
    for name, ours, theirs in rows:
        calls = 2000 if "256" not in name else 500
        rounds: dict[str, list[float]] = {"PER.py": [], "tutorial loop": [],
                                          **({"cpprb": []} if cpprb else {})}
        for _ in range(args.rounds):  # the memories take turns, so a drift hits them all
            rounds["PER.py"].append(ours(memory, calls))
            rounds["tutorial loop"].append(ours(baseline, max(calls // 20, 10)))
            if cpprb:
                rounds["cpprb"].append(theirs(cpprb, calls))
        measured["microseconds"][name] = rounds
        ours_us, loop_us = (statistics.median(rounds[key]) for key in ("PER.py", "tutorial loop"))
        line = f"{name:<18}{ours_us:>12.1f}{loop_us:>12.1f}{loop_us / ours_us:>9.1f}x"
        if cpprb:
            cpprb_us = statistics.median(rounds["cpprb"])
            line += f"{cpprb_us:>12.1f}{ours_us / cpprb_us:>13.2f}x"
        print(line, flush=True)
    provenance.write_results(args.results, measured)


def cpprb_args(transition: tuple) -> dict:
    state, action, reward, next_state, done = transition
    return {"obs": state, "act": action, "rew": reward, "next_obs": next_state, "done": done}


def make_cpprb(capacity: int, rng: np.random.Generator):
    try:
        from cpprb import PrioritizedReplayBuffer
    except ImportError:
        print("cpprb is not installed: skipping the C++ comparison")
        return None
    spec = {"shape": STATE_SIZE, "dtype": np.float32}
    buffer = PrioritizedReplayBuffer(
        capacity,
        {"obs": spec, "act": {"dtype": np.int64}, "rew": {}, "next_obs": spec, "done": {}},
        alpha=ALPHA,
        eps=EPSILON,
    )
    chunk = 4096
    for _ in range(0, capacity, chunk):
        states = rng.random((chunk, STATE_SIZE), dtype=np.float32)
        buffer.add(
            obs=states,
            act=rng.integers(2, size=chunk),
            rew=np.ones(chunk),
            next_obs=states,
            done=np.zeros(chunk),
            priorities=rng.exponential(0.3, chunk) + EPSILON,
        )
    return buffer


if __name__ == "__main__":
    main()
