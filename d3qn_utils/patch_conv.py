"""`PatchConv2D`: a convolution computed as one matrix product, for MinAtar's torso.

MinAtar's network (`OurModel` for images under 36x36) starts with a 16-filter 3x3 convolution of
a 10x10 frame. On a CPU, TensorFlow's Conv2D spends most of a gradient step's time on such tiny
convolutions (and XLA makes them slower still); the same convolution written as "gather every
3x3 patch, multiply by the kernel" is one slice-and-concatenate plus one matrix product, which
XLA fuses: about 2-3x faster a gradient step here (`benchmarks/bench_atari.py --minatar`).

The layer holds its weights exactly as Conv2D does (kernel (kh, kw, channels, filters), bias), so
it computes the same function, and `greedy_policy.py` runs it in numpy as it runs a Conv2D. With
strides it computes the Nature DQN torso's strided convolutions too (8x8/4, 4x4/2): on this
project's CPUs TensorFlow's own Conv2D is faster for those 84x84 frames, so the Atari torso keeps
Conv2D (`benchmarks/bench_pong_kernels.py` times both, docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

import keras


def output_size(size: int, kernel_size: int, strides: int) -> int:
    """Rows (or columns) of a "valid" convolution's output for `size` input rows."""
    return (size - kernel_size) // strides + 1


def shifted_views(images: Any, kernel_size: int, strides: int = 1) -> list:
    """The k*k views of `images` (batch, rows, cols, channels) shifted by (i, j) for i, j < k, in
    the kernel's (i, j) order, each taking every `strides`-th row and column: view (i, j) at
    (r, c) is images[r * strides + i, c * strides + j], the input a "valid" k x k convolution
    multiplies by kernel[i, j] for output (r, c). Slices only, so numpy arrays and tensors alike
    (greedy_policy.py uses both)."""
    rows = output_size(images.shape[1], kernel_size, strides)
    cols = output_size(images.shape[2], kernel_size, strides)
    row_span, col_span = (rows - 1) * strides + 1, (cols - 1) * strides + 1
    return [images[:, i:i + row_span:strides, j:j + col_span:strides, :]
            for i in range(kernel_size) for j in range(kernel_size)]


@keras.saving.register_keras_serializable(package="d3qn")
class PatchConv2D(keras.layers.Layer):
    """Conv2D(filters, kernel_size, strides, padding="valid") on channels-last images.

    For an input (batch, rows, cols, channels), a k x k kernel and stride s, every output
    position (r, c) is activation(sum over i, j < k and channels of x[r * s + i, c * s + j, ch]
    * kernel[i, j, ch, f] + bias[f]). The k*k shifted views of the image are concatenated along
    the channels, in the kernel's (i, j, channel) order, and multiplied by the kernel reshaped to
    (k*k*channels, filters). Cost: k*k copies of the output-sized views and one
    (positions, k*k*channels) x (.., filters) product per image.
    """

    def __init__(self, filters: int, kernel_size: int, strides: int = 1, activation: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(filters, int) or filters < 1:
            raise ValueError(f"filters must be a positive int, got {filters!r}")
        if not isinstance(kernel_size, int) or kernel_size < 1:
            raise ValueError(f"kernel_size must be a positive int, got {kernel_size!r}")
        if not isinstance(strides, int) or strides < 1:
            raise ValueError(f"strides must be a positive int, got {strides!r}")
        self.filters = filters
        self.kernel_size = kernel_size
        self.strides = strides
        self.activation = keras.activations.get(activation)

    def build(self, input_shape: tuple) -> None:
        channels = input_shape[-1]
        self.kernel = self.add_weight(
            shape=(self.kernel_size, self.kernel_size, channels, self.filters),
            initializer="glorot_uniform", name="kernel")  # Conv2D's defaults
        self.bias = self.add_weight(shape=(self.filters,), initializer="zeros", name="bias")

    def call(self, inputs: Any) -> Any:
        patches = keras.ops.concatenate(
            shifted_views(inputs, self.kernel_size, self.strides), axis=-1)
        kernel = keras.ops.reshape(self.kernel, (-1, self.filters))
        return self.activation(keras.ops.matmul(patches, kernel) + self.bias)

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        k, s = self.kernel_size, self.strides
        return (input_shape[0], output_size(input_shape[1], k, s),
                output_size(input_shape[2], k, s), self.filters)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "filters": self.filters,
                "kernel_size": self.kernel_size, "strides": self.strides,
                "activation": keras.activations.serialize(self.activation)}
