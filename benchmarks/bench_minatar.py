"""MinAtar training speed: env steps/s of the D3QN agent and of Stable-Baselines3's DQN with the
same network and update ratio, side by side in one run, and what a 2M-frame run costs each.

    python benchmarks/bench_minatar.py                                  # Breakout, both agents
    python benchmarks/bench_minatar.py --env-name MinAtar/SpaceInvaders-v1 --steps 40000
    python benchmarks/bench_atari.py --env-name MinAtar/Breakout-v1 --train-frequency 4 \\
        --before none --steps 20000                       # where our agent's step time goes

Both agents train with the MinAtar preset (settings.MINATAR_PRESET): batch 32, a gradient step
every 4 env steps, a target copy every 1,000, replay 100,000, Adam 1e-4, on the MinAtar paper's
network (1/255, conv 16 3x3, dense 128). Ours has its dueling head, double-DQN targets, 3-step
returns and prioritized replay; SB3's DQN a linear Q head and uniform replay, as it ships (its
replay has no PER). Epsilon is at the preset's final 0.1 from the start, so ~90% of the steps run
the network to act, as in nearly all of a 2M-frame run. Each agent first runs WARMUP untimed
steps, which fill its replay past LEARNING_STARTS and trace its graphs; then STEPS timed steps.
SB3 runs on torch, once with one thread and once with one per core (torch.set_num_threads; on
a shared CPU its two threads can be several times slower than one), and its faster run counts;
it plays the same environment (`minatar_wrappers.make_env`; SB3 moves the channels first and
scales by 1/255 itself).

SB3 is the optional column: without `stable_baselines3` (and torch) installed the script says so
and measures ours alone. The 2-core CPU may be shared: the load average is printed with the
numbers, and the ratio is the claim (both measured in this one run, one after the other).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import quiet_startup  # isort: skip  # noqa: F401 -- before TensorFlow, to filter its start-up lines
from agent_loop import run_steps, skip_end_of_run

import settings
from d3qn_agent import DQNAgent
from minatar_wrappers import make_env

ENV_NAME = "MinAtar/Breakout-v1"  # the MinAtar game both agents play
STEPS = 20_000  # timed env steps per agent
WARMUP = 6_000  # untimed steps first: past the preset's LEARNING_STARTS (5,000), graphs traced
SEED = 0  # seeds both agents and their environments
BUDGET = 2_000_000  # the run whose time the speeds project (the MinAtar study's budget)
PRESET = settings.MINATAR_PRESET


def measure_ours(env_name: str, steps: int, warmup: int, seed: int) -> float:
    """Env steps/s of d3qn_agent.py's own training loop on `env_name` (MinAtar preset)."""
    with tempfile.TemporaryDirectory() as work_dir:
        agent = DQNAgent(env_name, seed=seed, exploration_steps=1, model_dir=work_dir,
                         plot_dir=work_dir)
        skip_end_of_run(agent)
        run_steps(agent, warmup)
        return steps / run_steps(agent, steps)


def measure_sb3(env_name: str, steps: int, warmup: int, seed: int, threads: int) -> float:
    """Env steps/s of Stable-Baselines3's DQN on `env_name` with the same network and ratio,
    torch using `threads` threads."""
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class MinAtarTorso(BaseFeaturesExtractor):
        """The MinAtar paper's torso: conv 16 3x3 stride 1, dense 128 (SB3 scales by 1/255)."""

        def __init__(self, observation_space: object, features_dim: int = 128) -> None:
            super().__init__(observation_space, features_dim)
            channels, rows, cols = observation_space.shape  # SB3 put the channels first
            self.net = torch.nn.Sequential(
                torch.nn.Conv2d(channels, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                torch.nn.Linear(16 * (rows - 2) * (cols - 2), features_dim), torch.nn.ReLU())

        def forward(self, observations: torch.Tensor) -> torch.Tensor:
            return self.net(observations)

    torch.set_num_threads(threads)
    epsilon = PRESET["epsilon_min"]
    model = DQN(
        "CnnPolicy", make_env(env_name), learning_rate=PRESET["learning_rate"],
        buffer_size=PRESET["memory_size"], learning_starts=PRESET["learning_starts"],
        batch_size=PRESET["batch_size"], gamma=0.99, train_freq=PRESET["train_frequency"],
        gradient_steps=1, target_update_interval=PRESET["target_update"],
        exploration_initial_eps=epsilon, exploration_final_eps=epsilon,
        policy_kwargs={"features_extractor_class": MinAtarTorso, "net_arch": []},
        seed=seed, device="cpu", verbose=0)
    model.learn(total_timesteps=warmup)
    start = time.perf_counter()
    model.learn(total_timesteps=steps, reset_num_timesteps=False)
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--env-name", default=ENV_NAME, help="a MinAtar id")
    parser.add_argument("--steps", type=int, default=STEPS, help="timed env steps per agent")
    parser.add_argument("--warmup", type=int, default=WARMUP, help="untimed env steps first")
    parser.add_argument("--seed", type=int, default=SEED, help="random seed")
    parser.add_argument("--no-sb3", dest="sb3", action="store_false",
                        help="measure ours alone, even with Stable-Baselines3 installed")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup <= PRESET["learning_starts"]:
        parser.error(f"--steps must be >= 1 and --warmup > {PRESET['learning_starts']} (the "
                     f"preset's learning_starts), got {args.steps} and {args.warmup}")
    print("command: python " + shlex.join(sys.argv))
    print(f"{os.cpu_count()} CPUs, load average before {os.getloadavg()[0]:.2f} (1 min)")
    speeds = {"ours (d3qn_agent.py)": measure_ours(args.env_name, args.steps, args.warmup,
                                                   args.seed)}
    has_sb3 = importlib.util.find_spec("stable_baselines3") is not None
    if args.sb3 and has_sb3:
        for threads in sorted({1, os.cpu_count() or 1}):
            speeds[f"SB3 DQN, {threads} thread{'s' if threads > 1 else ''}"] = measure_sb3(
                args.env_name, args.steps, args.warmup, args.seed, threads)
    elif args.sb3:
        print("SB3 column skipped: stable_baselines3 is not installed "
              "(pip install stable-baselines3 with a CPU build of torch)")
    print(f"load average after {os.getloadavg()[0]:.2f} (1 min)")
    print(f"{args.env_name}, {args.steps:,} timed env steps each after {args.warmup:,} untimed")
    print(f"{'agent':<22} {'env steps/s':>12} {'a 2M-frame run':>15}")
    for agent, speed in speeds.items():
        print(f"{agent:<22} {speed:12,.0f} {BUDGET / speed / 60:12.1f} min")
    ours, *sb3 = speeds.values()
    if sb3:
        print(f"ours / SB3 (its faster run): {ours / max(sb3):.2f}x")


if __name__ == "__main__":
    main()
