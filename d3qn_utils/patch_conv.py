"""`PatchConv2D`: a convolution computed as one matrix product, for MinAtar's torso.

MinAtar's convolution is a tiny 3x3 one over a 10x10 frame, a small job for Conv2D's kernels;
here the patches are gathered and multiplied once by the kernel, which XLA fuses. Its
weights are Conv2D's. For 84x84 Atari frames benchmarks/bench_pong_kernels.py times the two
(docs/benchmarks.md), and the Atari torso keeps Conv2D.
"""

from __future__ import annotations

from typing import Any

import keras

from d3qn_utils.checks import check_integer


def shifted_views(images: Any, kernel_size: int, strides: int = 1) -> list:
    """The k*k views of `images` (batch, rows, cols, channels) in the kernel's (i, j) order, view
    (i, j) at (r, c) being images[r * strides + i, c * strides + j]: slices, for numpy or Keras."""
    rows, cols = (size - kernel_size + 1 for size in images.shape[1:3])  # the views at stride 1
    return [images[:, i:i + rows:strides, j:j + cols:strides, :]
            for i in range(kernel_size) for j in range(kernel_size)]


@keras.saving.register_keras_serializable(package="d3qn")
class PatchConv2D(keras.layers.Layer):
    """Conv2D(filters, kernel_size, strides, padding="valid") on channels-last images: the
    shifted views concatenated along the channels, times the kernel as (k*k*channels, filters)."""

    def __init__(self, filters: int, kernel_size: int, strides: int = 1, activation: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.filters = check_integer("filters", filters, 1)
        self.kernel_size = check_integer("kernel_size", kernel_size, 1)
        self.strides = check_integer("strides", strides, 1)
        self.activation = keras.activations.get(activation)

    def build(self, input_shape: tuple) -> None:
        self.kernel = self.add_weight(
            shape=(self.kernel_size, self.kernel_size, input_shape[-1], self.filters),
            initializer="glorot_uniform", name="kernel")  # Conv2D's defaults
        self.bias = self.add_weight(shape=(self.filters,), initializer="zeros", name="bias")

    def call(self, inputs: Any) -> Any:
        patches = keras.ops.concatenate(
            shifted_views(inputs, self.kernel_size, self.strides), axis=-1)
        kernel = keras.ops.reshape(self.kernel, (-1, self.filters))
        return self.activation(keras.ops.matmul(patches, kernel) + self.bias)

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        rows, cols = ((size - self.kernel_size) // self.strides + 1 for size in input_shape[1:3])
        return (input_shape[0], rows, cols, self.filters)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "filters": self.filters,
                "kernel_size": self.kernel_size, "strides": self.strides,
                "activation": keras.activations.serialize(self.activation)}
