"""What `DQNAgent.replay` hands the compiled gradient steps, where the tutorial called
`model.fit`: several gradient steps in one call, each on its own batch. The call itself is the
`GradientSteps` of the module `compiled_backend()` returns, a `CompiledSteps`, with the optimizer
`make_optimizer` builds (apex.py's learner uses both too).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import keras
import numpy as np

from d3qn_utils.training_session import NonFiniteError

BACKENDS = ("tensorflow", "jax")  # the Keras backends with a module here: <name>_backend.py


class Batches(NamedTuple):
    """`Memory.sample`'s arrays for several gradient steps, each with a leading axis of steps."""

    states: Any
    actions: Any
    rewards: Any
    next_states: Any
    dones: Any
    discounts: Any
    is_weights: Any

    @classmethod
    def dealt(cls, batch: tuple[np.ndarray, ...], is_weights: np.ndarray, steps: int
              ) -> Batches:
        """A draw of steps x batch transitions dealt into `steps` batches (`deal`), in the dtypes
        the compiled call takes."""
        states, actions, rewards, next_states, dones, discounts = batch
        return cls(deal(states, steps), deal(actions, steps).astype(np.int32),
                   deal(rewards, steps).astype(np.float32), deal(next_states, steps),
                   deal(dones, steps).astype(np.float32), deal(discounts, steps).astype(np.float32),
                   deal(is_weights, steps).astype(np.float32))


def deal(array: np.ndarray, steps: int) -> np.ndarray:
    """Deal a draw of steps x batch items into `steps` batches, as cards: (steps * batch, ...)
    -> (steps, batch, ...), batch k holding items k, k + steps, k + 2 steps, ..."""
    return array.reshape(-1, steps, *array.shape[1:]).swapaxes(0, 1)


class CompiledSteps:
    """`steps` gradient steps of `loss(batch)` -> (scalar loss, TD errors) on `model`'s weights
    with `optimizer`, in one call of `compiled` (the backend's `compile`: batches -> (applied,
    |TD errors|, losses)). Each step clips the gradient's global norm to `grad_clip`, applies it,
    then calls `after_step` (or None); `after_call` runs after each call. A step whose loss or
    gradient norm is not finite is not applied, nor any after it, and the call raises
    NonFiniteError: a NaN would poison the weights and, through the TD errors, the sum tree."""

    def __init__(self, loss: Callable[[Batches], tuple[Any, Any]], model: Any, target_model: Any,
                 optimizer: Any, grad_clip: float, after_step: Callable[[], None] | None,
                 steps: int, state_shape: tuple[int, ...], state_dtype: Any, xla: bool,
                 after_call: Callable[[], None] | None = None) -> None:
        self.loss, self.model, self.target_model = loss, model, target_model
        self.optimizer, self.grad_clip, self.steps = optimizer, grad_clip, steps
        self.after_step, self.after_call = after_step, after_call
        optimizer.build(model.trainable_variables)  # no variable may be created in a graph
        self.compiled = self.compile(state_shape, state_dtype, xla)

    def __call__(self, batches: Batches, env_step: int) -> tuple[np.ndarray, np.ndarray]:
        """Train on `batches`: the |TD errors| (steps, batch size) and the losses, each from
        before its step; NonFiniteError naming `env_step` if a step was not applied."""
        applied, abs_errors, losses = self.compiled(batches)
        if self.after_call is not None:
            self.after_call()
        if not applied:
            raise NonFiniteError(f"training at env step {env_step} gave a non-finite loss or "
                                 f"gradient (losses {np.asarray(losses).tolist()}); from there "
                                 "on the call's steps were not applied")
        return np.asarray(abs_errors), np.asarray(losses)


def make_optimizer(name: str, learning_rate: float, adam_epsilon: float,
                   decay_steps: int | None = None) -> keras.optimizers.Optimizer:
    """Adam (`adam_epsilon` its epsilon), or "rmsprop", the tutorial's (rho 0.95, epsilon 0.01);
    with `decay_steps` the step size annealed linearly to 0 over that many gradient steps."""
    if decay_steps is not None:
        # Late steps get small, so the noise of bootstrapped targets cannot undo a policy.
        learning_rate = keras.optimizers.schedules.PolynomialDecay(
            learning_rate, decay_steps, end_learning_rate=0.0)
    if name == "rmsprop":
        return keras.optimizers.RMSprop(learning_rate, rho=0.95, epsilon=0.01)
    return keras.optimizers.Adam(learning_rate, epsilon=adam_epsilon)


def compiled_backend() -> ModuleType:
    """tensorflow_backend or jax_backend, as Keras runs; ValueError for another backend."""
    name = keras.backend.backend()
    if name not in BACKENDS:
        raise ValueError(f"the Keras backend {name!r} (KERAS_BACKEND) is not supported here: "
                         f"use one of {', '.join(BACKENDS)}")
    return importlib.import_module(f"d3qn_utils.{name}_backend")

