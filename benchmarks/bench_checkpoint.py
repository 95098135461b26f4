"""Size on disk and save/load time of a checkpoint with a full Atari replay memory.

    python benchmarks/bench_checkpoint.py                  # Pong, 100,000-transition replay
    python benchmarks/bench_checkpoint.py --memory-size 20000

Builds the Pong agent with the Atari defaults, fills its prioritized replay (FrameStackStorage)
to capacity with real Pong frames from random play, then times `save_checkpoint` and
`load_checkpoint` and prints the size of each file. The checkpoint goes to a temporary directory.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from d3qn_agent import DQNAgent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-name", default="PongNoFrameskip-v4", help="Atari game id")
    parser.add_argument("--memory-size", type=int, default=100_000, help="replay capacity")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as directory:
        agent = DQNAgent(
            args.env_name, memory_size=args.memory_size, model_dir=directory, seed=args.seed
        )
        rng = np.random.default_rng(args.seed)
        print(f"filling the replay with {args.memory_size:,} random-play transitions ...")
        start = time.perf_counter()
        agent.start_episode()
        # memory_size stores fill the ring (FrameStackStorage also spends a few slots per episode
        # on the first frames of the episode, so it holds slightly fewer transitions than slots).
        for _ in range(args.memory_size):
            action = int(rng.integers(agent.action_size))
            next_state, reward, terminated, truncated, _ = agent.env.step(action)
            agent.remember(agent.state, action, reward, next_state, terminated)
            agent.state = next_state
            if terminated or truncated:
                agent.episode += 1
                agent.start_episode()
        print(f"filled in {time.perf_counter() - start:.0f} s")

        tracemalloc.start()
        start = time.perf_counter()
        path = Path(agent.save_checkpoint())
        save_seconds = time.perf_counter() - start
        _, save_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        start = time.perf_counter()
        agent.load_checkpoint(str(path))
        load_seconds = time.perf_counter() - start

        sizes = {file.name: file.stat().st_size for file in sorted(path.iterdir())}
        for name, size in sizes.items():
            print(f"  {name:<20}{size / 1e6:>10.1f} MB")
        total = sum(sizes.values())
        print(f"checkpoint of a {len(agent.MEMORY):,}-transition replay: {total / 1e6:.0f} MB on "
              f"disk, saved in {save_seconds:.1f} s, loaded in {load_seconds:.1f} s; extra "
              f"memory while saving (numpy/Python allocations): {save_peak / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
