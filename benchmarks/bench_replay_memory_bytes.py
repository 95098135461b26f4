"""Bytes per transition of the replay memory on real frames, with 1 and with N environments.

For each game (Pong's 84x84 frames, four to a stack; MinAtar Breakout's 10x10 states) and each
number of environments N, fills a small prioritized memory (PER.Memory with the game's storage,
FrameStackStorage, in N streams) with a random policy's transitions as d3qn_agent.py's run stores
them: N environments stepped in turn, each environment's transitions in its own stream, each
episode's end told to the memory. It then measures every array the storage owns and the
transitions it holds once every stream's ring has wrapped: bytes per transition held. Each
episode leaves slots that hold no transition (its last next state's frame and, with stacks, its
first stack's older frames), and each ring one stack's worth more where it wraps (its seam): N
rings, N seams. The sum tree's bytes are measured apart with tracemalloc, and whole uint8 and
float32 stacks given for comparison. Bytes do not depend on the machine; what it measured goes to
a results file (`--results`).

Run: python benchmarks/bench_replay_memory_bytes.py [--help]
"""

from __future__ import annotations

import argparse
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from d3qn_utils import quiet_startup  # noqa: F401  # isort: skip -- first: before TensorFlow
import PER
from benchmarks import provenance
from benchmarks.bench_atari import owned_array_bytes
from d3qn_utils import games

# Hyperparameters (each overridable from the command line).
ENV_IDS = ("PongNoFrameskip-v4", "MinAtar/Breakout-v1")  # the games whose frames fill it
N_ENVS = (1, 8)  # the numbers of environments compared
CAPACITY = 3_000  # slots of the measured storage: small, so the run stays short
# Random-policy env steps per game and N, over all N environments: each of 8 Pong environments
# finishes about three of its ~1,000-step random episodes, and every stream's ring wraps.
STEPS = 24_000
SEED = 0  # seed of the environments and of the random policy


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-ids", nargs="+", default=list(ENV_IDS),
                        help="the games (Atari or MinAtar ids)")
    parser.add_argument("--n-envs", type=int, nargs="+", default=list(N_ENVS),
                        help="the numbers of environments to compare")
    parser.add_argument("--capacity", type=int, default=CAPACITY, help="slots of the storage")
    parser.add_argument("--steps", type=int, default=STEPS,
                        help="random-policy env steps per game and N, over all N environments")
    parser.add_argument("--seed", type=int, default=SEED, help="environment and policy seed")
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args(argv)
    if min(args.n_envs) < 1:
        parser.error(f"--n-envs must all be at least 1, got {min(args.n_envs)}")
    if args.steps < 2 * args.capacity:
        parser.error(f"--steps {args.steps} must be at least twice --capacity {args.capacity}, "
                     "so that every stream's ring wraps")
    for env_id in args.env_ids:
        if games.torso(env_id) is None:
            parser.error(f"--env-ids {env_id!r} is not a game of image states (Atari, MinAtar)")
        shape = state_of(env_id, args.seed).shape
        needed = games.storage_spec(env_id).min_capacity(shape, max(args.n_envs))
        if args.capacity < needed:
            parser.error(f"--capacity {args.capacity} is too small for {env_id} in "
                         f"{max(args.n_envs)} streams: it needs at least {needed} slots")
    return args


def state_of(env_id: str, seed: int) -> np.ndarray:
    """The first state of `env_id`'s environment reset with `seed`."""
    env = games.make_env(env_id)
    try:
        return env.reset(seed=seed)[0]
    finally:
        env.close()


