"""What is compiled on the JAX backend (KERAS_BACKEND=jax): the gradient steps behind
`DQNAgent.replay`, the greedy forward pass, and reading the weights. `compiled_backend()` in
gradient_steps.py picks this module or tensorflow_backend.py from `keras.backend.backend()`.

Keras variables hold state; a jitted JAX function must be pure. So each call takes the variables'
values as arguments and returns the new ones: inside it, `keras.StatelessScope` maps every
variable the model reads to a value (what Keras' own `stateless_call` does), `jax.value_and_grad`
differentiates `loss` with respect to the online network's values, `optimizer.stateless_apply`
takes the Adam (or RMSprop) step, and `lax.scan` loops over the batches, as `tf.scan` does in
tensorflow_backend.py. The new values are assigned back to the variables after the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np

from d3qn_utils.gradient_steps import Batches
from d3qn_utils.training_session import NonFiniteError


class GradientSteps:
    """`steps` gradient steps of `loss` in one jitted call; tensorflow_backend.GradientSteps on
    JAX, with the same arguments and results (`xla` is moot: JAX always compiles with XLA)."""

    def __init__(self, loss: Callable[[Batches], tuple[Any, Any]], model: Any, target_model: Any,
                 optimizer: Any, grad_clip: float, after_step: Callable[[], None] | None,
                 steps: int, state_shape: tuple[int, ...], state_dtype: Any, xla: bool,
                 after_call: Callable[[], None] | None = None) -> None:
        self.loss = loss
        self.model = model
        self.target_model = target_model
        self.optimizer = optimizer
        self.grad_clip = grad_clip
        self.after_step = after_step
        self.after_call = after_call
        optimizer.build(model.trainable_variables)
        self.compiled = jax.jit(self.all_steps)

    def __call__(self, batches: Batches, env_step: int) -> tuple[np.ndarray, np.ndarray]:
        """Train on `batches`; return the |TD errors| (steps, batch size) and the losses, each
        from before its step. `env_step` only names the moment in a NonFiniteError."""
        online, target, optimizer = (self.model.trainable_variables, self.target_model.variables,
                                     self.optimizer.variables)
        values = [[variable.value for variable in group] for group in (online, target, optimizer)]
        fixed = [variable.value for variable in self.model.non_trainable_variables]
        *values, applied, abs_errors, losses = self.compiled(*values, fixed, tuple(batches))
        for group, new_values in zip((online, target, optimizer), values, strict=True):
            for variable, value in zip(group, new_values, strict=True):
                variable.assign(value)
        if self.after_call is not None:
            self.after_call()
        if not applied:
            raise NonFiniteError(f"training at env step {env_step} gave a non-finite loss or "
                                 f"gradient (losses {np.asarray(losses).tolist()}); from there "
                                 "on the call's steps were not applied")
        return np.asarray(abs_errors), np.asarray(losses)

    def all_steps(self, online: list, target: list, optimizer: list, fixed: list,
                  batches: tuple) -> tuple:
        """The jitted call: `one_step` on each batch in turn. A step whose loss or gradient norm
        is NaN or inf, and every one after it, leaves the values as they were."""
        def step(carry: tuple, batch: tuple) -> tuple:
            *values, allowed = carry
            *new_values, abs_errors, loss, finite = self.one_step(*values, fixed, Batches(*batch))
            applied = allowed & finite
            kept = jax.tree.map(lambda new, old: jnp.where(applied, new, old), new_values, values)
            return (*kept, applied), (abs_errors, loss)

        (online, target, optimizer, applied), (abs_errors, losses) = jax.lax.scan(
            step, (online, target, optimizer, jnp.array(True)), batches)
        return online, target, optimizer, applied, abs_errors, losses

    def one_step(self, online: list, target: list, optimizer: list, fixed: list, batch: Batches
                 ) -> tuple:
        """One gradient step on the values: (new online, target and optimizer values, |TD
        errors|, loss, whether loss and gradient norm are finite)."""
        model, target_model = self.model, self.target_model
        reads = [*zip(model.non_trainable_variables, fixed, strict=True),
                 *zip(target_model.variables, target, strict=True)]

        def loss_of(online: list) -> tuple:
            with keras.StatelessScope(state_mapping=[
                    *zip(model.trainable_variables, online, strict=True), *reads]):
                return self.loss(batch)

        (loss, errors), gradients = jax.value_and_grad(loss_of, has_aux=True)(online)
        # tf.clip_by_global_norm's rule: g * clip / max(norm, clip).
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(gradient)) for gradient in gradients))
        gradients = [gradient * (self.grad_clip / jnp.maximum(norm, self.grad_clip))
                     for gradient in gradients]
        online, optimizer = self.optimizer.stateless_apply(optimizer, gradients, online)
        if self.after_step is not None:  # the soft target update reads the new online values
            with keras.StatelessScope(state_mapping=[
                    *zip(model.trainable_variables, online, strict=True), *reads]) as scope:
                self.after_step()
            target = [scope.get_current_value(variable) for variable in target_model.variables]
        finite = jnp.isfinite(loss) & jnp.isfinite(norm)
        return online, target, optimizer, jnp.abs(errors), loss, finite


def greedy_call(model: Any, state_dtype: Any) -> Callable[[np.ndarray], np.ndarray]:
    """argmax_a Q(s, a) of a batch of states, one jitted forward pass on the model's values."""
    forward = jax.jit(lambda online, fixed, states: jnp.argmax(
        model.stateless_call(online, fixed, states, training=False)[0], axis=1))

    def greedy(states: np.ndarray) -> np.ndarray:
        return np.asarray(forward([v.value for v in model.trainable_variables],
                                  [v.value for v in model.non_trainable_variables],
                                  np.asarray(states, dtype=state_dtype)))

    return greedy


def weights_reader(variables: list) -> Callable[[], list[np.ndarray]]:
    """A function returning the current values of `variables` as numpy arrays."""
    return lambda: [np.asarray(variable.value) for variable in variables]
