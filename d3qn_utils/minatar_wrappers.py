"""MinAtar environments for the D3QN agent: Atari's ideas on a 10x10 grid, small enough for a CPU.

MinAtar (Young & Tian 2019, the `minatar` package) has five games: Asterix, Breakout, Freeway,
Seaquest and SpaceInvaders. A frame is a 10x10 grid with one boolean channel per kind of object
(4 to 10 channels), and sticky actions (0.1) keep the games stochastic. The package registers
"MinAtar/<Game>-v0" (all 6 actions, as in the papers) and "-v1" (each game's minimal action set)
only when asked to; `make_env` does that on first use.

`make_env` turns the boolean frames into uint8 0/255, so that the agent treats them as any other
image: `OurModel` scales by 1/255 and picks the MinAtar paper's small torso from their shape, and
`replay_storage.FrameStackStorage(stack_axis=None)` keeps each frame once, as uint8.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

PREFIX = "MinAtar/"  # every MinAtar id starts so
GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
SCREEN_SCALE = 16  # --record: each grid cell becomes a 16x16 block (a 160x160 screen)
FRAMES_PER_SECOND = 20  # --record: the game's own display shows a frame every 50 ms


def is_minatar(env_id: str) -> bool:
    """True if `env_id` names a MinAtar game, e.g. "MinAtar/Breakout-v1" (decided by the name:
    the package registers its ids only when asked; `make_env` reports an unknown game)."""
    return isinstance(env_id, str) and env_id.startswith(PREFIX)


def register() -> None:
    """Register the MinAtar ids with gymnasium, once."""
    if f"{PREFIX}{GAMES[0]}-v1" not in gymnasium.registry:
        import minatar.gym  # imports matplotlib and seaborn, so only when a MinAtar id is used

        minatar.gym.register_envs()


class BinaryFrame(gymnasium.ObservationWrapper):
    """Boolean (10, 10, C) frames -> uint8 (10, 10, C) with True as 255, and a screen to record.

    Why 255: the agent's networks read uint8 images as 0..255 intensities (`OurModel` scales them
    by 1/255), so a set cell becomes 1.0 at the network's input, as in the MinAtar paper. uint8
    also makes the replay keep one byte per cell (a float32 copy would take four).
    """

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        shape = env.observation_space.shape
        self.observation_space = gymnasium.spaces.Box(0, 255, shape, dtype=np.uint8)
        self.metadata = {**env.metadata, "render_fps": FRAMES_PER_SECOND}

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset the game, and its sticky-action memory with it.

        MinAtar keeps the last action across resets, so an episode's first step could repeat
        the previous episode's last action; starting each episode from the game's initial no-op
        makes a reset's seed alone fix the episode (a resumed checkpoint replays episodes so).
        """
        self.env.unwrapped.game.last_action = 0
        return super().reset(**kwargs)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """The frame as uint8: 255 where a channel is set, else 0."""
        return np.asarray(observation, dtype=np.uint8) * np.uint8(255)

    def render(self) -> Any:
        """With render_mode="rgb_array": the coloured grid (the game's own palette) as a uint8
        screen, each cell SCREEN_SCALE pixels wide; other modes as the game renders them."""
        screen = self.env.render()
        if self.env.render_mode != "rgb_array":
            return screen
        cells = np.round(np.asarray(screen) * 255).astype(np.uint8)
        return cells.repeat(SCREEN_SCALE, axis=0).repeat(SCREEN_SCALE, axis=1)


def make_env(env_id: str, max_episode_steps: int | None = None,
             render_mode: str | None = None) -> gymnasium.Env:
    """Make a MinAtar game with uint8 (10, 10, C) observations (`BinaryFrame`).

    `max_episode_steps` truncates episodes (None: the game's own end; Freeway's is 2,500 steps).
    Seeding works as for any gymnasium env: `reset(seed=...)` seeds the game and its sticky
    actions. An unknown game raises ValueError naming it and the known ones.
    """
    register()
    try:
        # Without the env checker: it would warn that the package's screen is float and that
        # it declares no frame rate, both of which BinaryFrame fixes.
        env = gymnasium.make(env_id, max_episode_steps=max_episode_steps, render_mode=render_mode,
                             disable_env_checker=True)
    except gymnasium.error.Error as err:
        known = ", ".join(f"{PREFIX}{game}-v1" for game in GAMES)
        raise ValueError(f"cannot make MinAtar environment {env_id!r}: {err} "
                         f"(the games are {known}; -v0 for all 6 actions)") from err
    return BinaryFrame(env)
