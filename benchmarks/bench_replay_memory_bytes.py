"""Bytes per transition of FrameStackStorage on real Pong transitions, vs storing full stacks.

Fills a small prioritized memory (PER.Memory with a FrameStackStorage) with transitions of a
random policy on the real ALE and measures: the bytes of the storage's arrays per slot, the bytes
of the memory's sum tree (tracemalloc), and how many slots each transition costs (one per step
plus four per episode, from the measured episode lengths). It then extrapolates to a large
memory. The extrapolation is explicit arithmetic: bytes per slot do not depend on capacity, and
the per-episode overhead is taken from the random policy's episode lengths (a trained agent's
Pong episodes are longer, so its overhead is smaller). What it measured goes to a results file
too (`--results`).

Run: python benchmarks/bench_replay_memory_bytes.py [--help]
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import PER
from atari_wrappers import make_env
from benchmarks import provenance
from d3qn_utils.replay_storage import FrameStackStorage

# Hyperparameters (each overridable from the command line).
ENV_ID = "PongNoFrameskip-v4"  # the ALE game whose frames fill the storage
CAPACITY = 3_000  # slots of the measured storage: small, so the run stays short
STEPS = 4_000  # random-policy steps to add: more than CAPACITY, so the ring wraps
TARGET_TRANSITIONS = 1_000_000  # memory size to extrapolate to
BATCH_SIZE = 32  # batch size for the sample() timing
SEED = 0  # seed of the environment and of the random policy


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-id", default=ENV_ID, help="ALE environment id")
    parser.add_argument("--capacity", type=int, default=CAPACITY, help="slots of the storage")
    parser.add_argument("--steps", type=int, default=STEPS, help="random-policy steps to add")
    parser.add_argument("--target-transitions", type=int, default=TARGET_TRANSITIONS,
                        help="memory size (transitions) to extrapolate to")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="sample() batch size")
    parser.add_argument("--seed", type=int, default=SEED, help="environment and policy seed")
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args()
    if args.steps < args.capacity:
        parser.error(f"--steps {args.steps} must be >= --capacity {args.capacity} to fill it")
    return args


def main() -> None:
    args = parse_args()
    env = make_env(args.env_id, seed=args.seed)
    obs, _ = env.reset(seed=args.seed)
    stack_size = obs.shape[-1]
    storage = FrameStackStorage(args.capacity)
    tracemalloc.start()
    memory = PER.Memory(args.capacity, storage=storage, rng=args.seed)
    tree_bytes = tracemalloc.get_traced_memory()[0]  # what the memory allocates beside storage
    tracemalloc.stop()
    episode_lengths, length, store_seconds = [], 0, 0.0
    for _ in range(args.steps):
        action = int(env.action_space.sample())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        start = time.perf_counter()
        memory.store((obs, action, reward, next_obs, terminated))
        store_seconds += time.perf_counter() - start
        length += 1
        if terminated or truncated:
            episode_lengths.append(length)
            length = 0
            obs, _ = env.reset()
        else:
            obs = next_obs
    env.close()

    samples = 100
    start = time.perf_counter()
    for _ in range(samples):
        memory.sample(args.batch_size)
    sample_seconds = (time.perf_counter() - start) / samples

    storage_bytes = sum(array.nbytes for array in storage.state_dict().values())
    bytes_per_slot = storage_bytes / args.capacity
    # Every episode costs its T steps plus `stack_size` slots that hold no transition.
    if episode_lengths:
        mean_length = float(np.mean(episode_lengths))
        length_note = f"mean of {len(episode_lengths)} finished random-policy episodes"
    else:
        mean_length = float(args.steps)
        length_note = "no episode finished: assumed one episode of --steps steps"
    slots_per_transition = (mean_length + stack_size) / mean_length
    bytes_per_transition = bytes_per_slot * slots_per_transition
    target_slots = int(np.ceil(args.target_transitions * slots_per_transition)) + stack_size
    target_bytes = target_slots * bytes_per_slot

    frame_bytes = int(np.prod(obs.shape))  # one uint8 stack
    scalars = storage.actions.itemsize + storage.rewards.itemsize + storage.dones.itemsize
    uint8_pair = 2 * frame_bytes + scalars
    float32_pair = 2 * frame_bytes * 4 + scalars

    print(f"env {args.env_id}, observation {obs.shape} {obs.dtype}, seed {args.seed}")
    print(f"measured: capacity {args.capacity} slots after {args.steps} steps "
          f"(the ring wrapped around), holding {len(storage)} transitions")
    print(f"  storage arrays: {storage_bytes:,} bytes = {bytes_per_slot:,.1f} bytes per slot")
    print(f"  episode length: {mean_length:,.1f} steps ({length_note}) -> "
          f"{slots_per_transition:.4f} slots per transition")
    print(f"  PER.Memory sum tree and bookkeeping: {tree_bytes:,} bytes = "
          f"{tree_bytes / args.capacity:,.1f} bytes per slot (tracemalloc, not included below)")
    print(f"  Memory.store(): {store_seconds / args.steps * 1e6:,.1f} us per transition; "
          f"Memory.sample({args.batch_size}): {sample_seconds * 1e3:,.2f} ms")
    print("bytes per transition (array data only):")
    print(f"  FrameStackStorage            {bytes_per_transition:>10,.0f}")
    print(f"  uint8 state + next_state     {uint8_pair:>10,}  "
          f"({uint8_pair / bytes_per_transition:.1f}x)")
    print(f"  float32 state + next_state   {float32_pair:>10,}  "
          f"({float32_pair / bytes_per_transition:.1f}x, the notebook's layout)")
    print(f"extrapolated (arithmetic, not measured) to {args.target_transitions:,} transitions:")
    print(f"  FrameStackStorage            {target_bytes / 1e9:>8.2f} GB ({target_slots:,} slots)")
    print(f"  uint8 state + next_state     {args.target_transitions * uint8_pair / 1e9:>8.2f} GB")
    print(f"  float32 state + next_state   {args.target_transitions * float32_pair / 1e9:>8.2f} GB")
    print(f"  PER.Memory sum tree          {tree_bytes / args.capacity * target_slots / 1e9:>8.2f}"
          " GB more (same for any storage)")
    provenance.write_results(args.results, {
        "env_id": args.env_id, "capacity": args.capacity, "steps": args.steps, "seed": args.seed,
        "storage_bytes": storage_bytes, "sum_tree_bytes": tree_bytes,
        "episode_lengths": episode_lengths, "slots_per_transition": slots_per_transition,
        "bytes_per_transition": {"FrameStackStorage": bytes_per_transition,
                                 "uint8 state + next_state": uint8_pair,
                                 "float32 state + next_state": float32_pair},
        "store_seconds_per_transition": store_seconds / args.steps,
        "sample_seconds": {str(args.batch_size): sample_seconds}})


if __name__ == "__main__":
    main()
