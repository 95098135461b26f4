"""Where a run's settings come from (a script's flag block, presets, the command line), and
d3qn_agent.py's own: its table of flags, its presets, its modes and its run's name.

Each constant of a script's flag block is also a command-line flag (`N_STEP` is `--n-step`, its
comment the help). A value comes from the first of: the command line; the flag block where the
reader edited it (it differs from its table, `D3QN_FLAGS` or apex.py's `APEX_FLAGS`); the presets
that apply, a later one winning; the flag block as shipped.
"""

from __future__ import annotations

import argparse
import inspect
import math
import numbers
import os
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

from d3qn_utils import agent_checkpoint, bfloat16_timing, games, recording
from d3qn_utils.checks import is_integer
from d3qn_utils.replay_memory import replay_variant
from d3qn_utils.run_files import LATEST

Preset = tuple[str, dict[str, Any]]  # (what it is for, {flag: value})


@dataclass(frozen=True)
class Flag:
    """A flag of a script's flag block: its value as shipped and what a value must satisfy:
    `rule` (description, test); `kind`, the command-line type when `shipped` is None or a tuple;
    `cli`, the command-line name if not the constant's; `alone`: given without a value, True;
    `at_most`: the flag whose value this one must not exceed; `multiple_of`: the flag whose
    value divides this one's."""

    shipped: Any
    rule: tuple[str, Callable[[Any], bool]] | None = None
    kind: type | None = None
    cli: str | None = None
    alone: bool = False
    at_most: str | None = None
    multiple_of: str | None = None


POSITIVE = ("positive", lambda value: value > 0)
NON_NEGATIVE = (">= 0", lambda value: value >= 0)
UNIT = ("in [0, 1]", lambda value: 0.0 <= value <= 1.0)
AT_LEAST_ONE = (">= 1", lambda value: value >= 1)
POSITIVE_SIZES = ("positive sizes", lambda sizes: len(sizes) > 0 and min(sizes) > 0)
POSITIVE_OR_NONE = ("positive (or None)", lambda value: value is None or value > 0)
SEED_RANGE = ("in [0, 2**32 - 1]", lambda value: 0 <= value <= 2**32 - 1)  # NumPy's, Keras'
DIRECTORY_OR_NONE = ("a directory name, not empty", lambda value: value != "")  # or None, True
# An evaluation plays its episodes side by side, each in an environment of its own (an Atari one
# holds its emulator and frames): a count beyond this one would not fit in memory for long.
MAX_EVAL_EPISODES = 1_000
EVAL_EPISODES_RANGE = (f"in [1, {MAX_EVAL_EPISODES:,}] (one environment each, side by side)",
                       lambda value: 1 <= value <= MAX_EVAL_EPISODES)
# N_ENVS environments are open at once, each with its emulator or frames: more would not fit.
MAX_N_ENVS = 1_000
N_ENVS_RANGE = (f"in [1, {MAX_N_ENVS:,}] (one environment each, side by side)",
                lambda value: 1 <= value <= MAX_N_ENVS)
# The largest value of an integer flag (all are counts or sizes): the schedules and plots compute
# in float64, exact for integers up to 2**53; no run takes that many steps.
LARGEST_INTEGER = 2**53
FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32
FLOAT32_TINY = 2**-150  # this or less rounds to 0 in float32 (half its smallest value above 0)

