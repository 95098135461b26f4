"""Where the D3QN agent's time goes on Atari Pong, part by part, and its agent steps per second,
before and after the fast path, in one run. The speed against Stable-Baselines3 is
bench_vs_sb3.py's; both time the Pong preset with the same short-run settings below.

    python benchmarks/bench_atari.py                  # Pong, its preset's settings, before and now
    python benchmarks/bench_atari.py --env-name CartPole-v1 --train-frequency 2 --steps 20000
    python benchmarks/bench_atari.py --before none --no-per --steps 1000
    python benchmarks/bench_atari.py --before none --n-envs 8   # 8 environments stepped together

Builds `DQNAgent("PongNoFrameskip-v4", ...)` with d3qn_agent.py's Atari defaults (Nature-DQN conv
torso, batch 32, Adam 1e-4, target copy every 1,000 steps, 3-step returns) and a gradient step
every 2 env steps as the Pong preset (`--train-frequency`), except for three settings that
keep the run short and representative:

- MEMORY_SIZE 20,000 instead of 100,000: sampling costs O(log N), so the time barely depends on
  it; the bytes per transition do not depend on it at all.
- LEARNING_STARTS 2,000 instead of 10,000: the untimed warm-up (LEARNING_STARTS + WARMUP_TRAIN
  steps) already trains, so every measured step is a training-phase step.
- EXPLORATION_STEPS 1 instead of 100,000: epsilon is at its final 0.01 from the start, so 99% of
  the steps run the network to act, as in 99% of a 10M-step run. With the Atari default
  schedule (--exploration-steps 100000) nearly every measured step would act at random.

The network computes in float32, as at the commit before the fast path, also on a CPU where the
Pong preset takes bfloat16 convolutions: `--bfloat16` measures those (this checkout only).

"Before" is the agent as commit BEFORE_COMMIT had it, the last one before the fast path (one
gradient step per TensorFlow call, no XLA, every greedy action a TensorFlow call): its files are
unpacked from git (`git archive`) into a temporary directory and this script measures them in a
subprocess (`--code DIR`), with the same settings. "Now" is the agent of this checkout, measured
in this process after it. `--before REV` measures another commit; `--before none` skips it.

The measured loop is the agent's own: `agent.run()`, with its budget `agent.config.total_steps`
set to end where the window does (act, envs.step, remember, a replay call every TRAIN_FREQUENCY x
GRADIENT_STEPS_PER_CALL steps once LEARNING_STARTS is reached, a hard target copy every
TARGET_UPDATE steps, `PlotModel` and a new episode at an episode's end). The work `run` does once
its budget is spent, which a real run does once at its end and not every few thousand steps, is
stubbed out as instance attributes: the final greedy evaluation (`agent.evaluate_and_keep_best`),
saving the last network (`agent.save`), drawing the plots (`agent.report.draw`) and the summary
line (`agent.report.finish`). The benchmark only wraps stopwatches around the methods the loop
calls, as instance attributes: `agent.act`, `agent.envs.step` (every environment's step;
an older commit's `agent.env.step`), `agent.remember`,
`agent.start_episodes` (env.reset), `agent.PlotModel`, `agent.update_target_model`, and the three
calls inside `agent.replay`, `agent.MEMORY.sample`, `agent.learn` and `agent.MEMORY.batch_update`.
These are the agent's internals; "other" (the table's "the rest") is what is left (the
per-episode print line and `run`'s first line, which go to a buffer here, the loop itself, and
entering and leaving `run`). The greedy evaluations (every EVAL_EVERY steps) fall outside the
measured window.

A step is an environment step: with `--n-envs N` (N_ENVS, this checkout only: `--before none`)
each loop iteration steps N environments and counts N steps, a window is a whole number of
iterations (`--steps` rounded up to a multiple of N), and every part is divided by the window's
environment steps, not by its iterations. `benchmarks/bench_n_envs.py` times N = 1, 2, 4 and 8
side by side with these functions.

Prints, for each part, microseconds per agent step, share of the measured time, calls, and
microseconds per call; then, for images, the replay memory's bytes per transition, measured from
its numpy arrays (frame store + sum tree) after the run, with the load average before and after.
After the warm-up, `--rounds` windows of `--steps` agent steps each are timed one after the
other, each window a round: every round's figures, "before" and "now", go to a results file too
(`--results`), timed alone (`provenance.time_alone`). "Before" and "now" run in two processes,
one after the other, so their rounds do not alternate: the pages draw the ratio only where
their ranges do not overlap.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Quiet TensorFlow's start-up lines, as d3qn_agent.py does (before anything imports TensorFlow).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import provenance, timing
from benchmarks.agent_loop import run_steps, skip_end_of_run

ROOT = Path(__file__).resolve().parent.parent

# Hyperparameters (each overridable from the command line).
ENV_NAME = "PongNoFrameskip-v4"  # the Atari game the agent plays
STEPS = 3_000  # measured agent steps after the warm-up
MEMORY_SIZE = 20_000  # replay capacity in transitions (the Atari default is 100,000)
LEARNING_STARTS = 2_000  # env steps before the first gradient step (Atari default 10,000)
WARMUP_TRAIN = 200  # untimed steps after LEARNING_STARTS: the first gradient steps run slower
EXPLORATION_STEPS = 1  # 1: epsilon at its final 0.01 already (Atari default 100,000)
SEED = 0  # seeds the agent, its environment and its replay memory
BEFORE_COMMIT = "538808e"  # the last commit before the fast path
TRAIN_FREQUENCY = 2  # env steps per gradient step: the Pong preset's (Atari preset: 4)
MEASURED = "measured: json "  # the last line of a --before subprocess, before what it measured

# The measured parts of one agent step, in the order the loop runs them.
PARTS = {
    "env step": "agent.envs.step: every environment's step",
    "env reset": "agent.start_episodes: env.reset at an episode's end",
    "act": "agent.act: epsilon-greedy, one forward pass",
    "store": "agent.remember: Memory.store into the frame store",
    "sample": "Memory.sample: draw a batch, rebuild its frame stacks",
    "train": "agent.learn: the gradient steps of a replay call",
    "priorities": "Memory.batch_update: new priorities",
    "target": "agent.update_target_model: hard copy",
    "episode end": "agent.PlotModel (PNG redrawn at most every 20 s)",
}
# How the parts add up to the four kinds of work.
GROUPS = {
    "env": ("env step", "env reset"),
    "acting": ("act",),
    "training": ("train", "target"),
    "replay memory": ("store", "sample", "priorities"),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--env-name", default=ENV_NAME,
                        help="environment id (an Atari id, or CartPole-v1 and the like)")
    parser.add_argument("--train-frequency", type=int, default=TRAIN_FREQUENCY,
                        help="env steps per gradient step (the Atari preset's is 4)")
    parser.add_argument("--before", default=BEFORE_COMMIT, metavar="REV",
                        help="also measure the agent of this git commit, first ('none': skip)")
    parser.add_argument("--code", default=str(ROOT), help=argparse.SUPPRESS)  # see --before
    parser.add_argument("--steps", type=int, default=STEPS,
                        help="measured agent steps (env steps, rounded up to a multiple of N)")
    parser.add_argument("--n-envs", type=int, default=1,
                        help="environments stepped together (N_ENVS; > 1 needs --before none)")
    parser.add_argument("--gradient-steps-per-call", type=int, default=None,
                        help="gradient steps per compiled call (default: the game's preset)")
    parser.add_argument("--memory-size", type=int, default=MEMORY_SIZE,
                        help="replay capacity (transitions)")
    parser.add_argument("--learning-starts", type=int, default=LEARNING_STARTS,
                        help="env steps before the first gradient step")
    parser.add_argument("--warmup-train", type=int, default=WARMUP_TRAIN,
                        help="untimed training steps before the measurement")
    parser.add_argument("--exploration-steps", type=int, default=EXPLORATION_STEPS,
                        help="env steps for epsilon to reach 0.01 (1: from the start)")
    parser.add_argument("--per", dest="use_per", action=argparse.BooleanOptionalAction,
                        default=True, help="prioritized replay (--no-per: uniform replay)")
    parser.add_argument("--seed", type=int, default=SEED, help="random seed")
    parser.add_argument("--bfloat16", action="store_true",
                        help="this checkout's convolutions in bfloat16 (default float32, as the "
                             "commit before the fast path, whatever the preset picks on this CPU)")
    timing.add_rounds_argument(parser)
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args()
    timing.check_rounds(args.rounds)
    for name in ("steps", "memory_size", "exploration_steps", "n_envs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ("learning_starts", "warmup_train"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.n_envs > 1 and args.before != "none":
        parser.error(f"--n-envs {args.n_envs} needs --before none: commit {args.before} steps "
                     "one environment")
    return args


class Stopwatches:
    """Seconds and calls per part of the agent step, counted by wrappers around its methods."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.calls = dict.fromkeys(PARTS, 0)

    def reset(self) -> None:
        """Forget the time and calls counted so far (after the warm-up)."""
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.calls = dict.fromkeys(PARTS, 0)

    def wrap(self, holder: object, method: str, part: str) -> None:
        """Replace `holder.method` by a timed call of itself (two clock reads a call: the
        "the rest" row holds their cost)."""
        function = getattr(holder, method)
        clock = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            result = function(*args, **kwargs)
            self.seconds[part] += clock() - start
            self.calls[part] += 1
            return result

        setattr(holder, method, timed)


