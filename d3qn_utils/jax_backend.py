"""What is compiled on the JAX backend (KERAS_BACKEND=jax): tensorflow_backend.py's calls.

A jitted JAX function must be pure, so each call takes the variables' values and returns the
new ones (`keras.StatelessScope` maps the variables to them), assigned back after the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np

from d3qn_utils.gradient_steps import Batches, CompiledSteps


class GradientSteps(CompiledSteps):
    """`CompiledSteps` as one jitted JAX call (`xla` is moot: JAX always compiles with XLA)."""

    def compile(self, state_shape: tuple[int, ...], state_dtype: Any, xla: bool) -> Any:
        self.jitted = jax.jit(self.all_steps)
        return self.on_variables

    def on_variables(self, batches: Batches) -> tuple:
        """The jitted call on the variables' values, the new ones assigned back."""
        online, target, optimizer = (self.model.trainable_variables, self.target_model.variables,
                                     self.optimizer.variables)
        values = [[variable.value for variable in group] for group in (online, target, optimizer)]
        fixed = [variable.value for variable in self.model.non_trainable_variables]
        *values, applied, abs_errors, losses = self.jitted(*values, fixed, tuple(batches))
        for group, new_values in zip((online, target, optimizer), values, strict=True):
            for variable, value in zip(group, new_values, strict=True):
                variable.assign(value)
        return applied, abs_errors, losses

    def all_steps(self, online: list, target: list, optimizer: list, fixed: list,
                  batches: tuple) -> tuple:
        """The jitted call: `one_step` on each batch, none applied after a non-finite one."""
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

        def scope(online: list) -> keras.StatelessScope:
            return keras.StatelessScope(
                state_mapping=[*zip(model.trainable_variables, online, strict=True), *reads])

        def loss_of(online: list) -> tuple:
            with scope(online):
                return self.loss(batch)

        (loss, errors), gradients = jax.value_and_grad(loss_of, has_aux=True)(online)
        # tf.clip_by_global_norm's rule: g * clip / max(norm, clip).
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(gradient)) for gradient in gradients))
        gradients = [gradient * (self.grad_clip / jnp.maximum(norm, self.grad_clip))
                     for gradient in gradients]
        online, optimizer = self.optimizer.stateless_apply(optimizer, gradients, online)
        if self.after_step is not None:  # the soft target update reads the new online values
            with scope(online) as stepped:
                self.after_step()
            target = [stepped.get_current_value(variable) for variable in target_model.variables]
        finite = jnp.isfinite(loss) & jnp.isfinite(norm)
        return online, target, optimizer, jnp.abs(errors), loss, finite


def greedy_call(model: Any, state_dtype: Any) -> Callable[[np.ndarray], np.ndarray]:
    """argmax_a Q(s, a) of a batch of states, one jitted forward pass on the model's values."""
    forward = jax.jit(lambda online, fixed, states: jnp.argmax(
        model.stateless_call(online, fixed, states, training=False)[0], axis=1))
    return lambda states: np.asarray(forward([v.value for v in model.trainable_variables],
                                             [v.value for v in model.non_trainable_variables],
                                             np.asarray(states, dtype=state_dtype)))


def weights_reader(variables: list) -> Callable[[], list[np.ndarray]]:
    """A function returning the current values of `variables` as numpy arrays."""
    return lambda: [np.asarray(variable.value) for variable in variables]