# d3qn_agent.py's flag block as shipped.
D3QN_FLAGS: dict[str, Flag] = {
    "env_name": Flag("CartPole-v1"),
    "tutorial": Flag(False),
    # N_ENVS environments step at once: a budget they divide ends where it says
    "total_steps": Flag(50_000, POSITIVE, multiple_of="n_envs"),
    "use_per": Flag(True, cli="per"),
    "per_rank_based": Flag(False, cli="rank-based"),
    "per_alpha": Flag(0.6, UNIT),
    "per_beta": Flag(0.4, UNIT),
    "ddqn": Flag(True),
    "dueling": Flag(True),
    "soft_update": Flag(False),
    "tau": Flag(0.005, ("in (0, 1]", lambda value: 0.0 < value <= 1.0)),
    "target_update": Flag(500, POSITIVE),
    "epsilon_greedy": Flag(False),
    "epsilon_start": Flag(1.0, UNIT),
    "epsilon_min": Flag(0.01, UNIT, at_most="epsilon_start"),  # exploration must not rise
    "exploration_steps": Flag(10_000, POSITIVE),
    "epsilon_decay": Flag(0.0005, NON_NEGATIVE),
    "memory_size": Flag(50_000, POSITIVE),
    "batch_size": Flag(128, POSITIVE, at_most="memory_size"),
    "gamma": Flag(0.99, UNIT),
    "n_step": Flag(3, POSITIVE, at_most="memory_size"),  # a longer return never completes
    "optimizer": Flag("adam", ("adam or rmsprop", lambda value: value in ("adam", "rmsprop"))),
    "loss": Flag("huber", ("huber or mse", lambda value: value in ("huber", "mse"))),
    "learning_rate": Flag(1e-3, POSITIVE),
    "adam_epsilon": Flag(1e-7, POSITIVE),
    "lr_decay": Flag(True),
    "grad_clip": Flag(10.0, POSITIVE),
    "learning_starts": Flag(1_000, NON_NEGATIVE),
    "train_frequency": Flag(2, POSITIVE),
    "gradient_steps_per_call": Flag(16, POSITIVE),
    "n_envs": Flag(1, N_ENVS_RANGE),
    "xla": Flag(True),
    "bfloat16": Flag(False),
    "hidden_units": Flag((256, 256), POSITIVE_SIZES, kind=int),
    "max_episode_steps": Flag(None, POSITIVE_OR_NONE, kind=int),
    "failure_reward": Flag(None, kind=float),
    "eval_every": Flag(1_000, POSITIVE),
    "eval_episodes": Flag(20, EVAL_EPISODES_RANGE),
    "test_episodes": Flag(10, POSITIVE),
    "seed": Flag(0, SEED_RANGE),
    "checkpoint_every": Flag(0, NON_NEGATIVE),
    "model_dir": Flag("models"),
    "plot_dir": Flag("plots"),
    "tensorboard": Flag(None, DIRECTORY_OR_NONE, kind=str, alone=True),
    "tensorboard_every": Flag(100, POSITIVE),
}


@dataclass(frozen=True)
class Measured:
    """A preset's value that a measurement on this machine finds, taken only for a flag no one
    chose: `measure(values)` -> (the value, its figures for the note), called once the run's
    other values are checked; `what`: the measurement, for the note of a run that chose."""

    measure: Callable[[dict[str, Any]], tuple[Any, str]]
    what: str


# The games' own presets live with their families' records (d3qn_utils/games.py). On a CPU with
# bfloat16 instructions a game of the family's `bfloat16_games` also gets this one: bfloat16
# where its gradient step is faster than float32's on this machine, its median below float32's
# fastest round (timed once per CPU model and core count, TensorFlow version, game, torso, batch
# size and XLA setting, then cached: d3qn_utils/bfloat16_timing.py), so every run on one machine
# does the same sums.
NATIVE_BFLOAT16_PRESET: dict[str, Any] = {"bfloat16": Measured(
    bfloat16_timing.preset_choice, "would time bfloat16 against float32 on this CPU")}
# The flags a preset may measure: --test and --resume measure none of them (`for_mode`).
MEASURED_FLAGS = tuple(name for name, value in NATIVE_BFLOAT16_PRESET.items()
                       if isinstance(value, Measured))
# TUTORIAL: the pylessons tutorial's own values where this code has a flag for them
# (docs/changes_from_the_tutorial.md#running-the-tutorials-own-settings).
TUTORIAL_PRESET: dict[str, Any] = {
    "max_episode_steps": 4_000, "failure_reward": -100.0, "memory_size": 10_000, "gamma": 0.95,
    "epsilon_greedy": True, "batch_size": 32, "tau": 0.1, "hidden_units": (512, 256, 64),
    "n_step": 1, "optimizer": "rmsprop", "loss": "mse", "learning_rate": 0.00025,
    "lr_decay": False, "grad_clip": 1e9, "train_frequency": 1,
}
# Schaul et al. (2016) tuned alpha and beta separately for the rank-based variant.
RANK_BASED_PRESET: dict[str, Any] = {"per_alpha": 0.7, "per_beta": 0.5}
# The replay variants' own presets, by name (a memory's `kind`, as `replay_variant` gives it).
VARIANT_PRESETS: dict[str, dict[str, Any]] = {"rank-based": RANK_BASED_PRESET}


