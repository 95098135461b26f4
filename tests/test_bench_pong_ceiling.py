"""The Pong ceiling benchmark counts a network's arithmetic as one would by hand."""

import sys
from pathlib import Path

import keras

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_pong_ceiling as ceiling


def test_forward_flops_counts_multiply_adds_of_convolutions_and_dense_layers() -> None:
    inputs = keras.Input((8, 8, 2))
    x = keras.layers.Conv2D(3, 4, strides=2, activation="relu")(inputs)  # 3x3x3 outputs
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(5)(x)
    model = keras.Model(inputs, outputs)
    first_conv = 2 * (3 * 3 * 3) * (4 * 4 * 2)  # 2 x outputs x kernel inputs = 1,728
    assert ceiling.forward_flops(model) == (first_conv + 2 * 27 * 5, first_conv)


def test_the_atari_network_is_the_nature_dqn_torso_with_a_dueling_head(tmp_path) -> None:
    agent = ceiling.DQNAgent("PongNoFrameskip-v4", memory_size=100, model_dir=str(tmp_path),
                             plot_dir=str(tmp_path))
    convolutions = (2 * 20 * 20 * 32 * 8 * 8 * 4, 2 * 9 * 9 * 64 * 4 * 4 * 32,
                    2 * 7 * 7 * 64 * 3 * 3 * 64)
    dense = 2 * 3136 * 512 + 2 * 512 * (1 + 6)
    assert ceiling.forward_flops(agent.model) == (sum(convolutions) + dense, convolutions[0])
