"""Whether an image torso's convolutions compute in bfloat16 on this CPU (the Pong preset's
BFLOAT16): chosen by timing the game's gradient step in both precisions, since bfloat16 units do
not promise a faster step on every CPU (whether bfloat16 pays depends on the CPU's units and the
kernels TensorFlow picks for them).

The timing (each precision compiled, then ROUNDS alternating rounds) runs at a run's start and
is kept in a small JSON file in the user's cache directory
($XDG_CACHE_HOME or ~/.cache, then d3qn/), one entry per CPU model and core count, TensorFlow
version, game, torso, batch size and XLA setting (`timing_key`), so a machine pays it once; a file
that cannot be read or written is timed again.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np

from d3qn_utils import games
from d3qn_utils.atomic_files import WriteError, atomic_file
from d3qn_utils.gradient_steps import Batches, make_optimizer

MARGIN = 0.05  # bfloat16 only where its step takes at most 95% of float32's: a tie stays float32
ROUNDS = 7  # alternating rounds, each CALLS_PER_ROUND calls of one gradient step per precision
CALLS_PER_ROUND = 5  # a round's time is their mean: one ~30 ms step alone varies too much
CACHE_NAME = "bfloat16_timings.json"


@dataclass(frozen=True)
class Timing:
    """One gradient step's milliseconds in each round, in bfloat16 and in float32, on this CPU;
    `cache`: the file it was read from, or None if measured at start."""

    bfloat16_ms: tuple[float, ...]
    float32_ms: tuple[float, ...]
    cache: Path | None = None

    @property
    def bfloat16_faster(self) -> bool:
        """Whether bfloat16 beats float32, so that the preset turns it on: its median by MARGIN
        and below float32's fastest round (apart from float32's every round, so that a round the
        machine slowed decides nothing in bfloat16's favour)."""
        bfloat16, float32 = statistics.median(self.bfloat16_ms), statistics.median(self.float32_ms)
        return bfloat16 <= (1.0 - MARGIN) * float32 and bfloat16 < min(self.float32_ms)

    def figures(self) -> str:
        """The timing as the run's note gives it: each precision's median (fastest-slowest)."""
        where = "measured at start" if self.cache is None else f"cached in {self.cache}"
        return (f"bfloat16 gradient step {shown(self.bfloat16_ms)} against float32 "
                f"{shown(self.float32_ms)} on this CPU ({len(self.bfloat16_ms)} rounds), {where}")


def shown(milliseconds: tuple[float, ...]) -> str:
    """Rounds' milliseconds as "37.3 ms (36.9-38.0)": the median, then the fastest and slowest."""
    return (f"{statistics.median(milliseconds):.1f} ms "
            f"({min(milliseconds):.1f}-{max(milliseconds):.1f})")


def preset_choice(values: dict[str, Any]) -> tuple[bool, str]:
    """The Pong preset's BFLOAT16 for a run of these (checked) flag values, and its figures:
    its game's torso timed at the run's batch size and XLA setting, or that timing cached."""
    timing = gradient_step_timing(values["env_name"], values["batch_size"], values["xla"])
    return timing.bfloat16_faster, timing.figures()


def gradient_step_timing(env_name: str, batch_size: int, xla: bool, cache: Path | None = None
                         ) -> Timing:
    """The timing of `env_name`'s gradient step (`time_gradient_steps`), from `cache` (default
    `cache_path()`) if it holds one for this CPU, TensorFlow and step, else measured and stored
    there; a cache that cannot be read or written is passed over."""
    cache = cache_path() if cache is None else cache
    torso = games.torso(env_name)
    key = timing_key(env_name, torso, batch_size, xla)
    entries = read_cache(cache)
    cached = entries.get(key)
    if isinstance(cached, dict) and all(is_rounds(cached.get(name))
                                        for name in ("bfloat16_ms", "float32_ms")):
        return Timing(tuple(cached["bfloat16_ms"]), tuple(cached["float32_ms"]), cache)
    env = games.make_env(env_name)
    try:
        shape, dtype = env.observation_space.shape, env.observation_space.dtype
        actions = int(env.action_space.n)
    finally:
        env.close()
    bfloat16_ms, float32_ms = time_gradient_steps(torso, shape, dtype, actions, batch_size, xla)
    entries[key] = {"bfloat16_ms": list(bfloat16_ms), "float32_ms": list(float32_ms)}
    with contextlib.suppress(OSError, WriteError):  # not kept: the next run times it again
        cache.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(cache) as temporary:
            temporary.write_text(json.dumps(entries, indent=1) + "\n")
    return Timing(tuple(bfloat16_ms), tuple(float32_ms))


