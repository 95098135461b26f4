"""What `DQNAgent.replay` hands the compiled gradient steps, where the tutorial called
`model.fit`: several gradient steps in one call, each on its own batch. The call itself,
`GradientSteps`, is in the module `compiled_backend()` returns for Keras' backend.
"""

from __future__ import annotations

import importlib
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
        """One draw of steps x batch transitions dealt into `steps` batches (`deal`), in the
        dtypes the compiled call takes."""
        states, actions, rewards, next_states, dones, discounts = batch
        return cls(deal(states, steps), deal(actions, steps).astype(np.int32),
                   deal(rewards, steps).astype(np.float32), deal(next_states, steps),
                   deal(dones, steps).astype(np.float32), deal(discounts, steps).astype(np.float32),
                   deal(is_weights, steps).astype(np.float32))


def deal(array: np.ndarray, steps: int) -> np.ndarray:
    """Deal a draw of steps x batch items into `steps` batches, as cards: (steps * batch, ...)
    -> (steps, batch, ...), batch k holding items k, k + steps, k + 2 steps, ..."""
    return array.reshape(-1, steps, *array.shape[1:]).swapaxes(0, 1)


def non_finite_error(env_step: int, losses: np.ndarray) -> NonFiniteError:
    """The error of a compiled call whose step at `env_step` had a non-finite loss or gradient."""
    return NonFiniteError(f"training at env step {env_step} gave a non-finite loss or gradient "
                          f"(losses {losses.tolist()}); from there on the call's steps were not "
                          "applied")


def compiled_backend() -> ModuleType:
    """tensorflow_backend or jax_backend, as Keras runs; ValueError for another backend."""
    name = keras.backend.backend()
    if name not in BACKENDS:
        raise ValueError(f"the Keras backend {name!r} (KERAS_BACKEND) is not supported here: "
                         f"use one of {', '.join(BACKENDS)}")
    return importlib.import_module(f"d3qn_utils.{name}_backend")

