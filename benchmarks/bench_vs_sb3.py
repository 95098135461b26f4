"""Training speed against Stable-Baselines3: env steps/s of the D3QN agent and of SB3's DQN with
the same network and update ratio, side by side in one run, on MinAtar or Atari Pong. For Pong
this is THE speed of the documented preset (bench_atari.py shows where its time goes).

    python benchmarks/bench_vs_sb3.py                                   # MinAtar Breakout
    python benchmarks/bench_vs_sb3.py --env-name MinAtar/SpaceInvaders-v1 --steps 40000
    python benchmarks/bench_vs_sb3.py --env-name PongNoFrameskip-v4 --rounds 3 --bfloat16
    python benchmarks/bench_atari.py --env-name MinAtar/Breakout-v1 --train-frequency 4 \\
        --before none --steps 20000                       # where our agent's step time goes

Both agents train with the game's preset values (games.MINATAR's, or for an Atari id
games.ATARI's with the game's own, as `python d3qn_agent.py --env-name GAME` runs it): batch 32,
a gradient step every 4 env steps (Pong: every 2), a target copy every 1,000, Adam 1e-4,
on the same network: MinAtar's (1/255, conv 16 3x3, dense 128) or the Nature DQN's (1/255, conv
32 8x8/4, 64 4x4/2, 64 3x3/1, dense 512, SB3's own `NatureCNN`). Ours has its dueling head,
double-DQN targets, 3-step returns (Atari) and prioritized replay; SB3's DQN a linear Q head and
uniform replay, as it ships (its replay has no PER). Epsilon is at the preset's final value (0.1
MinAtar, 0.01 Atari) from the start, so nearly every step runs the network to act, as in nearly
all of a long run. Each agent first runs `--warmup` untimed steps, which fill its replay past
`learning_starts` and trace its graphs; then `--steps` timed steps. For Pong, whose frames are
large, the replay holds 20,000 transitions and learning starts at 2,000 (the preset: 100,000 and
10,000; sampling costs O(log N), so the speed barely depends on it). SB3 runs on torch, once with
one thread and once with one per core (torch.set_num_threads; on a shared CPU two threads can
be the slower), and its faster run counts; it plays the same environment
(`games.make_env`; SB3 moves the channels first and scales by 1/255 itself).

Ours takes the preset's gradient steps per compiled call (MinAtar's 64: between two calls it
acts with a network up to 255 env steps old), SB3's DQN one per train(). Where the preset takes
more than one, ours also runs at `--gradient-steps-per-call 1` (ONE_PER_CALL) in the same rounds,
and only a row of ours at one per call is compared with SB3, like for like; the results file
records each row's gradient steps per call.

Ours runs in float32, as the Pong preset does on a CPU without bfloat16 units; `--bfloat16` adds
ours with BFLOAT16 (its convolutions in bfloat16, games.nature_torso: the Pong preset's choice on
AVX512_BF16 or AMX where it times faster) as one more agent of each round; SB3 stays in float32,
as it ships.

`--rounds N` (default 3) measures the agents N times, alternating (ours, SB3, ours, SB3, ...),
and the median of each agent's rounds counts: a drift of the machine hits both. SB3 is the
optional column: without `stable_baselines3` (and torch) installed the script says so and
measures ours alone.
The load average is printed with the numbers (the script times alone: `provenance.time_alone`),
and the ratio is the claim (both measured in this one run). Every round's speeds go to a results
file (`--results`), with torch's and SB3's versions.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from d3qn_utils import quiet_startup  # noqa: F401  # isort: skip -- first: before TensorFlow
from benchmarks import provenance, timing
from benchmarks.agent_loop import run_steps, skip_end_of_run
from d3qn_agent import DQNAgent
from d3qn_utils import games
from d3qn_utils.games import make_env

ENV_NAME = "MinAtar/Breakout-v1"  # the game both agents play
SEED = 0  # seeds both agents and their environments
# Ours at one gradient step per compiled call, as SB3's DQN takes one per train(): the row a
# ratio against SB3 compares like for like where the preset takes more per call (MinAtar: 64).
ONE_PER_CALL = "ours, float32, --gradient-steps-per-call 1"
# Per kind of game: timed steps, untimed warm-up steps, the run a speed projects to (frames),
# and the values that differ from the preset for a short benchmark (none for MinAtar).
MINATAR = {"steps": 20_000, "warmup": 6_000, "budget": 2_000_000, "changes": {}}
ATARI = {"steps": 2_000, "warmup": 3_000, "budget": 500_000,
         "changes": {"memory_size": 20_000, "learning_starts": 2_000}}


def game_settings(env_name: str) -> tuple[dict, dict]:
    """(the preset both agents train with, the benchmark's steps) for `env_name`: an Atari
    game's own preset over the Atari one (Pong's: a gradient step every 2 env steps)."""
    family = games.family(env_name)
    if family is games.MINATAR:
        return family.preset, MINATAR
    return {**family.preset, **family.game_presets.get(env_name, {}), **ATARI["changes"]}, ATARI


def measure_ours(env_name: str, steps: int, warmup: int, seed: int, bfloat16: bool = False,
                 gradient_steps_per_call: int | None = None) -> float:
    """Env steps/s of d3qn_agent.py's own training loop on `env_name` (its preset), with its
    convolutions in bfloat16 if `bfloat16`, with `gradient_steps_per_call` where given."""
    changes = game_settings(env_name)[1]["changes"]
    if gradient_steps_per_call is not None:
        changes = {**changes, "gradient_steps_per_call": gradient_steps_per_call}
    with tempfile.TemporaryDirectory() as work_dir:
        agent = DQNAgent(env_name, seed=seed, exploration_steps=1, bfloat16=bfloat16,
                         model_dir=work_dir, plot_dir=work_dir, checkpoint_every=0, **changes)
        skip_end_of_run(agent)
        run_steps(agent, warmup)
        return steps / run_steps(agent, steps)


def measure_sb3(env_name: str, steps: int, warmup: int, seed: int, threads: int) -> float:
    """Env steps/s of Stable-Baselines3's DQN on `env_name` with the same network and ratio,
    torch using `threads` threads."""
    model = sb3_dqn(env_name, game_settings(env_name)[0], seed, threads)
    model.learn(total_timesteps=warmup)
    start = time.perf_counter()
    model.learn(total_timesteps=steps, reset_num_timesteps=False)
    return steps / (time.perf_counter() - start)


def sb3_train_frequency(n_envs: int, train_frequency: int) -> tuple[int, int]:
    """SB3's (train_freq, gradient_steps) that make a gradient step every `train_frequency` env
    steps with `n_envs` environments: SB3 counts train_freq in vector steps of n_envs env steps
    each, so gradient_steps / (train_freq * n_envs) = 1 / train_frequency, in whole numbers."""
    common = math.gcd(n_envs, train_frequency)
    return train_frequency // common, n_envs // common


def sb3_dqn(env_name: str, preset: dict[str, Any], seed: int, threads: int, n_envs: int = 1) -> Any:
    """Stable-Baselines3's DQN for `env_name` with `preset`'s values and the network ours has:
    MinAtar's or the Nature DQN's torso for images, `preset["hidden_units"]` for vector states;
    on `n_envs` environments stepped together (a gradient step every TRAIN_FREQUENCY env steps
    whatever their number: `sb3_train_frequency`), torch using `threads` threads."""
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env
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
    family = games.family(env_name)
    if family.torso is None:  # vector states: the MLP
        policy, policy_kwargs = "MlpPolicy", {"net_arch": list(preset["hidden_units"])}
    else:  # the Nature DQN torso is SB3's default for images (NatureCNN); no hidden layer after
        policy, policy_kwargs = "CnnPolicy", {"net_arch": []}
        if family is games.MINATAR:
            policy_kwargs["features_extractor_class"] = MinAtarTorso
    env = make_env(env_name) if n_envs == 1 else make_vec_env(
        functools.partial(make_env, env_name), n_envs=n_envs, seed=seed)
    train_freq, gradient_steps = sb3_train_frequency(n_envs, preset["train_frequency"])
    epsilon = preset["epsilon_min"]
    return DQN(
        policy, env, learning_rate=preset["learning_rate"],
        buffer_size=preset["memory_size"], learning_starts=preset["learning_starts"],
        batch_size=preset["batch_size"], gamma=preset.get("gamma", 0.99), train_freq=train_freq,
        gradient_steps=gradient_steps, target_update_interval=preset["target_update"],
        exploration_initial_eps=epsilon, exploration_final_eps=epsilon,
        policy_kwargs=policy_kwargs, seed=seed, device="cpu", verbose=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--env-name", default=ENV_NAME, help="a MinAtar or Atari id")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"timed env steps per agent (MinAtar {MINATAR['steps']:,}, Atari "
                             f"{ATARI['steps']:,})")
    parser.add_argument("--warmup", type=int, default=None,
                        help=f"untimed env steps first (MinAtar {MINATAR['warmup']:,}, Atari "
                             f"{ATARI['warmup']:,})")
    timing.add_rounds_argument(parser)
    parser.add_argument("--seed", type=int, default=SEED, help="random seed")
    parser.add_argument("--bfloat16", action="store_true",
                        help="also measure ours with BFLOAT16 (its convolutions in bfloat16)")
    parser.add_argument("--no-sb3", dest="sb3", action="store_false",
                        help="measure ours alone, even with Stable-Baselines3 installed")
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args()
    provenance.time_alone()  # no other timing shares the cores
    preset, bench = game_settings(args.env_name)
    steps = bench["steps"] if args.steps is None else args.steps
    warmup = bench["warmup"] if args.warmup is None else args.warmup
    if steps < 1 or warmup <= preset["learning_starts"] or args.rounds < 1:
        parser.error(f"--steps and --rounds must be >= 1 and --warmup > "
                     f"{preset['learning_starts']} (learning_starts), got {steps}, "
                     f"{args.rounds} and {warmup}")
    print("command: python " + shlex.join(sys.argv))
    load_before = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average before {load_before[0]:.2f} (1 min)")
    agents = {"ours, float32": lambda: measure_ours(args.env_name, steps, warmup, args.seed)}
    # Each of ours' gradient steps per compiled call; SB3's DQN takes 1 per train().
    per_call = {"ours, float32": preset["gradient_steps_per_call"]}
    if per_call["ours, float32"] != 1:  # the preset shares a call: ours at 1 too, like for like
        agents[ONE_PER_CALL] = lambda: measure_ours(args.env_name, steps, warmup, args.seed,
                                                    gradient_steps_per_call=1)
        per_call[ONE_PER_CALL] = 1
    if args.bfloat16:
        agents["ours, bfloat16 convs"] = lambda: measure_ours(args.env_name, steps, warmup,
                                                              args.seed, bfloat16=True)
        per_call["ours, bfloat16 convs"] = preset["gradient_steps_per_call"]
    if args.sb3 and importlib.util.find_spec("stable_baselines3") is not None:
        for threads in sorted({1, os.cpu_count() or 1}):
            agents[f"SB3 DQN, {threads} thread{'s' if threads > 1 else ''}"] = (
                lambda threads=threads: measure_sb3(args.env_name, steps, warmup, args.seed,
                                                    threads))
    elif args.sb3:
        print("SB3 column skipped: stable_baselines3 is not installed "
              "(pip install stable-baselines3 with a CPU build of torch)")
    speeds: dict[str, list[float]] = {agent: [] for agent in agents}
    for _ in range(args.rounds):
        for agent, measure in agents.items():
            speeds[agent].append(measure())
    load_after = os.getloadavg()
    print(f"load average after {load_after[0]:.2f} (1 min)")
    print(f"{args.env_name}, {steps:,} timed env steps each after {warmup:,} untimed, "
          f"{args.rounds} round{'s' if args.rounds > 1 else ''}")
    budget = bench["budget"]
    print(f"{'agent':<22} {'env steps/s':>12} {'rounds':>18} {f'a {budget:,}-step run':>20}")
    medians = {agent: statistics.median(rounds) for agent, rounds in speeds.items()}
    for agent, rounds in speeds.items():
        each = " ".join(f"{speed:,.0f}" for speed in rounds)
        print(f"{agent:<22} {medians[agent]:12,.1f} {each:>18} "
              f"{budget / medians[agent] / 60:16.1f} min")
    sb3 = [speed for agent, speed in medians.items() if agent.startswith("SB3")]
    for agent, steps_per_call in per_call.items():
        if sb3 and steps_per_call == 1:  # like for like: one gradient step per call each
            print(f"{agent} / SB3 (its faster run): {medians[agent] / max(sb3):.2f}x")
    installed = {name: importlib.metadata.version(name) if importlib.util.find_spec(name)
                 else None for name in ("stable_baselines3", "torch")}
    provenance.write_results(args.results, {
        "env_name": args.env_name, "steps": steps, "warmup": warmup, "rounds": args.rounds,
        "env_steps_per_second": speeds, "gradient_steps_per_call": per_call, "versions": installed})


if __name__ == "__main__":
    main()
