"""Size on disk and save/load time of a checkpoint with a full Atari replay memory.

    python benchmarks/bench_checkpoint.py                  # Pong, 100,000-transition replay
    python benchmarks/bench_checkpoint.py --memory-size 20000

Builds the Pong agent with the Atari defaults, fills its prioritized replay (PER.Memory over a
replay_storage.FrameStackStorage) to capacity with real Pong frames from random play through the
agent's own loop, then times `agent.save_checkpoint` and `agent.resume` (which includes
replaying the episode in progress) in turn, `--rounds` times, and prints the size of each file.
The checkpoint goes to a temporary directory, every round's times to a results file
(`--results`).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import provenance, timing
from benchmarks.agent_loop import run_steps, skip_end_of_run
from d3qn_agent import DQNAgent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-name", default="PongNoFrameskip-v4", help="Atari game id")
    parser.add_argument("--memory-size", type=int, default=100_000, help="replay capacity")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    timing.add_rounds_argument(parser)
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args()
    timing.check_rounds(args.rounds)
    provenance.time_alone()  # no other timing shares the cores

    with tempfile.TemporaryDirectory() as directory:
        # Random play through the agent's own loop (no learning, no evaluation), so that the
        # checkpoint also holds a real episode in progress to replay on loading.
        never = 10**12
        agent = DQNAgent(
            args.env_name, memory_size=args.memory_size, model_dir=directory, seed=args.seed,
            total_steps=args.memory_size, exploration_steps=never, learning_starts=never,
            eval_every=never, plot_dir=directory, checkpoint_every=0,
        )
        skip_end_of_run(agent)
        print(f"filling the replay with {args.memory_size:,} random-play transitions ...")
        fill_seconds = run_steps(agent, args.memory_size)
        print(f"filled in {fill_seconds:.0f} s")

        save_seconds, load_seconds, save_peak = [], [], 0
        for _ in range(args.rounds):  # saving and loading take turns
            tracemalloc.start()
            start = time.perf_counter()
            path = Path(agent.save_checkpoint())
            save_seconds.append(time.perf_counter() - start)
            save_peak = max(save_peak, tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
            start = time.perf_counter()
            agent.resume(str(path))
            load_seconds.append(time.perf_counter() - start)
            sizes = {file.name: file.stat().st_size for file in sorted(path.iterdir())}
            shutil.rmtree(path)  # a checkpoint of this step is kept as it is: save it anew

        for name, size in sizes.items():
            print(f"  {name:<20}{size / 1e6:>10.1f} MB")
        total = sum(sizes.values())
        print(f"checkpoint of a {len(agent.MEMORY):,}-transition replay: {total / 1e6:.0f} MB on "
              f"disk, saved in {statistics.median(save_seconds):.1f} s, loaded in "
              f"{statistics.median(load_seconds):.1f} s (medians of {args.rounds}); extra "
              f"memory while saving (numpy/Python allocations): {save_peak / 1e6:.0f} MB")
        transitions = len(agent.MEMORY)
    provenance.write_results(args.results, {
        "env_name": args.env_name, "memory_size": args.memory_size, "seed": args.seed,
        "transitions": transitions, "fill_seconds": fill_seconds, "file_bytes": sizes,
        "save_seconds": save_seconds, "load_seconds": load_seconds,
        "save_peak_allocated_bytes": save_peak})


if __name__ == "__main__":
    main()
