"""Atari environments for the D3QN agent.

`make_env` builds the DeepMind-style Atari pipeline from gymnasium's own wrappers
(`AtariPreprocessing`, `FrameStackObservation`) plus three small wrappers for what gymnasium lacks:
`FireOnReset`, `SignReward` and `ChannelsLast`. Observations are uint8 (84, 84, 4), channels last,
ready for a Keras Conv2D. The replay storage that keeps each of their frames once is
`replay_storage.FrameStackStorage`. The PER notebook's wrappers, each with what replaces it here
and what behaves differently (clipped rewards, no-ops, FIRE alone): docs/per_notebook.md.
"""

from __future__ import annotations

from typing import Any

import ale_py
import gymnasium
import numpy as np
from gymnasium.wrappers import (
    AtariPreprocessing,
    FrameStackObservation,
    RecordEpisodeStatistics,
    TimeLimit,
)

# Importing ale_py already registers its environments; register_envs says so explicitly (and keeps
# linters from calling the import unused).
gymnasium.register_envs(ale_py)
# The ALE's banner ("A.L.E: Arcade Learning Environment (version ...)", "[Powered by Stella]")
# would come before a run's first line; its warnings and errors still print.
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Warning)

ALE_ENTRY_MODULE = "ale_py"  # every ALE environment's entry point lives in this package
FIRE_ACTION = 1  # ALE's minimal action sets put FIRE at index 1 when a game has it
ALE_FRAMES_PER_SECOND = 60  # the Atari 2600's NTSC frame rate, which the ALE emulates


def is_atari(env_id: str) -> bool:
    """Return True if `env_id` is a registered ALE (Atari) environment, e.g. "ALE/Pong-v5".

    Decided from the registered spec's entry point (ale_py's `AtariEnv`), not from the name.
    Unknown ids return False; `make_env` is the place that reports them.
    """
    try:
        spec = gymnasium.spec(env_id)
    except gymnasium.error.Error:
        return False
    entry_point = spec.entry_point
    module = entry_point.split(":")[0] if isinstance(entry_point, str) else entry_point.__module__
    return module == ALE_ENTRY_MODULE or module.startswith(ALE_ENTRY_MODULE + ".")


def has_fire_action(env: gymnasium.Env) -> bool:
    """True if the ALE game behind `env` has FIRE at its usual index in its action set."""
    return env.unwrapped.get_action_meanings()[FIRE_ACTION : FIRE_ACTION + 1] == ["FIRE"]