def d3qn_presets(values: dict[str, Any]) -> list[Preset]:
    """The presets d3qn_agent.py applies for these flag values, in the order they apply: the
    game's family's, the game's own, bfloat16 for some games on some CPUs (where it times
    faster), then the modes'."""
    env_name = values["env_name"]
    family = games.family(env_name)
    game = family.game_presets.get(env_name)
    units = env_name in family.bfloat16_games and native_bfloat16()  # read only for those
    variant = replay_variant(values["use_per"], values["per_rank_based"])
    return [(source, preset) for source, preset, applies in (
        (family.name, family.preset, bool(family.preset)),
        (env_name, game, game is not None),
        (env_name, NATIVE_BFLOAT16_PRESET, bool(units)),
        # Only where the flags pick that memory: --no-per --rank-based is uniform replay.
        (variant, VARIANT_PRESETS.get(variant), variant in VARIANT_PRESETS),
        ("tutorial", TUTORIAL_PRESET, values["tutorial"])) if applies]


def for_mode(flags: dict[str, Any], test: bool, resume: str | None,
             memories: dict[str, Any]) -> dict[str, Any]:
    """`flags` for d3qn_agent.py's mode: for --test or --resume, each of MEASURED_FLAGS that
    `flags` do not give gets a `Measured` that `resolve` takes instead of the preset's timing
    (a timing on this machine may choose otherwise than the one the network or checkpoint was
    made with): --test keeps the flag block's value (the played network keeps the precision it
    was saved with), --resume takes the value the checkpoint `resume` records (`memories`:
    d3qn_agent.py's REPLAY_MEMORIES, which name the run's checkpoints)."""
    if not (test or resume):
        return flags

    def played(name: str) -> Measured:
        return Measured(lambda values: (values[name], "not timed: --test plays a saved network "
                                        "in the precision it was saved with"),
                        "keeps the played network's")

    def recorded(name: str) -> Measured:
        def from_checkpoint(values: dict[str, Any]) -> tuple[Any, str]:
            found = agent_checkpoint.recorded_flag(checkpoint_root(values, memories), resume,
                                                   values, name)
            if found is None or not flag_type(D3QN_FLAGS[name])[1](found[0]):
                # The resume refuses or names it: no checkpoint, or a corrupt value
                return values[name], "not timed: no checkpoint to resume records it"
            value, directory = found
            return value, f"not timed: as checkpoint {directory} records it"
        return Measured(from_checkpoint, "would take the checkpoint's")

    return {**{name: (played if test else recorded)(name) for name in MEASURED_FLAGS}, **flags}


def checkpoint_root(values: dict[str, Any], memories: dict[str, Any]) -> str:
    """Where a run of these flag values keeps its checkpoints: `<model_dir>/<run_name>.checkpoints`,
    `memories` naming its replay memory's RUN_SUFFIX. Built here only, for the agent
    (`DQNAgent.checkpoint_root`) and for --resume reading a recorded flag, so both read one
    folder."""
    memory = memories[replay_variant(values["use_per"], values["per_rank_based"])]
    name = run_name(argparse.Namespace(**values), memory.RUN_SUFFIX)
    return os.path.join(values["model_dir"], name + ".checkpoints")


