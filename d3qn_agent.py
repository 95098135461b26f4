"""D3QN (Double + Dueling DQN) with Prioritized Experience Replay, in Keras 3 / TensorFlow.

`python d3qn_agent.py` trains on CartPole-v1, saves the model to `models/` and draws the learning
curve to `plots/`; `python d3qn_agent.py --test` loads the saved model and plays greedy episodes
(`--model PATH` plays another saved network, `--record FILE.gif` films the first episode).
Every hyperparameter below can be set on the command line (`python d3qn_agent.py --help`).

What the agent does, per environment step:
  act      epsilon-greedy on the online network's Q-values (one compiled forward pass).
  remember store (state, action, reward, next_state, terminated) in the replay memory: PER's
           `Memory` (prioritized) or `UniformMemory`, chosen by USE_PER; same interface.
  replay   every TRAIN_FREQUENCY steps: sample a batch (of N_STEP-step returns, read from
           consecutive stored transitions), take one compiled gradient step on the
           importance-weighted Huber TD loss, and give the new |TD errors| back to the memory as
           priorities.
  target   the target network is a copy of the online network, refreshed every TARGET_UPDATE steps
           (or Polyak-averaged with TAU after every gradient step when SOFT_UPDATE is on).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import math
import os
import signal
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

# TensorFlow prints several start-up lines about CUDA and oneDNN on import; keep its warnings.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter
from PIL import Image

import checkpoint
from PER import AGE_BIN_HIGH, AGE_BIN_LOW, Memory, UniformMemory

# ---------------------------------------------------------------------------------------------
# Hyperparameters. Each one is also a command-line flag: ENV_NAME -> --env-name, and so on.
# ---------------------------------------------------------------------------------------------
ENV_NAME = "CartPole-v1"  # gymnasium id; Atari ids ("ALE/Pong-v5") go through atari_wrappers
TOTAL_STEPS = 50_000  # training budget in environment steps (the tutorial counted 1000 episodes)
USE_PER = True  # prioritized experience replay; False: uniform replay with the same interface
PER_RANK_BASED = False  # rank-based priorities 1/rank(i) instead of proportional |delta| + eps
PER_ALPHA = 0.6  # how strongly priorities shape sampling (0 = uniform); rank-based default 0.7
PER_BETA = 0.4  # initial importance-sampling exponent, annealed to 1 over the run; rank-based 0.5
DDQN = True  # double DQN target: online net picks the next action, target net evaluates it
DUELING = True  # dueling head Q = V + (A - mean A) instead of a plain Q layer
SOFT_UPDATE = False  # Polyak-average the target net after each gradient step instead of copying
TAU = 0.005  # soft-update rate: target <- TAU * online + (1 - TAU) * target
TARGET_UPDATE = 500  # env steps between hard copies online -> target (a copy = one more backup)
EPSILON_GREEDY = False  # the tutorial's exponential epsilon decay instead of a linear schedule
EPSILON_START = 1.0  # exploration probability at the first step
EPSILON_MIN = 0.01  # exploration probability at the end of the schedule
EXPLORATION_STEPS = 10_000  # linear schedule: steps to go from EPSILON_START to EPSILON_MIN
EPSILON_DECAY = 0.0005  # exponential schedule: decay rate per step (the tutorial's value)
MEMORY_SIZE = 50_000  # replay capacity in transitions
BATCH_SIZE = 128  # transitions per gradient step
GAMMA = 0.99  # discount factor
N_STEP = 3  # rewards summed per TD target: r_t + ... + gamma^(n-1) r_t+n-1 + gamma^n Q(s_t+n)
LEARNING_RATE = 1e-3  # Adam step size
LR_DECAY = True  # anneal the step size linearly to 0 over the run's gradient steps
GRAD_CLIP = 10.0  # clip the gradient's global norm to this value
LEARNING_STARTS = 1_000  # environment steps collected before the first gradient step
TRAIN_FREQUENCY = 2  # environment steps per gradient step (half a gradient step per env step)
HIDDEN_UNITS = (256, 256)  # MLP torso for vector observations (the tutorial: 512, 256, 64)
MAX_EPISODE_STEPS = None  # None keeps the env's own time limit (500); the tutorial used 4000
FAILURE_REWARD = None  # None keeps the env's reward; the tutorial replaced it by -100 on failure
EVAL_EVERY = 1_000  # environment steps between greedy evaluations (they pick the saved model)
EVAL_EPISODES = 20  # greedy episodes per evaluation, run side by side
TEST_EPISODES = 10  # greedy episodes played by --test
SEED = 0  # seeds Python, NumPy, TensorFlow, the environments and the replay memory
CHECKPOINT_EVERY = 0  # env steps between checkpoints for --resume (0: only on Ctrl-C)
MODEL_DIR = "models"  # where the .keras files and the checkpoints go
PLOT_DIR = "plots"  # where the learning curve and the priority figure go
TENSORBOARD = None  # TensorBoard event-file directory; None: off (--tensorboard alone: runs/<name>)
TENSORBOARD_EVERY = 100  # gradient steps between TensorBoard's training scalars (loss, |TD|, ...)

# Defaults from the DQN literature (Mnih et al. 2015, Schaul et al. 2016, Stable-Baselines3's
# Atari settings; 3-step returns from Hessel et al. 2018) that replace the CartPole values above
# for Atari ids unless set explicitly. Adam's step stays constant there: an Atari budget is set
# for the whole game, and the Pong runs in the README were made that way.
ATARI_OVERRIDES: dict[str, Any] = {
    "total_steps": 10_000_000,
    "memory_size": 100_000,
    "batch_size": 32,
    "learning_rate": 1e-4,
    "learning_starts": 10_000,
    "target_update": 1_000,
    "train_frequency": 4,
    "n_step": 3,
    "lr_decay": False,
    "epsilon_min": 0.01,
    "exploration_steps": 100_000,
    "eval_every": 250_000,
    "eval_episodes": 10,
    "test_episodes": 3,
}
# Per-environment defaults for other classic-control games, next to the Atari ones and applied
# the same way (explicit flags win). Batch, Adam step, replay size, target period, exploration
# and gamma follow the RL Zoo's tuned DQN settings for each game; the 3-step returns (Rainbow)
# carry rewards back faster, which these sparse, delayed-reward games need most.
ACROBOT_LUNAR_LANDER_OVERRIDES: dict[str, Any] = {  # the RL Zoo tunes both games alike
    "total_steps": 100_000,
    "memory_size": 50_000,
    "learning_rate": 6.3e-4,
    "target_update": 250,
    "train_frequency": 4,
    "n_step": 3,
    "exploration_steps": 12_000,
    "epsilon_min": 0.1,
    "eval_every": 5_000,
}
ENV_OVERRIDES: dict[str, dict[str, Any]] = {
    "Acrobot-v1": dict(ACROBOT_LUNAR_LANDER_OVERRIDES),
    # A gradient step per env step, as the Zoo's (train_freq 4, gradient_steps -1): screened on
    # seeds 3 and 4, it lands better than one per 4 steps (greedy 205 vs 171) at ~3x the time.
    "LunarLander-v3": {**ACROBOT_LUNAR_LANDER_OVERRIDES, "train_frequency": 1},
    "MountainCar-v0": {
        "total_steps": 120_000,
        "memory_size": 10_000,
        "learning_rate": 4e-3,
        "gamma": 0.98,
        "target_update": 600,
        "train_frequency": 2,
        "n_step": 3,
        "exploration_steps": 24_000,
        "epsilon_min": 0.07,
        "eval_every": 5_000,
    },
}
# Schaul et al. (2016) tuned alpha and beta separately for the rank-based variant.
RANK_BASED_OVERRIDES: dict[str, Any] = {"per_alpha": 0.7, "per_beta": 0.5}
AVERAGE_WINDOW = 50  # episodes in the moving average that is printed and plotted
LATEST = "latest"  # --resume without a path: the newest checkpoint of this run
PLOT_REFRESH_SECONDS = 20.0  # redraw the learning curve at most this often during training
TENSORBOARD_ROOT = "runs"  # --tensorboard without a directory writes to runs/<run name>
PRIORITY_HISTORY_EVERY = 50  # gradient steps between the priority figure's beta / IS-weight points
RECENT_BATCHES = 20  # batches whose IS weights the priority figure shows


def format_overrides(overrides: dict[str, Any]) -> str:
    """`{"n_step": 3, "lr_decay": False}` as the command-line flags "--n-step 3, --no-lr-decay"
    for --help."""
    flags = []
    for name, value in overrides.items():
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            flags.append(f"--{flag} {value}")
    return ", ".join(flags)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Show each flag's default, and print the epilog as written (argparse would otherwise
    re-wrap it and split flags like --train-frequency at their hyphens)."""


