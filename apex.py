"""Ape-X: distributed prioritized experience replay (Horgan et al. 2018, arXiv:1803.00933) on Ray.

`python apex.py` starts a local Ray on this machine and trains CartPole-v1 with 2 actors;
`python apex.py --address auto` (or RAY_ADDRESS) joins a running Ray cluster instead. Every
hyperparameter below can be edited here or set on the command line (`python apex.py --help`), to
the same effect: either wins over the game family's preset (Atari's, MinAtar's: d3qn_utils/games.py,
as `apex_preset` converts it). The best evaluated network goes to `models/apex_<env>.keras`
(playable with `d3qn_agent.py --test --model ...`), the learning curve to `plots/apex_<env>.png`.
It runs on Keras' TensorFlow backend only (the actors trace with tf.function).

Three parts, built from this repository's own pieces, each in a module of ape_x/:
  actors   (ape_x/actor.py) NUM_ACTORS Ray actors, each with its own environment and a fixed
           exploration rate eps_i = EPSILON ** (1 + EPSILON_ALPHA * i / (N - 1)). Each keeps a
           local copy of the online and target networks, assembles the N_STEP-step returns of its
           transitions in a small local `PER.UniformMemory`, computes their |TD errors| with the
           learner's own `d3qn_agent.td_errors`, and sends them in blocks of BLOCK_SIZE, with
           those priorities, to the replay. Every WEIGHT_SYNC_EVERY env steps it pulls fresh
           weights.
  replay   (ape_x/replay.py) one Ray actor holding a `BlockMemory`, a `PER.Memory` (with
           `FrameStackStorage` for image games): `store_block` inserts a block with its
           priorities, `sample` serves prioritized batches with IS weights, `batch_update` takes
           the learner's new priorities, and the oldest transitions are overwritten first.
  learner  (ape_x/learner.py) this process: d3qn_agent.py's network (`OurModel`), optimizer and
           compiled double-DQN IS-weighted gradient step, without a `DQNAgent`. It requests the
           next batch before training on the current one, so sampling overlaps the gradient
           step, and publishes its weights through Ray's object store every PUBLISH_EVERY updates.
The local Ray or the cluster and the probe of its address: ape_x/connection.py; the progress
lines, TensorBoard and the plot: ape_x/report.py.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from d3qn_utils import quiet_startup  # isort: skip -- first: before TensorFlow
import keras
import ray

from ape_x.connection import check_reachable, connect_ray
from ape_x.learner import Learner
from d3qn_utils import games, run_files, settings, training_session
from d3qn_utils.settings import (
    AT_LEAST_ONE,
    DIRECTORY_OR_NONE,
    EVAL_EPISODES_RANGE,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_OR_NONE,
    POSITIVE_SIZES,
    SEED_RANGE,
    UNIT,
    Flag,
    Preset,
)

# ---------------------------------------------------------------------------------------------
# Hyperparameters. Each one is also a command-line flag: NUM_ACTORS -> --num-actors, and so on.
# ---------------------------------------------------------------------------------------------
ENV_NAME = "CartPole-v1"  # gymnasium id; Atari, MinAtar: their families' wrappers and presets
NUM_ACTORS = 2  # Ray actors collecting experience, one environment each (the paper: 360)
TOTAL_STEPS = 50_000  # budget: environment steps collected by all actors together
EPSILON = 0.4  # base exploration rate of the actors' schedule (the paper's 0.4)
EPSILON_ALPHA = 7.0  # spread of the schedule: eps_i = EPSILON ** (1 + alpha * i / (N - 1))
BLOCK_SIZE = 50  # transitions per block an actor sends to the replay, with their priorities
WEIGHT_SYNC_EVERY = 100  # env steps between an actor's pulls of the newest published weights
PUBLISH_EVERY = 10  # learner updates between weight publications to the object store
UPDATES_PER_STEP = 0.5  # learner updates per env step collected, held by pacing both sides;
# 0: no pacing, actors and learner run flat out (the paper's setting, with a GPU learner)
MEMORY_SIZE = 50_000  # replay capacity in transitions (the oldest go first)
BATCH_SIZE = 128  # transitions per learner update
LEARNING_STARTS = 1_000  # transitions in the replay before the first update
TARGET_UPDATE = 50  # learner updates between copies online -> target network
N_STEP = 3  # rewards summed per TD target (the paper: 3)
GAMMA = 0.99  # discount factor
LEARNING_RATE = 1e-3  # Adam step size
ADAM_EPSILON = 1e-7  # Adam's epsilon (Keras' default; MinAtar's preset: Dopamine's 3.125e-4)
GRAD_CLIP = 10.0  # clip the gradient's global norm to this value
PER_ALPHA = 0.6  # how strongly priorities shape sampling (the paper: 0.6)
PER_BETA = 0.4  # importance-sampling exponent, fixed (the paper: 0.4)
HIDDEN_UNITS = (256, 256)  # MLP torso for vector observations
DUELING = True  # dueling head Q = V + (A - mean A)
DDQN = True  # double DQN target
MAX_EPISODE_STEPS = None  # None keeps the env's own time limit (500 for CartPole-v1)
EVAL_EVERY = 2_000  # env steps collected between the learner's greedy evaluations
EVAL_EPISODES = 20  # greedy episodes per evaluation (the best evaluated network is saved)
STOP_WHEN_SOLVED = False  # end the run at the first evaluation >= the env's reward threshold
LOG_EVERY = 10.0  # seconds between progress lines
SEED = 0  # seeds the learner, each actor's environment and exploration, and the replay
MODEL_DIR = "models"  # where the .keras files go
PLOT_DIR = "plots"  # where the learning curve goes
TENSORBOARD = None  # TensorBoard event-file directory; None: off (--tensorboard alone: runs/<name>)
ADDRESS = None  # Ray cluster to join: "auto", "host:port" or "ray://host:port"; None: local Ray
CONNECT_TIMEOUT = 10.0  # seconds to reach --address before giving up
ACTOR_RESTARTS = 10  # times Ray restarts a dead actor (and its run) before the run fails
ACTOR_CPUS = 1.0  # Ray CPUs reserved per actor (the local Ray gets enough logical CPUs for all)
OBJECT_STORE_MB = 500  # size of the local Ray's shared-memory object store

# The flag block above as shipped, with what each value must satisfy (settings.py).
APEX_FLAGS: dict[str, Flag] = {
    "env_name": Flag("CartPole-v1"),
    "num_actors": Flag(2, AT_LEAST_ONE),
    "total_steps": Flag(50_000, AT_LEAST_ONE),
    "epsilon": Flag(0.4, UNIT),
    "epsilon_alpha": Flag(7.0, NON_NEGATIVE),
    "block_size": Flag(50, AT_LEAST_ONE),
    "weight_sync_every": Flag(100, AT_LEAST_ONE),
    "publish_every": Flag(10, AT_LEAST_ONE),
    "updates_per_step": Flag(0.5, NON_NEGATIVE),
    "memory_size": Flag(50_000, AT_LEAST_ONE),
    "batch_size": Flag(128, AT_LEAST_ONE, at_most="memory_size"),
    "learning_starts": Flag(1_000, NON_NEGATIVE),
    "target_update": Flag(50, AT_LEAST_ONE),
    "n_step": Flag(3, AT_LEAST_ONE),
    "gamma": Flag(0.99, UNIT),
    "learning_rate": Flag(1e-3, POSITIVE),
    "adam_epsilon": Flag(1e-7, POSITIVE),
    "grad_clip": Flag(10.0, POSITIVE),
    "per_alpha": Flag(0.6, UNIT),
    "per_beta": Flag(0.4, UNIT),
    "hidden_units": Flag((256, 256), POSITIVE_SIZES, kind=int),
    "dueling": Flag(True),
    "ddqn": Flag(True),
    "max_episode_steps": Flag(None, POSITIVE_OR_NONE, kind=int),
    "eval_every": Flag(2_000, AT_LEAST_ONE),
    "eval_episodes": Flag(20, EVAL_EPISODES_RANGE),
    "stop_when_solved": Flag(False),
    "log_every": Flag(10.0, POSITIVE),
    "seed": Flag(0, SEED_RANGE),
    "model_dir": Flag("models"),
    "plot_dir": Flag("plots"),
    "tensorboard": Flag(None, DIRECTORY_OR_NONE, kind=str, alone=True),
    "address": Flag(None, kind=str),
    "connect_timeout": Flag(10.0, POSITIVE),
    "actor_restarts": Flag(10, NON_NEGATIVE),
    "actor_cpus": Flag(1.0, POSITIVE),
    "object_store_mb": Flag(500, POSITIVE),
}


def apex_preset(family: games.GameFamily) -> dict[str, Any]:
    """apex.py's values for a game `family`'s d3qn_agent.py preset: the shared flags it sets, its
    target period and train frequency as learner updates at the same data rate. ValueError
    naming the family if its preset lacks either of those two."""
    preset = family.preset
    if missing := [name for name in ("target_update", "train_frequency") if name not in preset]:
        raise ValueError(f"the {family.name} preset (d3qn_utils/games.py) lacks "
                         f"{' and '.join(missing)}, which apex.py converts to learner updates")
    shared = ("total_steps", "memory_size", "batch_size", "learning_rate", "adam_epsilon",
              "learning_starts", "n_step", "eval_every", "eval_episodes")
    return {**{name: preset[name] for name in shared if name in preset},
            "target_update": preset["target_update"] // preset["train_frequency"],
            "updates_per_step": 1.0 / preset["train_frequency"]}


def apex_presets(values: dict[str, Any]) -> list[Preset]:
    """The presets apex.py applies: the game's family's (d3qn_utils/games.py: Atari, MinAtar) as
    apex.py's flags; a game's own preset is d3qn_agent.py's alone."""
    family = games.family(values["env_name"])
    return [(family.name, apex_preset(family))] if family.preset else []


