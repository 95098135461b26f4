"""Is GRADIENT_STEPS_PER_CALL worth what it changes? Each game's training speed at one gradient
step per compiled call (the tutorial's sample, fit, update) and at its preset's K, on TensorFlow
and JAX, side by side in one run.

    python benchmarks/bench_steps_per_call.py                      # every game below, both backends
    python benchmarks/bench_steps_per_call.py --games CartPole-v1 --backends tensorflow

K steps per call are K minibatches sampled at once, trained in one compiled call, then their
priorities written back: a minibatch's priorities are up to K - 1 gradient steps old when it is
drawn, and β's importance-sampling weights correct for the distribution at the sampling. A game's
preset keeps K > 1 only where it trains at least GAIN_NEEDED faster (docs/benchmarks.md).

Each backend runs in a subprocess of its own (Keras picks its backend once per process). There,
per game, two agents of the game's own preset differ only in GRADIENT_STEPS_PER_CALL (1 and K).
Both are warmed up past LEARNING_STARTS and their first compiled calls, then their own training
loops (`agent_loop.run_steps`: act, env.step, remember, replay) take turns for ROUNDS windows of
WINDOW agent steps each, so a drift of the machine hits both. Evaluations and checkpoints are off
and ε is at its final value from the start (`--exploration-steps 1`): nearly every step runs the
network to act, as nearly all of a long run's steps do. Agent steps/s per window, and the gain of
the medians, go to a results file (`--results`). The script times alone (`provenance.time_alone`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import provenance
from benchmarks.agent_loop import run_steps, skip_end_of_run

# The games the pages report (MinAtar's five share one preset and network: Breakout stands for
# them); Pong's preset already makes one gradient step per call.
GAMES = ("CartPole-v1", "Acrobot-v1", "LunarLander-v3", "MountainCar-v0", "MinAtar/Breakout-v1")
BACKENDS = ("tensorflow", "jax")
WINDOW = 4096  # agent steps a window: a multiple of every preset's train_frequency x K
ROUNDS = 3  # windows per agent, taking turns
GAIN_NEEDED = 0.15  # how much faster K per call must train for a preset to keep K > 1


def measure(game: str, window: int, rounds: int) -> dict:
    """This process's backend on `game`: agent steps/s of each window at 1 and at K per call."""
    from d3qn_agent import DQNAgent

    with tempfile.TemporaryDirectory() as work_dir:
        flags = dict(eval_every=10**9, checkpoint_every=0, exploration_steps=1,
                     model_dir=work_dir, plot_dir=work_dir)
        preset = DQNAgent(game, **flags).config.gradient_steps_per_call
        agents = {1: DQNAgent(game, gradient_steps_per_call=1, **flags),
                  preset: DQNAgent(game, gradient_steps_per_call=preset, **flags)}
        speeds: dict[int, list[float]] = {steps: [] for steps in agents}
        for agent in agents.values():
            skip_end_of_run(agent)
            period = agent.config.train_frequency * preset
            if window % period:
                raise ValueError(f"--window {window} is not a multiple of {game}'s "
                                 f"{agent.config.train_frequency} x {preset} steps per call")
            run_steps(agent, agent.config.learning_starts + 2 * period)  # the compiles too
        for _ in range(rounds):
            for steps, agent in agents.items():
                speeds[steps].append(window / run_steps(agent, window))
    return {"preset": preset, "steps_per_second": speeds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", nargs="+", default=list(GAMES))
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--window", type=int, default=WINDOW)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the game a subprocess measures
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.window, args.rounds)))
        return
    provenance.time_alone()  # no other timing shares the cores; its children time under it
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (1 min)")
    print("| game | backend | K | agent steps/s at 1 per call | at K per call | gain |")
    print("|---|---|---|---|---|---|")
    measured: dict = {"window": args.window, "rounds": args.rounds,
                      "gain_needed": GAIN_NEEDED, "games": {}}
    for game in args.games:
        for backend in args.backends:
            child = subprocess.run(
                [sys.executable, __file__, "--child", game, "--window", str(args.window),
                 "--rounds", str(args.rounds)], env={**os.environ, "KERAS_BACKEND": backend},
                capture_output=True, text=True)
            if child.returncode != 0:
                raise RuntimeError(f"{game} on {backend} failed:\n{child.stderr[-2000:]}")
            found = json.loads(child.stdout.strip().splitlines()[-1])
            measured["games"].setdefault(game, {})[backend] = found
            one, several = (statistics.median(found["steps_per_second"][str(steps)])
                            for steps in (1, found["preset"]))
            print(f"| {game} | {backend} | {found['preset']} | {one:,.0f} | {several:,.0f} | "
                  f"{several / one - 1:+.0%} |", flush=True)
    provenance.write_results(args.results, measured)


if __name__ == "__main__":
    main()