def filled_memory(env_id: str, n_envs: int, capacity: int, steps: int, seed: int
                  ) -> tuple[PER.Memory, list[int]]:
    """A PER.Memory of `capacity` slots in `n_envs` streams of `env_id`'s storage, after `steps`
    env steps of a uniformly random policy in `n_envs` environments stepped in turn (environment
    i seeded `seed + i`), each one's transitions in its stream and its episodes' ends told, as
    d3qn_agent.py's run stores them; with the lengths of the episodes that ended."""
    envs = [games.make_env(env_id) for _ in range(n_envs)]
    memory = PER.Memory(capacity, storage=games.storage_spec(env_id)(capacity, n_envs), rng=seed)
    rng = np.random.default_rng(seed)
    states = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    running, lengths = [0] * n_envs, []
    for _ in range(steps // n_envs):
        for i, env in enumerate(envs):
            action = int(rng.integers(env.action_space.n))
            next_state, reward, terminated, truncated, _ = env.step(action)
            memory.store((states[i], action, float(reward), next_state, terminated), stream=i)
            running[i] += 1
            if terminated or truncated:
                memory.end_episode(i)
                lengths.append(running[i])
                running[i] = 0
                next_state, _ = env.reset()
            states[i] = next_state
    for env in envs:
        env.close()
    return memory, lengths


def sum_tree_bytes(env_id: str, capacity: int) -> int:
    """What a PER.Memory of `capacity` slots allocates beside its storage (its sum and min
    trees), by tracemalloc."""
    storage = games.storage_spec(env_id)(capacity)  # allocated before: not counted
    tracemalloc.start()
    memory = PER.Memory(capacity, storage=storage, rng=0)
    allocated = tracemalloc.get_traced_memory()[0]  # while `memory` holds its trees
    tracemalloc.stop()
    del memory
    return allocated


def measure(env_id: str, n_envs: list[int], capacity: int, steps: int, seed: int
            ) -> dict[str, Any]:
    """One game's bytes per transition held at each N, and a whole stack's for comparison."""
    found: dict[str, Any] = {"by_n_envs": {}}
    for n in n_envs:
        memory, lengths = filled_memory(env_id, n, capacity, steps, seed)
        storage, segments = memory.storage, memory.storage.segments
        # Every array it owns: the frames, the slots' fields, each stream's pending next state
        # (kept in memory, not saved) and the streams' counters.
        storage_bytes = owned_array_bytes(storage) + owned_array_bytes(segments)
        found["by_n_envs"][str(n)] = {
            "storage_bytes": storage_bytes, "transitions_held": len(storage),
            "bytes_per_transition": storage_bytes / len(storage), "episode_lengths": lengths,
            "every_ring_full": bool((segments.written == segments.sizes).all())}
        print(f"{env_id}, {n} environment(s): {len(storage):,} transitions held in "
              f"{capacity:,} slots ({storage_bytes:,} bytes of arrays) = "
              f"{storage_bytes / len(storage):,.1f} bytes per transition; "
              f"{len(lengths)} random-policy episodes ended", flush=True)
    state = state_of(env_id, seed)
    scalars = storage.actions.itemsize + storage.rewards.itemsize + storage.dones.itemsize
    found["stack_bytes"] = int(state.nbytes)
    found["pair_bytes"] = {"uint8 state + next_state": 2 * state.nbytes + scalars,
                           "float32 state + next_state": 8 * state.nbytes + scalars}
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    measured = {"capacity": args.capacity, "steps": args.steps, "seed": args.seed,
                "sum_tree_bytes": sum_tree_bytes(args.env_ids[0], args.capacity),
                "games": {env_id: measure(env_id, args.n_envs, args.capacity, args.steps,
                                          args.seed) for env_id in args.env_ids}}
    print(f"PER.Memory's sum and min trees: {measured['sum_tree_bytes']:,} bytes at "
          f"{args.capacity:,} slots")
    for env_id, found in measured["games"].items():
        by_n = found["by_n_envs"]
        first = by_n[str(args.n_envs[0])]["bytes_per_transition"]
        ratios = ", ".join(f"N = {n}: {values['bytes_per_transition'] / first:.3f}x"
                           for n, values in by_n.items())
        print(f"{env_id}: bytes per transition over N = {args.n_envs[0]}'s: {ratios}")
    provenance.write_results(args.results, measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
