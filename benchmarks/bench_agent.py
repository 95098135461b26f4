"""Prioritized vs uniform replay for the D3QN agent on CartPole-v1, over several seeds, with
Stable-Baselines3's DQN beside them when it is installed.

    python benchmarks/bench_agent.py                  # seeds 0-4 x {PER, uniform, SB3}
    python benchmarks/bench_agent.py --seeds 5 6 7 --total-steps 20000
    python benchmarks/bench_agent.py --tensorboard    # every run of ours also to runs/bench_agent/

Every run of ours uses d3qn_agent.py's defaults except USE_PER and SEED. SB3's DQN (the peer a
user would pick instead; `pip install stable-baselines3` with a CPU torch) runs with the RL Zoo's
tuned CartPole-v1 hyperparameters. All runs go one after the other in this process (never in
parallel: the timings are part of the result), and all are judged the same way: a greedy
evaluation of EVAL_EPISODES episodes every EVAL_EVERY steps, on the same episode seeds.

Columns: steps to solve is the first evaluation whose mean reaches CartPole-v1's threshold of
475; "held" is the share of the evaluations after that one that stay >= 475; the final
evaluation scores the last network (the one a run ends with), the best the best evaluated one;
training steps/s leaves the evaluation episodes out, and the evaluation share is their part of
the run's wall time. Prints one table row per run, then a summary per variant, and draws the
mean evaluation curve with a min-max band over seeds to plots/per_vs_uniform_CartPole-v1.png.
Models and per-run logs go to a temporary directory; every run's numbers go to a results file
(`--results`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Quiet TensorFlow's start-up lines, as d3qn_agent.py does (keras imports TensorFlow first here).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gymnasium as gym
import keras
import numpy as np
from matplotlib.figure import Figure

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import d3qn_agent
from benchmarks import provenance
from benchmarks.markdown_table import format_row

ROOT = Path(__file__).resolve().parent.parent
ENV_NAME = "CartPole-v1"
VARIANTS = {"PER": True, "uniform": False}  # our variants: label -> USE_PER
SB3 = "SB3 DQN"
SOLVED_SCORE = 475.0  # CartPole-v1's reward threshold
# The RL Zoo's tuned DQN hyperparameters for CartPole-v1 (rl-baselines3-zoo, hyperparams/dqn.yml).
SB3_ZOO_SETTINGS = {
    "learning_rate": 2.3e-3,
    "batch_size": 64,
    "buffer_size": 100_000,
    "learning_starts": 1_000,
    "gamma": 0.99,
    "target_update_interval": 10,
    "train_freq": 256,
    "gradient_steps": 128,
    "exploration_fraction": 0.16,
    "exploration_final_eps": 0.04,
    "policy_kwargs": {"net_arch": [256, 256]},
}


def held_share(eval_means: np.ndarray, solved_score: float) -> float | None:
    """Share of the evaluations after the first one >= `solved_score` that are >= it too.

    None when no evaluation reached it or the first one that did was the last.
    """
    reached = np.flatnonzero(eval_means >= solved_score)
    if reached.size == 0 or reached[0] == eval_means.size - 1:
        return None
    return float(np.mean(eval_means[reached[0] + 1:] >= solved_score))


def result_of(variant: str, seed: int, eval_steps: list[int], eval_means: list[float],
              wall: float, eval_wall: float, steps: int) -> dict:
    """One run's row: the numbers every column and the plot are computed from."""
    means = np.asarray(eval_means)
    reached = np.flatnonzero(means >= SOLVED_SCORE)
    return {
        "variant": variant,
        "seed": seed,
        "solved_at": int(eval_steps[reached[0]]) if reached.size else None,
        "held": held_share(means, SOLVED_SCORE),
        "wall": wall,
        "train_speed": steps / (wall - eval_wall),
        "eval_share": eval_wall / wall,
        "final": float(means[-1]),
        "best": float(means.max()),
        "eval_steps": np.asarray(eval_steps),
        "eval_means": means,
    }