def native_bfloat16(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's bfloat16 instructions for TensorFlow's oneDNN ("AMX_BF16", "AVX512_BF16"), or
    None (none, no /proc/cpuinfo, JAX: the Pong study measured TensorFlow only, or a GPU that
    TensorFlow sees: it would run the timing there, not on the CPU): without them bfloat16 is
    not timed."""
    import keras

    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return None
    try:
        match = re.search(r"^flags\s*:(.*)$", cpuinfo.read_text(), re.MULTILINE)
    except OSError:
        return None
    flags = set(match[1].split()) if match else set()
    return next((name.upper() for name in ("amx_bf16", "avx512_bf16") if name in flags), None)


def resolve(script: ModuleType, table: dict[str, Flag],
            presets: Callable[[dict[str, Any]], list[Preset]], given: dict[str, Any]
            ) -> tuple[argparse.Namespace, list[str]]:
    """A run's settings and one note per value a preset decided or lost; `given`: the command
    line's flags (or `DQNAgent`'s keywords). A `Measured` value is measured only for a flag no
    one chose, after the checks; one in `given` takes the preset's place (`for_mode`). ValueError
    naming an unknown flag or a bad value."""
    unknown = sorted(set(given) - set(table))
    if unknown:
        raise ValueError(f"unknown flag(s) {unknown}; known: {sorted(table)}")
    given = {name: as_tuple(value) for name, value in given.items()}
    # A `Measured` given for a flag chooses nothing: it finds the value a preset would measure
    # another way (`for_mode`), and only where a preset would.
    instead = {name: value for name, value in given.items() if isinstance(value, Measured)}
    given = {name: value for name, value in given.items() if name not in instead}
    at_top = {name: as_tuple(getattr(script, name.upper())) for name in table}
    edited = {name: value for name, value in at_top.items() if value != table[name].shipped}
    chosen = {**edited, **given}
    values = {**at_top, **given}
    notes = {}
    measured: dict[str, tuple[str, Measured]] = {}  # measured once the values are checked
    for source, preset in presets(values):
        for name, value in preset.items():
            if name not in chosen and isinstance(value, Measured):
                measured[name] = (source, instead.get(name, value))
                notes[name] = ""  # its place among the notes, filled in once measured
            elif name not in chosen:
                measured.pop(name, None)  # a later preset's value wins over a measurement
                values[name] = value
                notes[name] = f"{name} {value} ({source} preset)"
            elif isinstance(value, Measured) or chosen[name] != value:
                where = (option(name, table[name], chosen[name]) if name in given
                         else f"{name.upper()} at the top of {Path(script.__file__).name}")
                has = value.what if isinstance(value, Measured) else f"has {value}"
                notes[name] = f"{name} {chosen[name]} ({where}; the {source} preset {has})"
    check(values, table)
    for name, (source, measurement) in measured.items():
        values[name], figures = measurement.measure(values)
        notes[name] = f"{name} {values[name]} ({source} preset: {figures})"
    return argparse.Namespace(**values), list(notes.values())


def check(values: dict[str, Any], table: dict[str, Flag]) -> None:
    """ValueError naming the first flag whose value has the wrong type (a float flag's: a finite
    number), exceeds LARGEST_INTEGER, is out of its range, exceeds its `at_most` flag's or is
    not a multiple of its `multiple_of` flag's."""
    for name, flag in table.items():
        for description, valid in (flag_type(flag), integer_size(flag),
                                   *([flag.rule] if flag.rule else [])):
            if not valid(values[name]):
                raise ValueError(f"{name.upper()} ({option(name, flag)}) must be "
                                 f"{description}, got {values[name]!r}")
    for name, flag in table.items():  # once every value has its type
        if flag.at_most and values[name] > values[flag.at_most]:
            raise ValueError(f"{name.upper()} ({values[name]}) must not exceed "
                             f"{flag.at_most.upper()} ({values[flag.at_most]})")
        if flag.multiple_of and values[name] % values[flag.multiple_of]:
            factor = values[flag.multiple_of]
            below = values[name] - values[name] % factor
            nearest = [str(value) for value in (below, below + factor)
                       if 0 < value <= LARGEST_INTEGER]
            raise ValueError(f"{name.upper()} ({values[name]}) must be a multiple of "
                             f"{flag.multiple_of.upper()} ({factor}), such as "
                             f"{' or '.join(nearest)} ({option(name, flag)})")


def no_training_warning(first_step: int, total_steps: int, learning_starts: int,
                        n_envs: int = 1) -> str | None:
    """A warning line if TOTAL_STEPS ends before env step `first_step`, the first gradient step
    (a step count, so a multiple of `n_envs`: the line names N_ENVS when it is over 1), or None
    (not refused: some runs only collect on purpose, benchmarks/bench_checkpoint.py)."""
    if first_step <= total_steps:
        return None
    environments = f", N_ENVS being {n_envs:,}" if n_envs > 1 else ""
    return (f"warning: TOTAL_STEPS ({total_steps:,}) ends before the first gradient step "
            f"(env step {first_step:,}, LEARNING_STARTS being {learning_starts:,}{environments}): "
            "this run will not train, and the network it saves as best is the untrained one")


def flag_type(flag: Flag) -> tuple[str, Callable[[Any], bool]]:
    """(what a value of `flag` must be, its test): the type the command line would parse, so an
    edit at the top of a script ("300", 1e3 for an int) fails as clearly."""
    if isinstance(flag.shipped, tuple):
        return "a tuple of integers", lambda value: isinstance(value, tuple) and all(
            map(is_integer, value))
    kind = flag.kind if flag.shipped is None else type(flag.shipped)
    description, test = {
        bool: ("True or False", lambda value: isinstance(value, bool)),
        int: ("an integer", is_integer),
        # NaN and inf: no flag means them, and they would surface late, as NaN weights or rewards;
        # nor a value beyond float32's range (1e308), which the networks' float32 turns into inf,
        # nor one so small that float32 rounds it to 0 (a learning rate of 1e-50 would not learn)
        float: ("a finite number within float32's range, not one it rounds to 0", lambda value:
                isinstance(value, numbers.Real) and not isinstance(value, bool)
                and math.isfinite(value) and (value == 0 or FLOAT32_TINY < abs(value)
                                              <= FLOAT32_MAX)),
        str: ("a string", lambda value: isinstance(value, str)),
    }[kind]
    if flag.shipped is not None:
        return description, test
    return (description + (" or None or True" if flag.alone else " or None"),
            lambda value: value is None or (flag.alone and value is True) or test(value))


