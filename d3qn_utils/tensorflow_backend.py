"""What is compiled on the TensorFlow backend (Keras' default): the gradient steps behind
`DQNAgent.replay`, the greedy forward pass, and reading the weights.

In place of the tutorial's `model.fit` per batch, one concrete function loops (`tf.scan`) over a
call's batches: one call from Python and one hand-over of the batches for all its gradient steps,
and XLA fuses a step's many small operations (one call's steps against one each, measured:
docs/benchmarks.md, "Several gradient steps per call").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from d3qn_utils.gradient_steps import Batches, CompiledSteps


class GradientSteps(CompiledSteps):
    """`CompiledSteps` as one traced TensorFlow call, XLA-compiled if `xla`."""

    def compile(self, state_shape: tuple[int, ...], state_dtype: Any, xla: bool) -> Any:
        """`all_steps` traced for batches of these states."""
        states = tf.TensorSpec((self.steps, None, *state_shape), tf.as_dtype(state_dtype))
        per_sample = tf.TensorSpec((self.steps, None), tf.float32)
        signature = Batches(states=states, actions=tf.TensorSpec((self.steps, None), tf.int32),
                            rewards=per_sample, next_states=states, dones=per_sample,
                            discounts=per_sample, is_weights=per_sample)
        return tf.function(self.all_steps, autograph=False, jit_compile=xla
                           ).get_concrete_function(signature)

    def all_steps(self, batches: Any) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The traced call: `one_step` on each batch in turn; (applied, |TD errors|, losses)."""
        if self.steps == 1:  # one batch: traced as it is, without tf.scan's loop around it
            abs_errors, loss, applied = self.one_step(
                type(batches)(*(field[0] for field in batches)), allowed=tf.constant(True))
            return applied, abs_errors[tf.newaxis], loss[tf.newaxis]
        first = (tf.zeros_like(batches.is_weights[0]), tf.constant(0.0), tf.constant(True))
        abs_errors, losses, applied = tf.scan(
            lambda previous, batch: self.one_step(batch, allowed=previous[2]), batches, first)
        return applied[-1], abs_errors, losses

    def one_step(self, batch: Any, allowed: tf.Tensor
                 ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """One gradient step, applied only if `allowed` and finite: (|TD errors|, loss, applied)."""
        with tf.GradientTape() as tape:
            loss, errors = self.loss(batch)
        variables = self.model.trainable_variables
        gradients, norm = tf.clip_by_global_norm(tape.gradient(loss, variables), self.grad_clip)

        def apply() -> tf.Tensor:
            self.optimizer.apply_gradients(zip(gradients, variables, strict=True))
            if self.after_step is not None:
                self.after_step()
            return tf.constant(True)

        finite = tf.math.is_finite(loss) & tf.math.is_finite(norm)
        applied = tf.cond(allowed & finite, apply, lambda: tf.constant(False))
        return tf.abs(errors), loss, applied


def greedy_call(model: Any, state_dtype: Any, xla: bool = True
                ) -> Callable[[np.ndarray], np.ndarray]:
    """argmax_a Q(s, a) of a batch of states, one traced call, by XLA unless `xla` is False
    (both timed for one Pong state: docs/benchmarks.md)."""
    spec = tf.TensorSpec((None, *model.input_shape[1:]), tf.as_dtype(state_dtype))
    traced = tf.function(
        lambda states: tf.argmax(model(states, training=False), axis=1, output_type=tf.int32),
        autograph=False, jit_compile=xla).get_concrete_function(spec)
    return lambda states: traced(states).numpy()


def weights_reader(variables: list) -> Callable[[], list[np.ndarray]]:
    """A function returning the current values of `variables` as numpy arrays, read in one
    traced call: one dispatch for all of them, not one `.numpy()` read per variable."""
    read = tf.function(lambda: [tf.identity(v) for v in variables],
                       autograph=False).get_concrete_function()
    return lambda: [tensor.numpy() for tensor in read()]
