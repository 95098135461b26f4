"""Prioritized vs uniform replay for the D3QN agent on CartPole-v1, over several seeds.

    python benchmarks/bench_agent.py                  # 5 seeds x {PER, uniform}, as in the README
    python benchmarks/bench_agent.py --seeds 2 --total-steps 20000
    python benchmarks/bench_agent.py --tensorboard    # every run also to runs/bench_agent/

Every run uses d3qn_agent.py's defaults except USE_PER and SEED, and runs in this process one
after the other (never in parallel: the timings are part of the result). A run counts as solved
at the first greedy evaluation (EVAL_EPISODES episodes, every EVAL_EVERY steps) whose mean return
reaches CartPole-v1's threshold of 475. Prints one table row per run, then a summary per variant,
and draws the mean evaluation curve with a min-max band over seeds to
plots/per_vs_uniform_CartPole-v1.png. Models and per-run logs go to a temporary directory.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Quiet TensorFlow's start-up lines, as d3qn_agent.py does (keras imports TensorFlow first here).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
from matplotlib.figure import Figure

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import d3qn_agent

ROOT = Path(__file__).resolve().parent.parent
ENV_NAME = "CartPole-v1"
VARIANTS = {"PER": True, "uniform": False}  # label -> USE_PER
SOLVED_SCORE = 475.0  # CartPole-v1's reward threshold


def train_once(label: str, seed: int, total_steps: int, work_dir: Path,
               tensorboard: str | None = None) -> dict:
    """Train one agent with the defaults; return its numbers and evaluation curve.

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
    return {
        "variant": label,
        "seed": seed,
        "solved_at": agent.steps_to_solve,
        "wall": wall,
        "speed": agent.step / wall,
        "final": means[-1],
        "best": agent.best_evaluation,
        "eval_steps": np.array(steps),
        "eval_means": np.array(means),
    }


def format_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def print_run(result: dict) -> None:
    solved = f"{result['solved_at']:,}" if result["solved_at"] is not None else "not solved"
    print(format_row([result["variant"], str(result["seed"]), solved, f"{result['wall']:.0f}",
                      f"{result['speed']:.0f}", f"{result['final']:.1f}",
                      f"{result['best']:.1f}"]), flush=True)


def print_summary(results: list[dict], total_steps: int) -> None:
    """Per variant: solved count, median steps to solve (unsolved runs count as never)."""
    print()
    print(format_row(["variant", "solved", "median steps to solve", "mean wall time (s)",
                      "mean env steps/s", "mean final eval"]))
    print(format_row(["---"] * 6))
    for label in VARIANTS:
        runs = [r for r in results if r["variant"] == label]
        solve_steps = [r["solved_at"] if r["solved_at"] is not None else np.inf for r in runs]
        median = statistics.median(solve_steps)
        median_text = f"{median:,.0f}" if np.isfinite(median) else f"> {total_steps:,}"
        print(format_row([
            label,
            f"{sum(r['solved_at'] is not None for r in runs)}/{len(runs)}",
            median_text,
            f"{np.mean([r['wall'] for r in runs]):.0f}",
            f"{np.mean([r['speed'] for r in runs]):.0f}",
            f"{np.mean([r['final'] for r in runs]):.1f}",
        ]))


def plot(results: list[dict], path: Path, solved_score: float) -> None:
    """Mean greedy-evaluation return over seeds against env steps, min-max band, per variant."""
    figure = Figure(figsize=(9, 5), layout="constrained")
    axes = figure.add_subplot()
    for (label, color) in zip(VARIANTS, ("tab:red", "tab:blue"), strict=True):
        runs = [r for r in results if r["variant"] == label]
        steps = runs[0]["eval_steps"]
        curves = np.stack([r["eval_means"] for r in runs])
        axes.plot(steps, curves.mean(axis=0), color=color,
                  label=f"{label}: mean of {len(runs)} seeds")
        axes.fill_between(steps, curves.min(axis=0), curves.max(axis=0), color=color,
                          alpha=0.15, label=f"{label}: min-max over seeds")
    axes.axhline(solved_score, color="gray", linestyle="--", label=f"solved ({solved_score:g})")
    axes.set_xlabel("Environment steps")
    axes.set_ylabel(f"Greedy evaluation return (mean of {d3qn_agent.EVAL_EPISODES} episodes)")
    axes.set_title(f"{ENV_NAME}: D3QN with prioritized vs uniform replay "
                   "(double DQN, dueling, defaults of d3qn_agent.py)", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0 .. N-1 per variant")
    parser.add_argument("--total-steps", type=int, default=d3qn_agent.TOTAL_STEPS,
                        help="training budget per run in env steps")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "plots" / f"per_vs_uniform_{ENV_NAME}.png",
                        help="where to write the comparison plot")
    parser.add_argument("--tensorboard", nargs="?", const="runs/bench_agent", metavar="DIR",
                        help="log every run to TensorBoard under DIR (alone: runs/bench_agent)")
    args = parser.parse_args()
    if args.seeds < 1 or args.total_steps < 1:
        parser.error(f"--seeds and --total-steps must be positive, got {args.seeds} and "
                     f"{args.total_steps}")

    print(f"{ENV_NAME}, {args.total_steps:,} steps per run, seeds 0..{args.seeds - 1}, "
          f"solved = greedy mean >= {SOLVED_SCORE:g} over {d3qn_agent.EVAL_EPISODES} episodes")
    print(format_row(["variant", "seed", "steps to solve", "wall time (s)", "env steps/s",
                      "final eval", "best eval"]))
    print(format_row(["---"] * 7))
    results = []
    with tempfile.TemporaryDirectory() as work_dir:
        for seed in range(args.seeds):
            for label in VARIANTS:
                result = train_once(label, seed, args.total_steps, Path(work_dir),
                                    args.tensorboard)
                results.append(result)
                print_run(result)
    print_summary(results, args.total_steps)
    plot(results, args.out, SOLVED_SCORE)
    print(f"\nplot: {args.out}")


if __name__ == "__main__":
    main()
