"""The greedy policy argmax_a Q(s, a) of a Q-network, as cheap to call as the network allows.

`act` needs one greedy action per environment step. Through TensorFlow, even a traced call costs
~300 µs of fixed overhead; CartPole's whole 4-256-256-(1+2) forward pass costs ~20 µs in numpy.
So for a multilayer perceptron (`OurModel` for vector states) `GreedyPolicy` runs the forward
pass in numpy on a copy of the weights, taken again at the first call after the agent says they
changed (`weights_changed()`: after training, loading, or restoring a checkpoint), one copy
per training call: every 16 CartPole steps. For images the
convolutions stay in a traced TensorFlow function.

With the dueling head, Q(s, a) = V(s) + A(s, a) - mean A(s, .) differs from A(s, a) by the same
amount for every action, so the greedy action is argmax A(s, .), and V is not computed.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

NUMPY_ACTIVATIONS = {"relu": lambda x: np.maximum(x, 0.0), "linear": lambda x: x}


def mlp_layers(model: keras.Model) -> list[keras.layers.Dense] | None:
    """The Dense layers of an `OurModel` MLP, from the input to the head whose argmax is the
    greedy action (A for the dueling head, else Q); None for any other network (conv torso)."""
    if len(model.input_shape) != 2:
        return None
    dense = [layer for layer in model.layers
             if isinstance(layer, keras.layers.Dense) and layer.name != "state_value"]
    others = [layer.__class__.__name__ for layer in model.layers
              if not isinstance(layer, (keras.layers.InputLayer, keras.layers.Dense))]
    head = dense[-1].name if dense else None
    if (head, others) not in (("q_values", []), ("action_advantage", ["DuelingCombine"])):
        return None
    if any(layer.activation.__name__ not in NUMPY_ACTIVATIONS for layer in dense):
        return None
    return dense


class GreedyPolicy:
    """argmax_a Q(s, a) for a batch of states: numpy for an MLP, a traced TensorFlow call else."""

    def __init__(self, model: keras.Model, state_dtype: Any) -> None:
        self.layers = mlp_layers(model)
        self._weights: list[np.ndarray] | None = None
        if self.layers is None:
            spec = tf.TensorSpec((None, *model.input_shape[1:]), tf.as_dtype(state_dtype))
            self._traced = tf.function(
                lambda states: tf.argmax(model(states, training=False), axis=1,
                                         output_type=tf.int32),
                autograph=False).get_concrete_function(spec)
        else:
            # One traced call reads all the weights: ~0.2 ms, where `.numpy()` on each
            # variable costs ~0.1 ms apiece.
            variables = [v for layer in self.layers for v in (layer.kernel, layer.bias)]
            self._read_weights = tf.function(
                lambda: [tf.identity(v) for v in variables],
                autograph=False).get_concrete_function()
            self._activations = [NUMPY_ACTIVATIONS[layer.activation.__name__]
                                 for layer in self.layers]

    def weights_changed(self) -> None:
        """Note that the network's weights changed: the next call copies them (~0.2 ms)."""
        self._weights = None

    def __call__(self, states: np.ndarray) -> np.ndarray:
        """Greedy actions (int) of a batch of states (batch, *state_shape)."""
        if self.layers is None:
            return self._traced(states).numpy()
        if self._weights is None:
            self._weights = [tensor.numpy() for tensor in self._read_weights()]
        x = np.asarray(states, np.float32)
        for i, activation in enumerate(self._activations):
            x = activation(x @ self._weights[2 * i] + self._weights[2 * i + 1])
        return x.argmax(axis=1)
