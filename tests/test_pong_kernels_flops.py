"""bench_pong_kernels.py counts a network's arithmetic as one would by hand."""


import keras

from benchmarks import bench_pong_kernels as kernels


def test_forward_flops_counts_multiply_adds_of_convolutions_and_dense_layers() -> None:
    inputs = keras.Input((8, 8, 2))
    x = keras.layers.Conv2D(3, 4, strides=2, activation="relu")(inputs)  # 3x3x3 outputs
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(5)(x)
    model = keras.Model(inputs, outputs)
    first_conv = 2 * (3 * 3 * 3) * (4 * 4 * 2)  # 2 x outputs x kernel inputs = 1,728
    assert kernels.forward_flops(model) == (first_conv + 2 * 27 * 5, first_conv)


def test_the_atari_network_is_the_nature_dqn_torso_with_a_dueling_head(tmp_path) -> None:
    agent = kernels.DQNAgent("PongNoFrameskip-v4", memory_size=100, model_dir=str(tmp_path),
                             plot_dir=str(tmp_path))
    convolutions = (2 * 20 * 20 * 32 * 8 * 8 * 4, 2 * 9 * 9 * 64 * 4 * 4 * 32,
                    2 * 7 * 7 * 64 * 3 * 3 * 64)
    dense = 2 * 3136 * 512 + 2 * 512 * (1 + 6)
    assert kernels.forward_flops(agent.model) == (sum(convolutions) + dense, convolutions[0])


def test_a_patch_conv_torso_counts_as_the_conv2d_torso_and_a_step_as_five_passes() -> None:
    def model(convolution: type) -> keras.Model:
        inputs = keras.Input((8, 8, 2))
        x = keras.layers.Flatten()(convolution(3, 4, strides=2)(inputs))
        return keras.Model(inputs, keras.layers.Dense(5)(x))

    forward, first_conv = kernels.forward_flops(model(keras.layers.Conv2D))
    assert kernels.forward_flops(model(kernels.PatchConv2D)) == (forward, first_conv)
    # Batch 4: online forward + backward (the first layer without its input gradient), and the
    # next states through the online and the target network.
    # forward 1,728 + 270 = 1,998 a sample: 4 x (3 x 1,998 - 1,728 + 2 x 1,998) = 33,048.
    assert (forward, first_conv) == (1_998, 1_728)
    assert kernels.gradient_step_flops(model(keras.layers.Conv2D), 4) == 33_048
