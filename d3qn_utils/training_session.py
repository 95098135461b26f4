"""Stopping a training run cleanly: on Ctrl-C, SIGTERM (`kill`, `docker stop`, a scheduler
before preemption), or NaN or inf from training or the environment, with a checkpoint saved.
"""

from __future__ import annotations

import contextlib
import hashlib
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
CTRL_C_EXIT_CODE = 128 + signal.SIGINT  # 130, as a shell reports a program Ctrl-C ended


class NonFiniteError(RuntimeError):
    """NaN or inf from a training step or the environment: the run stops, last good state saved."""


class PoisonedStateError(NonFiniteError):
    """The state to checkpoint holds NaN or inf: nothing was written, and the message names the
    newest intact checkpoint to resume from instead."""


class StopRequest:
    """Set by a stop signal: `requested` is True and `signal_name` says which ("SIGTERM")."""

    requested, signal_name = False, ""

    def __call__(self, signum: int, frame: Any) -> None:
        self.requested, self.signal_name = True, signal.Signals(signum).name


@contextlib.contextmanager
def stop_requests(handler: Callable[[int, Any], None] | None = None) -> Iterator[StopRequest]:
    """While inside (main thread only), Ctrl-C and SIGTERM do not end the process: they set the
    yielded `StopRequest`, which the loop checks after each step (or call `handler`). Inside
    another `stop_requests()` without a handler, the yielded request is that one's, so a stop
    that came before this block (as a run starts, inside `exit_code`) is not lost."""
    enclosing = signal.getsignal(signal.SIGINT)
    request = enclosing if isinstance(enclosing, StopRequest) and handler is None else StopRequest()
    previous = {number: signal.signal(number, handler or request) for number in STOP_SIGNALS}
    try:
        yield request
    finally:
        for number, earlier in previous.items():
            signal.signal(number, earlier)


@contextlib.contextmanager
def saved_on(error_type: type[Exception], save: Callable[[], str]) -> Iterator[None]:
    """If the block raises `error_type`, call `save()` (which writes the last good state and
    returns where) and raise the error again with that path added to its message; if that state
    is not finite (`PoisonedStateError`, from `save()` or the block), with what its error says
    instead."""
    try:
        yield
    except PoisonedStateError:
        raise
    except error_type as error:
        try:
            saved = f". Last good state saved to {save()}"
        except PoisonedStateError as poisoned:
            saved = f"; {poisoned}"
        raise error_type(f"{error}{saved}") from error


def exit_code(run: Callable[[], None]) -> int:
    """Run `run` (a started `DQNAgent.run`) to its end; 0, or after one `error:` line 2 for a
    failed write (disk full) or 3 for NaN or inf from training or the environment."""
    try:
        # A stop from here on is the run's (its own stop_requests() takes this request);
        # once its budget is spent and evaluated, the run finishes.
        with stop_requests():
            run()
    except (NonFiniteError, WriteError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2 if isinstance(err, WriteError) else 3
    return 0


def stopped_by_ctrl_c(when: str) -> int:
    """What a program does on Ctrl-C outside a training run's own stop (start-up, a resume's
    loading, --test): one line saying `when` it stopped, and the shell's exit code for SIGINT."""
    print(f"stopped: Ctrl-C {when}", file=sys.stderr, flush=True)
    return CTRL_C_EXIT_CODE


class NonFiniteGuard(gym.Wrapper):
    """The environment, raising NonFiniteError naming the env step and the value once a reward or
    an observation holds NaN or inf, before the agent stores it (`steps_taken()`: steps so far;
    `position`: the environments stepped before this one in a step of several, each counted)."""

    def __init__(self, env: gym.Env, steps_taken: Callable[[], int], position: int = 0) -> None:
        super().__init__(env)
        self.steps_taken = steps_taken
        self.position = position

    def step(self, action: Any) -> tuple:
        result = self.env.step(action)
        step, reward = self.steps_taken() + self.position + 1, result[1]
        # A float reward, the common case, is checked without numpy's per-call cost.
        if not (type(reward) is float and math.isfinite(reward)) and not np.isfinite(
                np.asarray(reward, dtype=np.float64)).all():
            raise NonFiniteError(f"the environment returned reward {reward!r} at env step {step}")
        check_observation(result[0], f"env step {step}")
        return result

    def reset(self, **options: Any) -> tuple:
        observation, info = self.env.reset(**options)
        check_observation(observation, f"its reset after env step {self.steps_taken()}")
        return observation, info


def check_observation(observation: Any, where: str) -> None:
    """NonFiniteError naming `where` and the value if `observation` holds NaN or inf."""
    if not is_finite(observation):
        value = np.asarray(observation)[~np.isfinite(observation)].flat[0].item()
        raise NonFiniteError(f"the environment returned an observation holding {value!r} at "
                             f"{where}")


def is_finite(observation: Any) -> bool:
    """Whether `observation` holds no NaN or inf (integer observations, like frames, always)."""
    observation = observation if type(observation) is np.ndarray else np.asarray(observation)
    return observation.dtype.kind != "f" or all_finite(observation)


def state_digest(state: np.ndarray | None) -> str | None:
    """SHA-256 of an observation, which a resumed episode must reproduce exactly; None for none
    yet or one holding NaN (a fixed environment's would differ)."""
    if state is None or not is_finite(state):
        return None
    return hashlib.sha256(np.ascontiguousarray(state)).hexdigest()