class FireOnReset(gymnasium.Wrapper):
    """Press FIRE once after every reset.

    Why: games such as Breakout stay frozen until FIRE launches the ball, so an untrained agent can
    spend a whole episode's time limit doing nothing useful. gymnasium's `AtariPreprocessing` only
    does random no-ops on reset. Cost: one extra agent step per reset.
    """

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        if not has_fire_action(env):
            meanings = env.unwrapped.get_action_meanings()
            raise ValueError(f"FireOnReset needs FIRE as action {FIRE_ACTION}, got {meanings}")

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset, then press FIRE; if that ends the episode, reset again (without the seed)."""
        self.env.reset(seed=seed, options=options)
        obs, _, terminated, truncated, info = self.env.step(FIRE_ACTION)
        if terminated or truncated:
            obs, info = self.env.reset(options=options)
        return obs, info


class SignReward(gymnasium.RewardWrapper):
    """Replace each reward by its sign: -1.0, 0.0 or +1.0.

    Why: the DQN papers clip rewards so that one learning rate and one error scale work for every
    game, whatever its score scale. gymnasium has `ClipReward`, but clipping to [-1, 1] keeps
    fractional rewards; the sign is what the papers use. Pong's rewards are already -1/0/+1.
    """

    def reward(self, reward: float) -> float:
        """Return the sign of `reward` as a float."""
        return float(np.sign(reward))


class ChannelsLast(gymnasium.ObservationWrapper):
    """Move the stacking axis from first to last: (4, 84, 84) -> (84, 84, 4).

    Why: `FrameStackObservation` stacks along a new first axis, while Keras' Conv2D expects
    channels last by default (data_format="channels_last"). Cost: one copy of the stack per step,
    which keeps the observation contiguous.
    """

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gymnasium.spaces.Box) or len(space.shape) != 3:
            raise ValueError(f"ChannelsLast needs a (stack, height, width) Box, got {space}")
        self.observation_space = gymnasium.spaces.Box(
            low=np.moveaxis(space.low, 0, -1),
            high=np.moveaxis(space.high, 0, -1),
            dtype=space.dtype,
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """Return a contiguous copy of `observation` with its first axis moved last."""
        return np.ascontiguousarray(np.moveaxis(observation, 0, -1))


def make_env(
    env_id: str,
    seed: int | None = None,
    *,
    frame_stack: int = 4,
    clip_rewards: bool = True,
    noop_max: int = 30,
    terminal_on_life_loss: bool = False,
    max_episode_steps: int | None = None,
    render_mode: str | None = None,
) -> gymnasium.Env:
    """Make an Atari environment with uint8 (84, 84, frame_stack) channels-last observations.

    Works for any ALE id ("PongNoFrameskip-v4", "ALE/Pong-v5", "ALE/Breakout-v5", ...). The ALE
    env is always made with frameskip=1 because `AtariPreprocessing` skips exactly 4 frames (so
    the random 2-4 frame skip of ids like "Pong-v4" is replaced). Sticky actions stay at the id's
    own setting (0.25 for v5 ids, 0 for v4 ids): the v5 default is the ALE's recommended protocol.

    Args:
        env_id: a registered ALE environment id.
        seed: if given, the action space is seeded and the environment is reset once with it, so
            the later `env.reset()` calls (no-op counts, sticky actions) are reproducible.
            Passing `seed=` to `env.reset` yourself works as usual.
        frame_stack: number of most recent frames in one observation.
        clip_rewards: replace rewards by their sign (DQN convention). The raw game score is still
            in `info["episode"]["r"]` at the end of each episode (`RecordEpisodeStatistics`).
        noop_max: at most this many random no-op frames on reset (0 disables).
        terminal_on_life_loss: end the episode when a life is lost (off: Machado et al. 2018).
            gymnasium's `AtariPreprocessing` then restarts the whole game on the next reset.
        max_episode_steps: truncate episodes after this many agent steps (after frame skipping);
            None keeps only the ALE's own limit of 108,000 frames (27,000 agent steps).
        render_mode: passed to the ALE environment ("rgb_array" or "human"). `env.render()`
            then shows the game's full-colour 210x160 screen after the last skipped frame, and
            `env.metadata["render_fps"]` is the agent steps' real-time rate (15 per second).

    Raises:
        ValueError: `env_id` is not a registered ALE environment, or an argument is out of range.
    """
    if not is_atari(env_id):
        raise ValueError(
            f"unknown Atari game id {env_id!r}: not a registered ALE environment (the ROMs come "
            f"with the ale-py package; ids look like 'PongNoFrameskip-v4' or 'ALE/Pong-v5')"
        )
    if frame_stack < 1:
        raise ValueError(f"frame_stack must be >= 1, got {frame_stack}")
    if noop_max < 0:
        raise ValueError(f"noop_max must be >= 0, got {noop_max}")
    if max_episode_steps is not None and max_episode_steps < 1:
        raise ValueError(f"max_episode_steps must be >= 1 or None, got {max_episode_steps}")

    # frameskip=1: AtariPreprocessing does the skipping (and refuses envs that skip on their own).
    env = gymnasium.make(env_id, frameskip=1, render_mode=render_mode)
    # The order matters:
    # 1. AtariPreprocessing wraps the raw ALE env: it reads the screen from the emulator, skips 4
    #    frames, max-pools the last two, and does the random no-ops on reset.
    # 2. FireOnReset comes after it, so FIRE is pressed after the no-ops and lasts a whole agent
    #    step (4 frames) rather than one frame.
    # 3. TimeLimit counts agent steps; RecordEpisodeStatistics sits outside it so it also sees
    #    time-limit truncations, and inside SignReward so it records the raw game score.
    # 4. FrameStackObservation stacks the final per-frame observations, so it comes after every
    #    wrapper that changes or adds steps; ChannelsLast then only transposes the finished stack.
    env = AtariPreprocessing(
        env, noop_max=noop_max, frame_skip=4, screen_size=84,
        terminal_on_life_loss=terminal_on_life_loss, grayscale_obs=True, scale_obs=False,
    )
    # One step now spans frame_skip frames, so the steps' real-time rate is 60 / 4 = 15 per
    # second (`--record` plays a GIF at this rate); the ALE's metadata says 30.
    env.metadata = {**env.metadata, "render_fps": ALE_FRAMES_PER_SECOND / env.frame_skip}
    # The ALE cannot say which games wait for FIRE, so press it in every game that has it (as the
    # DQN baselines do); where FIRE is not needed (Pong) it only costs one agent step per reset.
    if has_fire_action(env):
        env = FireOnReset(env)
    if max_episode_steps is not None:
        env = TimeLimit(env, max_episode_steps=max_episode_steps)
    env = RecordEpisodeStatistics(env)
    if clip_rewards:
        env = SignReward(env)
    env = FrameStackObservation(env, stack_size=frame_stack)
    env = ChannelsLast(env)
    if seed is not None:
        env.action_space.seed(seed)
        env.reset(seed=seed)
    return env

