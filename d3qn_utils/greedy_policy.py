"""The greedy policy argmax_a Q(s, a) of a Q-network, as cheap to call as the network allows.

A traced TensorFlow call has a fixed cost per call that a small numpy forward pass has not (the
`act` rows of docs/benchmarks.md's loop tables measure acting), so an MLP or MinAtar's
`PatchConv2D` torso runs in numpy on a copy of the weights, taken again after
`weights_changed()` (the agent calls it after each replay() call: every TRAIN_FREQUENCY x
GRADIENT_STEPS_PER_CALL environment steps, 32 on CartPole); the Nature torso stays compiled.
With the dueling head the greedy action is argmax A(s, .), so the numpy pass stops at the
advantages. The agent acts with `epsilon_greedy_actions` (one action per environment, one forward
pass), apex.py's actors with `epsilon_greedy`; both programs evaluate (`play_greedy`), score
episodes (`unclipped_score`) and keep the best evaluated network (`keep_best`) with what is here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import keras
import numpy as np

from d3qn_utils.gradient_steps import compiled_backend
from d3qn_utils.patch_conv import PatchConv2D, shifted_views

if TYPE_CHECKING:
    from d3qn_utils.training_session import StopRequest

NUMPY_ACTIVATIONS = {"relu": lambda x: np.maximum(x, 0.0), "linear": lambda x: x}
TORSO_LAYERS = (keras.layers.Rescaling, PatchConv2D, keras.layers.Flatten, keras.layers.Dense)
When = TypeVar("When")  # what marks an evaluation: an env step, or (env step, seconds)


def numpy_layers(model: keras.Model, head: str | None = None) -> list[keras.layers.Layer] | None:
    """The layers a numpy forward pass runs, from the input to the layer `head` whose argmax is
    the greedy action (the output if the model has no such layer), if all are float32
    TORSO_LAYERS; None for any other network (Conv2D, bfloat16, a dueling merge)."""
    names = [layer.name for layer in model.layers]
    output = model.get_layer(head).output if head in names else model.output
    layers = [layer for layer in keras.Model(model.inputs, output).layers
              if not isinstance(layer, keras.layers.InputLayer)]
    for layer in layers:
        activation = getattr(layer, "activation", None)
        if not isinstance(layer, TORSO_LAYERS) or layer.compute_dtype != "float32" or (
                activation is not None and activation.__name__ not in NUMPY_ACTIVATIONS):
            return None
    return layers


def numpy_forward(layer: keras.layers.Layer, weights: list[np.ndarray], x: np.ndarray
                  ) -> np.ndarray:
    """One layer of `numpy_layers` applied to a float32 batch `x`."""
    if isinstance(layer, keras.layers.Rescaling):
        return x * np.float32(layer.scale) + np.float32(layer.offset)
    if isinstance(layer, keras.layers.Flatten):
        return x.reshape(len(x), -1)
    kernel, bias = weights
    if isinstance(layer, PatchConv2D):  # as PatchConv2D computes it: patches times the kernel
        x = np.concatenate(shifted_views(x, layer.kernel_size, layer.strides), axis=-1)
        kernel = kernel.reshape(-1, kernel.shape[-1])
    return NUMPY_ACTIVATIONS[layer.activation.__name__](x @ kernel + bias)


class GreedyPolicy:
    """argmax_a Q(s, a) for a batch of states: numpy where `numpy_layers` allows, else compiled.
    `head`: a layer with the same argmax as the output (a dueling network's advantages)."""

    def __init__(self, model: keras.Model, state_dtype: Any, head: str | None = None) -> None:
        self.layers = numpy_layers(model, head)
        self._weights: list[list[np.ndarray]] | None = None
        if self.layers is None:
            self._compiled = compiled_backend().greedy_call(model, state_dtype)
        else:
            variables = [v for layer in self.layers for v in layer.weights]
            self._counts = [len(layer.weights) for layer in self.layers]
            self._read_weights = compiled_backend().weights_reader(variables)

    def weights_changed(self) -> None:
        """Note that the network's weights changed: the next call copies them."""
        self._weights = None

    def __call__(self, states: np.ndarray) -> np.ndarray:
        """Greedy actions (int) of a batch of states (batch, *state_shape)."""
        if self.layers is None:
            return self._compiled(states)
        if self._weights is None:
            flat = iter(self._read_weights())
            self._weights = [[next(flat) for _ in range(count)] for count in self._counts]
        x = np.asarray(states, np.float32)
        for layer, weights in zip(self.layers, self._weights, strict=True):
            x = numpy_forward(layer, weights, x)
        return x.argmax(axis=1)


def play_greedy(envs: list[Any], policy: GreedyPolicy, seeds: list[int],
                stop: StopRequest | None = None) -> np.ndarray | None:
    """Returns of one greedy episode in each of `envs`, reset with `seeds`, played side by side
    (one forward pass a step); an Atari env's unclipped score where it gives one. None once
    `stop` is requested: a stop signal ends even an evaluation of many long episodes at once."""

    def stopped() -> bool:
        return stop is not None and stop.requested

    if stopped():  # before the resets: a caller stopped while making `envs` may have too few
        return None
    states = np.stack([env.reset(seed=seed)[0] for env, seed in zip(envs, seeds, strict=True)])
    returns = np.zeros(len(envs))
    running = np.ones(len(envs), dtype=bool)
    while running.any():
        if stopped():
            return None
        actions = policy(states)
        for i in np.flatnonzero(running):
            states[i], reward, terminated, truncated, info = envs[i].step(actions[i])
            returns[i] += reward
            if terminated or truncated:
                running[i] = False
                returns[i] = unclipped_score(info, returns[i])
    return returns


def unclipped_score(info: dict[str, Any], summed: float) -> float:
    """An episode's score from the `info` of its last step: the raw game score that
    `RecordEpisodeStatistics` records there (Atari: inside the reward clipping), else `summed`,
    the sum of the rewards as the env gave them."""
    return info.get("episode", {}).get("r", summed)


def epsilon_greedy(policy: GreedyPolicy, state: np.ndarray, epsilon: float,
                   rng: np.random.Generator, action_size: int) -> int:
    """The action for one state (`epsilon_greedy_actions` for a batch of one): with probability
    `epsilon` one of `action_size` uniformly at random (two draws of `rng`), else the greedy one
    (one draw)."""
    return epsilon_greedy_actions(policy, [state], epsilon, rng, action_size)[0]


def epsilon_greedy_actions(policy: GreedyPolicy, states: Sequence[np.ndarray], epsilon: float,
                           rng: np.random.Generator, action_size: int) -> list[int]:
    """The actions for `states`, one per environment: for each in turn, with probability
    `epsilon` one of `action_size` uniformly at random (two draws of `rng`), else the greedy one
    (one draw); the greedy ones from one forward pass over all the states, made only if one is
    needed."""
    actions = [int(rng.integers(action_size)) if rng.random() < epsilon else None
               for _ in states]
    if None in actions:
        greedy = policy(np.stack(states))
        actions = [int(greedy[i]) if action is None else action
                   for i, action in enumerate(actions)]
    return actions


def keep_best(mean: float, when: When, best: float, solved_at: When | None,
              solved_score: float | None, save: Callable[[str], None], path: str
              ) -> tuple[float, When | None, str]:
    """After a greedy evaluation with mean return `mean` at `when`: the best mean so far, when the
    game's `solved_score` was first reached (None: not yet) and the note for the evaluation's
    line. A mean at least the best so far calls `save(path)`: ties keep the later network."""
    note = ""
    if mean >= best:
        best = mean
        save(path)
        note = f", best so far: saved {path}"
    if solved_at is None and solved_score and mean >= solved_score:
        solved_at = when
        note += f", solved (>= {solved_score:g})"
    return best, solved_at, note