def integer_size(flag: Flag) -> tuple[str, Callable[[Any], bool]]:
    """(the rule, its test) that an integer flag's values (a tuple's each) do not exceed
    LARGEST_INTEGER; any value passes for a flag of another type. Run after `flag_type`'s."""
    if (flag.kind if flag.shipped is None or isinstance(flag.shipped, tuple)
            else type(flag.shipped)) is not int:
        return "", lambda value: True
    return (f"at most 2**53 ({LARGEST_INTEGER:,})", lambda value: value is None or all(
        number <= LARGEST_INTEGER for number in (value if isinstance(value, tuple) else [value])))


def as_tuple(value: Any) -> Any:
    """A list as a tuple (HIDDEN_UNITS = [64, 64] means (64, 64)); anything else as it is."""
    return tuple(value) if isinstance(value, list) else value


def option(name: str, flag: Flag, value: Any = None) -> str:
    """The command-line flag for `name` (n_step: --n-step), the --no- form for the value False."""
    return f"--{'no-' if value is False else ''}{flag.cli or name.replace('_', '-')}"


def flag_comments(script: ModuleType) -> dict[str, str]:
    """{flag: its comment} from the lines `NAME = value  # comment` of `script`'s source."""
    line = re.compile(r"^([A-Z][A-Z0-9_]*) = .*?  # (.*)$", re.MULTILINE)
    return {name.lower(): comment for name, comment in line.findall(inspect.getsource(script))}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Show defaults; keep the epilog's lines (argparse would split flags at their hyphens)."""


class FlagParser(argparse.ArgumentParser):
    """A parser whose errors are one `error:` line (--help shows the usage), a flag's own worded
    as the flag block's checks are: "TARGET_UPDATE (--target-update) must be an integer, got
    '1e22'"."""

    def error(self, message: str) -> NoReturn:
        own = re.fullmatch(r"argument [^:]+: ([A-Z][A-Z0-9_]* \(--.*)", message, re.DOTALL)
        self.exit(2, f"error: {own[1] if own else message}\n")