def overrides_epilog() -> str:
    """The Atari, per-environment and rank-based defaults, one paragraph each, for --help."""
    paragraphs = [("Atari ids", ATARI_OVERRIDES)]
    paragraphs += [(env_name, overrides) for env_name, overrides in ENV_OVERRIDES.items()]
    paragraphs += [("--rank-based", RANK_BASED_OVERRIDES)]
    wrap = textwrap.TextWrapper(width=88, subsequent_indent="  ", break_on_hyphens=False)
    return "Defaults that change unless given explicitly:\n" + "\n".join(
        wrap.fill(f"{what}: {format_overrides(overrides)}") for what, overrides in paragraphs)


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags; each one's default is the constant of the same name above."""
    parser = argparse.ArgumentParser(
        prog="d3qn_agent.py",
        description="Train (default) or test a D3QN agent with prioritized experience replay.",
        formatter_class=HelpFormatter,
        epilog=overrides_epilog(),
    )
    add = parser.add_argument
    boolean = argparse.BooleanOptionalAction
    add("--test", action="store_true", help="play the saved model greedily instead of training")
    add("--model", default=None, metavar="PATH",
        help="with --test: play this .keras file instead of MODEL_DIR/<run name>.keras")
    add("--record", default=None, metavar="FILE.gif",
        help="with --test: also write the first episode as an animated GIF")
    add("--resume", nargs="?", const=LATEST, default=None, metavar="CHECKPOINT",
        help="continue training from the newest checkpoint of this run (or from CHECKPOINT, a "
        "step-* directory)")
    add("--env-name", default=ENV_NAME, help="gymnasium environment id (discrete actions)")
    add("--total-steps", type=int, default=TOTAL_STEPS, help="training budget in env steps")
    add("--per", dest="use_per", action=boolean, default=USE_PER,
        help="prioritized replay (--no-per: uniform replay)")
    add("--rank-based", dest="per_rank_based", action=boolean, default=PER_RANK_BASED,
        help="rank-based instead of proportional priorities")
    add("--per-alpha", type=float, default=PER_ALPHA, help="priority exponent alpha")
    add("--per-beta", type=float, default=PER_BETA,
        help="initial importance-sampling exponent, annealed to 1 over the run")
    add("--ddqn", action=boolean, default=DDQN, help="double DQN target")
    add("--dueling", action=boolean, default=DUELING, help="dueling network head")
    add("--soft-update", action=boolean, default=SOFT_UPDATE,
        help="Polyak-average the target network after every gradient step")
    add("--tau", type=float, default=TAU, help="soft-update rate")
    add("--target-update", type=int, default=TARGET_UPDATE,
        help="env steps between hard target-network copies")
    add("--epsilon-greedy", action=boolean, default=EPSILON_GREEDY,
        help="the tutorial's exponential epsilon decay (else linear)")
    add("--epsilon-start", type=float, default=EPSILON_START, help="initial exploration rate")
    add("--epsilon-min", type=float, default=EPSILON_MIN, help="final exploration rate")
    add("--exploration-steps", type=int, default=EXPLORATION_STEPS,
        help="linear schedule: env steps from --epsilon-start to --epsilon-min")
    add("--epsilon-decay", type=float, default=EPSILON_DECAY,
        help="exponential schedule: decay rate per env step")
    add("--memory-size", type=int, default=MEMORY_SIZE, help="replay capacity (transitions)")
    add("--batch-size", type=int, default=BATCH_SIZE, help="transitions per gradient step")
    add("--gamma", type=float, default=GAMMA, help="discount factor")
    add("--n-step", type=int, default=N_STEP, help="rewards summed per TD target (n-step return)")
    add("--learning-rate", type=float, default=LEARNING_RATE, help="Adam learning rate")
    add("--lr-decay", action=boolean, default=LR_DECAY,
        help="anneal the learning rate linearly to 0 over the run's gradient steps")
    add("--grad-clip", type=float, default=GRAD_CLIP, help="max global gradient norm")
    add("--learning-starts", type=int, default=LEARNING_STARTS,
        help="env steps before the first gradient step")
    add("--train-frequency", type=int, default=TRAIN_FREQUENCY,
        help="env steps per gradient step")
    add("--hidden-units", type=int, nargs="+", default=HIDDEN_UNITS,
        help="hidden layer sizes of the MLP for vector observations")
    add("--max-episode-steps", type=int, default=MAX_EPISODE_STEPS,
        help="time limit per episode; None keeps the env's own (500 for CartPole-v1)")
    add("--failure-reward", type=float, default=FAILURE_REWARD,
        help="reward stored for a terminal step; None keeps the env's (the tutorial: -100)")
    add("--eval-every", type=int, default=EVAL_EVERY,
        help="env steps between greedy evaluations; the best one is saved")
    add("--eval-episodes", type=int, default=EVAL_EPISODES, help="episodes per evaluation")
    add("--test-episodes", type=int, default=TEST_EPISODES, help="episodes played by --test")
    add("--seed", type=int, default=SEED, help="random seed")
    add("--checkpoint-every", type=int, default=CHECKPOINT_EVERY,
        help="env steps between checkpoints, also written at the end (0: only on Ctrl-C)")
    add("--model-dir", default=MODEL_DIR, help="directory for the saved .keras models")
    add("--plot-dir", default=PLOT_DIR,
        help="directory for the learning curve and the priority figure (PNG)")
    add("--tensorboard", nargs="?", const=True, default=TENSORBOARD, metavar="DIR",
        help=f"write TensorBoard event files to DIR (alone: {TENSORBOARD_ROOT}/<run name>)")
    add("--tensorboard-every", type=int, default=TENSORBOARD_EVERY,
        help="gradient steps between TensorBoard's training scalars")
    return parser


def default_flags() -> dict[str, Any]:
    """The flag block above as a dict keyed by lower-case flag name (without the modes)."""
    flags = vars(build_parser().parse_args([]))
    for mode in ("test", "resume", "model", "record"):
        del flags[mode]
    return flags


def explicit_flags(argv: list[str], parser: argparse.ArgumentParser | None = None
                   ) -> dict[str, Any]:
    """Parse `argv` and return only the flags the user actually gave (so Atari defaults can apply).

    `parser` defaults to this file's `build_parser()` (apex.py passes its own). `--help` and
    malformed flags exit here, as argparse does.
    """
    parser = build_parser() if parser is None else parser
    names = vars(parser.parse_args(argv))  # reports errors and --help with the real defaults
    # argparse fills in defaults only for names the namespace lacks, so a pre-filled marker
    # survives exactly for the flags that were not given.
    not_given = object()
    given = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(names, not_given)))
    return {name: value for name, value in vars(given).items() if value is not not_given}


def resolve_flags(env_name: str, flags: dict[str, Any], atari: bool) -> argparse.Namespace:
    """Merge the defaults, the Atari / per-environment / rank-based overrides and the explicit
    `flags` (in that order, so explicit flags always win), then check.

    Raises ValueError naming the first unknown flag or out-of-range value.
    """
    settings = default_flags()
    unknown = sorted(set(flags) - set(settings))
    if unknown:
        raise ValueError(f"unknown flag(s) {unknown}; known: {sorted(settings)}")
    if atari:
        settings.update(ATARI_OVERRIDES)
    settings.update(ENV_OVERRIDES.get(env_name, {}))
    if flags.get("per_rank_based", settings["per_rank_based"]):
        settings.update(RANK_BASED_OVERRIDES)
    settings.update(flags)
    settings["env_name"] = env_name
    settings["hidden_units"] = tuple(settings["hidden_units"])
    config = argparse.Namespace(**settings)
    _check_ranges(config)
    return config


def _check_ranges(config: argparse.Namespace) -> None:
    """Raise ValueError for the first flag whose value cannot work."""
    positive = ["total_steps", "memory_size", "batch_size", "learning_rate", "grad_clip",
                "target_update", "train_frequency", "n_step", "exploration_steps", "eval_every",
                "eval_episodes", "test_episodes", "tensorboard_every"]
    for name in positive:
        value = getattr(config, name)
        if not value > 0:
            raise ValueError(f"{name.upper()} must be positive, got {value}")
    unit_interval = ["gamma", "epsilon_start", "epsilon_min", "per_alpha", "per_beta"]
    for name in unit_interval:
        value = getattr(config, name)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name.upper()} must be in [0, 1], got {value}")
    if not 0.0 < config.tau <= 1.0:
        raise ValueError(f"TAU must be in (0, 1], got {config.tau}")
    for name in ("learning_starts", "epsilon_decay", "checkpoint_every"):
        if getattr(config, name) < 0:
            raise ValueError(f"{name.upper()} must be >= 0, got {getattr(config, name)}")
    if config.batch_size > config.memory_size:
        raise ValueError(f"BATCH_SIZE ({config.batch_size}) must not exceed "
                         f"MEMORY_SIZE ({config.memory_size})")
    if config.max_episode_steps is not None and config.max_episode_steps <= 0:
        raise ValueError(f"MAX_EPISODE_STEPS must be positive, got {config.max_episode_steps}")
    if not config.hidden_units or min(config.hidden_units) <= 0:
        raise ValueError(f"HIDDEN_UNITS must be positive sizes, got {config.hidden_units}")


def is_atari_env(env_name: str) -> bool:
    """True if `env_name` is an ALE id. atari_wrappers (and ale_py) is imported only here."""
    try:
        import atari_wrappers
    except ImportError:
        return False
    return atari_wrappers.is_atari(env_name)


