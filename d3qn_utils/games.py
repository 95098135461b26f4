"""Game families, one record each (`FAMILIES`): how to tell its ids, its environment, its replay
storage, its torso and its presets. d3qn_agent.py calls the functions below, one line each;
settings.py and apex.py read the presets from the records. ale_py and minatar are imported only
for one of their games: a CartPole run loads neither.

A new family (Procgen, Craftax, ...) is a wrapper module and one `GameFamily` in `FAMILIES`,
before `ATARI` if it knows its ids by name (Atari's test imports ale_py for an id gymnasium does
not know), saying how its games are seeded (`Seeding`): a resumed run replays the episode in
progress from its seed, and an evaluation's episodes are its seeds'.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import keras

from d3qn_utils import minatar_wrappers  # light: it imports minatar for a MinAtar id only
from d3qn_utils.patch_conv import PatchConv2D
from d3qn_utils.replay_storage import FrameStackStorage, StorageSpec

# The Nature torso's convolution layer: TensorFlow's Conv2D, oneDNN's kernels where TensorFlow
# turns them on (benchmarks/bench_pong_kernels.py sets it to time PatchConv2D against it).
NATURE_CONV = keras.layers.Conv2D


class Seeding(enum.Enum):
    """How a family's games are seeded. The agent starts every episode with `reset(seed=)`, and
    an episode must replay from its seed alone: a resumed run replays the episode in progress
    (d3qn_agent.py's `load_state_dict`), and evaluations play the same episodes, resumed or not."""

    # `reset(seed=s)` starts the episode of s, as gymnasium's games do (classic, MinAtar, Atari).
    RESET = "reset(seed=) replays an episode"
    # The levels are fixed when the game is made and `reset` takes no seed (Procgen's
    # `start_level`): `make_env` makes the game again with the seed (`MadeAgainOnSeededReset`).
    CONSTRUCTION = "levels fixed when the game is made: made again with the seed"


@dataclass(frozen=True)
class GameFamily:
    """One family of games, what d3qn_agent.py and apex.py do differently for its games.

    `name` names its preset in a run's notes ("Atari preset"). `recognises(env_name)`: True
    for the family's ids, without importing its package. `make_env(env_name,
    max_episode_steps, render_mode)`: its environment; ValueError for an unknown game.
    `seeding`: how its games are seeded (`Seeding`); with CONSTRUCTION, `make_env` also takes
    `seed=` (None: a game of unseeded levels).
    `storage`: its replay storage's class and options (default one row per transition), sized
    before `storage(capacity)` makes one. `torso(frames, bfloat16)`: the convolutional torso of
    its uint8 image states, or None (vector states: `OurModel`'s MLP). `preset`: d3qn_agent.py's
    values for all its games (apex.py converts them to its own flags, so a preset gives all of
    those `apex_preset` reads, or none); `game_presets`: one game's, applied after it;
    `bfloat16_games`: games that also get BFLOAT16 on a CPU with bfloat16 instructions.
    `packages`: the modules its games import, which a CartPole run must not.
    """

    name: str
    ids: str  # what its ids look like, for --help
    recognises: Callable[[str], bool]
    make_env: Callable[..., gym.Env]  # (env_name, max_episode_steps, render_mode[, seed=])
    seeding: Seeding
    storage: StorageSpec = field(default_factory=StorageSpec)
    torso: Callable[[Any, bool], Any] | None = None
    preset: dict[str, Any] = field(default_factory=dict)
    game_presets: dict[str, dict[str, Any]] = field(default_factory=dict)
    bfloat16_games: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()


# ---- Torsos --------------------------------------------------------------------------------------
def nature_torso(frames: Any, bfloat16: bool = False) -> Any:
    """The Nature DQN's torso for uint8 (84, 84, stack) frames: 1/255, three convolutions, 512
    units. `bfloat16`: only the convolutions, most of its multiply-adds; the dense layer stays
    float32."""
    conv_dtype = "mixed_bfloat16" if bfloat16 else None  # None: Keras' float32
    x = keras.layers.Rescaling(1.0 / 255.0)(frames)
    for filters, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
        x = NATURE_CONV(filters, kernel, strides=stride, activation="relu", dtype=conv_dtype)(x)
    x = keras.layers.Flatten()(x)
    return keras.layers.Dense(512, activation="relu")(x)


def minatar_torso(frames: Any, bfloat16: bool = False) -> Any:
    """The MinAtar paper's torso for uint8 (10, 10, channels) frames, too small for the Nature
    strides: 1/255, one 3x3 convolution of 16 (`PatchConv2D`: one matrix product), 128 units.
    `bfloat16`: the convolution only."""
    conv_dtype = "mixed_bfloat16" if bfloat16 else None
    x = keras.layers.Rescaling(1.0 / 255.0)(frames)
    x = PatchConv2D(16, 3, activation="relu", dtype=conv_dtype)(x)
    x = keras.layers.Flatten()(x)
    return keras.layers.Dense(128, activation="relu")(x)


# ---- Classic vector games: gymnasium's own ids ---------------------------------------------------
def make_gymnasium_env(env_name: str, max_episode_steps: int | None = None,
                       render_mode: str | None = None) -> gym.Env:
    """A gymnasium id as gymnasium makes it; ValueError for an id it does not know."""
    try:
        return gym.make(env_name, max_episode_steps=max_episode_steps, render_mode=render_mode)
    except gym.error.Error as err:
        raise ValueError(f"cannot make environment {env_name!r}: {err}") from err


# The RL Zoo's tuned DQN settings, with 3-step returns (Rainbow) to carry these sparse, delayed
# rewards back faster.
ACROBOT_LUNAR_LANDER_PRESET: dict[str, Any] = {  # the RL Zoo tunes both games alike
    "total_steps": 100_000, "memory_size": 50_000, "learning_rate": 6.3e-4, "target_update": 250,
    # A gradient step per env step, as the Zoo's (train_freq 4, gradient_steps -1): better last
    # networks than one per 4 steps (docs/classic_control.md), at four times the gradient steps.
    "train_frequency": 1,
    "n_step": 3, "exploration_steps": 12_000, "epsilon_min": 0.1, "eval_every": 5_000,
}
CLASSIC = GameFamily(
    name="gymnasium", ids="gymnasium ids", recognises=lambda env_name: True,  # the last resort
    make_env=make_gymnasium_env, seeding=Seeding.RESET,
    game_presets={
        # Less exploration noise in Acrobot's 3-step returns scored higher (classic_control.md).
        "Acrobot-v1": {**ACROBOT_LUNAR_LANDER_PRESET, "epsilon_min": 0.01},
        "LunarLander-v3": dict(ACROBOT_LUNAR_LANDER_PRESET),
        "MountainCar-v0": {
            "total_steps": 120_000, "memory_size": 10_000, "learning_rate": 4e-3, "gamma": 0.98,
            "target_update": 600, "train_frequency": 2, "n_step": 3, "exploration_steps": 24_000,
            "epsilon_min": 0.07, "eval_every": 5_000,
        },
    })


# ---- MinAtar (minatar_wrappers.py) ---------------------------------------------------------------
MINATAR = GameFamily(
    name="MinAtar", ids="MinAtar ids",
    recognises=lambda env_name: env_name.startswith(minatar_wrappers.PREFIX),
    make_env=minatar_wrappers.make_env,
    seeding=Seeding.RESET,  # BinaryFrame's reset clears the sticky last action as well
    storage=StorageSpec(FrameStackStorage, {"stack_axis": None}),  # whole states, no stacks
    torso=minatar_torso,
    # The MinAtar paper's DQN (Young & Tian 2019, its examples/dqn.py) and Revisiting Rainbow's
    # (Obando-Ceron & Castro 2021, Dopamine's MinAtar settings).
    preset={
        "total_steps": 2_000_000,  # the MinAtar README's curves at 2M frames (the paper runs 5M)
        "memory_size": 100_000,  # both papers
        "batch_size": 32,  # both papers
        "learning_rate": 1e-4,  # Revisiting Rainbow's Rainbow (its DQN: 2.5e-4, screened lower)
        "adam_epsilon": 3.125e-4,  # Dopamine's, as both Revisiting Rainbow's (docs/minatar.md)
        "lr_decay": False,  # a constant step, as in both
        "learning_starts": 5_000,  # the paper's replay start size (Revisiting Rainbow: 1,000)
        "target_update": 1_000,  # both papers
        "train_frequency": 4,  # Revisiting Rainbow (the paper: a gradient step every frame)
        "exploration_steps": 100_000,  # the paper: epsilon 1 -> 0.1 over the first 100,000 frames
        "epsilon_min": 0.1,  # the paper, so training returns compare with its curves (ε = 0.1)
        "n_step": 1,  # as both papers' DQN: with 3-step returns Asterix did not learn (minatar.md)
        "gradient_steps_per_call": 64,  # a call's fixed cost shared (docs/benchmarks.md)
        "eval_every": 100_000,  # 20 greedy evaluations of 10 episodes in a 2M run
        "eval_episodes": 10,
    },
    packages=("minatar",))


# ---- Atari (atari_wrappers.py) -------------------------------------------------------------------
def is_ale_id(env_name: str) -> bool:
    """True if `env_name` is an ALE (Atari) environment, e.g. "PongNoFrameskip-v4". An id that
    gymnasium knows without ale_py (CartPole-v1) is decided without importing it."""
    with contextlib.suppress(gym.error.Error):  # an id unknown to gymnasium: ale_py may know it
        if not str(gym.spec(env_name).entry_point).startswith("ale_py"):
            return False
    return importlib.import_module("atari_wrappers").is_atari(env_name)


def make_atari_env(env_name: str, max_episode_steps: int | None = None,
                   render_mode: str | None = None) -> gym.Env:
    """An ALE game through atari_wrappers.py (imported here: it imports ale_py)."""
    return importlib.import_module("atari_wrappers").make_env(
        env_name, max_episode_steps=max_episode_steps, render_mode=render_mode)


# Pong (docs/atari.md): XLA off, because off skips XLA's compile time; its gradient step with and
# without XLA shows no difference detected (the rounds' ranges overlap: bench_pong_kernels.py,
# docs/benchmarks.md). A checkpoint every 25,000 steps (two kept: docs/atari.md).
PONG_PRESET: dict[str, Any] = {
    "total_steps": 500_000, "train_frequency": 2, "xla": False, "checkpoint_every": 25_000,
}
ATARI = GameFamily(
    name="Atari", ids="Atari ids", recognises=is_ale_id, make_env=make_atari_env,
    seeding=Seeding.RESET,  # reset(seed=) seeds the ALE (sticky actions) and the no-ops
    storage=StorageSpec(FrameStackStorage),  # each frame once, four stacked on the last axis
    torso=nature_torso,
    # The DQN literature's values (Mnih et al. 2015, Schaul et al. 2016, SB3; 3-step returns from
    # Hessel et al. 2018), with a constant Adam step as in the Pong runs. One gradient step per
    # call, as in those papers, so the network that acts is at most TRAIN_FREQUENCY steps old.
    preset={
        "total_steps": 10_000_000, "memory_size": 100_000, "batch_size": 32,
        "learning_rate": 1e-4, "learning_starts": 10_000, "target_update": 1_000,
        "train_frequency": 4, "gradient_steps_per_call": 1, "n_step": 3, "lr_decay": False,
        "epsilon_min": 0.01, "exploration_steps": 100_000, "eval_every": 250_000,
        "eval_episodes": 10, "test_episodes": 3,
    },
    game_presets={"PongNoFrameskip-v4": PONG_PRESET, "ALE/Pong-v5": PONG_PRESET},
    # On Pong, five seeds each detected no difference in learning between bfloat16 and float32
    # convolutions (docs/atari.md, the pong_bf16 study); what bfloat16 saves,
    # `benchmarks/bench_vs_sb3.py --bfloat16` measures.
    bfloat16_games=("PongNoFrameskip-v4", "ALE/Pong-v5"),
    packages=("ale_py", "atari_wrappers"))

# The families in the order their ids are tried: by name first, then Atari's (it imports ale_py
# for an id gymnasium does not know), then any gymnasium id.
FAMILIES: list[GameFamily] = [MINATAR, ATARI, CLASSIC]


# ---- What d3qn_agent.py and apex.py call ---------------------------------------------------------
def family(env_name: str) -> GameFamily:
    """The first of FAMILIES that recognises `env_name`; ValueError if it is not a string. Cost:
    a registry lookup, and ale_py's import for an id gymnasium does not know (Atari's test)."""
    if not isinstance(env_name, str):
        raise ValueError(f"ENV_NAME (--env-name) must be a string, got {env_name!r}")
    return next(candidate for candidate in FAMILIES if candidate.recognises(env_name))


class MadeAgainOnSeededReset(gym.Wrapper):
    """A game whose levels are fixed when it is made (`Seeding.CONSTRUCTION`), seeded as
    gymnasium's games are: `reset(seed=s)` makes the game again with s, `make(s)`, and starts its
    first episode; `reset()` goes on to its next. Its spaces stay the first game's, so a seeded
    action space stays seeded."""

    def __init__(self, make: Callable[[int | None], gym.Env]) -> None:
        super().__init__(make(None))
        self.make = make
        self.action_space = self.env.action_space
        self.observation_space = self.env.observation_space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[Any, dict[str, Any]]:
        if seed is not None:
            self.env.close()
            self.env = self.make(seed)
        return self.env.reset(options=options)


def make_env(env_name: str, max_episode_steps: int | None = None,
             render_mode: str | None = None) -> gym.Env:
    """Create the environment through its family; an unknown id raises ValueError. Whatever
    the family's `seeding`, `reset(seed=)` replays an episode. `render_mode="rgb_array"`:
    `env.render()` gives the screen."""
    if render_mode == "rgb_array":  # drawn off-screen, so no display (nor SDL errors) is needed
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    game_family = family(env_name)
    if game_family.seeding is Seeding.CONSTRUCTION:
        return MadeAgainOnSeededReset(lambda seed: game_family.make_env(
            env_name, max_episode_steps, render_mode, seed=seed))
    return game_family.make_env(env_name, max_episode_steps, render_mode)


def torso(env_name: str) -> Callable[[Any, bool], Any] | None:
    """The game's convolutional torso (frames, bfloat16) -> features, or None: `OurModel`'s MLP."""
    return family(env_name).torso


def storage_spec(env_name: str) -> StorageSpec:
    """The class and options of this game's replay storage, to size it before making it."""
    return family(env_name).storage
