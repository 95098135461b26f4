"""MinAtar environments for the D3QN agent: Atari's ideas on a 10x10 grid, small enough for a CPU.

MinAtar (Young & Tian 2019) frames are 10x10 grids with one boolean channel per kind of object;
"MinAtar/<Game>-v0" has all 6 actions, "-v1" each game's minimal set. `make_env` registers them
on first use and gives uint8 0/255 frames, which the agent treats as any other image.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

PREFIX = "MinAtar/"  # every MinAtar id starts so

GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
SCREEN_SCALE = 16  # --record: each grid cell becomes a 16x16 block (a 160x160 screen)
FRAMES_PER_SECOND = 20  # --record: the game's own display shows a frame every 50 ms


class BinaryFrame(gymnasium.ObservationWrapper):
    """Boolean (10, 10, C) frames -> uint8 with True as 255 (`OurModel` scales uint8 images by
    1/255: a set cell is 1.0 as in the MinAtar paper, one byte in the replay), and a screen."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.observation_space = gymnasium.spaces.Box(0, 255, env.observation_space.shape, np.uint8)
        self.metadata = {**env.metadata, "render_fps": FRAMES_PER_SECOND}

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset the game and its sticky last action, so that the seed alone fixes an episode
        (a resumed checkpoint replays episodes so)."""
        game = self.env.unwrapped.game
        if not hasattr(game, "last_action"):  # MinAtar's own field: fail, not silently differ
            raise RuntimeError("this MinAtar has no Game.last_action to reset (minatar changed)")
        game.last_action = 0
        seed = kwargs.pop("seed", None)
        if seed is not None and game.random is game.env.random:
            # The one generator minatar's `seed` made before, seeded again in place: the same
            # stream as the new RandomState(seed) minatar makes, at a fraction of its cost
            # (every episode starts with a seeded reset).
            game.random.seed(seed)
        elif seed is not None:
            game.seed(seed)  # the first: one RandomState for the game and its sticky actions
        return super().reset(**kwargs)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, dtype=np.uint8) * np.uint8(255)

    def render(self) -> Any:
        """With render_mode="rgb_array": the coloured grid as a uint8 screen, each cell
        SCREEN_SCALE pixels wide; other modes as the game renders them."""
        screen = self.env.render()
        if self.env.render_mode != "rgb_array":
            return screen
        cells = np.round(np.asarray(screen) * 255).astype(np.uint8)
        return cells.repeat(SCREEN_SCALE, axis=0).repeat(SCREEN_SCALE, axis=1)


def make_env(env_id: str, max_episode_steps: int | None = None,
             render_mode: str | None = None) -> gymnasium.Env:
    """Make a MinAtar game with uint8 (10, 10, C) observations (`BinaryFrame`); an unknown game
    raises ValueError naming it and the known ones."""
    if f"{PREFIX}{GAMES[0]}-v1" not in gymnasium.registry:  # registered on first use
        import minatar.gym  # imports matplotlib and seaborn, so only when a MinAtar id is used

        minatar.gym.register_envs()
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
