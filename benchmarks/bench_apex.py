"""Ape-X (apex.py) on this machine: throughput with 1 and 2 actors, what each part costs, a
projection of those costs to 8, 64 and 360 actors, and CartPole solved against d3qn_agent.py.

    python benchmarks/bench_apex.py                 # everything, as in the README
    python benchmarks/bench_apex.py --skip-solve    # throughput, costs and projection only

1. Throughput: apex.py's learner with 1 and 2 actors on a local Ray, paced (UPDATES_PER_STEP 0.5,
   the default) and unpaced (0: actors and learner flat out, the paper's setting), each for
   --steps env steps; env steps/s collected and learner updates/s from the first update on, and
   the updates per env step the whole run made (pacing holds it near UPDATES_PER_STEP).
2. Costs, measured one at a time in this process and on the local Ray: an actor's env step with
   its action, its TD errors per block, a learner update, the replay's store_block, sample and
   priority update on a full replay, a remote call, and the object store's transfer of a block
   and of the weights.
3. Projection: every actor on a core of its own at the measured per-actor rate; the replay actor
   (one Python process) must serve every block, sample and update; the learner must make
   UPDATES_PER_STEP updates per env step; the object store must carry the blocks and the weight
   pulls. The first resource to run out is the bottleneck.
4. CartPole solved: `python apex.py --stop-when-solved` and `python d3qn_agent.py`, one after
   the other as subprocesses (outputs in a temporary directory), each timed from its launch to
   its first greedy evaluation >= 475.

Throughput and costs are measured in `--rounds` rounds (the four throughput runs in turn within
a round; each cost's median of its calls once per round); the projection takes the rounds'
medians. Every round's figures go to a results file too (`--results`).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import ray

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import ape_x.actor
import ape_x.connection
import ape_x.learner
import ape_x.replay
import apex
from benchmarks import provenance, timing
from benchmarks.timing import median_seconds
from d3qn_agent import OurModel
from d3qn_utils import games
from d3qn_utils.gradient_steps import Batches

ROOT = Path(__file__).resolve().parent.parent
ACTOR_COUNTS = (8, 64, 360)
# Horgan et al. (2018), as reported: 360 actors generate ~50K environment frames/s in all
# (~139 per actor; 4 frames per agent step, so ~12.5K transitions/s), and the learner takes
# 19 batches of 512 per second (~9.7K transitions/s), from a replay of up to 2M transitions.
PAPER = {"actors": 360, "frames_per_second": 50_000, "frames_per_step": 4,
         "batches_per_second": 19, "batch_size": 512}
ATARI_TRANSITION_BYTES = 2 * 84 * 84 * 4  # an actor's block carries state and next state
REPLAY_BUSY_LIMIT = 0.8  # a Python process that is busier than this starts to queue requests


def throughput(num_actors: int, updates_per_step: float, steps: int, directory: str) -> tuple:
    """(env steps/s, updates/s) of an apex.py run on the local Ray, from its first update on,
    and its updates per env step collected."""
    config, _ = apex.resolve_config({
        "num_actors": num_actors, "updates_per_step": updates_per_step, "total_steps": steps,
        "eval_every": 10**9, "eval_episodes": 1, "log_every": 1e6,
        "model_dir": directory, "plot_dir": directory})
    learner = ape_x.learner.Learner(config)
    learner.launch()
    try:
        learner.train()
        # to now: the end of training
        return (*learner.report.rates(learner.env_steps, learner.updates),
                learner.updates / learner.env_steps)
    finally:
        learner.stop_actors()


def component_costs(directory: str, rounds: int) -> dict[str, float | list[float]]:
    """Seconds per operation of each part in each of `rounds` rounds (a list per part), and the
    sizes of a block and of the weights, with apex.py's CartPole defaults."""

    def each_round(function: Callable[[], object], repeats: int) -> list[float]:
        return [median_seconds(function, repeats) for _ in range(rounds)]

    # Epsilon 0: every step pays for a forward pass, as nearly all do late in a run.
    config, _ = apex.resolve_config({"num_actors": 1, "epsilon": 0.0, "model_dir": directory,
                                     "plot_dir": directory})
    learner = ape_x.learner.Learner(config)
    weights = learner.weights()
    actor = ape_x.actor.Actor(0, config)
    actor.set_weights(weights)
    blocks, per_step = [], []
    for _ in range(rounds):
        start, steps = time.perf_counter(), actor.steps
        while actor.steps - steps < 3_000:
            blocks.append(actor.collect_block())
        per_step.append((time.perf_counter() - start) / (actor.steps - steps))
    full = max(blocks, key=lambda block: len(block[1]))
    transitions, abs_errors, context, _, _ = full
    replay = ape_x.replay.Replay(config)
    while len(replay.memory) < config.memory_size:  # a full replay, as in a long run
        replay.add_block(0, transitions, abs_errors, context, 0, [])
    batch = replay.memory.n_step_batch(np.arange(len(abs_errors)))
    td_errors = each_round(lambda: actor.abs_td_errors(batch), 50)
    tree_idx, stamps, sample_batch, is_weights, _ = replay.sample(config.batch_size)
    costs = {
        "actor_step": per_step,
        "actor_td_errors_per_block": td_errors,
        "learner_update": each_round(
            lambda: learner.learn(Batches.dealt(sample_batch, is_weights, 1), 0), 100),
        "replay_add_block": each_round(
            lambda: replay.add_block(0, transitions, abs_errors, context, 0, []), 200),
        "replay_sample": each_round(lambda: replay.sample(config.batch_size), 200),
        "replay_update": each_round(
            lambda: replay.update_priorities(tree_idx, stamps, np.abs(np.sin(tree_idx))), 200),
        "block_bytes": float(sum(np.asarray(field).nbytes for field in transitions)
                             + abs_errors.nbytes),
        "weights_bytes": float(sum(w.nbytes for part in weights for w in part)),
        "block_transitions": float(len(abs_errors)),
    }

    @ray.remote(num_cpus=0)
    class Peer:
        """Another process, to time what crosses process boundaries."""

        def noop(self, _: object = None) -> None:
            return None

        def fetch(self, references: list) -> int:
            return len(ray.get(references[0]))

    peer = Peer.remote()
    ray.get(peer.noop.remote())
    costs["remote_call"] = each_round(lambda: ray.get(peer.noop.remote()), 200)
    # A transfer's cost is its call's time less that round's round trip.
    costs["block_transfer"] = [
        seconds - call for seconds, call in zip(
            each_round(lambda: ray.get(peer.noop.remote(transitions)), 200),
            costs["remote_call"], strict=True)]
    costs["weights_publish_and_pull"] = [
        seconds - call for seconds, call in zip(
            each_round(lambda: ray.get(peer.fetch.remote([ray.put(weights)])), 50),
            costs["remote_call"], strict=True)]
    ray.kill(peer)
    return costs


