"""What depends on the game, one call each, so that d3qn_agent.py reads the same for all of them:
the environment, the convolutional torso and the replay storage. ale_py and minatar are imported
only for one of their games: a CartPole run loads neither.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from typing import Any

import gymnasium as gym
import keras

from d3qn_utils import minatar_wrappers  # light: it imports minatar for a MinAtar id only
from d3qn_utils.patch_conv import PatchConv2D
from d3qn_utils.replay_storage import FrameStackStorage, storage_type

# The Nature torso's convolution layer: TensorFlow's Conv2D, oneDNN's kernels where TensorFlow
# turns them on (benchmarks/bench_pong_kernels.py sets it to time PatchConv2D against it).
NATURE_CONV = keras.layers.Conv2D


def is_minatar(env_name: str) -> bool:
    """True if `env_name` names a MinAtar game, e.g. "MinAtar/Breakout-v1" (by its name)."""
    return isinstance(env_name, str) and env_name.startswith(minatar_wrappers.PREFIX)


def is_atari(env_name: str) -> bool:
    """True if `env_name` is an ALE (Atari) environment, e.g. "PongNoFrameskip-v4". An id that
    gymnasium knows without ale_py (CartPole-v1) is decided without importing it."""
    if is_minatar(env_name):
        return False
    with contextlib.suppress(gym.error.Error):  # an id unknown to gymnasium: ale_py may know it
        if not str(gym.spec(env_name).entry_point).startswith("ale_py"):
            return False
    return importlib.import_module("atari_wrappers").is_atari(env_name)


def make_env(env_name: str, max_episode_steps: int | None = None,
             render_mode: str | None = None) -> gym.Env:
    """Create the environment (Atari and MinAtar ids through their wrappers' modules); an
    unknown id raises ValueError. `render_mode="rgb_array"`: `env.render()` gives the screen."""
    if render_mode == "rgb_array":  # drawn off-screen, so no display (nor SDL errors) is needed
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    if is_minatar(env_name):
        return minatar_wrappers.make_env(env_name, max_episode_steps, render_mode)
    if is_atari(env_name):
        return importlib.import_module("atari_wrappers").make_env(
            env_name, max_episode_steps=max_episode_steps, render_mode=render_mode)
    try:
        return gym.make(env_name, max_episode_steps=max_episode_steps, render_mode=render_mode)
    except gym.error.Error as err:
        raise ValueError(f"cannot make environment {env_name!r}: {err}") from err


def image_torso(frames: Any, bfloat16: bool = False) -> Any:
    """The convolutional torso for uint8 (height, width, channels) frames: 1/255, then the Nature
    DQN's, or the MinAtar paper's for an image too small for its strides. `bfloat16`: only the
    convolutions, most of the Nature torso's multiply-adds; the dense layer stays float32."""
    conv_dtype = "mixed_bfloat16" if bfloat16 else None  # None: Keras' float32
    x = keras.layers.Rescaling(1.0 / 255.0)(frames)
    if min(frames.shape[1:3]) < 36:  # too small for the Nature strides (MinAtar's 10x10)
        x = PatchConv2D(16, 3, activation="relu", dtype=conv_dtype)(x)  # one matrix product
        units = 128
    else:
        for filters, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = NATURE_CONV(filters, kernel, strides=stride, activation="relu", dtype=conv_dtype)(x)
        units = 512
    x = keras.layers.Flatten()(x)
    return keras.layers.Dense(units, activation="relu")(x)


def replay_storage(env_name: str, state_shape: tuple[int, ...], capacity: int
                   ) -> FrameStackStorage | None:
    """Where a replay memory keeps this game's transitions: each image frame once, as uint8
    (Atari's four stacked on the last axis), or None (a `TransitionStorage`) for vectors."""
    return (FrameStackStorage(capacity, stack_axis=-1 if is_atari(env_name) else None)
            if storage_type(state_shape) is FrameStackStorage else None)