def instrument(agent: Any) -> Stopwatches:
    """Wrap stopwatches around every method the agent's training step calls."""
    watches = Stopwatches()
    for holder, method, part in (
        # every environment's step (an older commit's agent steps its one `env`)
        (agent.envs if hasattr(agent, "envs") else agent.env, "step", "env step"),
        # the episodes' resets (an older commit's agent resets its one `env`: start_episode)
        (agent, "start_episodes" if hasattr(agent, "start_episodes") else "start_episode",
         "env reset"),
        (agent, "act", "act"),
        (agent, "remember", "store"),
        (agent.MEMORY, "sample", "sample"),
        (agent, "learn" if hasattr(agent, "learn") else "train_on_batch", "train"),  # or older
        (agent.MEMORY, "batch_update", "priorities"),
        (agent, "update_target_model", "target"),
        (agent, "PlotModel", "episode end"),
    ):
        watches.wrap(holder, method, part)
    return watches


def window_steps(steps: int, n_envs: int) -> int:
    """The env steps of a window of at least `steps`: a whole number of loop iterations, each
    stepping `n_envs` environments."""
    return -(-steps // n_envs) * n_envs


def new_measurement(steps: int, gradient_steps_per_call: int) -> dict[str, Any]:
    """What `time_round` fills, round after round, for windows of `steps` env steps."""
    return {"steps_per_second": [], "steps": steps, "wall_seconds": [],
            "gradient_steps_per_call": gradient_steps_per_call,
            "parts": {part: {"seconds": [], "calls": []} for part in PARTS}}


def time_round(agent: Any, watches: Stopwatches, measured: dict[str, Any]) -> float:
    """Time one window of the agent's own loop, `measured["steps"]` env steps (a whole number of
    its iterations), adding its speed, wall time and each part's seconds and calls to
    `measured`; return the wall time in seconds."""
    watches.reset()
    wall = run_steps(agent, measured["steps"])
    measured["steps_per_second"].append(measured["steps"] / wall)
    measured["wall_seconds"].append(wall)
    for part in PARTS:
        measured["parts"][part]["seconds"].append(watches.seconds[part])
        measured["parts"][part]["calls"].append(watches.calls[part])
    return wall


def owned_array_bytes(holder: object) -> int:
    """Bytes of the numpy arrays held as attributes of `holder`, views of others not counted."""
    return sum(value.nbytes for value in vars(holder).values()
               if isinstance(value, np.ndarray) and value.base is None)


def print_time_table(watches: Stopwatches, steps: int, wall: float) -> None:
    print(f"{'part':<12} {'us/step':>9} {'% time':>7} {'calls':>6} {'us/call':>9}  what")
    for part, what in PARTS.items():
        seconds, calls = watches.seconds[part], watches.calls[part]
        per_call = f"{seconds / calls * 1e6:9,.0f}" if calls else f"{'-':>9}"
        print(f"{part:<12} {seconds / steps * 1e6:9,.0f} {100 * seconds / wall:7.1f} "
              f"{calls:6,} {per_call}  {what}")
    other = wall - sum(watches.seconds.values())
    print(f"{'other':<12} {other / steps * 1e6:9,.0f} {100 * other / wall:7.1f} {'':>6} "
          f"{'':>9}  the rest: replay glue, episode line, loop, stopwatches")
    print(f"{'total':<12} {wall / steps * 1e6:9,.0f} {100.0:7.1f}")
    print()
    print("by kind of work: " + ", ".join(
        f"{group} {100 * sum(watches.seconds[p] for p in parts) / wall:.1f}%"
        for group, parts in GROUPS.items()))


def print_memory_bytes(agent: Any) -> dict[str, float]:
    """Replay bytes per transition: array bytes per slot times slots per stored transition.
    Returns what it printed."""
    memory = agent.MEMORY
    storage = memory.storage
    storage_bytes = owned_array_bytes(storage)
    tree = getattr(memory, "tree", None)  # only the proportional PER memory has a sum tree
    tree_bytes = owned_array_bytes(tree) if tree is not None else 0
    # A new episode costs its stack's older frames as extra slots that hold no transition.
    slots_per_transition = storage.written / len(storage)
    per_slot = (storage_bytes + tree_bytes) / memory.capacity
    print(f"replay memory ({type(memory).__name__} + {type(storage).__name__}), capacity "
          f"{memory.capacity:,} slots: {storage.written:,} slots written, holding "
          f"{len(storage):,} transitions")
    print(f"  storage arrays {storage_bytes:,} bytes + sum tree {tree_bytes:,} bytes = "
          f"{per_slot:,.1f} bytes per slot")
    print(f"  {slots_per_transition:.4f} slots per transition -> "
          f"{per_slot * slots_per_transition:,.0f} bytes per transition "
          f"(x {agent.config.memory_size:,} = "
          f"{per_slot * slots_per_transition * agent.config.memory_size / 1e6:,.0f} MB for "
          f"this memory; the frames are allocated at full capacity, only written pages are used)")
    state_bytes = int(np.prod(agent.state_shape))
    print(f"  for comparison: a uint8 state + next_state pair is {2 * state_bytes:,} bytes, "
          f"float32 {8 * state_bytes:,} bytes")
    return {"storage_bytes": storage_bytes, "sum_tree_bytes": tree_bytes,
            "capacity": memory.capacity, "slots_per_transition": slots_per_transition,
            "bytes_per_transition": per_slot * slots_per_transition}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Build the agent of `args.code` (this checkout, or an unpacked commit), warm it up, time
    `args.steps` agent steps (rounded up to whole iterations of its N_ENVS environments) and
    print where the time went; return what it measured."""
    sys.path.insert(0, args.code)
    import d3qn_agent
    # Commits before the helpers moved into d3qn_utils/ kept them beside d3qn_agent.py.
    reporting = importlib.import_module("d3qn_utils.reporting" if (
        Path(args.code) / "d3qn_utils").is_dir() else "reporting")

    with tempfile.TemporaryDirectory() as work_dir:
        flags = dict(use_per=args.use_per, seed=args.seed, memory_size=args.memory_size,
                     learning_starts=args.learning_starts,
                     exploration_steps=args.exploration_steps,
                     train_frequency=args.train_frequency, model_dir=work_dir, plot_dir=work_dir,
                     checkpoint_every=0)
        if args.gradient_steps_per_call:
            flags["gradient_steps_per_call"] = args.gradient_steps_per_call
        if args.code == str(ROOT):  # an older commit's agent may not know the flags
            flags.update(bfloat16=args.bfloat16, n_envs=args.n_envs)
        if args.n_envs > 1:  # a budget N_ENVS divides (`run_steps` moves it to the window's end)
            flags["total_steps"] = args.n_envs * 1_000_000
        agent = d3qn_agent.DQNAgent(args.env_name, **flags)
        config = agent.config
        per_call = getattr(config, "gradient_steps_per_call", 1)  # older commits: one a call
        # An older commit's report has no description: its reporting.describe(config) gives it.
        description = getattr(getattr(agent, "report", None), "description", None) or (
            reporting.describe(config))
        print(f"{args.env_name}: {description}; batch {config.batch_size}, a "
              f"gradient step every {config.train_frequency} env steps, "
              f"{per_call} per compiled call, XLA "
              f"{'on' if getattr(config, 'xla', False) else 'off'}")
        skip_end_of_run(agent)
        watches = instrument(agent)
        warmup = args.learning_starts + args.warmup_train
        print(f"warm-up: {warmup:,} untimed steps in {run_steps(agent, warmup):.0f} s")
        steps = window_steps(args.steps, args.n_envs)
        measured = new_measurement(steps, per_call)
        for round_number in range(args.rounds):  # windows one after the other, a round each
            first_epsilon = agent.epsilon_at(agent.step)
            wall = time_round(agent, watches, measured)
            print(f"round {round_number + 1}: {steps:,} agent steps in {wall:.1f} s, "
                  f"epsilon {first_epsilon:.3f} -> {agent.epsilon:.3f}, {agent.episode} "
                  f"episodes finished so far; agent steps/s: {steps / wall:,.1f}")
        print(f"\nthe last round's {steps:,} steps, part by part:")
        print_time_table(watches, steps, wall)
        print()
        if agent.state_dtype == np.uint8:  # image frames: the frame storage's bytes
            measured["replay_memory"] = print_memory_bytes(agent)
            print()
    return measured


def measure_commit(revision: str, argv: list[str]) -> dict[str, Any]:
    """Unpack `revision`'s files into a temporary directory and measure them in a subprocess
    with the same arguments; print its output; return what it measured."""
    with tempfile.TemporaryDirectory() as code:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", code], input=archive, check=True)
        result = subprocess.run(
            [sys.executable, __file__, *argv, "--before", "none", "--code", code],
            capture_output=True, text=True, check=True)
    *shown, measured = result.stdout.splitlines()
    print("\n".join(shown))
    return json.loads(measured.removeprefix(MEASURED))


def main() -> None:
    args = parse_args()
    if args.code != str(ROOT):  # the subprocess measuring --before: its parent writes it down
        print(MEASURED + json.dumps(measure(args)))
        return
    provenance.time_alone()  # no other timing shares the cores; its child times under it
    print("command: python " + shlex.join(sys.argv))
    load_before = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average before {load_before[0]:.2f} (1 min)")
    measured = {}
    if args.before != "none":
        print(f"\n== before: commit {args.before}")
        same_settings = [f"--{name.replace('_', '-')}={value}"
                         for name, value in vars(args).items()
                         if name not in ("before", "code", "use_per", "gradient_steps_per_call",
                                         "bfloat16", "results")]
        same_settings.append("--per" if args.use_per else "--no-per")
        measured["before"] = measure_commit(args.before, same_settings)
        print("\n== now: this checkout")
    measured["now"] = measure(args)
    load_after = os.getloadavg()
    speeds = {variant: statistics.median(found["steps_per_second"])
              for variant, found in measured.items()}
    print(f"load average after {load_after[0]:.2f} (1 min)")
    print("agent steps/s (medians of the rounds): " + ", ".join(f"{variant} {speed:,.1f}"
                                        for variant, speed in speeds.items()))
    if "before" in speeds:
        print(f"now / before: {speeds['now'] / speeds['before']:.2f}x")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(f"process peak resident memory: {peak_mb:,.0f} MB")
    provenance.write_results(args.results, {
        "env_name": args.env_name, "n_envs": args.n_envs, "before_commit": args.before,
        "bfloat16": args.bfloat16, "rounds": args.rounds, **measured,
        "peak_resident_mb": peak_mb})


if __name__ == "__main__":
    main()
