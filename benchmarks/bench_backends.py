"""The agent's compiled calls on each Keras backend, side by side: a gradient step and a greedy
action, on Pong's network (or another game's), with one and with several steps per call.

    python benchmarks/bench_backends.py                            # TensorFlow and JAX, Pong
    python benchmarks/bench_backends.py --backends jax             # JAX alone (a GPU machine)
    python benchmarks/bench_backends.py --env-name MinAtar/Breakout-v1

Each backend runs in a subprocess of its own (Keras picks its backend once per process), with
the game's preset: batch 32 for Atari and MinAtar, the double-DQN n-step target, the IS-weighted
Huber loss, Adam; in float32, also where the Pong preset takes bfloat16 convolutions. A gradient
step is timed as `DQNAgent.learn` on random batches sent from the host, |TD errors| returned to
it, the median of REPEATS calls after a warm-up, divided by the steps per call; a greedy action
as `DQNAgent.greedy_actions` on one state, back to back and right after a call of gradient steps
(as in the agent's loop, where acting follows training). The backends take turns, a process
each, for `--rounds` rounds; every round's figure goes to a results file (`--results`), and the
device each backend ran on is printed. For env steps/s of the whole agent
loop: `bench_atari.py --before none`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import provenance, timing
from benchmarks.timing import median_seconds

ENV_NAME = "PongNoFrameskip-v4"  # whose preset and network are timed
STEPS_PER_CALL = (1, 16)  # gradient steps per compiled call
REPEATS = 20  # timed calls per measurement (the median counts)
BACKENDS = ("tensorflow", "jax")


def measure(env_name: str, repeats: int) -> dict:
    """Time this process's backend: {device, step_ms per steps-per-call, act_ms}."""
    import keras
    import numpy as np

    from d3qn_agent import DQNAgent
    from d3qn_utils.gradient_steps import Batches

    results: dict = {"backend": keras.backend.backend(), "step_ms": {}}
    with tempfile.TemporaryDirectory() as work_dir:
        for steps in STEPS_PER_CALL:
            agent = DQNAgent(env_name, gradient_steps_per_call=steps, memory_size=1_000,
                             bfloat16=False, model_dir=work_dir, plot_dir=work_dir)
            batch_size = agent.config.batch_size
            rng = np.random.default_rng(0)
            shape = (steps, batch_size, *agent.state_shape)
            states = (rng.integers(0, 256, shape).astype(np.uint8) if agent.state_dtype == np.uint8
                      else rng.normal(size=shape).astype("float32"))
            per_sample = np.ones((steps, batch_size), np.float32)
            batches = Batches(states, rng.integers(0, agent.action_size, per_sample.shape,
                                                   dtype=np.int32), per_sample, states[::-1],
                              np.zeros_like(per_sample), 0.99 * per_sample, per_sample)
            seconds = median_seconds(lambda: agent.learn(batches, 0), repeats)  # noqa: B023
            results["step_ms"][steps] = 1e3 * seconds / steps
        one_state = states[0, :1]
        results["act_ms"] = 1e3 * median_seconds(lambda: agent.greedy_actions(one_state), 200)
        results["act_after_step_ms"] = 1e3 * statistics.median(
            greedy_after_learning(agent, batches, one_state) for _ in range(repeats))
    results["device"] = device_name(results["backend"])
    return results


def greedy_after_learning(agent: Any, batches: Any, one_state: Any) -> float:
    """Seconds of one greedy action taken right after a call of gradient steps, as acting
    follows training in the agent's loop."""
    agent.learn(batches, 0)
    start = time.perf_counter()
    agent.greedy_actions(one_state)
    return time.perf_counter() - start


def device_name(backend: str) -> str:
    """The device the backend computes on, in words."""
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        kind = device.device_kind  # "cpu" again on a CPU, the model on a GPU
        return device.platform if kind == device.platform else f"{device.platform}: {kind}"
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return f"gpu: {gpus[0].name}" if gpus else "cpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-name", default=ENV_NAME)
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--repeats", type=int, default=REPEATS)
    timing.add_rounds_argument(parser)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.env_name, args.repeats)))
        return
    timing.check_rounds(args.rounds)
    provenance.time_alone()  # no other timing shares the cores; its children time under it
    print(f"command: python benchmarks/bench_backends.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (1 min)")
    print(f"{args.env_name}: ms per gradient step at {', '.join(map(str, STEPS_PER_CALL))} "
          "steps per call, and per greedy action")
    print("| backend | device | " + " | ".join(f"step, {n} per call" for n in STEPS_PER_CALL)
          + " | greedy action | greedy action after a step |")
    print("|---|---|" + "---|" * (len(STEPS_PER_CALL) + 2))
    measured: dict = {"env_name": args.env_name, "repeats": args.repeats,
                      "rounds": args.rounds, "backends": {}}
    for _ in range(args.rounds):  # the backends take turns, so a drift hits them both
        for backend in args.backends:
            if "failed" in measured["backends"].get(backend, {}):
                continue
            result = subprocess.run(
                [sys.executable, __file__, "--child", "--env-name", args.env_name, "--repeats",
                 str(args.repeats)], env={**os.environ, "KERAS_BACKEND": backend},
                capture_output=True, text=True)
            if result.returncode != 0:
                error = result.stderr.strip().splitlines()[-1]
                measured["backends"][backend] = {"failed": error}
                print(f"| {backend} | failed: {error} |")
                continue
            found = json.loads(result.stdout.strip().splitlines()[-1])
            add_round(measured["backends"], backend, found)
            steps = " | ".join(f"{found['step_ms'][str(n)]:.2f}" for n in STEPS_PER_CALL)
            print(f"| {backend} | {found['device']} | {steps} | {found['act_ms']:.2f} | "
                  f"{found['act_after_step_ms']:.2f} |", flush=True)
    provenance.write_results(args.results, measured)


def add_round(backends: dict[str, dict], backend: str, found: dict) -> None:
    """Append one child's figures to `backend`'s rounds: a list per figure."""
    rounds = backends.setdefault(backend, {
        "backend": found["backend"], "device": found["device"],
        "step_ms": {steps: [] for steps in found["step_ms"]}, "act_ms": [],
        "act_after_step_ms": []})
    for steps, milliseconds in found["step_ms"].items():
        rounds["step_ms"][steps].append(milliseconds)
    rounds["act_ms"].append(found["act_ms"])
    rounds["act_after_step_ms"].append(found["act_after_step_ms"])


if __name__ == "__main__":
    main()