def train_ours(label: str, seed: int, total_steps: int, work_dir: Path,
               tensorboard: str | None = None) -> dict:
    """Train one agent with the defaults of d3qn_agent.py.

    With `tensorboard`, the run logs to TensorBoard in `tensorboard/<label>_seed<seed>`.
    """
    keras.backend.clear_session()  # start every run from an empty Keras graph state
    log_path = work_dir / f"{label}_seed{seed}.log"
    agent = d3qn_agent.DQNAgent(ENV_NAME, use_per=VARIANTS[label], seed=seed,
                                total_steps=total_steps, model_dir=str(work_dir),
                                plot_dir=str(work_dir),
                                tensorboard=tensorboard and f"{tensorboard}/{label}_seed{seed}")
    with log_path.open("w") as log, contextlib.redirect_stdout(log):
        start = time.perf_counter()
        agent.run()
        wall = time.perf_counter() - start
    steps, _, means = zip(*agent.evaluations, strict=True)
    return result_of(label, seed, list(steps), list(means), wall,
                     agent.report.evaluation_seconds, agent.step)


def train_sb3(seed: int, total_steps: int) -> dict:
    """Train Stable-Baselines3's DQN with the Zoo's settings, evaluated on our episode seeds."""
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback

    eval_envs = [gym.make(ENV_NAME) for _ in range(d3qn_agent.EVAL_EPISODES)]

    def evaluate(model: DQN, evaluation: int) -> float:
        """Greedy episodes side by side, seeded as DQNAgent.evaluate seeds its own."""
        states = np.stack([env.reset(seed=d3qn_agent.episode_seed(seed, 1, evaluation, i))[0]
                           for i, env in enumerate(eval_envs)])
        returns = np.zeros(len(eval_envs))
        running = np.ones(len(eval_envs), dtype=bool)
        while running.any():
            actions, _ = model.predict(states, deterministic=True)
            for i in np.flatnonzero(running):
                states[i], reward, terminated, truncated, _ = eval_envs[i].step(actions[i])
                returns[i] += reward
                running[i] = not (terminated or truncated)
        return float(returns.mean())

    class Evaluations(BaseCallback):
        """Every EVAL_EVERY env steps, a timed greedy evaluation (its time is left out)."""

        def __init__(self) -> None:
            super().__init__()
            self.steps: list[int] = []
            self.means: list[float] = []
            self.seconds = 0.0

        def _on_step(self) -> bool:
            if self.num_timesteps % d3qn_agent.EVAL_EVERY == 0:
                start = time.perf_counter()
                self.means.append(evaluate(self.model, len(self.means)))
                self.steps.append(self.num_timesteps)
                self.seconds += time.perf_counter() - start
            return True

    env = gym.make(ENV_NAME)
    env.reset(seed=seed)
    callback = Evaluations()
    start = time.perf_counter()
    model = DQN("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **SB3_ZOO_SETTINGS)
    model.learn(total_timesteps=total_steps, callback=callback)
    wall = time.perf_counter() - start
    return result_of(SB3, seed, callback.steps, callback.means, wall, callback.seconds,
                     total_steps)


def format_held(held: float | None) -> str:
    return "n/a" if held is None else f"{100 * held:.0f} %"


def print_run(result: dict) -> None:
    solved = f"{result['solved_at']:,}" if result["solved_at"] is not None else "not solved"
    print(format_row([result["variant"], str(result["seed"]), solved,
                      format_held(result["held"]), f"{result['wall']:.0f}",
                      f"{result['train_speed']:.0f}", f"{100 * result['eval_share']:.0f} %",
                      f"{result['final']:.1f}", f"{result['best']:.1f}"]), flush=True)


def print_summary(results: list[dict], total_steps: int) -> None:
    """Per variant: solved count, last networks >= 475, median steps to solve (unsolved runs
    count as never), mean held share (over the runs that have one), speed and final score."""
    print()
    print(format_row(["variant", "solved", "last network >= 475", "median steps to solve",
                      "mean held", "mean wall time (s)", "mean training steps/s",
                      "evaluation share", "mean final eval"]))
    print(format_row(["---"] * 9))
    for label in dict.fromkeys(r["variant"] for r in results):
        runs = [r for r in results if r["variant"] == label]
        solve_steps = [r["solved_at"] if r["solved_at"] is not None else np.inf for r in runs]
        median = statistics.median(solve_steps)
        median_text = f"{median:,.0f}" if np.isfinite(median) else f"> {total_steps:,}"
        helds = [r["held"] for r in runs if r["held"] is not None]
        print(format_row([
            label,
            f"{sum(r['solved_at'] is not None for r in runs)}/{len(runs)}",
            f"{sum(r['final'] >= SOLVED_SCORE for r in runs)}/{len(runs)}",
            median_text,
            format_held(float(np.mean(helds)) if helds else None),
            f"{np.mean([r['wall'] for r in runs]):.0f}",
            f"{np.mean([r['train_speed'] for r in runs]):.0f}",
            f"{100 * np.mean([r['eval_share'] for r in runs]):.0f} %",
            f"{np.mean([r['final'] for r in runs]):.1f}",
        ]))


def plot(results: list[dict], path: Path) -> None:
    """Mean greedy-evaluation return over seeds against env steps, min-max band, per variant."""
    figure = Figure(figsize=(9, 5), layout="constrained")
    axes = figure.add_subplot()
    colors = {"PER": "tab:red", "uniform": "tab:blue", SB3: "tab:gray"}
    for label in dict.fromkeys(r["variant"] for r in results):
        runs = [r for r in results if r["variant"] == label]
        steps = runs[0]["eval_steps"]
        curves = np.stack([r["eval_means"] for r in runs])
        axes.plot(steps, curves.mean(axis=0), color=colors[label],
                  label=f"{label}: mean of {len(runs)} seeds")
        axes.fill_between(steps, curves.min(axis=0), curves.max(axis=0), color=colors[label],
                          alpha=0.12, label=f"{label}: min-max over seeds")
    axes.axhline(SOLVED_SCORE, color="black", linestyle="--", label=f"solved ({SOLVED_SCORE:g})")
    axes.set_xlabel("Environment steps")
    axes.set_ylabel(f"Greedy evaluation return (mean of {d3qn_agent.EVAL_EPISODES} episodes)")
    axes.set_title(f"{ENV_NAME}: D3QN with prioritized vs uniform replay (defaults of "
                   "d3qn_agent.py), and SB3's DQN with the RL Zoo's settings", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4],
                        help="seeds to run for every variant")
    parser.add_argument("--total-steps", type=int, default=d3qn_agent.TOTAL_STEPS,
                        help="training budget per run in env steps")
    parser.add_argument("--no-sb3", dest="sb3", action="store_false",
                        help="leave out Stable-Baselines3's DQN even when it is installed")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "plots" / f"per_vs_uniform_{ENV_NAME}.png",
                        help="where to write the comparison plot")
    parser.add_argument("--tensorboard", nargs="?", const="runs/bench_agent", metavar="DIR",
                        help="log every run to TensorBoard under DIR (alone: runs/bench_agent)")
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args()
    provenance.time_alone()  # no other timing shares the cores
    if args.total_steps < 1:
        parser.error(f"--total-steps must be positive, got {args.total_steps}")
    run_sb3 = args.sb3 and importlib.util.find_spec("stable_baselines3") is not None
    print(f"{ENV_NAME}, {args.total_steps:,} steps per run, seeds {args.seeds}, solved = greedy "
          f"mean >= {SOLVED_SCORE:g} over {d3qn_agent.EVAL_EPISODES} episodes, evaluated every "
          f"{d3qn_agent.EVAL_EVERY:,} steps")
    if args.sb3 and not run_sb3:
        print("note: stable-baselines3 is not installed, so its column is skipped "
              "(pip install stable-baselines3, with a CPU build of torch)")
    print(format_row(["variant", "seed", "steps to solve", "held after solving", "wall time (s)",
                      "training steps/s", "evaluation share", "final eval", "best eval"]))
    print(format_row(["---"] * 9))
    results = []
    with tempfile.TemporaryDirectory() as work_dir:
        for seed in args.seeds:
            for label in VARIANTS:
                results.append(train_ours(label, seed, args.total_steps, Path(work_dir),
                                          args.tensorboard))
                print_run(results[-1])
            if run_sb3:
                results.append(train_sb3(seed, args.total_steps))
                print_run(results[-1])
    print_summary(results, args.total_steps)
    plot(results, args.out)
    print(f"\nplot: {os.path.relpath(args.out, ROOT)}")
    provenance.write_results(args.results, {
        "env_name": ENV_NAME, "total_steps": args.total_steps, "solved_score": SOLVED_SCORE,
        "eval_every": d3qn_agent.EVAL_EVERY, "eval_episodes": d3qn_agent.EVAL_EPISODES,
        "sb3_versions": {name: importlib.metadata.version(name) for name in
                         ("stable_baselines3", "torch")} if run_sb3 else None,
        "runs": results})


if __name__ == "__main__":
    main()
