"""Which convolutions take Pong's gradient step and greedy action fastest on this CPU: each
candidate timed side by side in one process, in alternating rounds.

    python benchmarks/bench_pong_kernels.py
    python benchmarks/bench_pong_kernels.py --rounds 9

Candidates for the Nature DQN torso (conv 32 8x8/4, 64 4x4/2, 64 3x3/1 on 84x84x4 frames):
TensorFlow's `Conv2D` (oneDNN's kernels where TensorFlow turns them on), the same convolutions
computing in bfloat16 (`BFLOAT16`, games.nature_torso: float32 weights, each call's inputs and
weights rounded to bfloat16, fast on CPUs with AVX512_BF16 or AMX; the dense layers and the
loss stay float32) and `PatchConv2D` (patch_conv.py: the strided views of each layer's input
side by side, times the kernel, one matrix product), each with the gradient step compiled by XLA
and without. Each agent is d3qn_agent.py's Pong network and gradient step (`DQNAgent.learn` on
one random batch of 32), built once; then every round times 10 calls of each candidate in turn,
so a drift of the machine hits them all; every round's median is kept, and the median of the
rounds is printed. The rate
is the step's arithmetic over its time, also as a share of the rate this CPU multiplies float32
matrices at (a 2048 x 2048 matmul).

The arithmetic is counted from the network's layer shapes, a multiply-add as 2: the online
network forward and backward on the states, and forward on the next states twice (the online
network picks a', the target network evaluates it). The backward pass costs twice the forward
one (gradients of the inputs and of the weights), except for the first convolution, whose input
(the frames) needs no gradient.

Then the greedy action for one state (timed before the gradient steps), the acting cost of
every env step: the call that acting uses (`GreedyPolicy` with the Conv2D torso, traced and
compiled by XLA), the same call traced without XLA, both again for the bfloat16 torso, and the
numpy forward pass of `greedy_policy.py` on the PatchConv2D torso, without and with the copy of
the weights that it needs after each training call. What it measured goes to a results file
too (`--results`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from d3qn_utils import quiet_startup  # noqa: F401  # isort: skip -- first: before TensorFlow
import keras
import numpy as np
import tensorflow as tf

from benchmarks import provenance, timing
from benchmarks.timing import median_seconds
from d3qn_agent import DQNAgent
from d3qn_utils import games, tensorflow_backend
from d3qn_utils.gradient_steps import Batches
from d3qn_utils.patch_conv import PatchConv2D

ENV_NAME = "PongNoFrameskip-v4"  # whose network and preset are timed
ROUNDS = 5  # alternating rounds of CALLS timed calls per candidate
CALLS = 10
# Each torso: (its convolution layer, whether it computes in bfloat16).
TORSOS = {"Conv2D": (keras.layers.Conv2D, False), "Conv2D bfloat16": (keras.layers.Conv2D, True),
          "PatchConv2D": (PatchConv2D, False)}
MATMUL_SIZE = 2048  # n of the n x n x n matmul that gives this CPU's float32 rate


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


def matmul_speed(rounds: int) -> list[float]:
    """FLOP/s of a square float32 matmul of MATMUL_SIZE in each of `rounds` rounds, a round the
    median of 10 calls."""
    matrix = tf.constant(np.random.default_rng(0).standard_normal(
        (MATMUL_SIZE, MATMUL_SIZE), dtype=np.float32))
    matmul = tf.function(lambda: tf.linalg.matmul(matrix, matrix))
    return [2 * MATMUL_SIZE**3 / median_seconds(lambda: matmul().numpy(), 10)
            for _ in range(rounds)]


def build_agent(convolution: type, bfloat16: bool, xla: bool, work_dir: str) -> DQNAgent:
    """The Pong agent with `convolution` in its torso (games.NATURE_CONV), in bfloat16 or not,
    and XLA on or off."""
    games.NATURE_CONV = convolution
    try:
        return DQNAgent(ENV_NAME, memory_size=1_000, bfloat16=bfloat16, xla=xla,
                        model_dir=work_dir, plot_dir=work_dir)
    finally:
        games.NATURE_CONV = keras.layers.Conv2D


def alternating_rounds(calls: dict[str, Callable[[], object]], rounds: int
                       ) -> dict[str, list[float]]:
    """Seconds per call of each candidate in each of `rounds` rounds (a round's figure the
    median of CALLS calls), the candidates taking turns within each round (each warmed up
    first)."""
    for call in calls.values():
        call()
    medians: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            medians[name].append(median_seconds(call, CALLS))
    return medians


def greedy_calls(agents: dict[str, DQNAgent]) -> dict[str, Callable[[], object]]:
    """The greedy-action candidates for one random Pong state."""
    conv_agent, bf16_agent = agents["Conv2D, XLA off"], agents["Conv2D bfloat16, XLA off"]
    state = np.random.default_rng(1).integers(0, 256, (1, *conv_agent.state_shape), np.uint8)

    def plain_call(agent: DQNAgent) -> Callable[[np.ndarray], np.ndarray]:
        return tensorflow_backend.greedy_call(agent.model, agent.state_dtype, xla=False)

    conv_plain, bf16_plain = plain_call(conv_agent), plain_call(bf16_agent)
    numpy_policy = agents["PatchConv2D, XLA off"].greedy_actions
    if numpy_policy.layers is None:
        raise RuntimeError("the PatchConv2D torso should run in numpy (greedy_policy.py)")

    def numpy_after_training() -> object:
        numpy_policy.weights_changed()
        return numpy_policy(state)

    return {"compiled by XLA (acting's)": lambda: conv_agent.greedy_actions(state),
            "compiled, no XLA": lambda: conv_plain(state),
            "bfloat16, compiled by XLA": lambda: bf16_agent.greedy_actions(state),
            "bfloat16, compiled, no XLA": lambda: bf16_plain(state),
            "numpy, PatchConv2D": lambda: numpy_policy(state),
            "numpy, weights copied first": numpy_after_training}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    timing.add_rounds_argument(parser, default=ROUNDS)
    provenance.add_results_argument(parser, __file__)
    args = parser.parse_args()
    timing.check_rounds(args.rounds)
    provenance.time_alone()  # no other timing shares the cores

    with tempfile.TemporaryDirectory() as work_dir:
        agents = {f"{name}, XLA {'on' if xla else 'off'}":
                  build_agent(convolution, bfloat16, xla, work_dir)
                  for name, (convolution, bfloat16) in TORSOS.items() for xla in (False, True)}
    conv_agent = agents["Conv2D, XLA off"]
    step_flops = gradient_step_flops(conv_agent.model, conv_agent.config.batch_size)
    # Acting first: a greedy call after gradient steps runs slower (bench_backends.py times one
    # right after a step), which would blur the gap between its candidates.
    actions = alternating_rounds(greedy_calls(agents), args.rounds)
    steps = alternating_rounds(
        {name: random_gradient_step(agent) for name, agent in agents.items()}, args.rounds)
    matmul_rates = matmul_speed(args.rounds)
    matmul_rate = statistics.median(matmul_rates)

    print(f"{ENV_NAME} gradient step, batch {conv_agent.config.batch_size}, "
          f"{step_flops / 1e9:.2f} GFLOP; median of {args.rounds} alternating rounds of {CALLS}; "
          f"float32 matmul {matmul_rate / 1e9:.0f} GFLOP/s")
    print(f"{'torso':<32} {'ms':>7} {'GFLOP/s':>8} {'of matmul':>10}")
    for name, rounds in steps.items():
        seconds = statistics.median(rounds)
        rate = step_flops / seconds
        print(f"{name:<32} {seconds * 1e3:7.2f} {rate / 1e9:8.0f} {rate / matmul_rate:10.0%}")
    print(f"\ngreedy action for one state (median of {args.rounds} rounds of {CALLS})")
    for name, rounds in actions.items():
        print(f"{name:<28} {statistics.median(rounds) * 1e3:7.3f} ms")
    provenance.write_results(args.results, {
        "env_name": ENV_NAME, "batch_size": conv_agent.config.batch_size, "rounds": args.rounds,
        "calls_per_round": CALLS, "gradient_step_flops": step_flops,
        "matmul_flops_per_second": matmul_rates, "gradient_step_seconds": steps,
        "greedy_action_seconds": actions})


if __name__ == "__main__":
    main()
