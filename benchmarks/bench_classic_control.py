"""The D3QN agent on Acrobot-v1, LunarLander-v3 and MountainCar-v0, against the RL Zoo's DQN.

    python benchmarks/bench_classic_control.py                       # 3 games x seeds 0, 1, 2
    python benchmarks/bench_classic_control.py --envs Acrobot-v1 --seeds 3

Every run is `python d3qn_agent.py --env-name ID --seed N` with the game's preset
(settings.GAME_PRESETS: budget, replay, learning rate, ...), run in this process one after the
other. After training, the last network and the best evaluated one (the `.keras` files the
run saved) each play EPISODES greedy episodes on episode seeds that no evaluation during training
used. Prints one row per run (last and best greedy mean, the step of the best evaluation, wall
time) and a summary per game beside the RL Zoo's published DQN score at the same budget
(rl-baselines3-zoo, benchmark.md). Models, plots and training logs go to --model-dir (default: a
temporary directory, deleted at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

# Quiet TensorFlow's start-up lines, as d3qn_agent.py does (keras imports TensorFlow first here).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from markdown_table import format_row

import d3qn_agent

EPISODES = 20  # greedy episodes that score each saved network after training
# The RL Zoo's DQN (and, for Acrobot, its best algorithm's) mean return at the same budget, and
# the target each of our seeds must reach.
ZOO_DQN = {"Acrobot-v1": -76.6, "LunarLander-v3": 154.0, "MountainCar-v0": -100.8}
TARGETS = {"Acrobot-v1": -70.0, "LunarLander-v3": 200.0, "MountainCar-v0": -100.8}


def train_and_score(env_name: str, seed: int, work_dir: Path) -> dict:
    """Train with the defaults, then score the last and the best saved network greedily."""
    keras.backend.clear_session()
    run_dir = work_dir / f"seed{seed}"  # each seed's networks and plots apart
    run_dir.mkdir(parents=True, exist_ok=True)
    agent = d3qn_agent.DQNAgent(env_name, seed=seed, model_dir=str(run_dir), plot_dir=str(run_dir))
    with (run_dir / f"{agent.name}.log").open("w") as log, \
            contextlib.redirect_stdout(log):
        start = time.perf_counter()
        agent.run()
        wall = time.perf_counter() - start
    best_step = max(agent.evaluations, key=lambda evaluation: evaluation[2])[0]
    # evaluate() seeds its episodes by the number of evaluations taken so far, so both networks
    # play the same episodes, which no evaluation during training has played.
    scores = {}
    for which, path in (("last", agent.Model_name.removesuffix(".keras") + "_last.keras"),
                        ("best", agent.Model_name)):
        agent.load(path)
        scores[which] = float(agent.evaluate(EPISODES).mean())
    return {"env": env_name, "seed": seed, "steps": agent.step, "wall": wall,
            "best_step": best_step, **scores}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(ZOO_DQN), choices=list(ZOO_DQN),
                        help="games to run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds to run")
    parser.add_argument("--model-dir", default=None,
                        help="keep the networks, plots and logs here (default: a temporary "
                        "directory)")
    args = parser.parse_args()

    print(f"greedy mean over {EPISODES} episodes of the last and of the best evaluated network")
    print(format_row(["game", "seed", "env steps", "last network", "best network",
                      "best evaluated at step", "wall time (s)"]))
    print(format_row(["---"] * 7))
    results = []
    with contextlib.ExitStack() as stack:
        if args.model_dir is None:
            work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        else:
            work_dir = Path(args.model_dir)  # train_and_score creates it with the run's folder
        for env_name in args.envs:
            for seed in args.seeds:
                result = train_and_score(env_name, seed, work_dir)
                results.append(result)
                print(format_row([env_name, str(seed), f"{result['steps']:,}",
                                  f"{result['last']:.1f}", f"{result['best']:.1f}",
                                  f"{result['best_step']:,}", f"{result['wall']:.0f}"]),
                      flush=True)
    print()
    print(format_row(["game", "budget (env steps)", "target", "seeds at target (last network)",
                      "mean last network", "mean best network", "RL Zoo DQN"]))
    print(format_row(["---"] * 7))
    for env_name in args.envs:
        runs = [r for r in results if r["env"] == env_name]
        at_target = sum(r["last"] >= TARGETS[env_name] for r in runs)
        print(format_row([env_name, f"{runs[0]['steps']:,}", f"{TARGETS[env_name]:g}",
                          f"{at_target}/{len(runs)}",
                          f"{np.mean([r['last'] for r in runs]):.1f}",
                          f"{np.mean([r['best'] for r in runs]):.1f}",
                          f"{ZOO_DQN[env_name]:g}"]))


if __name__ == "__main__":
    main()