def project(costs: dict[str, float], config: argparse.Namespace, measured_actor_rate: float,
            num_actors: int, rho: float) -> dict[str, float | str]:
    """Throughput at `num_actors`, each actor on its own core, `rho` updates per env step.

    The actors would collect N * r env steps/s. The replay actor spends, per env step, a
    block's insert, transfer and call per BLOCK_SIZE steps, rho times a sample, an update and
    two calls, and a call per WEIGHT_SYNC_EVERY steps (a call's whole measured round trip is
    counted against it: an upper bound); the learner manages 1 / (its update time) updates/s.
    Whichever limit is lowest decides.
    """
    block = costs["block_transitions"]
    per_step_replay = ((costs["replay_add_block"] + costs["block_transfer"] + costs["remote_call"])
                       / block
                       + rho * (costs["replay_sample"] + costs["replay_update"]
                                + 2 * costs["remote_call"])
                       + costs["remote_call"] / config.weight_sync_every)
    limits = {
        "actors": num_actors * measured_actor_rate,
        "replay actor": REPLAY_BUSY_LIMIT / per_step_replay,
        "learner": 1.0 / costs["learner_update"] / rho,
    }
    bottleneck = min(limits, key=limits.get)
    rate = limits[bottleneck]
    # An actor pulls weights every WEIGHT_SYNC_EVERY of its steps, but only newer ones: at most
    # one per PUBLISH_EVERY updates.
    pulls = num_actors * min(rate / num_actors / config.weight_sync_every,
                             rate * rho / config.publish_every)
    store_bytes = rate * costs["block_bytes"] / block + pulls * costs["weights_bytes"]
    return {"actors": num_actors, "demand": limits["actors"], "rate": rate, "pulls": pulls,
            "updates": rate * rho, "replay_busy": rate * per_step_replay,
            "store_mb": store_bytes / 1e6, "bottleneck": bottleneck,
            "replay_limit": limits["replay actor"], "learner_limit": limits["learner"]}


