"""Atari environments for the D3QN agent, and a replay storage that keeps every frame once.

`make_env` builds the DeepMind-style Atari pipeline from gymnasium's own wrappers
(`AtariPreprocessing`, `FrameStackObservation`) plus three small wrappers for what gymnasium lacks:
`FireOnReset`, `SignReward` and `ChannelsLast`. Observations are uint8 (84, 84, 4), channels last,
ready for a Keras Conv2D.

`FrameStackStorage` is a replay storage for those observations: consecutive stacks share three of
their four frames, so it stores each 84x84 frame once and rebuilds the stacks when sampled
(~7 KB per transition instead of ~56 KB for a uint8 state + next state pair). PER.py's `Memory`
and `UniformMemory` take it through `storage=`.
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
    channels last by default (data_format="channels_last"). Cost: one 28 KB copy per step, which
    keeps the observation contiguous.
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


class FrameStackStorage:
    """Replay storage for stacked frames that keeps every frame once, as uint8.

    A ring of `capacity` slots. Each slot holds one frame (the newest frame of some observation)
    and the action, reward and done of the transition that starts at that observation. The stack
    of slot k is the frames of slots k-S+1 .. k (S = stack size, mod capacity); its next state is
    the stack of slot k+1. With S = 4, one episode written from slot 10 on looks like:

        slot:     10   11   12   13   14   15   ...  13+T  14+T
        frame:    p0   p1   p2   o0   o1   o2   ...  oT-1  oT
        holds:    -    -    -    t0   t1   t2   ...  tT-1   -
                  '-- prefix --'                          '-- last next state

    where o0 is the newest frame of the reset observation, p0..p2 are its three older frames
    (whatever `FrameStackObservation` padded with), t_i is the transition from observation i to
    i+1, and transition t_i reads slots 10+i .. 14+i. An `add` whose state equals the previous
    next_state (same episode) writes one slot; any other `add` (a new episode, or anything else)
    writes all S frames of the state and the newest frame of next_state, S+1 slots. Every stored
    observation's frames are therefore literally in the ring: padding at episode starts comes
    back exactly, and no frame of an earlier episode can leak into a stack. This needs next_state
    to be state shifted by one frame, as frame stacking produces; `add` checks it.

    Writing slot w overwrites a frame that the transitions of slots w .. w+S-1 read; `add` reports
    those that held one as freed. Overhead: S slots per episode hold no transition, so
    `capacity` slots hold about capacity * T / (T + S) transitions for episodes of T steps.

    Memory: per slot, one frame (84 * 84 = 7,056 bytes) plus action (int64), reward (float32),
    done and holds_transition (bool): 7,070 bytes. The frame ring is allocated on the first `add`
    with np.zeros, so slots not yet written take no physical memory on Linux.
    Time: `add` compares about two stacks and copies 1 or S+1 frames (~60-90 us for 84x84x4 on
    this project's 2-core CPU); `get` copies 2S frames per slot (~1.5 ms for 32 slots).
    """

    def __init__(self, capacity: int, stack_axis: int = -1) -> None:
        """Make an empty storage of `capacity` slots; `stack_axis` is the states' stacking axis."""
        if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer) or capacity < 2:
            raise ValueError(f"capacity must be an int >= 2, got {capacity!r}")
        if isinstance(stack_axis, bool) or not isinstance(stack_axis, int | np.integer):
            raise ValueError(f"stack_axis must be an int, got {stack_axis!r}")
        self.capacity = int(capacity)
        self.stack_axis = int(stack_axis)
        self.holds_transition = np.zeros(self.capacity, dtype=bool)
        self.written = 0
        self.actions = np.zeros(self.capacity, dtype=np.int64)
        self.rewards = np.zeros(self.capacity, dtype=np.float32)
        self.dones = np.zeros(self.capacity, dtype=bool)
        # Set by the first add (or load_state_dict), once the states' shape is known:
        self.frames: np.ndarray | None = None  # (capacity, *frame_shape) uint8
        self.state_shape: tuple[int, ...] | None = None
        self._frames_first: tuple[int, ...] = ()  # transpose order: stacking axis first
        self._next_slot = 0  # the slot the next frame is written to
        self._pending_slot = -1  # slot of the last next_state's newest frame (-1: none)
        self._pending_stack: np.ndarray | None = None  # copy of that next_state, to compare
        self._count = 0  # slots that hold a transition, kept so len() is O(1)

    def __len__(self) -> int:
        """Number of slots that hold a complete transition."""
        return self._count

    @property
    def stack_size(self) -> int:
        """Frames per stacked state (0 before the first add)."""
        return 0 if self.state_shape is None else self.state_shape[self.stack_axis]

    def add(self, experience: tuple) -> tuple[int, np.ndarray]:
        """Store one (state, action, reward, next_state, done) transition.

        States are uint8 stacks, e.g. (84, 84, 4) with `stack_axis=-1`, and next_state must be
        state shifted by one frame. Returns the slot that now holds this transition and an int64
        array of the slots that stopped holding a transition because of this write (never the
        returned slot). Raises ValueError for a malformed experience, leaving the storage as it was.
        """
        state, action, reward, next_state, done = self._checked(experience)
        state_frames = state.transpose(self._frames_first)  # views, stacking axis first
        next_frames = next_state.transpose(self._frames_first)
        if self._pending_stack is not None and np.array_equal(self._pending_stack, state):
            slot = self._pending_slot  # same episode: the state's frames are in the ring
            freed = self._write([next_frames[-1]])
        else:
            slot = (self._next_slot + self.stack_size - 1) % self.capacity
            freed = self._write([*state_frames, next_frames[-1]])
        self.actions[slot] = action
        self.rewards[slot] = reward
        self.dones[slot] = done
        self.holds_transition[slot] = True
        self._count += 1
        self._pending_slot = (slot + 1) % self.capacity
        self._pending_stack = next_state.copy()
        return slot, freed[freed != slot]

    def get(
        self, slots: np.ndarray, last_slots: np.ndarray | None = None
    ) -> tuple[np.ndarray, ...]:
        """Return (states, actions, rewards, next_states, dones) of `slots`, leading dim len(slots).

        States are rebuilt from the ring exactly as they were added. With `last_slots`, next_states
        are those of the transitions in `last_slots` (the end of an n-step chain from `slots`).
        Every slot must hold a transition (see `holds_transition`); others raise ValueError.
        """
        slots = self._checked_slots(slots)
        ends = slots if last_slots is None else self._checked_slots(last_slots)
        if ends.shape != slots.shape:
            raise ValueError(f"last_slots has shape {ends.shape}, slots {slots.shape}")
        return (
            self._stacks(slots),
            self.actions[slots],
            self.rewards[slots],
            self._stacks((ends + 1) % self.capacity),
            self.dones[slots],
        )

    def rewards_and_dones(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rewards and done flags stored in `slots`."""
        return self.rewards[slots], self.dones[slots]

    def next_in_episode(self, slots: np.ndarray) -> np.ndarray:
        """Bool mask: slot+1 holds the transition that came right after slot's, in its episode.

        A new episode starts S+1 slots on, and overwriting slot+1 breaks slot's transition, so for
        a slot that holds a transition this is just whether slot+1 holds one. O(len(slots)).
        """
        return self.holds_transition[(slots + 1) % self.capacity]

    def _checked_slots(self, slots: Any) -> np.ndarray:
        """`slots` as an int array of slots that hold transitions, or ValueError naming them."""
        slots = np.asarray(slots)
        if slots.ndim != 1 or not np.issubdtype(slots.dtype, np.integer):
            raise ValueError(f"slots must be a 1-d integer array, got {slots.dtype} {slots.shape}")
        if slots.size and (slots.min() < 0 or slots.max() >= self.capacity):
            raise ValueError(f"slots must be in [0, {self.capacity}), got {slots}")
        missing = slots[~self.holds_transition[slots]]
        if missing.size:
            raise ValueError(f"slots {missing} hold no transition")
        if self.frames is None:  # nothing added yet, so slots is empty
            raise ValueError("get() on an empty FrameStackStorage")
        return slots

    def state_dict(self) -> dict[str, np.ndarray]:
        """Return the storage as plain numpy arrays (for np.savez); only written slots' frames."""
        shape = () if self.state_shape is None else self.state_shape
        frames = self.frames[: self.written] if self.frames is not None else np.zeros(0, np.uint8)
        return {
            "capacity": np.array(self.capacity),
            "stack_axis": np.array(self.stack_axis),
            "state_shape": np.array(shape, dtype=np.int64),
            "next_slot": np.array(self._next_slot),
            "pending_slot": np.array(self._pending_slot),
            "written": np.array(self.written),
            "frames": frames,
            "actions": self.actions.copy(),
            "rewards": self.rewards.copy(),
            "dones": self.dones.copy(),
            "holds_transition": self.holds_transition.copy(),
        }

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore what `state_dict` returned; the capacity must match this storage's."""
        missing = {
            "capacity", "stack_axis", "state_shape", "next_slot", "pending_slot", "written",
            "frames", "actions", "rewards", "dones", "holds_transition",
        } - set(arrays)
        if missing:
            raise ValueError(f"FrameStackStorage state is missing {sorted(missing)}")
        if int(arrays["capacity"]) != self.capacity:
            raise ValueError(
                f"saved capacity {int(arrays['capacity'])} != this storage's {self.capacity}"
            )
        written = int(arrays["written"])
        shape = tuple(int(n) for n in arrays["state_shape"])
        frames = np.asarray(arrays["frames"])
        if not 0 <= written <= self.capacity or (shape and frames.shape[0] != written):
            raise ValueError(f"saved written={written} does not match frames {frames.shape}")
        self.stack_axis = int(arrays["stack_axis"])
        self.frames, self.state_shape, self._pending_stack = None, None, None
        if shape:
            self._allocate(shape)
            self.frames[:written] = frames
        self.written = written
        self._next_slot = int(arrays["next_slot"])
        self._pending_slot = int(arrays["pending_slot"])
        if self._pending_slot >= 0:
            self._pending_stack = self._stacks(np.array([self._pending_slot]))[0]
        self.actions[:] = arrays["actions"]
        self.rewards[:] = arrays["rewards"]
        self.dones[:] = arrays["dones"]
        self.holds_transition[:] = arrays["holds_transition"]
        self._count = int(self.holds_transition.sum())

    def _checked(self, experience: tuple) -> tuple[np.ndarray, int, float, np.ndarray, bool]:
        """Validate one experience (ValueError naming the bad field); allocate on the first one."""
        if not isinstance(experience, tuple | list) or len(experience) != 5:
            raise ValueError("experience must be (state, action, reward, next_state, done)")
        state, action, reward, next_state, done = experience
        state, next_state = np.asarray(state), np.asarray(next_state)
        for name, value in (("state", state), ("next_state", next_state)):
            if value.dtype != np.uint8:
                raise ValueError(f"{name} must be uint8 stacked frames, got dtype {value.dtype}")
        shape = state.shape if self.state_shape is None else self.state_shape
        for name, value in (("state", state), ("next_state", next_state)):
            if value.shape != shape:
                raise ValueError(f"{name} shape {value.shape} != expected {shape}")
        if self.state_shape is None:
            if state.ndim < 2 or not -state.ndim <= self.stack_axis < state.ndim:
                raise ValueError(f"state shape {shape} has no stacking axis {self.stack_axis}")
            if self.capacity < shape[self.stack_axis] + 1:
                raise ValueError(
                    f"capacity {self.capacity} cannot hold one stack of "
                    f"{shape[self.stack_axis]} frames plus its next frame"
                )
        action = np.asarray(action)
        if action.ndim != 0 or not np.issubdtype(action.dtype, np.integer):
            raise ValueError(f"action must be an integer scalar, got {action!r}")
        reward = np.asarray(reward)
        is_number = reward.ndim == 0 and np.issubdtype(reward.dtype, np.number)
        if not is_number or not np.isfinite(reward):
            raise ValueError(f"reward must be a finite number, got {reward!r}")
        done = np.asarray(done)
        if done.ndim != 0 or not (done.dtype == bool or np.issubdtype(done.dtype, np.number)):
            raise ValueError(f"done must be a bool scalar, got {done!r}")
        if not self._is_shifted(state, next_state):
            raise ValueError(
                "next_state must be state shifted by one frame along the stacking axis "
                f"{self.stack_axis} (as frame stacking produces)"
            )
        if self.state_shape is None:
            self._allocate(shape)
        return state, int(action), float(reward), next_state, bool(done)

    def _allocate(self, state_shape: tuple[int, ...]) -> None:
        """Allocate the frame ring (np.zeros: pages are only backed by memory once written)."""
        self.state_shape = tuple(state_shape)
        self._frames_first = self._stack_axis_first(len(state_shape))
        frame_shape = [state_shape[axis] for axis in self._frames_first[1:]]
        self.frames = np.zeros((self.capacity, *frame_shape), dtype=np.uint8)

    def _stack_axis_first(self, ndim: int) -> tuple[int, ...]:
        """Axis order that puts the stacking axis of an `ndim`-dim state first."""
        axis = self.stack_axis % ndim
        return (axis, *(i for i in range(ndim) if i != axis))

    def _is_shifted(self, state: np.ndarray, next_state: np.ndarray) -> bool:
        """True if next_state's frames 0..S-2 equal state's frames 1..S-1."""
        order = self._stack_axis_first(state.ndim)
        state_frames, next_frames = state.transpose(order), next_state.transpose(order)
        # Contiguous copies first: comparing strided views directly is several times slower.
        newer = np.empty((len(state_frames) - 1, *state_frames.shape[1:]), dtype=np.uint8)
        older = np.empty_like(newer)
        for i in range(len(newer)):
            newer[i] = state_frames[i + 1]
            older[i] = next_frames[i]
        return np.array_equal(newer, older)

    def _stacks(self, slots: np.ndarray) -> np.ndarray:
        """The stacked observations whose newest frames are in `slots`, shape (n, *state_shape)."""
        stacks = np.empty((len(slots), *self.state_shape), dtype=np.uint8)
        by_frame = stacks.transpose(0, *(axis + 1 for axis in self._frames_first))
        # One gather per frame position: much faster than gathering all and transposing.
        for position in range(self.stack_size):
            by_frame[:, position] = self.frames[(slots + position - self.stack_size + 1)
                                                % self.capacity]
        return stacks

    def _write(self, frames: list[np.ndarray]) -> np.ndarray:
        """Write `frames` to the next slots; return the slots whose transitions this broke."""
        start = self._next_slot
        # A transition reads S slots back and one ahead, so writing slot w breaks those of
        # slots w .. w+S-1.
        span = min(len(frames) + self.stack_size - 1, self.capacity)
        readers = (start + np.arange(span)) % self.capacity
        broken = readers[self.holds_transition[readers]]
        self.holds_transition[broken] = False
        self._count -= broken.size
        for offset, frame in enumerate(frames):
            self.frames[(start + offset) % self.capacity] = frame
        self._next_slot = (start + len(frames)) % self.capacity
        self.written = min(self.written + len(frames), self.capacity)
        return broken.astype(np.int64)
