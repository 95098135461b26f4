"""PatchConv2D against TensorFlow's Conv2D, with strides: a tiny case by hand, the Nature DQN
torso's shapes, the numpy forward pass of greedy_policy.py, and saving."""

import keras
import numpy as np
import pytest

from d3qn_utils.greedy_policy import numpy_forward
from d3qn_utils.patch_conv import PatchConv2D, shifted_views

NATURE_LAYERS = [  # (filters, kernel, stride, input shape): the Nature DQN torso, and odd sizes
    (32, 8, 4, (2, 84, 84, 4)), (64, 4, 2, (2, 20, 20, 32)), (64, 3, 1, (2, 9, 9, 64)),
    (5, 4, 2, (3, 11, 13, 3)), (5, 3, 3, (1, 10, 8, 2))]


def test_a_strided_sum_by_hand():
    # A 5x5 image 0..24 row by row, a 3x3 kernel of ones, stride 2: each output is the sum of a
    # 3x3 block with top left (a, b), 9 * (5a + b) + 54: 54, 72 / 144, 162.
    image = np.arange(25, dtype=np.float32).reshape(1, 5, 5, 1)
    layer = PatchConv2D(1, 3, strides=2)
    layer.build(image.shape)
    layer.set_weights([np.ones((3, 3, 1, 1), np.float32), np.zeros(1, np.float32)])
    np.testing.assert_array_equal(np.asarray(layer(image))[0, :, :, 0], [[54, 72], [144, 162]])
    assert [view.shape for view in shifted_views(image, 3, 2)] == [(1, 2, 2, 1)] * 9


@pytest.mark.parametrize(("filters", "kernel", "stride", "shape"), NATURE_LAYERS)
def test_strided_patch_conv_is_conv2d_with_the_same_weights(filters, kernel, stride, shape):
    images = np.random.default_rng(kernel * stride).random(shape, dtype=np.float32)
    patch = PatchConv2D(filters, kernel, strides=stride, activation="relu")
    conv = keras.layers.Conv2D(filters, kernel, strides=stride, activation="relu")
    conv.build(shape)
    patch.build(shape)
    rng = np.random.default_rng(0)
    weights = [rng.normal(size=w.shape).astype(np.float32) for w in conv.get_weights()]
    conv.set_weights(weights)
    patch.set_weights(weights)  # the same weights, in the same layout
    expected = np.asarray(conv(images))
    assert patch.compute_output_shape(shape) == expected.shape
    np.testing.assert_allclose(np.asarray(patch(images)), expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(numpy_forward(patch, weights, images), expected, rtol=1e-5,
                               atol=1e-4)


def test_strides_are_saved_and_a_config_without_them_means_one(tmp_path):
    inputs = keras.Input((20, 20, 3))
    model = keras.Model(inputs, PatchConv2D(4, 4, strides=2)(inputs))
    model.save(tmp_path / "strided.keras")
    loaded = keras.models.load_model(tmp_path / "strided.keras", safe_mode=True)
    assert loaded.layers[-1].strides == 2 and loaded.output_shape == (None, 9, 9, 4)
    config = PatchConv2D(4, 3).get_config()
    del config["strides"]  # as MinAtar networks saved before strides were there
    assert PatchConv2D.from_config(config).strides == 1


def test_a_bad_kernel_size_is_refused_by_value():
    with pytest.raises(ValueError, match="kernel_size must be an integer >= 1, got 0"):
        PatchConv2D(16, 0)


@pytest.mark.parametrize("strides", [0, 1.5, "2", True])
def test_a_bad_stride_is_refused_by_value(strides):
    with pytest.raises(ValueError, match=f"strides must be an integer >= 1, got {strides!r}"):
        PatchConv2D(4, 3, strides=strides)