def resolve_config(flags: dict[str, Any]) -> tuple[argparse.Namespace, list[str]]:
    """The flags above (as edited), the game family's preset for the flags left as shipped and
    the explicit `flags`, checked (settings.py), and the notes on what the preset set. Raises
    ValueError naming the first flag whose value cannot work."""
    config, notes = settings.resolve(sys.modules[__name__], APEX_FLAGS, apex_presets, flags)
    if config.block_size + config.n_step - 1 > config.memory_size:
        raise ValueError(f"MEMORY_SIZE ({config.memory_size}) must hold a block and its "
                         f"n-step context ({config.block_size + config.n_step - 1})")
    return config, notes


def interrupt(signum: int, frame: Any) -> None:
    """Signal handler: raise KeyboardInterrupt naming the signal, as Ctrl-C does."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run_until_stopped(learner: Learner) -> int:
    """Run `learner` to its end (0). Ctrl-C or SIGTERM stops every actor and saves the network
    and the plot (0); an actor failing for good saves them too (1). A second stop signal while
    they are saved is noted and ignored. The previous signal handlers come back afterwards."""
    with training_session.stop_requests():  # the handler while `learner` saves (after `interrupt`)
        try:
            with training_session.stop_requests(interrupt):
                learner.run()
            return 0
        except KeyboardInterrupt as interruption:
            learner.finish("interrupted by "
                           + (interruption.args[0] if interruption.args else "SIGINT"))
            return 0
        except (RuntimeError, ray.exceptions.RayError) as error:
            learner.finish("stopped by an error")
            print(f"error: {str(error).strip().splitlines()[-1]}", file=sys.stderr)
            return 1


def check_backend() -> None:
    """ValueError unless Keras runs on TensorFlow: the actors trace their |TD errors| with
    tf.function (ape_x/actor.py), so on another backend they would fail inside Ray workers."""
    if (backend := keras.backend.backend()) != "tensorflow":
        raise ValueError(f"apex.py runs on Keras' TensorFlow backend only, not on {backend!r} "
                         "(KERAS_BACKEND): unset KERAS_BACKEND or set it to tensorflow")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point. A Keras backend other than TensorFlow, bad flags or presets, an
    unknown environment, an unreachable cluster or another run writing the same files print one
    `error:` line and return 2 (before any actor starts), Ctrl-C before the run one `stopped:`
    line and 130; otherwise the run's own exit code (`run_until_stopped`), the run holding the
    lock of its files (run_files.py) throughout."""
    quiet_startup.main_started()  # Ctrl-C from here is a KeyboardInterrupt, a stop
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = settings.build_parser(
            sys.modules[__name__], APEX_FLAGS,
            "Train a D3QN agent with Ape-X distributed prioritized replay on Ray.",
            [(family.ids, apex_preset(family)) for family in games.FAMILIES if family.preset])
        flags = settings.explicit_flags(argv, parser)  # --help answers on any backend
        config, notes = resolve_config(flags)
        if notes:
            print(f"settings: {', '.join(notes)}", flush=True)
        first_update = max(config.learning_starts, 1) + 1  # Learner.train waits for the replay
        if warning := settings.no_training_warning(first_update, config.total_steps,
                                                   config.learning_starts):
            print(warning, file=sys.stderr)
        check_backend()  # flags and settings are checked on any backend; a run needs TensorFlow
        address = config.address or os.environ.get("RAY_ADDRESS") or None
        if address:
            check_reachable(address, config.connect_timeout)
        learner = Learner(config)
        plot_path = learner.report.plot_path
        # The lock of the run's files: no second run writes them meanwhile.
        lock = run_files.take_lock((learner.model_path, learner.last_model_path, plot_path))
        with lock.released_on_error():
            for note in run_files.earlier_runs(learner.model_path,
                                               outputs=[learner.last_model_path, plot_path]):
                print(f"note: {note}", flush=True)
            connect_ray(config, address)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before `run_until_stopped` takes Ctrl-C over
        ray.shutdown()  # a local Ray that was starting
        return training_session.stopped_by_ctrl_c("before the run started")
    try:
        return run_until_stopped(learner)
    finally:
        ray.shutdown()
        lock.release()


if __name__ == "__main__":
    sys.exit(main())