def time_to_solve(command: list[str], solved_marker: str, cwd: str) -> tuple[float | None, str]:
    """Seconds from launching `command` to the first output line containing `solved_marker`
    (None if it ends without one), and its last output line. Stops the process once solved."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    solved, last = None, ""
    for line in process.stdout:
        last = line.strip() or last
        if solved is None and solved_marker in line:
            solved = time.perf_counter() - start
            process.terminate()
    process.wait()
    return solved, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8_000,
                        help="env steps per throughput run")
    parser.add_argument("--skip-solve", action="store_true",
                        help="leave out the CartPole runs against d3qn_agent.py")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="seeds of the CartPole runs")
    timing.add_rounds_argument(parser)
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args()
    timing.check_rounds(args.rounds)
    provenance.time_alone()  # no other timing shares the cores
    config, _ = apex.resolve_config({})
    with tempfile.TemporaryDirectory() as directory:
        ape_x.connection.connect_ray(config, address=None)
        try:
            print(f"throughput, {args.steps:,} env steps per run (rates from the first update):")
            print("| actors | pacing | env steps/s collected | learner updates/s | updates per "
                  "env step |")
            print("|---|---|---|---|---|")
            runs = [(num_actors, pacing) for num_actors in (1, 2)
                    for pacing in (config.updates_per_step, 0.0)]
            rounds: dict[tuple, list[tuple]] = {run: [] for run in runs}
            for _ in range(args.rounds):  # the four runs in turn
                for num_actors, pacing in runs:
                    rounds[num_actors, pacing].append(
                        throughput(num_actors, pacing, args.steps, directory))
                    label = f"{pacing:g} updates/step" if pacing else "none (flat out)"
                    collected, updates, ratio = rounds[num_actors, pacing][-1]
                    print(f"| {num_actors} | {label} | {collected:.0f} | {updates:.0f} | "
                          f"{ratio:.2f} |", flush=True)
            # (env steps/s, updates/s, updates per env step): a list of the rounds' values each
            rates = {run: tuple(map(list, zip(*found, strict=True)))
                     for run, found in rounds.items()}
            cost_rounds = component_costs(directory, args.rounds)
            costs = {name: statistics.median(value) if isinstance(value, list) else value
                     for name, value in cost_rounds.items()}
        finally:
            ray.shutdown()
    print(f"\ncosts (medians of {args.rounds} rounds; one operation at a time):")
    print("| part | cost |")
    print("|---|---|")
    rows = [("actor: env step + action (greedy), per transition", costs["actor_step"], "ms"),
            ("actor: TD errors of a block (priorities)", costs["actor_td_errors_per_block"], "ms"),
            ("learner: one update (learn, batch "
             f"{config.batch_size})", costs["learner_update"], "ms"),
            (f"replay: store_block ({costs['block_transitions']:.0f} + context)",
             costs["replay_add_block"], "us"),
            (f"replay: sample({config.batch_size}), full replay", costs["replay_sample"], "us"),
            (f"replay: priority update ({config.batch_size})", costs["replay_update"], "us"),
            ("Ray: remote call round trip", costs["remote_call"], "us"),
            (f"Ray: a block to another process ({costs['block_bytes'] / 1e3:.1f} KB)",
             costs["block_transfer"], "us"),
            (f"Ray: weights published and pulled ({costs['weights_bytes'] / 1e6:.2f} MB)",
             costs["weights_publish_and_pull"], "ms")]
    for name, seconds, unit in rows:
        print(f"| {name} | {seconds * (1e3 if unit == 'ms' else 1e6):.{3 if unit == 'ms' else 1}f}"
              f" {unit} |")
    # One actor alone, unpaced, is the per-actor rate a core of its own would give.
    actor_rate = statistics.median(rates[1, 0.0][0])
    atari_weights = 2 * 4 * OurModel((84, 84, 4), 6, dueling=True,
                                     image_torso=games.nature_torso).count_params()
    paper_steps = PAPER["frames_per_second"] / PAPER["frames_per_step"]
    # The paper's learner samples 19 * 512 transitions per ~12,500 collected: at our batch size
    # that many samples per env step is this many updates per env step.
    paper_rho = PAPER["batches_per_second"] * PAPER["batch_size"] / paper_steps / config.batch_size
    measured: dict = {
        "steps": args.steps,
        "throughput": [{"actors": num_actors, "updates_per_step": pacing,
                        "env_steps_per_second": collected, "updates_per_second": updates,
                        "updates_per_env_step": ratio}
                       for (num_actors, pacing), (collected, updates, ratio) in rates.items()],
        "rounds": args.rounds, "costs_seconds": cost_rounds, "projections": {}}
    print(f"\nprojection (CartPole costs above; each actor {actor_rate:.0f} env steps/s on a core "
          "of its own, the rate one unpaced actor reached here):")
    for title, rho in ((f"apex.py's pacing, {config.updates_per_step:g} updates per env step",
                        config.updates_per_step),
                       (f"the paper's replay ratio, {paper_rho * config.batch_size:.2f} sampled "
                        f"transitions per env step ({paper_rho:.4f} updates of "
                        f"{config.batch_size})", paper_rho)):
        print(f"\n{title}:")
        print("| actors | actors could collect (steps/s) | achievable (steps/s) | learner "
              "updates/s | replay actor busy | object store MB/s | bottleneck |")
        print("|---|---|---|---|---|---|---|")
        measured["projections"][title] = []
        for num_actors in ACTOR_COUNTS:
            row = project(costs, config, actor_rate, num_actors, rho)
            measured["projections"][title].append({"actors": num_actors, **row})
            print(f"| {num_actors} | {row['demand']:,.0f} | {row['rate']:,.0f} | "
                  f"{row['updates']:,.0f} | {100 * row['replay_busy']:.0f}% | "
                  f"{row['store_mb']:.1f} | {row['bottleneck']} |")
        print(f"at 360 actors: {math.ceil(row['demand'] / row['replay_limit'])} replay shards "
              f"and {math.ceil(row['demand'] / row['learner_limit'])} learners' worth of updates "
              f"would keep up with the actors (one replay actor serves "
              f"{row['replay_limit']:,.0f} env steps/s, one learner {row['learner_limit']:,.0f}).")
        atari_mb = (row["rate"] * ATARI_TRANSITION_BYTES + row["pulls"] * atari_weights) / 1e6
        print(f"with Atari's transitions ({ATARI_TRANSITION_BYTES / 1e3:.0f} KB: two 84x84x4 "
              f"stacks) and weights ({atari_weights / 1e6:.1f} MB: two Nature-DQN networks) the "
              f"object store would move {atari_mb:,.0f} MB/s at that rate.")
    print(f"the paper (Horgan et al. 2018): {PAPER['actors']} actors, "
          f"~{PAPER['frames_per_second']:,} frames/s (~{paper_steps:,.0f} agent steps/s), "
          f"learner {PAPER['batches_per_second']} batches of {PAPER['batch_size']}/s (~"
          f"{PAPER['batches_per_second'] * PAPER['batch_size']:,} sampled transitions/s, "
          f"{PAPER['batches_per_second'] / paper_steps:.4f} updates per agent step)")
    if not args.skip_solve:
        measured["solved_seconds"] = solve_times(args.seeds)
    provenance.write_results(args.results, measured)


def solve_times(seeds: list[int]) -> list[dict[str, float | None]]:
    """Per seed, the seconds from launch to the first greedy evaluation >= 475 of apex.py and
    of d3qn_agent.py, printed as a table; returned."""
    times = []
    print("\nCartPole-v1 solved (first greedy evaluation >= 475), seconds from launch:")
    print("| seed | apex.py (2 actors) | d3qn_agent.py |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory() as directory:
        outputs = ["--model-dir", directory, "--plot-dir", directory]
        for seed in seeds:
            apex_seconds, _ = time_to_solve(
                [sys.executable, str(ROOT / "apex.py"), "--stop-when-solved", "--seed", str(seed),
                 *outputs], "solved (>=", directory)
            d3qn_seconds, _ = time_to_solve(
                [sys.executable, str(ROOT / "d3qn_agent.py"), "--seed", str(seed), *outputs],
                "solved (>=", directory)
            print(f"| {seed} | {apex_seconds or float('nan'):.0f} | "
                  f"{d3qn_seconds or float('nan'):.0f} |", flush=True)
            times.append({"seed": seed, "apex.py": apex_seconds, "d3qn_agent.py": d3qn_seconds})
    return times


if __name__ == "__main__":
    main()
