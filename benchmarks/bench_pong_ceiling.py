"""How fast Pong could train on this CPU at best: the arithmetic of one gradient step against the
rate this machine multiplies float32 matrices at.

    python benchmarks/bench_pong_ceiling.py
    TF_ENABLE_ONEDNN_OPTS=1 python benchmarks/bench_pong_ceiling.py --no-xla  # fastest Pong here

Counts the floating-point operations of one gradient step of d3qn_agent.py's Atari network
(Nature-DQN torso, dueling head, batch 32, double DQN) from its layers' shapes, a multiply-add
counted as 2: the online network forward and backward on the states, and forward on the next
states twice (the online network picks a', the target network evaluates it). The backward pass
costs twice the forward one (gradients of the inputs and of the weights), except for the first
convolution, whose input (the frames) needs no gradient.

Then times, on random inputs, the agent's compiled gradient step and a square float32 matmul
(`tf.linalg.matmul`, large enough to run at the CPU's best rate), and prints both rates in
GFLOP/s. Dividing the step's arithmetic by the matmul's rate gives a lower bound on a gradient
step's time; with a step every TRAIN_FREQUENCY agent steps and everything else free (acting,
the emulator, the replay) that bounds the agent steps per second. What it measured goes to a
results file too (`--results`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import provenance
from timing import median_seconds

from d3qn_agent import DQNAgent
from d3qn_utils.gradient_steps import Batches
from d3qn_utils.patch_conv import PatchConv2D

BEFORE_STEPS_PER_SECOND = 37.7  # Pong before the fast path (docs/benchmarks.md), the 1.5x base
MATMUL_SIZE = 2048  # n of the n x n x n matmul: 17 GFLOP, ~0.1-0.3 s on this CPU


def forward_flops(model: keras.Model) -> tuple[int, int]:
    """(all layers, the first convolution): floating-point operations of one sample's forward
    pass through the model's Conv2D (or PatchConv2D) and Dense layers; the rest (ReLU, scaling,
    the dueling mean) is a few thousand operations and left out."""
    total = first_conv = 0
    for layer in model.layers:
        if isinstance(layer, (keras.layers.Conv2D, PatchConv2D)):
            _, height, width, filters = layer.output.shape
            kernel_height, kernel_width, channels, _ = layer.kernel.shape
            flops = 2 * height * width * filters * kernel_height * kernel_width * channels
            first_conv = first_conv or flops
        elif isinstance(layer, keras.layers.Dense):
            inputs, units = layer.kernel.shape
            flops = 2 * inputs * units
        else:
            continue
        total += flops
    return total, first_conv


def gradient_step_flops(model: keras.Model, batch_size: int) -> int:
    """Floating-point operations of one gradient step: the online network forward and backward
    on the states, then the online and the target network forward on the next states."""
    forward, first_conv = forward_flops(model)
    return batch_size * ((3 * forward - first_conv) + 2 * forward)


def random_gradient_step(agent: DQNAgent) -> Callable[[], object]:
    """A call of `agent.learn` on one random batch of the agent's shapes (one gradient step)."""
    rng = np.random.default_rng(0)
    batch_size = agent.config.batch_size
    shape = (1, batch_size, *agent.state_shape)  # one gradient step per call (the Atari preset)
    states = rng.integers(0, 256, shape, dtype=agent.state_dtype)
    next_states = rng.integers(0, 256, shape, dtype=agent.state_dtype)
    per_sample = np.ones((1, batch_size), np.float32)
    actions = rng.integers(0, agent.action_size, (1, batch_size), dtype=np.int32)
    batches = Batches(states, actions, per_sample, next_states, np.zeros_like(per_sample),
                      0.99 * per_sample, per_sample)
    return lambda: agent.learn(batches, agent.step)


def matmul_speed() -> tuple[float, float]:
    """(seconds, FLOP/s) of a square float32 matmul of MATMUL_SIZE, median of 10."""
    matrix = tf.constant(np.random.default_rng(0).standard_normal(
        (MATMUL_SIZE, MATMUL_SIZE), dtype=np.float32))
    matmul = tf.function(lambda: tf.linalg.matmul(matrix, matrix))
    seconds = median_seconds(lambda: matmul().numpy(), 10)
    return seconds, 2 * MATMUL_SIZE**3 / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-name", default="PongNoFrameskip-v4")
    parser.add_argument("--train-frequency", type=int, default=2, help="the Pong preset's: 2")
    parser.add_argument("--no-xla", dest="xla", action="store_false",
                        help="run the gradient step without XLA (fastest with oneDNN here)")
    parser.add_argument("--repeats", type=int, default=50, help="timed gradient steps")
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args()
    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")

    with tempfile.TemporaryDirectory() as work_dir:
        agent = DQNAgent(args.env_name, memory_size=1_000, xla=args.xla, model_dir=work_dir,
                         plot_dir=work_dir)
    batch_size = agent.config.batch_size
    forward, first_conv = forward_flops(agent.model)
    step_flops = gradient_step_flops(agent.model, batch_size)
    learn = random_gradient_step(agent)
    step_seconds = median_seconds(learn, args.repeats)
    matmul_seconds, matmul_rate = matmul_speed()

    fastest_step = step_flops / matmul_rate
    bound = args.train_frequency / fastest_step
    print(f"{args.env_name}: batch {batch_size}, XLA {'on' if args.xla else 'off'}; "
          f"forward pass {forward / 1e6:.1f} MFLOP a sample (first convolution "
          f"{first_conv / 1e6:.1f})")
    print(f"gradient step: {step_flops / 1e9:.2f} GFLOP in {step_seconds * 1e3:.1f} ms "
          f"(median of {args.repeats}): {step_flops / step_seconds / 1e9:.0f} GFLOP/s")
    print(f"matmul {MATMUL_SIZE}^3: {matmul_seconds * 1e3:.1f} ms: {matmul_rate / 1e9:.0f} GFLOP/s")
    print(f"at the matmul's rate a gradient step takes at least {fastest_step * 1e3:.1f} ms: with "
          f"one every {args.train_frequency} agent steps and all else free, at most "
          f"{bound:.1f} agent steps/s, {bound / BEFORE_STEPS_PER_SECOND:.2f}x the "
          f"{BEFORE_STEPS_PER_SECOND} before the fast path (target 1.5x: "
          f"{1.5 * BEFORE_STEPS_PER_SECOND:.1f})")
    provenance.write_results(args.results, {
        "env_name": args.env_name, "batch_size": batch_size, "xla": args.xla,
        "train_frequency": args.train_frequency, "repeats": args.repeats,
        "forward_flops_per_sample": forward, "first_convolution_flops": first_conv,
        "gradient_step_flops": step_flops, "gradient_step_seconds": step_seconds,
        "matmul_size": MATMUL_SIZE, "matmul_seconds": matmul_seconds,
        "matmul_flops_per_second": matmul_rate})


if __name__ == "__main__":
    main()