def cache_path() -> Path:
    """The cache file: in $XDG_CACHE_HOME (if an absolute path) or ~/.cache, under d3qn/."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "d3qn" / CACHE_NAME


def read_cache(cache: Path) -> dict[str, Any]:
    """The cache's entries, or none for a missing, unreadable or corrupt file."""
    try:
        entries = json.loads(cache.read_text())
    except (OSError, ValueError):  # ValueError: not JSON, or not UTF-8
        return {}
    return entries if isinstance(entries, dict) else {}


def is_rounds(value: Any) -> bool:
    """Whether a cached value is what a timing gives: a list of rounds' times, each a positive
    finite number."""
    return isinstance(value, list) and len(value) > 0 and all(
        isinstance(ms, (int, float)) and not isinstance(ms, bool) and math.isfinite(ms) and ms > 0
        for ms in value)


def timing_key(env_name: str, torso: Any, batch_size: int, xla: bool) -> str:
    """What a timing holds for: this CPU's model and cores, TensorFlow's version, the game, its
    torso, the batch size and XLA."""
    import tensorflow as tf

    return (f"{cpu_model()} ({os.cpu_count()} cores), TensorFlow {tf.__version__}, {env_name}, "
            f"torso {torso.__module__}.{torso.__qualname__}, batch {batch_size}, XLA {xla}")


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name from `cpuinfo`, or "unknown CPU"."""
    try:
        match = re.search(r"^model name\s*:\s*(.*)$", cpuinfo.read_text(), re.MULTILINE)
    except OSError:
        return "unknown CPU"
    return match[1].strip() if match else "unknown CPU"


def time_gradient_steps(torso: Any, state_shape: tuple[int, ...], state_dtype: Any, actions: int,
                        batch_size: int, xla: bool) -> tuple[list[float], list[float]]:
    """Milliseconds of one gradient step on a random batch in each round, (bfloat16, float32):
    `torso` with a linear head, compiled as the agent compiles its step (TensorFlow's
    `GradientSteps`, Adam), each precision called once untimed (its kernels are built then), then
    in ROUNDS alternating rounds of CALLS_PER_ROUND calls each (their mean), so a drift of the
    machine hits both."""
    from d3qn_utils.tensorflow_backend import GradientSteps  # timed on TensorFlow only

    rng = np.random.default_rng(0)
    shape = (1, batch_size, *state_shape)  # one gradient step per call
    per_sample = np.ones((1, batch_size), np.float32)
    batches = Batches(
        rng.integers(0, 256, shape).astype(state_dtype),
        rng.integers(0, actions, (1, batch_size), dtype=np.int32), per_sample,
        rng.integers(0, 256, shape).astype(state_dtype), np.zeros_like(per_sample),
        0.99 * per_sample, per_sample)
    steps = {}
    for bfloat16 in (True, False):
        model, target_model = (q_network(torso, state_shape, actions, bfloat16) for _ in range(2))
        steps[bfloat16] = GradientSteps(
            functools.partial(timed_loss, model, target_model), model, target_model,
            make_optimizer("adam", 1e-4, 1e-7), 10.0, None, 1, state_shape, state_dtype, xla)
        steps[bfloat16](batches, 0)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(ROUNDS):
        for bfloat16, step in steps.items():
            start = time.perf_counter()
            for _ in range(CALLS_PER_ROUND):
                step(batches, 0)  # returns numpy arrays: the step has finished
            seconds[bfloat16].append((time.perf_counter() - start) / CALLS_PER_ROUND)
    return [1000 * s for s in seconds[True]], [1000 * s for s in seconds[False]]


def q_network(torso: Any, state_shape: tuple[int, ...], actions: int, bfloat16: bool
              ) -> keras.Model:
    """`torso` on uint8 states with one linear layer of Q-values: the agent's network up to its
    head (the dueling pair costs a few hundred multiply-adds more)."""
    frames = keras.Input(shape=state_shape, dtype="uint8")
    return keras.Model(frames, keras.layers.Dense(actions)(torso(frames, bfloat16)))


def timed_loss(model: Any, target_model: Any, batch: Batches) -> tuple[Any, Any]:
    """A loss through the networks as d3qn_agent.py's `weighted_loss` (double DQN) goes: the
    online and the target network forward on the next states, the online network forward and
    backward on the states; (mean squared error, errors)."""
    import tensorflow as tf

    next_q = model(batch.next_states) + target_model(batch.next_states)
    targets = batch.rewards + batch.discounts * tf.reduce_max(next_q, axis=1)
    q_taken = tf.gather(model(batch.states, training=True), batch.actions, batch_dims=1)
    errors = tf.stop_gradient(targets) - q_taken
    return tf.reduce_mean(batch.is_weights * tf.square(errors)), errors