def make_env(
    env_name: str, max_episode_steps: int | None, atari: bool, render_mode: str | None = None
) -> gym.Env:
    """Create the environment; unknown ids raise ValueError instead of gymnasium's own errors.

    `render_mode="rgb_array"` makes `env.render()` return the screen as an RGB array (for
    `--record`); it costs nothing until `render()` is called.
    """
    if render_mode == "rgb_array":
        # Drawn off-screen (pygame for the classic-control games), so no display is needed; SDL
        # would otherwise print errors about a missing display on a headless machine.
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    if atari:
        import atari_wrappers

        return atari_wrappers.make_env(env_name, max_episode_steps=max_episode_steps,
                                       render_mode=render_mode)
    try:
        return gym.make(env_name, max_episode_steps=max_episode_steps, render_mode=render_mode)
    except gym.error.Error as err:
        raise ValueError(f"cannot make environment {env_name!r}: {err}") from err


# ---------------------------------------------------------------------------------------------
# Recording (--test --record FILE.gif): limits that keep a GIF small enough for a README
# ---------------------------------------------------------------------------------------------
GIF_MAX_FPS = 25  # keep at most this many screens per second of game time, played in real time
GIF_MAX_FRAMES = 2_000  # cap the length: 80 s of CartPole (50 steps/s), 133 s of Atari (15/s)
GIF_MAX_WIDTH = 320  # shrink wider screens (CartPole renders 600x400; Atari's 160x210 stays)
GIF_COLORS = 64  # one shared palette; flat game graphics need few colours
GIF_MAX_BYTES = 3_000_000  # if still larger, every 2nd frame is dropped until it fits


