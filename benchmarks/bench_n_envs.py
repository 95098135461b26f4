"""Speed with N environments stepped together (N_ENVS), N = 1, 2, 4 and 8 side by side in one run.

Env steps per second and where an env step's time goes at each N, one game at its preset's
replay ratio, with Stable-Baselines3's DQN at the same N and ratio beside them.

    python benchmarks/bench_n_envs.py                                  # MinAtar Breakout
    python benchmarks/bench_n_envs.py --env-name CartPole-v1
    python benchmarks/bench_n_envs.py --env-name PongNoFrameskip-v4
    python benchmarks/bench_n_envs.py --env-name CartPole-v1 --n-envs 1 4 --steps 2048 --no-sb3

One agent per N, each d3qn_agent.py's with the game's preset (CartPole: the defaults; MinAtar: its
family's; Pong: the Atari preset with Pong's own), its `N_ENVS` environments' transitions in one
replay memory, ε at its final value from the start (`EXPLORATION_STEPS` 1, so nearly every step
runs the network to act, as nearly all of a long run does), float32, no checkpoints. Pong's memory
holds 20,000 transitions and learns from 2,000 on (bench_vs_sb3.py's `ATARI` changes: a draw
costs O(log capacity), so the speed barely depends on it). Each agent first runs an untimed
warm-up of `LEARNING_STARTS` + `bench_atari.WARMUP_TRAIN` env steps (its first gradient steps
compile); then `--rounds` rounds, each timing a window of `--steps` env steps of every agent in
turn (N = 1, 2, 4, 8, then SB3's), so a drift of the machine hits them all. Warm-up and window
are rounded up to a whole number of replay periods (TRAIN_FREQUENCY x GRADIENT_STEPS_PER_CALL env
steps) and of loop iterations at every N: each window makes the same gradient steps at each N.

The stopwatches and the loop are bench_atari.py's (`instrument`, `time_round`): every part of the
agent's own `run` (environment, action, store, draw, learn, ...) per env step, an env step being
one environment's step, N of them per loop iteration. "Outside the gradient step" is everything
but `learn`.

SB3's DQN (bench_vs_sb3.py's `sb3_dqn`: the same network, batch, learning rate, memory, target
period and ε, uniform replay and a plain Q head as it ships) steps the same N environments in a
vector (`make_vec_env`). SB3 counts `train_freq` in vector steps of N env steps, so it gets the
train_freq and gradient_steps that make a gradient step every TRAIN_FREQUENCY env steps at every
N (`sb3_train_frequency`); torch uses `--sb3-threads` threads. Without `stable_baselines3`
installed the script says so and measures ours alone, as `--no-sb3` does.

Timed alone (`provenance.time_alone`); every round's figures go to a results file (`--results`),
rendered in docs/benchmarks.md ("Many environments, one memory").
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from d3qn_utils import quiet_startup  # noqa: F401  # isort: skip -- first: before TensorFlow
import d3qn_agent
from benchmarks import bench_atari, bench_vs_sb3, benchmark_tables, provenance, timing
from benchmarks.agent_loop import run_steps, skip_end_of_run
from d3qn_agent import DQNAgent
from d3qn_utils import games, settings

ENV_NAME = "MinAtar/Breakout-v1"  # the game the agents play
N_ENVS = (1, 2, 4, 8)  # the numbers of environments measured side by side
# Timed env steps per window, by family (sized on CartPole, MinAtar Breakout and Pong): with 3
# rounds each of those games' runs takes about 6 minutes on 2 cores, its warm-ups included.
STEPS = {games.CLASSIC.name: 4_096, games.MINATAR.name: 8_192, games.ATARI.name: 320}
SEED = 0  # seeds every agent and its environments


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--env-name", default=ENV_NAME,
                        help="the game (CartPole-v1, MinAtar/Breakout-v1, PongNoFrameskip-v4 "
                             "or another id)")
    parser.add_argument("--n-envs", type=int, nargs="+", default=list(N_ENVS),
                        help="the numbers of environments to measure side by side")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed env steps per window and N (rounded up to whole replay "
                             "periods); default by family: " + ", ".join(
                                 f"{family} {steps:,}" for family, steps in STEPS.items()))
    parser.add_argument("--warmup-train", type=int, default=bench_atari.WARMUP_TRAIN,
                        help="untimed env steps after LEARNING_STARTS before the first window")
    timing.add_rounds_argument(parser)
    parser.add_argument("--seed", type=int, default=SEED, help="random seed")
    parser.add_argument("--no-sb3", dest="sb3", action="store_false",
                        help="measure ours alone, even with Stable-Baselines3 installed")
    parser.add_argument("--sb3-threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads for SB3's DQN")
    provenance.add_results_argument(parser, __file__)
    return parser.parse_args(argv)


def check_n_envs(n_envs: list[int]) -> None:
    """ValueError naming `--n-envs` unless its values are distinct positive integers."""
    if min(n_envs) < 1 or len(set(n_envs)) != len(n_envs):
        raise ValueError(f"--n-envs must be distinct positive integers, got "
                         f"{' '.join(map(str, n_envs))}")


def check(args: argparse.Namespace) -> None:
    """ValueError naming the first bad flag and its value."""
    check_n_envs(args.n_envs)
    for name in ("steps", "sb3_threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.warmup_train < 0:
        raise ValueError(f"--warmup-train must be >= 0, got {args.warmup_train}")


def whole(steps: int, period: int) -> int:
    """`steps` rounded up to a multiple of `period`."""
    return -(-steps // period) * period


def build_agent(env_name: str, n_envs: int, seed: int, work_dir: str) -> DQNAgent:
    """The agent of `env_name`'s preset with `n_envs` environments, as the benchmark times it."""
    changes = bench_vs_sb3.ATARI["changes"] if games.family(env_name) is games.ATARI else {}
    # The preset's budget, rounded up to a multiple of N_ENVS (`run_steps` moves it anyway).
    config, _ = settings.resolve(d3qn_agent, settings.D3QN_FLAGS, settings.d3qn_presets,
                                 {"env_name": env_name, "bfloat16": False, **changes})
    agent = DQNAgent(env_name, seed=seed, n_envs=n_envs, exploration_steps=1, bfloat16=False,
                     total_steps=-(-config.total_steps // n_envs) * n_envs,
                     model_dir=os.path.join(work_dir, str(n_envs)),
                     plot_dir=os.path.join(work_dir, str(n_envs)), checkpoint_every=0,
                     **changes)
    skip_end_of_run(agent)
    return agent


def sb3_speed(model: Any, steps: int) -> float:
    """Env steps/s of SB3's model over `steps` more env steps of its `learn`."""
    before = model.num_timesteps
    start = time.perf_counter()
    model.learn(total_timesteps=steps, reset_num_timesteps=False)
    return (model.num_timesteps - before) / (time.perf_counter() - start)


def print_summary(found: dict[str, Any]) -> None:
    """The medians of the rounds, per N: what the page's table shows."""
    columns = ["env steps/s", *benchmark_tables.N_ENVS_COLUMNS, "outside the gradient step"]
    labels = [*columns, "learn share", *(["SB3 env steps/s"] if found["sb3"] else [])]
    print(f"{'N':>3}  " + "  ".join(labels))
    for n, measured in found["ours"].items():
        figures = benchmark_tables.n_envs_figures(measured)
        cells = [f"{figures[column].median:,.1f}" for column in columns]
        cells.append(f"{figures['learn'].median / figures['total'].median:.0%}")
        if found["sb3"]:
            cells.append(f"{statistics.median(found['sb3'][n]['env_steps_per_second']):,.1f}")
        print(f"{n:>3}  " + "  ".join(f"{cell:>{len(label)}}"
                                      for cell, label in zip(cells, labels, strict=True)))
    print("(µs per env step but the speeds; medians of the rounds)")


def main(argv: list[str] | None = None) -> int:
    """Measure; 2 after one `error:` line for a bad flag, before any timing."""
    args = parse_args(argv)
    timing.check_rounds(args.rounds)
    command = provenance.command_line(None if argv is None else [__file__, *argv])
    with_sb3 = args.sb3 and importlib.util.find_spec("stable_baselines3") is not None
    with tempfile.TemporaryDirectory() as work_dir:
        try:
            check(args)
            agents = {n: build_agent(args.env_name, n, args.seed, work_dir)
                      for n in sorted(args.n_envs)}
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        provenance.time_alone()  # no other timing shares the cores
        print(f"command: {command}")
        print(f"{os.cpu_count()} CPUs, load average before {os.getloadavg()[0]:.2f} (1 min)")
        config = agents[min(agents)].config
        period = math.lcm(config.train_frequency * config.gradient_steps_per_call, *agents)
        warmup = whole(config.learning_starts + args.warmup_train, period)
        steps = whole(STEPS[games.family(args.env_name).name] if args.steps is None
                      else args.steps, period)
        print(f"{args.env_name}: a gradient step every {config.train_frequency} env steps, "
              f"{config.gradient_steps_per_call} per call, batch {config.batch_size}; "
              f"N = {', '.join(map(str, agents))}; {warmup:,} untimed env steps, then "
              f"{args.rounds} round{'s' if args.rounds > 1 else ''} of {steps:,} timed env "
              "steps per N")
        watches = {n: bench_atari.instrument(agent) for n, agent in agents.items()}
        ours = {n: bench_atari.new_measurement(steps, config.gradient_steps_per_call)
                for n in agents}
        for n, agent in agents.items():
            print(f"ours, N = {n}: warm-up in {run_steps(agent, warmup):.0f} s")
        models: dict[int, Any] = {}
        if with_sb3:
            for n in agents:
                models[n] = bench_vs_sb3.sb3_dqn(args.env_name, vars(config), args.seed,
                                                  args.sb3_threads, n_envs=n)
                start = time.perf_counter()
                models[n].learn(total_timesteps=warmup)
                print(f"SB3, N = {n}: warm-up in {time.perf_counter() - start:.0f} s")
        elif args.sb3:
            print("SB3 column skipped: stable_baselines3 is not installed "
                  "(pip install stable-baselines3 with a CPU build of torch)")
        sb3_speeds: dict[int, list[float]] = {n: [] for n in models}
        for round_number in range(args.rounds):  # every agent in turn, a window each
            for n, agent in agents.items():
                bench_atari.time_round(agent, watches[n], ours[n])
            for n, model in models.items():
                sb3_speeds[n].append(sb3_speed(model, steps))
            print(f"round {round_number + 1}: env steps/s " + ", ".join(
                f"N = {n} {ours[n]['steps_per_second'][-1]:,.0f}"
                + (f" (SB3 {sb3_speeds[n][-1]:,.0f})" if models else "") for n in agents))
    print(f"load average after {os.getloadavg()[0]:.2f} (1 min)")
    installed = {name: importlib.metadata.version(name) if importlib.util.find_spec(name)
                 else None for name in ("stable_baselines3", "torch")}
    found = {
        "env_name": args.env_name, "n_envs": list(agents), "steps": steps, "warmup": warmup,
        "rounds": args.rounds, "train_frequency": config.train_frequency,
        "gradient_steps_per_call": config.gradient_steps_per_call,
        "batch_size": config.batch_size, "memory_size": config.memory_size,
        "ours": {str(n): measured for n, measured in ours.items()},
        "sb3": {str(n): {"env_steps_per_second": speeds,
                         "train_freq_and_gradient_steps": bench_vs_sb3.sb3_train_frequency(
                             n, config.train_frequency)}
                for n, speeds in sb3_speeds.items()} or None,
        "sb3_threads": args.sb3_threads if models else None, "versions": installed}
    print_summary(found)
    provenance.write_results(args.results, found, command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
