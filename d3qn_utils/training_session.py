"""Stopping a training run cleanly: on Ctrl-C, SIGTERM, or NaN or inf from the environment.

`stop_requests()` turns Ctrl-C and SIGTERM (`kill`, `docker stop`, a scheduler before
preemption) into a request the training loop sees after its step, so the run can save a
checkpoint and exit. `FiniteSteps` raises `NonFiniteError` as soon as the environment returns
NaN or inf, before the transition is stored; `saved_on` then saves the last good state.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np

from d3qn_utils.atomic_files import WriteError
from d3qn_utils.checks import all_finite

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class NonFiniteError(RuntimeError):
    """A training step produced NaN or inf, or the environment returned one; the run stops with
    its last good state saved (`saved_on`)."""


class StopRequest:
    """Set by a stop signal: `requested` is True and `signal_name` says which ("SIGTERM")."""

    def __init__(self) -> None:
        self.requested, self.signal_name = False, ""

    def __call__(self, signum: int, frame: Any) -> None:
        self.requested, self.signal_name = True, signal.Signals(signum).name


@contextlib.contextmanager
def on_stop_signals(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """While inside, Ctrl-C and SIGTERM call `handler(signum, frame)`; the previous handlers
    come back on exit. (Only the main thread can do this.)"""
    previous = {number: signal.signal(number, handler) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, earlier in previous.items():
            signal.signal(number, earlier)


@contextlib.contextmanager
def stop_requests() -> Iterator[StopRequest]:
    """While inside, Ctrl-C and SIGTERM set the yielded `StopRequest`, not ending the process."""
    request = StopRequest()
    with on_stop_signals(request):
        yield request


@contextlib.contextmanager
def saved_on(error_type: type[Exception], save: Callable[[], str]) -> Iterator[None]:
    """If the block raises `error_type`, call `save()` (which writes the last good state and
    returns where) and raise the error again with that path added to its message."""
    try:
        yield
    except error_type as error:
        raise error_type(f"{error}. Last good state saved to {save()}") from error


def exit_code(run: Callable[[], None]) -> int:
    """Run `run` (a started `DQNAgent.run`) to its end; 0, or after one `error:` line 2 for a
    failed write (disk full) or 3 for NaN or inf from training or the environment."""
    try:
        with stop_requests():  # a stop once the budget is spent: the run finishes
            run()
    except (NonFiniteError, WriteError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2 if isinstance(err, WriteError) else 3
    return 0


class FiniteSteps(gym.Wrapper):
    """An environment that raises NonFiniteError (`check_environment_step`) as soon as a reward
    or an observation holds NaN or inf; `steps_taken()`: env steps before this one."""

    def __init__(self, env: gym.Env, steps_taken: Callable[[], int]) -> None:
        super().__init__(env)
        self.steps_taken = steps_taken

    def step(self, action: Any) -> tuple:
        result = self.env.step(action)
        check_environment_step(self.steps_taken() + 1, result[1], result[0])
        return result

    def reset(self, **options: Any) -> tuple:
        observation, info = self.env.reset(**options)
        check_environment_step(self.steps_taken(), 0.0, observation, reset=True)
        return observation, info


def check_environment_step(step: int, reward: Any, observation: Any, reset: bool = False
                           ) -> None:
    """NonFiniteError naming env step `step` and the value if the environment returned a reward
    or an observation holding NaN or inf (`reset`: of a reset after that step)."""
    if not (type(reward) is float and math.isfinite(reward)) and not np.isfinite(
            np.asarray(reward, dtype=np.float64)).all():
        raise NonFiniteError(f"the environment returned reward {reward!r} at env step {step}")
    if not is_finite(observation):
        observation = np.asarray(observation)
        value = observation[~np.isfinite(observation)].flat[0].item()
        where = f"its reset after env step {step}" if reset else f"env step {step}"
        raise NonFiniteError(f"the environment returned an observation holding {value!r} at "
                             f"{where}")


def is_finite(observation: Any) -> bool:
    """Whether `observation` holds no NaN or inf (integer observations, like frames, always)."""
    observation = observation if type(observation) is np.ndarray else np.asarray(observation)
    return observation.dtype.kind != "f" or all_finite(observation)