def check_gif_path(path: str) -> Path:
    """Return `path` as a Path if a GIF can be written there, else raise ValueError naming it.

    Checks the `.gif` extension and that the directory exists and accepts a new file (by
    creating and deleting a temporary one), so that a bad path fails before any episode.
    """
    target = Path(path)
    if target.suffix.lower() != ".gif":
        raise ValueError(f"cannot record to {path!r}: the file name must end in .gif")
    if target.is_dir():
        raise ValueError(f"cannot record to {path!r}: it is a directory")
    directory = target.parent
    if not directory.exists():
        raise ValueError(f"cannot record to {path!r}: directory {str(directory)!r} does not exist")
    if not directory.is_dir():
        raise ValueError(f"cannot record to {path!r}: {str(directory)!r} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as err:
        raise ValueError(f"cannot record to {path!r}: directory {str(directory)!r} is not "
                         f"writable ({err.strerror})") from err
    return target


class GifRecorder:
    """The screens of one episode, shrunk as they come in, written as one animated GIF.

    For an environment that takes `steps_per_second` steps per second of game time (its
    metadata's `render_fps`), `add` keeps the screen of every `every`-th step, so at most
    GIF_MAX_FPS per second and GIF_MAX_FRAMES in all, and the GIF plays in real time. `save`
    drops every 2nd frame until the file fits in GIF_MAX_BYTES. Memory: one byte per pixel of
    each kept frame (68 KB for CartPole, 34 KB for Atari).
    """

    def __init__(self, steps_per_second: float) -> None:
        if not steps_per_second > 0:
            raise ValueError(f"steps_per_second must be positive, got {steps_per_second}")
        self.every = max(1, round(steps_per_second / GIF_MAX_FPS))
        self.frame_ms = 1000.0 * self.every / steps_per_second
        self.frames: list[Image.Image] = []  # palette images sharing the first frame's palette
        self.last_step: int | None = None

    @property
    def full(self) -> bool:
        """True once GIF_MAX_FRAMES frames are kept: later frames are ignored."""
        return len(self.frames) >= GIF_MAX_FRAMES

    def wants(self, step: int, last: bool = False) -> bool:
        """Whether the screen after `step` steps should be rendered and passed to `add`.

        Every `every`-th step and the episode's `last` one, so the GIF shows its end.
        """
        return not self.full and step != self.last_step and (step % self.every == 0 or last)

    def add(self, step: int, frame: Any) -> None:
        """Keep `frame`, the (height, width, 3) uint8 screen after `step` steps: shrunk to
        GIF_MAX_WIDTH and mapped to the palette of the first frame (computed from it, without
        dithering: flat colours compress well and do not flicker). Cost: ~2 ms for CartPole.

        Raises ValueError if the environment gave no RGB frame.
        """
        frame = None if frame is None else np.asarray(frame)
        if frame is None or frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[-1] != 3:
            got = None if frame is None else f"{frame.dtype} {frame.shape}"
            raise ValueError(f"the environment's render() gave no RGB frame (got {got}); "
                             "--record needs render_mode='rgb_array'")
        image = Image.fromarray(frame)
        if image.width > GIF_MAX_WIDTH:
            height = round(image.height * GIF_MAX_WIDTH / image.width)
            # Area averaging: sharp enough for shrinking, 4x faster than Lanczos here.
            image = image.resize((GIF_MAX_WIDTH, height), Image.Resampling.BOX)
        palette = self.frames[0] if self.frames else image.quantize(GIF_COLORS,
                                                                     dither=Image.Dither.NONE)
        self.frames.append(image.quantize(palette=palette, dither=Image.Dither.NONE))
        self.last_step = step

    def encode(self, max_bytes: int | None = None) -> tuple[bytes, int]:
        """The animated GIF's bytes and its number of frames; fewer frames if over `max_bytes`
        (default GIF_MAX_BYTES).

        Dropping every 2nd frame doubles each kept frame's duration, so the speed stays the
        same. Cost: one encode per halving, ~2 ms and ~0.7 KB per CartPole frame.
        """
        if not self.frames:
            raise ValueError("no frame was recorded")
        max_bytes = GIF_MAX_BYTES if max_bytes is None else max_bytes
        every = 1
        while True:
            kept = self.frames[::every]
            buffer = io.BytesIO()
            kept[0].save(buffer, format="GIF", save_all=True, append_images=kept[1:],
                         duration=round(self.frame_ms * every), loop=0)
            if buffer.tell() <= max_bytes or len(kept) == 1:
                return buffer.getvalue(), len(kept)
            every *= 2

    def save(self, path: str | Path) -> tuple[int, int]:
        """Write the GIF to `path` atomically; return its size in bytes and its frame count."""
        data, frames = self.encode()
        with checkpoint.atomic_file(path) as temporary:
            temporary.write_bytes(data)
        return len(data), frames


# ---------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------
@keras.saving.register_keras_serializable(package="d3qn")
class DuelingCombine(keras.layers.Layer):
    """Combine the dueling streams: Q(s, a) = V(s) + A(s, a) - mean over a' of A(s, a').

    Inputs: [value (batch, 1), advantage (batch, n_actions)]; output (batch, n_actions). The mean
    is taken per sample, over actions only. Subtracting it makes V and A identifiable: adding a
    constant to every advantage leaves Q unchanged. A registered layer instead of a `Lambda` so
    that `.keras` files load in Keras' safe mode (Lambda layers hold pickled Python code). It has
    no settings of its own, so the base class's `get_config` is all it needs.
    """

    def call(self, inputs: list) -> Any:
        value, advantage = inputs
        return value + advantage - keras.ops.mean(advantage, axis=-1, keepdims=True)

    def compute_output_shape(self, input_shapes: list) -> tuple:
        return input_shapes[1]


def OurModel(  # the tutorial's name
    input_shape: tuple[int, ...],
    action_space: int,
    dueling: bool,
    hidden_units: tuple[int, ...] = HIDDEN_UNITS,
) -> keras.Model:
    """Q-network: state -> one Q-value per action (uncompiled; the agent trains it itself).

    The torso follows the input: a vector gets an MLP with `hidden_units`; a (height, width,
    channels) uint8 image gets the Nature-DQN torso (Rescaling 1/255, conv 32x8x8/4, 64x4x4/2,
    64x3x3/1, dense 512). The head is either one linear layer or the dueling pair V, A combined
    by `DuelingCombine`.
    """
    if len(input_shape) == 3:
        inputs = keras.Input(shape=input_shape, dtype="uint8", name="frames")
        x = keras.layers.Rescaling(1.0 / 255.0)(inputs)
        for filters, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = keras.layers.Conv2D(filters, kernel, strides=stride, activation="relu")(x)
        x = keras.layers.Flatten()(x)
        x = keras.layers.Dense(512, activation="relu")(x)
    elif len(input_shape) == 1:
        inputs = keras.Input(shape=input_shape, dtype="float32", name="state")
        x = inputs
        for units in hidden_units:
            x = keras.layers.Dense(units, activation="relu", kernel_initializer="he_uniform")(x)
    else:
        raise ValueError(f"input_shape must be (features,) or (height, width, channels), "
                         f"got {input_shape}")
    if dueling:
        state_value = keras.layers.Dense(1, name="state_value")(x)
        action_advantage = keras.layers.Dense(action_space, name="action_advantage")(x)
        q_values = DuelingCombine(name="q_values")([state_value, action_advantage])
    else:
        q_values = keras.layers.Dense(action_space, name="q_values")(x)
    return keras.Model(inputs, q_values, name="d3qn" if dueling else "dqn")


def double_dqn_targets(
    rewards: Any, dones: Any, next_q_online: Any, next_q_target: Any, discounts: Any, double: bool
) -> tf.Tensor:
    """TD targets r + discount * (1 - done) * Q_next, one per sample.

    `discounts` is gamma (a scalar), or gamma^k per sample when `rewards` sum k steps (n-step).

    Double DQN (van Hasselt et al. 2016): the online network chooses a' = argmax Q_online(s', .)
    and the target network evaluates it, Q_next = Q_target(s', a'); this removes most of the
    overestimation of max. Plain DQN: Q_next = max over a' of Q_target(s', a'). `dones` must be
    1 only for real terminations: a time-limit truncation still bootstraps.
    """
    rewards = tf.cast(rewards, tf.float32)
    dones = tf.cast(dones, tf.float32)
    if double:
        next_actions = tf.argmax(next_q_online, axis=1, output_type=tf.int32)
        next_values = tf.gather(next_q_target, next_actions, axis=1, batch_dims=1)
    else:
        next_values = tf.reduce_max(next_q_target, axis=1)
    return rewards + discounts * (1.0 - dones) * tf.cast(next_values, tf.float32)


def batch_td_errors(
    model: keras.Model, target_model: keras.Model, states: Any, actions: Any, rewards: Any,
    next_states: Any, dones: Any, discounts: Any, double: bool, training: bool = False,
) -> tf.Tensor:
    """TD errors target - Q(s, a) of a batch, the target from `double_dqn_targets`.

    The train step differentiates them (training=True, inside its tape; stop_gradient holds the
    target fixed); apex.py's actors take their absolute values as the first priorities of the
    transitions they send, so actor and learner agree by construction. Cost: three forward
    passes of the batch.
    """
    targets = double_dqn_targets(rewards, dones, model(next_states, training=False),
                                 target_model(next_states, training=False), discounts, double)
    q_taken = tf.gather(model(states, training=training), actions, axis=1, batch_dims=1)
    return tf.stop_gradient(targets) - q_taken


def huber(errors: tf.Tensor, delta: float = 1.0) -> tf.Tensor:
    """Elementwise Huber loss: quadratic for |error| <= delta, linear beyond (bounded gradient)."""
    abs_errors = tf.abs(errors)
    quadratic = tf.minimum(abs_errors, delta)
    return 0.5 * tf.square(quadratic) + delta * (abs_errors - quadratic)


class NonFiniteError(RuntimeError):
    """A training step produced NaN or inf; the run stops with its last good state saved."""


def episode_seed(seed: int, *indices: int) -> int:
    """A reset seed for one episode, so that every episode can be replayed from its seed alone.

    Derived with numpy's SeedSequence, so runs with nearby seeds do not share episodes.
    """
    return int(np.random.SeedSequence([seed, *indices]).generate_state(1)[0])


# ---------------------------------------------------------------------------------------------
# TensorBoard and the priority figure
# ---------------------------------------------------------------------------------------------
class TensorBoardWriter:
    """Scalars for TensorBoard, written with `tf.summary` to event files in `log_dir`.

    `TensorBoardWriter("runs/x").write(step, {"episode/score": 200.0})`; any training loop can
    use it. The directory is created and checked at once (ValueError naming it if it cannot be
    written), the event file on the first `write`. A scalar costs ~0.8 ms (eager tf.summary on a
    busy 2-core CPU), so write every few steps, not every step; TensorFlow flushes
    the events every few seconds, `flush` and `close` at once.
    """

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        try:
            os.makedirs(log_dir, exist_ok=True)
            with tempfile.TemporaryFile(dir=log_dir):
                pass
        except OSError as error:
            raise ValueError(f"cannot write TensorBoard logs to {log_dir!r}: "
                             f"{error.strerror or error}") from error
        self._writer: Any = None

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Write each `tag: value` of `scalars` at x-axis position `step`."""
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        with self._writer.as_default(step=step):
            for tag, value in scalars.items():
                tf.summary.scalar(tag, float(value))

    def flush(self) -> None:
        """Write buffered events to disk now."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file; a later `write` opens a new one."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def priority_figure_data(memory: Memory | UniformMemory) -> dict[str, Any]:
    """What the priority figure shows about `memory` (built with track_replays=True).

    relative_probabilities: N * P(i) of every transition held, 1 being uniform replay's chance;
    floor: N * P(i) of a transition with |delta| = 0, (epsilon)^alpha / total * N, and epsilon
    (proportional PER; None otherwise); age_low, age_high: the age bins (transitions stored
    since) the memory ever held; replay_rate, uniform_rate: replays per transition and gradient
    step at those ages, measured and uniform replay's expectation. Cost O(capacity).
    """
    _, probabilities = memory.sampling_probabilities()
    size = len(probabilities)
    floor = epsilon = None
    if isinstance(memory, Memory) and not memory.rank_based and memory.tree.total_priority > 0:
        floor = memory.epsilon**memory.alpha / memory.tree.total_priority * size
        epsilon = memory.epsilon
    stats = memory.stats
    seen = stats.exposure_by_age > 0
    return {
        "relative_probabilities": probabilities * size,
        "floor": floor,
        "epsilon": epsilon,
        "age_low": AGE_BIN_LOW[seen],
        "age_high": AGE_BIN_HIGH[seen],
        "replay_rate": stats.replays_by_age[seen] / stats.exposure_by_age[seen],
        "uniform_rate": stats.uniform_replays_by_age[seen] / stats.exposure_by_age[seen],
    }


def draw_priority_figure(
    path: str,
    data: dict[str, Any],
    history: list[tuple[int, float, float, float]],
    recent_is_weights: np.ndarray,
    title: str,
) -> None:
    """Four panels on what prioritized replay does, saved atomically to `path` (~0.3 s).

    `data` from `priority_figure_data`; `history` (env step, beta, smallest and mean IS weight of
    a batch) over the run; `recent_is_weights` the IS weights of the last batches.
    """
    figure = Figure(figsize=(13, 8.5), layout="constrained")
    figure.suptitle(title, fontsize=11)
    (probability_axes, weight_axes), (beta_axes, age_axes) = figure.subplots(2, 2)

    relative = data["relative_probabilities"]
    low, high = relative.min(initial=1.0), relative.max(initial=1.0)
    edges = np.geomspace(low * 0.999, high * 1.001, 41) if high > low * 1.01 else \
        np.array([low * 0.9, high * 1.1])
    counts, _ = np.histogram(relative, edges)
    mass, _ = np.histogram(relative, edges, weights=relative)
    probability_axes.stairs(100 * counts / max(counts.sum(), 1), edges, fill=True, alpha=0.4,
                            color="tab:gray", label="share of the transitions")
    probability_axes.stairs(100 * mass / max(mass.sum(), 1e-300), edges, color="tab:red",
                            linewidth=2, label="share of the sampling probability they hold")
    probability_axes.axvline(1.0, color="black", linestyle="--", label="uniform replay (1)")
    if data["floor"] is not None:
        probability_axes.axvline(data["floor"], color="tab:blue", linestyle=":",
                                 label=f"|δ| = 0: only ε = {data['epsilon']:g} left")
    probability_axes.set_xscale("log")
    ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)
             if edges[0] <= t <= edges[-1]]
    probability_axes.set_xticks(ticks, [f"{t:g}" for t in ticks])
    probability_axes.xaxis.set_minor_formatter(NullFormatter())
    probability_axes.set_xlabel("N·P(i): a transition's sampling probability relative to uniform")
    probability_axes.set_ylabel("% (per bin)")
    probability_axes.set_title(f"Priorities of the {len(relative):,} transitions in the memory "
                               "at the end\nmost are replayed less often than uniform replay "
                               "would, a few much more", fontsize=10)
    probability_axes.legend(fontsize=8)

    weights = recent_is_weights.ravel()
    weight_axes.hist(weights, bins=np.linspace(0.0, 1.0, 41), color="tab:purple", alpha=0.7)
    beta = history[-1][1] if history else float("nan")
    weight_axes.set_xlim(0.0, 1.02)
    weight_axes.set_xlabel("importance-sampling weight w_i = (N·P(i))^-β / max_j w_j")
    weight_axes.set_ylabel("samples")
    weight_axes.set_title(f"IS weights of the last {len(recent_is_weights)} batches (β = "
                          f"{beta:.2f})\nthe most often replayed transitions count the least "
                          "in the loss", fontsize=10)

    if history:
        steps, betas, smallest, mean = (np.array(column) for column in zip(*history, strict=True))
        beta_axes.plot(steps, betas, color="black", label="β (annealed to 1)")
        beta_axes.plot(steps, mean, color="tab:purple", alpha=0.8, label="mean IS weight")
        beta_axes.plot(steps, smallest, color="tab:purple", alpha=0.4, linewidth=0.8,
                       label="smallest IS weight in the batch")
        beta_axes.legend(fontsize=8, loc="center right")
    beta_axes.set_ylim(0.0, 1.05)
    beta_axes.set_xlabel("environment step")
    beta_axes.set_title("β over the run\nas β grows to 1, the IS weights undo more of the "
                        "sampling bias", fontsize=10)
    beta_axes.grid(alpha=0.3)

    if len(data["age_low"]):
        # Measured over uniform replay's expectation, so the memory's growth during the run
        # (which changes every transition's uniform chance) cancels out.
        age_edges = np.append(data["age_low"], data["age_high"][-1]) + 1.0
        ratio = data["replay_rate"] / np.maximum(data["uniform_rate"], 1e-300)
        age_axes.stairs(ratio, age_edges, baseline=None, color="tab:red", linewidth=2,
                        label="measured")
        age_axes.axhline(1.0, color="black", linestyle="--", label="uniform replay")
        age_axes.set_xscale("log")
        age_axes.set_ylim(0.0, max(1.5, 1.1 * ratio.max()))
        age_axes.legend(fontsize=8)
    age_axes.set_xlabel("age + 1 (transitions stored after it, log bins)")
    age_axes.set_ylabel("replays relative to uniform replay")
    age_axes.set_title("How often transitions were replayed, by their age\nnew ones enter at "
                       "top priority: replayed soon, later less often", fontsize=10)
    age_axes.grid(alpha=0.3, which="both")
    with checkpoint.atomic_file(path) as temporary:
        figure.savefig(temporary, dpi=90)