def command_line_type(name: str, flag: Flag, kind: type) -> Callable[[str], Any]:
    """The function argparse converts a command-line word of `flag` with: `kind` of it, or an
    error in the flag block's words ("1e3" is not an integer, as the edit 1e3 is not)."""
    def convert(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            description = flag_type(Flag(None, kind=kind))[0].removesuffix(" or None")
            raise argparse.ArgumentTypeError(f"{name.upper()} ({option(name, flag)}) must be "
                                             f"{description}, got {text!r}") from None
    return convert


def build_parser(script: ModuleType, table: dict[str, Flag], description: str,
                 presets: list[Preset]) -> argparse.ArgumentParser:
    """A parser with one flag per entry of `table` (default: the script's constant, help: its
    comment); the epilog lists the `presets`."""
    wrap = textwrap.TextWrapper(width=88, subsequent_indent="  ", break_on_hyphens=False)
    epilog = ("Presets: flags not edited at the top of the script nor given here take these "
              "values\n" + "\n".join(wrap.fill(f"{source}: {format_preset(preset, table)}")
                                     for source, preset in presets))
    parser = FlagParser(prog=Path(script.__file__).name, description=description, epilog=epilog,
                        formatter_class=HelpFormatter)
    comments = flag_comments(script)
    for name, flag in table.items():
        options: dict[str, Any] = {"dest": name, "default": getattr(script, name.upper()),
                                   "help": comments.get(name, "")}
        if isinstance(flag.shipped, bool):
            options["action"] = argparse.BooleanOptionalAction
        elif isinstance(flag.shipped, tuple):
            options.update(type=command_line_type(name, flag, flag.kind), nargs="+")
        elif flag.alone:
            options.update(type=flag.kind, nargs="?", const=True, metavar="DIR")
        else:
            options["type"] = command_line_type(name, flag, flag.kind or type(flag.shipped))
        parser.add_argument(option(name, flag), **options)
    return parser


def format_preset(preset: dict[str, Any], table: dict[str, Flag]) -> str:
    """`{"n_step": 3, "lr_decay": False}` as the command-line flags "--n-step 3, --no-lr-decay"."""
    flags = (option(name, table[name], value) + ("" if isinstance(value, bool) else f" {value}")
             for name, value in preset.items())
    return ", ".join(flags)


def game_presets() -> list[Preset]:
    """Each game family's presets for --help: the family's, its games', bfloat16's."""
    presets = []
    for family in games.FAMILIES:
        presets += [(family.ids, family.preset)] if family.preset else []
        presets += family.game_presets.items()
        if family.bfloat16_games:
            presets.append((f"{' and '.join(family.bfloat16_games)} on a CPU with AVX512_BF16 "
                            "or AMX, where a timing finds their gradient step at least "
                            f"{bfloat16_timing.MARGIN:.0%} faster in bfloat16 and its median "
                            "below float32's fastest round (timed once per CPU, TensorFlow "
                            "version and batch, then cached)",
                            {"bfloat16": True}))
    return presets


def d3qn_parser(script: ModuleType) -> argparse.ArgumentParser:
    """d3qn_agent.py's parser: its modes (--test, --model, --record, --resume), its flags."""
    presets = [*game_presets(), ("--rank-based", RANK_BASED_PRESET)]
    parser = build_parser(script, D3QN_FLAGS, "Train (default) or test a D3QN agent with "
                          "prioritized experience replay.", presets)
    modes = parser.add_argument_group("modes")
    modes.add_argument("--test", action="store_true",
                       help="play the saved model greedily instead of training")
    modes.add_argument("--model", metavar="PATH", help="with --test: play this .keras file "
                       "instead of MODEL_DIR/<run name>.keras")
    modes.add_argument("--record", metavar="FILE.gif",
                       help="with --test: also write the first episode as an animated GIF")
    modes.add_argument("--resume", nargs="?", const=LATEST, metavar="CHECKPOINT",
                       help="continue training from the newest checkpoint of this run (or from "
                       "CHECKPOINT, a step-* directory)")
    return parser


def pop_modes(flags: dict[str, Any]) -> tuple[bool, str | None, str | None, str | None]:
    """Take d3qn_agent.py's modes out of `flags`: (test, resume, model, record); ValueError for
    --model or --record without --test, --resume with it, an empty --resume, or a --record path
    that cannot be written."""
    test, resume, model, record = (flags.pop(mode, None)
                                   for mode in ("test", "resume", "model", "record"))
    if resume == "":
        raise ValueError("--resume '' names no checkpoint: give a step-* directory, or --resume "
                         "alone for the newest")
    for flag, value in (("--model", model), ("--record", record)):
        if value is not None and not test:
            raise ValueError(f"{flag} {value!r} needs --test (it plays a saved network; "
                             "training saves to --model-dir)")
    if test and resume is not None:
        given = "--resume" if resume == LATEST else f"--resume {resume}"
        raise ValueError(f"--test and {given} exclude each other: --test plays a saved network "
                         "(--model picks which), --resume continues a training; give one of them")
    if record is not None:
        recording.check_gif_path(record)
    return bool(test), resume, model, record


def explicit_flags(argv: list[str], parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The flags `argv` actually gives (so presets can apply); `--help` and errors exit here."""
    names = vars(parser.parse_args(argv))  # reports errors and --help with the real defaults
    # argparse fills in defaults only for names the namespace lacks: the marker stays if not given
    not_given = object()
    given = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(names, not_given)))
    return {name: value for name, value in vars(given).items() if value is not not_given}


def run_name(config: argparse.Namespace, replay_suffix: str) -> str:
    """The name of a run's files, built as the tutorial named its plot: DDQN_CartPole-v1_Dueling_PER
    and so on (its model file was <env>_e_greedy.h5); `replay_suffix` is the replay memory's part
    ("_PER", its `RUN_SUFFIX`)."""
    name = ("DDQN_" if config.ddqn else "DQN_") + config.env_name.replace("/", "-")
    name += "_soft" if config.soft_update else ""
    name += "_Dueling" if config.dueling else ""
    name += "_Greedy" if config.epsilon_greedy else ""
    return name + replay_suffix