# ---------------------------------------------------------------------------------------------
# Agent
# ---------------------------------------------------------------------------------------------
class DQNAgent:
    """D3QN agent with prioritized (or uniform) replay; `run()` trains, `test()` plays.

    `DQNAgent("CartPole-v1", use_per=False, seed=3)`: keyword flags are the lower-case names of
    the constants at the top of this file. All state of a run lives on the object (networks,
    optimizer, memory, `step`, `episode`, `epsilon`, `scores`, `average`, `evaluations`, `rng`)
    so that it can be saved and restored as a whole.
    """

    def __init__(self, env_name: str = ENV_NAME, **flags: Any) -> None:
        self.env_name = env_name
        self.atari = is_atari_env(env_name)
        self.config = config = resolve_flags(env_name, flags, self.atari)
        keras.utils.set_random_seed(config.seed)
        self.env = make_env(env_name, config.max_episode_steps, self.atari)
        if not isinstance(self.env.action_space, gym.spaces.Discrete):
            raise ValueError(f"{env_name} has action space {self.env.action_space}; "
                             "DQN needs a discrete one")
        self.env.action_space.seed(config.seed)
        self.state_shape = tuple(self.env.observation_space.shape)
        self.state_dtype = self.env.observation_space.dtype
        self.action_size = int(self.env.action_space.n)
        self.solved_score = self.env.spec.reward_threshold if self.env.spec else None

        self.rng = np.random.default_rng(config.seed)  # epsilon-greedy draws
        self.MEMORY = self._make_memory()

        self.model = OurModel(self.state_shape, self.action_size, config.dueling,
                              config.hidden_units)
        self.target_model = OurModel(self.state_shape, self.action_size, config.dueling,
                                     config.hidden_units)
        self.target_model.set_weights(self.model.get_weights())
        self._make_optimizer()
        self._compile_functions()

        self.step = 0  # environment steps taken in training
        self.episode = 0  # finished training episodes
        self.epsilon = self.epsilon_at(0)
        self.scores: list[float] = []  # return of every training episode
        self.average: list[float] = []  # moving average of `scores` after every episode
        self.evaluations: list[tuple[int, int, float]] = []  # (step, episode, mean greedy return)
        self.best_evaluation = -math.inf
        self.steps_to_solve: int | None = None  # first evaluation step with mean >= threshold
        self._eval_envs: list[gym.Env] = []
        self.evaluation_seconds = 0.0  # wall time spent in greedy evaluations by this process
        self._last_plot_time = time.perf_counter()
        # The episode in progress. Every episode starts from a reset with its own seed and its
        # actions are recorded, so a checkpoint taken mid-episode can replay it exactly.
        self.state: np.ndarray | None = None
        self.episode_score = 0.0
        self.episode_actions: list[int] = []
        self._stop_requested = False

        self.name = self.run_name()
        self.Model_name = os.path.join(config.model_dir, self.name + ".keras")
        self.Plot_name = os.path.join(config.plot_dir, self.name + ".png")
        self.checkpoint_root = os.path.join(config.model_dir, self.name + ".checkpoints")
        self.Priority_plot_name = os.path.join(config.plot_dir, self.name + "_priorities.png")
        # What the priority figure shows besides the memory's own counters.
        self.priority_history: list[tuple[int, float, float, float]] = []  # (step, beta, w)
        self.recent_is_weights = np.ones((RECENT_BATCHES, config.batch_size), np.float32)
        self.recent_batches = 0  # batches written to recent_is_weights (a ring)
        self.tensorboard_dir: str | None = None
        self.tensorboard: TensorBoardWriter | None = None
        if config.tensorboard:
            self.tensorboard_dir = (os.path.join(TENSORBOARD_ROOT, self.name)
                                    if config.tensorboard is True else str(config.tensorboard))
            self.tensorboard = TensorBoardWriter(self.tensorboard_dir)
        self._interval_sums = [0.0, 0.0, 0]  # loss, mean |TD error|, gradient steps since a write
        self._interval_start = (time.perf_counter(), 0)  # (time, env step) of the last write

    def _make_memory(self) -> Memory | UniformMemory:
        """PER `Memory` or `UniformMemory`; image observations keep each frame once."""
        config = self.config
        storage = None
        if len(self.state_shape) == 3:
            from atari_wrappers import FrameStackStorage

            if config.memory_size <= self.state_shape[-1]:
                raise ValueError(f"MEMORY_SIZE must exceed the frame stack "
                                 f"({self.state_shape[-1]}) for images, got {config.memory_size}")

            storage = FrameStackStorage(config.memory_size)
        memory_rng = np.random.default_rng([config.seed, 1])
        returns = {"n_step": config.n_step, "gamma": config.gamma}
        # The memories count who gets replayed, for the priority figure (~1% of a CartPole step).
        returns["track_replays"] = True
        if not config.use_per:
            return UniformMemory(config.memory_size, storage=storage, rng=memory_rng, **returns)
        # Anneal beta linearly to 1 over the gradient steps this run will take (Schaul et al.).
        return Memory(
            config.memory_size,
            alpha=config.per_alpha,
            beta=config.per_beta,
            beta_increment=(1.0 - config.per_beta) / self.planned_gradient_steps(),
            rank_based=config.per_rank_based,
            storage=storage,
            rng=memory_rng,
            **returns,
        )

    def planned_gradient_steps(self) -> int:
        """Gradient steps a run of TOTAL_STEPS takes (what beta and LR_DECAY anneal over)."""
        config = self.config
        return max(1, (config.total_steps - config.learning_starts) // config.train_frequency)

    def _make_optimizer(self) -> None:
        """Adam for the online network, built now so no variable is created inside a graph."""
        learning_rate = self.config.learning_rate
        if self.config.lr_decay:
            # Late updates get small, so a policy that has been learned is no longer
            # overwritten by the noise of bootstrapped targets (the optimizer's step counter
            # drives the schedule, and it is part of every checkpoint).
            learning_rate = keras.optimizers.schedules.PolynomialDecay(
                learning_rate, self.planned_gradient_steps(), end_learning_rate=0.0)
        self.optimizer = keras.optimizers.Adam(learning_rate=learning_rate)
        self.optimizer.build(self.model.trainable_variables)

    def _compile_functions(self) -> None:
        """Trace the greedy policy, the train step and the target update as TF graphs.

        Why: `model.predict` / `model.fit` cost ~70-90 ms per call on small batches; a traced
        function costs about a millisecond. Called again after `load` swaps the model.
        """
        states = tf.TensorSpec((None, *self.state_shape), tf.as_dtype(self.state_dtype))
        vector = tf.TensorSpec((None,), tf.float32)
        actions = tf.TensorSpec((None,), tf.int32)
        # Concrete functions are traced once for these signatures; calling them skips the
        # argument matching of a tf.function (~0.3-1 ms per call here). The steps use tf.cond
        # explicitly, so autograph (which re-reads this file's source when tracing) is off.
        def trace(function: Any, *signature: tf.TensorSpec) -> Any:
            return tf.function(function, autograph=False).get_concrete_function(*signature)

        self._greedy_actions = trace(self._greedy_actions_eager, states)
        self._train_step = trace(self._train_step_eager, states, actions, vector, states, vector,
                                 vector, vector)
        self._blend_target = trace(self._blend_target_eager, tf.TensorSpec((), tf.float32))

    def run_name(self) -> str:
        """File stem built from the flags, as in the tutorial: DDQN_CartPole-v1_Dueling_PER."""
        config = self.config
        name = ("DDQN_" if config.ddqn else "DQN_") + self.env_name.replace("/", "-")
        name += "_soft" if config.soft_update else ""
        name += "_Dueling" if config.dueling else ""
        name += "_Greedy" if config.epsilon_greedy else ""
        if config.use_per:
            name += "_PERrank" if config.per_rank_based else "_PER"
        return name

    def describe(self) -> str:
        """One line naming the flags that are on, for the plot title and the log."""
        config = self.config
        parts = ["double DQN" if config.ddqn else "DQN"]
        if config.dueling:
            parts.append("dueling")
        if config.use_per:
            parts.append("rank-based PER" if config.per_rank_based else "proportional PER")
        else:
            parts.append("uniform replay")
        if config.n_step > 1:
            parts.append(f"{config.n_step}-step returns")
        parts.append(f"soft target (tau={config.tau})" if config.soft_update
                     else f"target copy every {config.target_update} steps")
        parts.append("exponential epsilon" if config.epsilon_greedy else "linear epsilon")
        return ", ".join(parts)

    # ---- acting ------------------------------------------------------------------------------
    def _greedy_actions_eager(self, states: tf.Tensor) -> tf.Tensor:
        return tf.argmax(self.model(states, training=False), axis=1, output_type=tf.int32)

    def epsilon_at(self, step: int) -> float:
        """Exploration rate after `step` env steps (linear, or the tutorial's exponential)."""
        config = self.config
        if config.epsilon_greedy:
            decay = math.exp(-config.epsilon_decay * step)
            return config.epsilon_min + (config.epsilon_start - config.epsilon_min) * decay
        fraction = min(1.0, step / config.exploration_steps)
        return config.epsilon_start + fraction * (config.epsilon_min - config.epsilon_start)

    def act(self, state: np.ndarray) -> int:
        """Epsilon-greedy action for one state, with epsilon from the current step."""
        self.epsilon = self.epsilon_at(self.step)
        if self.rng.random() < self.epsilon:
            return int(self.rng.integers(self.action_size))
        return int(self._greedy_actions(state[np.newaxis]).numpy()[0])

    # ---- learning ----------------------------------------------------------------------------
    def remember(self, state: np.ndarray, action: int, reward: float, next_state: np.ndarray,
                 done: bool) -> None:
        """Store one transition; `done` must mean terminated (not truncated by a time limit)."""
        self.MEMORY.store((state, action, reward, next_state, done))

    def _train_step_eager(self, states: tf.Tensor, actions: tf.Tensor, rewards: tf.Tensor,
                          next_states: tf.Tensor, dones: tf.Tensor, discounts: tf.Tensor,
                          is_weights: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        config = self.config
        with tf.GradientTape() as tape:
            td_errors = batch_td_errors(self.model, self.target_model, states, actions, rewards,
                                        next_states, dones, discounts, config.ddqn, training=True)
            # The IS weights undo PER's sampling bias, one weight per sample's loss.
            loss = tf.reduce_mean(is_weights * huber(td_errors))
        variables = self.model.trainable_variables
        gradients = tape.gradient(loss, variables)
        gradients, norm = tf.clip_by_global_norm(gradients, config.grad_clip)

        # A NaN or inf would poison the weights and, through the TD errors, the sum tree: skip
        # such a step, so the caller can stop with the last good state.
        def apply() -> tf.Tensor:
            self.optimizer.apply_gradients(zip(gradients, variables, strict=True))
            return tf.constant(True)

        finite = tf.math.is_finite(loss) & tf.math.is_finite(norm)
        applied = tf.cond(finite, apply, lambda: tf.constant(False))
        return tf.abs(td_errors), loss, applied

    def train_on_batch(self, batch: tuple, is_weights: np.ndarray) -> tuple[np.ndarray, float]:
        """One compiled gradient step on `batch` = (states, actions, rewards, next_states, dones,
        discounts), as `Memory.sample` returns it.

        Returns the per-sample |TD error| and the IS-weighted Huber loss, both measured before
        the step. Cost on this 2-core CPU: ~2-3 ms for CartPole's defaults, ~33 ms for Pong's.

        Raises NonFiniteError, leaving the weights as they were, if the loss or the gradient is
        NaN or infinite.
        """
        states, actions, rewards, next_states, dones, discounts = batch
        abs_errors, loss, applied = self._train_step(
            states, np.asarray(actions, np.int32), np.asarray(rewards, np.float32),
            next_states, np.asarray(dones, np.float32), np.asarray(discounts, np.float32),
            np.asarray(is_weights, np.float32),
        )
        if not applied:
            raise NonFiniteError(f"training step at env step {self.step} gave a non-finite loss "
                                 f"or gradient (loss {float(loss)}); it was not applied")
        return abs_errors.numpy(), float(loss)

    def replay(self) -> float:
        """Sample a batch, train on it, and send the new |TD errors| back as priorities."""
        tree_idx, batch, is_weights = self.MEMORY.sample(self.config.batch_size)
        abs_errors, loss = self.train_on_batch(batch, is_weights)
        self.MEMORY.batch_update(tree_idx, abs_errors)
        if self.config.soft_update:
            self.update_target_model()
        self._record_gradient_step(loss, abs_errors, is_weights)
        return loss

    def _record_gradient_step(self, loss: float, abs_errors: np.ndarray,
                              is_weights: np.ndarray) -> None:
        """Keep what the priority figure and TensorBoard show about this gradient step.

        A few microseconds: the IS weights go into a ring of RECENT_BATCHES batches, every
        PRIORITY_HISTORY_EVERY-th step adds a point to `priority_history`, and with TensorBoard
        the loss and mean |TD error| are averaged over TENSORBOARD_EVERY steps before writing.
        """
        gradient_step = self.step // self.config.train_frequency
        self.recent_is_weights[self.recent_batches % RECENT_BATCHES] = is_weights
        self.recent_batches += 1
        beta = getattr(self.MEMORY, "beta", 0.0)  # uniform replay: weights 1, as with beta = 0
        if gradient_step % PRIORITY_HISTORY_EVERY == 0:
            self.priority_history.append(
                (self.step, beta, float(is_weights.min()), float(is_weights.mean())))
        if self.tensorboard is None:
            return
        sums = self._interval_sums
        sums[0] += loss
        sums[1] += float(abs_errors.mean())
        sums[2] += 1
        if gradient_step % self.config.tensorboard_every:
            return
        now, (then, start_step) = time.perf_counter(), self._interval_start
        scalars = {
            "train/loss": sums[0] / sums[2],
            "train/mean_abs_td_error": sums[1] / sums[2],
            "train/epsilon": self.epsilon,
            "train/env_steps_per_second": (self.step - start_step) / max(now - then, 1e-9),
        }
        if self.config.use_per:
            scalars.update({"replay/beta": beta, "replay/max_is_weight": is_weights.max(),
                            "replay/min_is_weight": is_weights.min()})
        self.log_scalars(scalars)
        self._interval_sums = [0.0, 0.0, 0]
        self._interval_start = (now, self.step)

    def log_scalars(self, scalars: dict[str, float]) -> None:
        """Write `scalars` to TensorBoard at the current env step (no-op without TensorBoard)."""
        if self.tensorboard is not None:
            self.tensorboard.write(self.step, scalars)

    def _blend_target_eager(self, tau: tf.Tensor) -> None:
        for target, online in zip(self.target_model.weights, self.model.weights, strict=True):
            target.assign(tau * online + (1.0 - tau) * target)

    def update_target_model(self) -> None:
        """Hard copy online -> target, or a soft update with TAU when SOFT_UPDATE is on."""
        tau = self.config.tau if self.config.soft_update else 1.0
        self._blend_target(tf.constant(tau, tf.float32))

    # ---- saving ------------------------------------------------------------------------------
    def save(self, name: str) -> None:
        """Save the online network as a `.keras` file (architecture + weights), atomically."""
        with checkpoint.atomic_file(name) as temporary:
            self.model.save(temporary)

    def load(self, name: str) -> None:
        """Load a `.keras` file saved by `save` into the online and target networks.

        The architecture comes from the file (flags like HIDDEN_UNITS need not match); the
        optimizer starts afresh.

        Raises ValueError if the file is missing, unreadable, or made for another environment.
        """
        if not os.path.isfile(name):
            raise ValueError(f"no saved model at {name!r}; train first (python d3qn_agent.py)")
        try:
            model = keras.models.load_model(name)
        except Exception as err:  # Keras raises several types for a corrupt or foreign file
            raise ValueError(f"cannot load model {name!r}: {err}") from err
        expected = (None, *self.state_shape)
        if tuple(model.input_shape) != expected or model.output_shape[-1] != self.action_size:
            raise ValueError(f"model {name!r} maps {model.input_shape} -> {model.output_shape}, "
                             f"but {self.env_name} needs {expected} -> {self.action_size} actions")
        self.model = model
        self.target_model = keras.models.clone_model(model)
        self.target_model.set_weights(model.get_weights())
        self._make_optimizer()
        self._compile_functions()

    # ---- evaluation and plots ----------------------------------------------------------------
    def evaluate(self, episodes: int) -> np.ndarray:
        """Returns of `episodes` greedy episodes, played side by side (one batched forward pass
        per step). Each evaluation's episodes have seeds of their own, so a run repeats exactly,
        resumed or not.
        """
        while len(self._eval_envs) < episodes:
            self._eval_envs.append(make_env(self.env_name, self.config.max_episode_steps,
                                            self.atari))
        envs = self._eval_envs[:episodes]
        evaluation = len(self.evaluations)
        states = np.stack([
            env.reset(seed=episode_seed(self.config.seed, 1, evaluation, i))[0]
            for i, env in enumerate(envs)
        ])
        returns = np.zeros(episodes)
        running = np.ones(episodes, dtype=bool)
        while running.any():
            actions = self._greedy_actions(states).numpy()
            for i in np.flatnonzero(running):
                states[i], reward, terminated, truncated, info = envs[i].step(actions[i])
                returns[i] += reward
                if terminated or truncated:
                    running[i] = False
                    returns[i] = info.get("episode", {}).get("r", returns[i])  # unclipped score
        return returns

    def PlotModel(self, score: float) -> float:  # the tutorial's name
        """Record a finished episode's score; return the moving average. The PNG is redrawn at
        most every PLOT_REFRESH_SECONDS (a redraw costs ~0.1 s) and by `save_plot` at the end.
        """
        self.scores.append(score)
        window = self.scores[-AVERAGE_WINDOW:]
        self.average.append(sum(window) / len(window))
        if time.perf_counter() - self._last_plot_time > PLOT_REFRESH_SECONDS:
            self.save_plot()
        return self.average[-1]

    def save_plot(self) -> None:
        """Draw raw scores, their moving average and the greedy evaluations to `Plot_name`."""
        figure = Figure(figsize=(10, 5), layout="constrained")  # Agg canvas, no GUI, no pyplot
        axes = figure.add_subplot()
        episodes = np.arange(1, len(self.scores) + 1)
        axes.plot(episodes, self.scores, color="tab:blue", alpha=0.45, label="episode score")
        axes.plot(episodes, self.average, color="tab:red",
                  label=f"{AVERAGE_WINDOW}-episode average")
        if self.evaluations:
            _, eval_episodes, eval_means = zip(*self.evaluations, strict=True)
            axes.plot(eval_episodes, eval_means, "k.", markersize=7,
                      label=f"greedy evaluation ({self.config.eval_episodes} episodes)")
        axes.set_xlabel("Episode")
        axes.set_ylabel("Score")
        axes.set_title(f"{self.env_name}: {self.describe()}\nseed {self.config.seed}, "
                       f"{self.step:,} environment steps", fontsize=10)
        axes.grid(alpha=0.3)
        axes.legend(loc="upper left")
        with checkpoint.atomic_file(self.Plot_name) as temporary:
            figure.savefig(temporary, dpi=100)
        self._last_plot_time = time.perf_counter()

    def save_priority_plot(self) -> None:
        """Draw what prioritized replay did in this run to `Priority_plot_name` (~0.3 s).

        Priorities in the memory, the IS weights of the last batches, beta over the run, and how
        often transitions of each age were replayed, against uniform replay's expectation.
        """
        if not self.recent_batches:
            return  # no gradient step yet: nothing to show
        kind = self.MEMORY.kind
        title = (f"{self.env_name}: what {kind} replay did (alpha {self.config.per_alpha:g}), "
                 f"step {self.step:,}" if self.config.use_per else
                 f"{self.env_name}: uniform replay, step {self.step:,}")
        recent = self.recent_is_weights[:min(self.recent_batches, RECENT_BATCHES)]
        draw_priority_figure(self.Priority_plot_name, priority_figure_data(self.MEMORY),
                             self.priority_history, recent, title)

    def _evaluate_and_keep_best(self) -> None:
        """Greedy evaluation; save the model when it is the best so far; note when solved."""
        start = time.perf_counter()
        returns = self.evaluate(self.config.eval_episodes)
        self.evaluation_seconds += time.perf_counter() - start
        mean = float(returns.mean())
        self.evaluations.append((self.step, self.episode, mean))
        note = ""
        if mean >= self.best_evaluation:
            self.best_evaluation = mean
            self.save(self.Model_name)
            note = f", best so far: saved {self.Model_name}"
        if self.steps_to_solve is None and self.solved_score and mean >= self.solved_score:
            self.steps_to_solve = self.step
            note += f", solved (>= {self.solved_score:g})"
        self.log_scalars({"eval/greedy_mean_score": mean})
        print(f"evaluation at step {self.step}: mean {mean:.1f} +/- {returns.std():.1f} over "
              f"{len(returns)} greedy episodes{note}", flush=True)

    # ---- main loops --------------------------------------------------------------------------
    def start_episode(self) -> None:
        """Reset the environment with this episode's own seed and clear the episode record.

        (A seeded reset reloads an Atari ROM: ~0.25 s, about 1% of a Pong episode's time.)
        """
        self.state, _ = self.env.reset(seed=episode_seed(self.config.seed, 0, self.episode))
        self.episode_score = 0.0
        self.episode_actions = []

    def run(self) -> None:
        """Train until TOTAL_STEPS environment steps, printing one line per episode.

        Evaluates greedily every EVAL_EVERY steps and at the end, saves the best model to
        `Model_name` and the last one next to it (`..._last.keras`), and draws `Plot_name`.
        Writes a checkpoint every CHECKPOINT_EVERY steps and at the end (when CHECKPOINT_EVERY
        is set). Ctrl-C stops after the current step with a checkpoint and the plot.

        Raises NonFiniteError after saving a checkpoint of the last good state.
        """
        config = self.config
        print(f"training on {self.env_name} until step {config.total_steps:,}: "
              f"{self.describe()}", flush=True)
        if self.tensorboard_dir:
            print(f"TensorBoard logs: {self.tensorboard_dir} (tensorboard --logdir "
                  f"{os.path.dirname(self.tensorboard_dir) or '.'})", flush=True)
        self._last_plot_time = time.perf_counter()
        start_time, start_step = time.perf_counter(), self.step
        self._interval_start = (start_time, start_step)
        if self.state is None:
            self.start_episode()
        previous_handler = signal.signal(signal.SIGINT, self._request_stop)
        try:
            while self.step < config.total_steps and not self._stop_requested:
                self._step_and_learn(start_time, start_step)
        except NonFiniteError as error:
            path = self.save_checkpoint()
            raise NonFiniteError(f"{error}. Last good state saved to {path}") from error
        finally:
            signal.signal(signal.SIGINT, previous_handler)
            if self.tensorboard is not None:
                self.tensorboard.flush()
        if self._stop_requested:
            path = self.save_checkpoint()
            self.save_plot()
            self.save_priority_plot()
            print(f"interrupted at step {self.step}: checkpoint {path}, plots {self.Plot_name} "
                  f"and {self.Priority_plot_name}; continue with --resume", flush=True)
            return
        if not self.evaluations or self.evaluations[-1][0] != self.step:
            self._evaluate_and_keep_best()
        self.save(self.Model_name.removesuffix(".keras") + "_last.keras")
        self.save_plot()
        self.save_priority_plot()
        if self.tensorboard is not None:
            self.tensorboard.flush()
        if config.checkpoint_every:
            self.save_checkpoint()
        elapsed = time.perf_counter() - start_time
        steps = self.step - start_step
        solved = (f"solved at step {self.steps_to_solve}" if self.steps_to_solve is not None
                  else "not solved")
        training = elapsed - self.evaluation_seconds
        print(f"done: {steps:,} steps in {elapsed:.0f} s, {self.evaluation_seconds:.0f} s of "
              f"them in evaluations ({steps / max(training, 1e-9):.0f} training steps/s); "
              f"final evaluation {self.evaluations[-1][2]:.1f}, best "
              f"{self.best_evaluation:.1f}; {solved}; model {self.Model_name}, plots "
              f"{self.Plot_name} and {self.Priority_plot_name}", flush=True)

    def _step_and_learn(self, start_time: float, start_step: int) -> None:
        """One environment step: act, remember, learn, and the bookkeeping around them."""
        config = self.config
        action = self.act(self.state)
        next_state, reward, terminated, truncated, info = self.env.step(action)
        self.step += 1
        self.episode_actions.append(action)
        self.episode_score += reward
        if terminated and config.failure_reward is not None:
            reward = config.failure_reward
        # Only a real termination stops bootstrapping; a time-limit cut does not.
        self.remember(self.state, action, reward, next_state, terminated)
        self.state = next_state
        if (self.step >= config.learning_starts and self.step % config.train_frequency == 0
                and len(self.MEMORY) >= config.batch_size):
            self.replay()
        if not config.soft_update and self.step % config.target_update == 0:
            self.update_target_model()
        if terminated or truncated:
            self.episode += 1
            score = info.get("episode", {}).get("r", self.episode_score)  # Atari: unclipped
            average = self.PlotModel(score)
            self.log_scalars({"episode/score": score, "episode/average_score": average})
            speed = (self.step - start_step) / (time.perf_counter() - start_time)
            print(f"episode: {self.episode}, step: {self.step}/{config.total_steps}, "
                  f"score: {score:g}, e: {self.epsilon:.2f}, average: {average:.1f}, "
                  f"{speed:.0f} steps/s", flush=True)
            self.start_episode()
        if self.step % config.eval_every == 0:
            self._evaluate_and_keep_best()
        if config.checkpoint_every and self.step % config.checkpoint_every == 0:
            print(f"checkpoint: {self.save_checkpoint()}", flush=True)

    def _request_stop(self, signum: int, frame: Any) -> None:
        """SIGINT handler: finish the current step, then checkpoint and stop."""
        self._stop_requested = True

    # ---- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self) -> str:
        """Write everything needed to continue this run to a new checkpoint directory.

        Online and target weights (Keras `.weights.h5`), the optimizer's variables and the
        replay memory (`.npz`), counters, scores, the random generators and the actions of the
        episode in progress (JSON). Written atomically; the last two are kept. Returns its path.
        """
        def write(directory: Path) -> None:
            self.model.save_weights(directory / "online.weights.h5")
            self.target_model.save_weights(directory / "target.weights.h5")
            checkpoint.write_arrays(directory / "optimizer.npz", {
                str(i): variable.numpy() for i, variable in enumerate(self.optimizer.variables)
            })
            checkpoint.write_arrays(directory / "memory.npz", self.MEMORY.state_dict())
            checkpoint.write_json(directory / "progress.json", {
                "fingerprint": self.fingerprint(),
                "step": self.step,
                "episode": self.episode,
                "epsilon": self.epsilon,
                "scores": self.scores,
                "average": self.average,
                "evaluations": self.evaluations,
                "best_evaluation": self.best_evaluation,
                "steps_to_solve": self.steps_to_solve,
                "rng": self.rng.bit_generator.state,
                "episode_actions": self.episode_actions,
                "episode_score": self.episode_score,
                "state_sha256": self._state_digest(),
                "priority_history": self.priority_history,
                "recent_is_weights": self.recent_is_weights.tolist(),
                "recent_batches": self.recent_batches,
            })

        if self.state is None:
            self.start_episode()
        return str(checkpoint.write_checkpoint(self.checkpoint_root, self.step, write))

    def _state_digest(self) -> str:
        """SHA-256 of the current observation: a resumed episode must reproduce it exactly."""
        return hashlib.sha256(np.ascontiguousarray(self.state)).hexdigest()

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint must share with this agent to be loaded into it."""
        config = self.config
        return {
            "env_name": self.env_name,
            "observation_shape": list(self.state_shape),
            "actions": self.action_size,
            "dueling": config.dueling,
            "hidden_units": list(config.hidden_units) if len(self.state_shape) == 1 else None,
            "memory": self.MEMORY.kind,
            "memory_size": config.memory_size,
        }

    def load_checkpoint(self, where: str = LATEST) -> str:
        """Continue from a checkpoint: the newest of this run, or the `step-*` directory given.

        Raises ValueError naming the file and what is wrong if there is no checkpoint, it was
        made for another environment, network or memory, or a file is missing or corrupt.
        Nothing on disk is written. Returns the checkpoint's path.
        """
        directory = (checkpoint.latest_checkpoint(self.checkpoint_root) if where == LATEST
                     else Path(where))
        progress_file = directory / "progress.json"
        progress = checkpoint.read_json(progress_file)
        saved, current = progress.get("fingerprint"), self.fingerprint()
        if not isinstance(saved, dict) or saved.keys() != current.keys():
            raise ValueError(f"checkpoint file {progress_file} is corrupt: no valid fingerprint")
        differences = [f"{key}={saved[key]!r} (this run: {current[key]!r})"
                       for key in current if saved[key] != current[key]]
        if differences:
            raise ValueError(f"checkpoint {directory} was made for another setup: "
                             + ", ".join(differences))
        optimizer_arrays = checkpoint.read_arrays(directory / "optimizer.npz")
        memory_arrays = checkpoint.read_arrays(directory / "memory.npz")
        for network, file in ((self.model, "online.weights.h5"),
                              (self.target_model, "target.weights.h5")):
            try:
                network.load_weights(directory / file)
            except Exception as error:  # Keras raises several types for a bad weights file
                raise ValueError(f"checkpoint file {directory / file} is missing or does not "
                                 f"fit the network: {error}") from error
        variables = self.optimizer.variables
        if sorted(optimizer_arrays, key=int) != [str(i) for i in range(len(variables))] or any(
                optimizer_arrays[str(i)].shape != tuple(v.shape) for i, v in enumerate(variables)):
            raise ValueError(f"checkpoint file {directory / 'optimizer.npz'} does not fit the "
                             "optimizer")
        for i, variable in enumerate(variables):
            variable.assign(optimizer_arrays[str(i)])
        try:
            self.MEMORY.load_state_dict(memory_arrays)
        except ValueError as error:
            raise ValueError(f"checkpoint file {directory / 'memory.npz'}: {error}") from error
        try:
            self._restore_progress(progress)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"checkpoint file {progress_file} is corrupt: {error!r}") from error
        return str(directory)

    def _restore_progress(self, progress: dict[str, Any]) -> None:
        """Counters, scores and generators from progress.json; then replay the open episode."""
        self.step = int(progress["step"])
        self.episode = int(progress["episode"])
        self.epsilon = float(progress["epsilon"])
        self.scores = [float(score) for score in progress["scores"]]
        self.average = [float(average) for average in progress["average"]]
        self.evaluations = [(int(a), int(b), float(c)) for a, b, c in progress["evaluations"]]
        self.best_evaluation = float(progress["best_evaluation"])
        self.steps_to_solve = progress["steps_to_solve"]
        self.rng.bit_generator.state = progress["rng"]
        # Rebuild the episode in progress: same seed, same actions, same observation.
        self.start_episode()
        for action in progress["episode_actions"]:
            self.state, *_ = self.env.step(int(action))
        self.episode_actions = [int(action) for action in progress["episode_actions"]]
        self.episode_score = float(progress["episode_score"])
        # Checkpoints from before the priority figure lack its history: it starts afresh.
        self.priority_history = [(int(a), float(b), float(c), float(d))
                                 for a, b, c, d in progress.get("priority_history", [])]
        if "recent_is_weights" in progress:
            self.recent_is_weights[:] = np.asarray(progress["recent_is_weights"], np.float32)
        self.recent_batches = int(progress.get("recent_batches", 0))
        if self._state_digest() != progress["state_sha256"]:
            raise ValueError("replaying the episode in progress did not reproduce its "
                             "observation (is the environment deterministic under a seed?)")

    def test(self, model: str | None = None, record: str | None = None) -> list[float]:
        """Play TEST_EPISODES greedy episodes with the network saved in `model` (by default
        `Model_name`), printing each score; return the scores.

        With `record` (a .gif path), the first episode is also written there as an animated GIF
        of the environment's screens (see GifRecorder), as soon as it ends.

        Raises ValueError before playing if `record` cannot be written or `model` is missing or
        made for another environment.
        """
        if record is not None:
            check_gif_path(record)
        self.load(self.Model_name if model is None else model)
        env = self.env
        if record is not None:  # an env of its own: rendering needs render_mode at creation
            env = make_env(self.env_name, self.config.max_episode_steps, self.atari,
                           render_mode="rgb_array")
        scores = []
        for episode in range(1, self.config.test_episodes + 1):
            recorder = None
            if record is not None and episode == 1:
                recorder = GifRecorder(env.metadata.get("render_fps") or GIF_MAX_FPS)
            score = self._play_greedy_episode(env, episode_seed(self.config.seed, 2, episode),
                                              recorder)
            scores.append(score)
            print(f"episode: {episode}/{self.config.test_episodes}, score: {score:g}", flush=True)
            if recorder is not None:
                size, frames = recorder.save(record)
                print(f"recorded episode 1 to {record}: {frames} frames, {size / 1e6:.2f} MB",
                      flush=True)
        if env is not self.env:
            env.close()
        print(f"mean score {np.mean(scores):.1f} over {len(scores)} episodes", flush=True)
        return scores

    def _play_greedy_episode(self, env: gym.Env, seed: int,
                             recorder: GifRecorder | None = None) -> float:
        """Play one greedy episode from a reset with `seed`; return its (unclipped) score.

        Hands the screens the `recorder` wants to it (one `env.render()` each).
        """
        state, _ = env.reset(seed=seed)
        score, done, info, steps = 0.0, False, {}, 0
        if recorder is not None:
            recorder.add(steps, env.render())
        while not done:
            action = int(self._greedy_actions(state[np.newaxis]).numpy()[0])
            state, reward, terminated, truncated, info = env.step(action)
            score += reward
            steps += 1
            done = terminated or truncated
            if recorder is not None and recorder.wants(steps, last=done):
                recorder.add(steps, env.render())
        return float(info.get("episode", {}).get("r", score))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; bad input prints one `error:` line and returns 2, a training
    step that turns NaN returns 3 (after saving the last good state)."""
    argv = sys.argv[1:] if argv is None else argv
    flags = explicit_flags(argv)
    test_mode = flags.pop("test", False)
    resume = flags.pop("resume", None)
    model = flags.pop("model", None)
    record = flags.pop("record", None)
    env_name = flags.pop("env_name", ENV_NAME)
    try:
        for flag, value in (("--model", model), ("--record", record)):
            if value is not None and not test_mode:
                raise ValueError(f"{flag} {value!r} needs --test (it plays a saved network; "
                                 "training saves to --model-dir)")
        if record is not None:
            check_gif_path(record)  # before building the agent: bad paths fail at once
        agent = DQNAgent(env_name, **flags)
        if test_mode:
            agent.test(model, record)
            return 0
        if resume:
            print(f"resuming from {agent.load_checkpoint(resume)} at step {agent.step}",
                  flush=True)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        agent.run()
    except NonFiniteError as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
