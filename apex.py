"""Ape-X: distributed prioritized experience replay (Horgan et al. 2018, arXiv:1803.00933) on Ray.

`python apex.py` starts a local Ray on this machine and trains CartPole-v1 with 2 actors;
`python apex.py --address auto` (or RAY_ADDRESS) joins a running Ray cluster instead. Every
hyperparameter below can be edited here or set on the command line (`python apex.py --help`), to
the same effect: either wins over the Atari preset (below). The best evaluated network goes
to `models/apex_<env>.keras` (playable with `d3qn_agent.py --test --model ...`), the learning
curve to `plots/apex_<env>.png`.

Three parts, built from this repository's own pieces:
  actors   NUM_ACTORS Ray actors, each with its own environment and a fixed exploration rate
           eps_i = EPSILON ** (1 + EPSILON_ALPHA * i / (N - 1)). Each keeps a local copy of the
           online and target networks, assembles the N_STEP-step returns of its transitions in
           a small local `PER.UniformMemory`, computes their |TD errors| with the learner's own
           `d3qn_agent.td_errors`, and sends them in blocks of BLOCK_SIZE, with those
           priorities, to the replay. Every WEIGHT_SYNC_EVERY env steps it pulls fresh weights.
  replay   one Ray actor holding a `BlockMemory`, a `PER.Memory` (with `FrameStackStorage` for
           image games): `store_block` inserts a block with its priorities, `sample` serves
           prioritized batches with IS weights, `batch_update` takes the learner's new
           priorities, and the oldest transitions are overwritten first.
  learner  this process: a `d3qn_agent.DQNAgent`, whose network (`OurModel`), compiled
           double-DQN IS-weighted train step, target copy, greedy evaluation and saving are used
           as they are. It requests the next batch before training on the current one, so
           sampling overlaps the gradient step, and publishes its weights through Ray's object
           store every PUBLISH_EVERY updates.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from d3qn_utils import quiet_startup  # noqa: F401  # isort: skip -- first: before TensorFlow
import grpc
import numpy as np
import ray
import tensorflow as tf
from matplotlib.figure import Figure
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from d3qn_agent import ADVANTAGE_LAYER, DQNAgent, OurModel, episode_seed, td_errors
from d3qn_utils import settings, training_session
from d3qn_utils.atomic_files import atomic_file
from d3qn_utils.checks import check_block, check_non_negative, is_integer
from d3qn_utils.games import is_atari, is_minatar, make_env, replay_storage
from d3qn_utils.gradient_steps import Batches
from d3qn_utils.greedy_policy import GreedyPolicy
from d3qn_utils.reporting import Forecast, TensorBoardWriter, tensorboard_dir
from d3qn_utils.settings import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_OR_NONE,
    POSITIVE_SIZES,
    UNIT,
    Flag,
    Preset,
)
from PER import Memory, UniformMemory

# ---------------------------------------------------------------------------------------------
# Hyperparameters. Each one is also a command-line flag: NUM_ACTORS -> --num-actors, and so on.
# ---------------------------------------------------------------------------------------------
ENV_NAME = "CartPole-v1"  # gymnasium id; Atari ids ("PongNoFrameskip-v4") go through atari_wrappers
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

ROOT = Path(__file__).resolve().parent
# A cluster's workers get the repository through Ray's working_dir upload, without these.
UPLOAD_EXCLUDES = [".git", "models", "plots", "runs", "__pycache__", ".pytest_cache"]
RECENT_EPISODES = 10  # episodes per actor in a progress line's mean return
SHOWN_ACTORS = 8  # actors named in a progress line and the plot's legend, spread over the epsilons
LOCAL_START_ATTEMPTS = 3  # tries to start the local Ray
LOOPBACK = ("localhost", "127.0.0.1", "::1")
# check_reachable's request to a Ray GCS (a read of no key) and to a Ray client server (the
# PING its clients send first), as (method, serialized request); and answers Ray never gives
RAY_PROBES = {"gcs": ("/ray.rpc.InternalKVGcsService/InternalKVGet", b""),
              "client": ("/ray.rpc.RayletDriver/ClusterInfo", b"\x08\x06")}
NOT_RAY_ANSWERS = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.DEADLINE_EXCEEDED,
                   grpc.StatusCode.UNAVAILABLE)
IDLE_SLEEP = 0.005  # seconds a paced learner or actor waits before asking again

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
    "grad_clip": Flag(10.0, POSITIVE),
    "per_alpha": Flag(0.6, UNIT),
    "per_beta": Flag(0.4, UNIT),
    "hidden_units": Flag((256, 256), POSITIVE_SIZES, kind=int),
    "dueling": Flag(True),
    "ddqn": Flag(True),
    "max_episode_steps": Flag(None, POSITIVE_OR_NONE, kind=int),
    "eval_every": Flag(2_000, AT_LEAST_ONE),
    "eval_episodes": Flag(20, AT_LEAST_ONE),
    "stop_when_solved": Flag(False),
    "log_every": Flag(10.0, POSITIVE),
    "seed": Flag(0),
    "model_dir": Flag("models"),
    "plot_dir": Flag("plots"),
    "tensorboard": Flag(None, kind=str, alone=True),
    "address": Flag(None, kind=str),
    "connect_timeout": Flag(10.0, POSITIVE),
    "actor_restarts": Flag(10, NON_NEGATIVE),
    "actor_cpus": Flag(1.0, POSITIVE),
    "object_store_mb": Flag(500, POSITIVE),
}


def apex_preset(preset: dict[str, Any]) -> dict[str, Any]:
    """apex.py's values for a d3qn_agent.py `preset`: the shared flags, and its target period
    and train frequency as learner updates at the same data rate."""
    shared = ("total_steps", "memory_size", "batch_size", "learning_rate", "learning_starts",
              "n_step", "eval_every", "eval_episodes")
    return {**{name: preset[name] for name in shared},
            "target_update": preset["target_update"] // preset["train_frequency"],
            "updates_per_step": 1.0 / preset["train_frequency"]}


APEX_ATARI_PRESET = apex_preset(settings.ATARI_PRESET)
APEX_MINATAR_PRESET = apex_preset(settings.MINATAR_PRESET)


def apex_presets(values: dict[str, Any]) -> list[Preset]:
    """The presets apex.py applies: Atari and MinAtar ids only."""
    if is_atari(values["env_name"]):
        return [("Atari", APEX_ATARI_PRESET)]
    if is_minatar(values["env_name"]):
        return [("MinAtar", APEX_MINATAR_PRESET)]
    return []


def resolve_config(flags: dict[str, Any]) -> tuple[argparse.Namespace, list[str]]:
    """The flags above (as edited), the Atari preset for the flags left as shipped and the
    explicit `flags`, checked (settings.py), and the notes on what the preset set. Raises
    ValueError naming the first flag whose value cannot work."""
    config, notes = settings.resolve(sys.modules[__name__], APEX_FLAGS, apex_presets, flags)
    if config.block_size + config.n_step - 1 > config.memory_size:
        raise ValueError(f"MEMORY_SIZE ({config.memory_size}) must hold a block and its "
                         f"n-step context ({config.block_size + config.n_step - 1})")
    return config, notes


def actor_epsilon(index: int, num_actors: int, epsilon: float, alpha: float) -> float:
    """Exploration rate of actor `index` of `num_actors` (Horgan et al. 2018, section 4.1):
    eps_i = epsilon ** (1 + alpha * i / (N - 1)), from epsilon down to epsilon ** (1 + alpha).
    A single actor uses epsilon."""
    if num_actors == 1:
        return epsilon
    return epsilon ** (1.0 + alpha * index / (num_actors - 1))


def shown_actors(num_actors: int) -> list[int]:
    """At most SHOWN_ACTORS actor indices, from the most to the least exploring."""
    spread = np.linspace(0, num_actors - 1, min(num_actors, SHOWN_ACTORS))
    return sorted(set(spread.round().astype(int).tolist()))


def run_name(env_name: str) -> str:
    """File stem of a run's model and plot: apex_CartPole-v1."""
    return "apex_" + env_name.replace("/", "-")


# ---------------------------------------------------------------------------------------------
# Actor
# ---------------------------------------------------------------------------------------------
class Actor:
    """One Ape-X actor: its own environment, exploration rate and copy of the networks.

    `collect_block` plays until a block is ready and returns it with the |TD errors| of its
    transitions, computed with the local networks exactly as the learner's train step computes
    them (`td_errors` on `PER`'s n-step batch). `run` (the Ray method) sends blocks to the
    replay until it answers stop, pulling fresh weights every WEIGHT_SYNC_EVERY env steps; it
    keeps one block in flight, so a slow replay slows the actor instead of queueing blocks.

    Cost per env step: one env step plus, unless exploring, one forward pass (`GreedyPolicy`:
    numpy for an MLP, as DQNAgent acts); per
    block, one batched TD-error computation (three forward passes of BLOCK_SIZE states).
    """

    def __init__(self, index: int, config: argparse.Namespace, replay_name: str | None = None
                 ) -> None:
        self.index = index
        self.config = config
        # Found by name, so a restarted actor finds it again (None: no replay, for tests).
        self.replay = ray.get_actor(replay_name) if replay_name else None
        self.epsilon = actor_epsilon(index, config.num_actors, config.epsilon,
                                     config.epsilon_alpha)
        self.env = make_env(config.env_name, config.max_episode_steps)
        state_shape = tuple(self.env.observation_space.shape)
        self.action_size = int(self.env.action_space.n)
        self.model = OurModel(state_shape, self.action_size, config.dueling, config.hidden_units)
        self.target_model = OurModel(state_shape, self.action_size, config.dueling,
                                     config.hidden_units)
        self.rng = np.random.default_rng([config.seed, 2, index])
        self._compile_functions(tf.as_dtype(self.env.observation_space.dtype), state_shape)
        self.weights_version = -1
        self.steps = 0  # env steps taken by this actor
        self.episode = 0
        self.returns: list[float] = []  # returns of the episodes finished since the last block
        self.state = self._reset()
        self.score = 0.0
        self.outbox = self._new_outbox()
        self._unsent_steps = 0

    def _compile_functions(self, dtype: tf.DType, state_shape: tuple[int, ...]) -> None:
        """Build the greedy policy and trace the |TD errors| once, as DQNAgent does (a concrete
        function call costs about a millisecond, `model.predict` ~70 ms). Closures, not methods:
        Ray's actor wrapper adds an argument to every method, which tf.function would trace."""
        model, target_model, double = self.model, self.target_model, self.config.ddqn
        self.greedy_actions = GreedyPolicy(model, dtype, head=ADVANTAGE_LAYER)

        def abs_td_errors(states: tf.Tensor, actions: tf.Tensor, rewards: tf.Tensor,
                          next_states: tf.Tensor, dones: tf.Tensor,
                          discounts: tf.Tensor) -> tf.Tensor:
            batch = (states, actions, rewards, next_states, dones, discounts)
            return tf.abs(td_errors(model, target_model, batch, double))

        states = tf.TensorSpec((None, *state_shape), dtype)
        vector = tf.TensorSpec((None,), tf.float32)
        self._abs_td_errors = tf.function(abs_td_errors, autograph=False).get_concrete_function(
            states, tf.TensorSpec((None,), tf.int32), vector, states, vector, vector)

    def _reset(self) -> np.ndarray:
        state, _ = self.env.reset(seed=episode_seed(self.config.seed, 3, self.index, self.episode))
        return state

    def _new_outbox(self) -> UniformMemory:
        """A block plus its n-step context: PER assembles the n-step returns, as in the replay."""
        return UniformMemory(self.config.block_size + self.config.n_step - 1,
                             n_step=self.config.n_step, gamma=self.config.gamma)

    def set_weights(self, weights: tuple[list[np.ndarray], list[np.ndarray]]) -> None:
        """Load (online, target) weights as the learner published them."""
        online, target = weights
        self.model.set_weights(online)
        self.target_model.set_weights(target)
        self.greedy_actions.weights_changed()

    def act(self, state: np.ndarray) -> int:
        """Epsilon-greedy with this actor's fixed epsilon."""
        if self.rng.random() < self.epsilon:
            return int(self.rng.integers(self.action_size))
        return int(self.greedy_actions(state[np.newaxis])[0])

    def abs_td_errors(self, batch: tuple[np.ndarray, ...]) -> np.ndarray:
        """|TD errors| of an n-step batch (as `Memory.n_step_batch` returns it) under the local
        networks: what the learner's `learn` would return for the same weights."""
        states, actions, rewards, next_states, dones, discounts = batch
        return self._abs_td_errors(
            states, np.asarray(actions, np.int32), np.asarray(rewards, np.float32), next_states,
            np.asarray(dones, np.float32), np.asarray(discounts, np.float32)).numpy()

    def collect_block(self) -> tuple[tuple[np.ndarray, ...], np.ndarray, int, int, list[float]]:
        """Play until a block is ready: (transitions, abs_errors, context, new_steps, returns).

        A block ends at BLOCK_SIZE + N_STEP - 1 transitions, whose last N_STEP - 1 are context
        (they complete the others' n-step returns and open the next block), or at the end of an
        episode, with no context. `new_steps` counts the env steps not sent before; `returns`
        are the episodes finished meanwhile. Only a termination is stored as done.
        """
        while True:
            action = self.act(self.state)
            next_state, reward, terminated, truncated, _ = self.env.step(action)
            self.steps += 1
            self._unsent_steps += 1
            self.score += reward
            self.outbox.store((self.state, action, reward, next_state, terminated))
            self.state = next_state
            if terminated or truncated:
                self.returns.append(self.score)
                self.episode += 1
                self.state, self.score = self._reset(), 0.0
                return self._take_block(context=0)
            if len(self.outbox) == self.outbox.capacity:
                return self._take_block(context=self.config.n_step - 1)

    def _take_block(self, context: int) -> tuple:
        outbox = self.outbox
        size = len(outbox)
        transitions = outbox.block()  # slot i holds the i-th: the outbox never wraps
        abs_errors = self.abs_td_errors(outbox.n_step_batch(np.arange(size - context)))
        self.outbox = self._new_outbox()
        for row in zip(*(field[size - context:] for field in transitions), strict=True):
            self.outbox.store(row)  # the context opens the next block
        returns, self.returns = self.returns, []
        new_steps, self._unsent_steps = self._unsent_steps, 0
        return transitions, abs_errors, context, new_steps, returns

    def pull_weights(self) -> None:
        """Load the newest weights the learner published, if newer than the ones held."""
        published = ray.get(self.replay.latest_weights.remote(self.weights_version))
        if published is not None:
            self.weights_version, (reference,) = published
            self.set_weights(ray.get(reference))

    def run(self) -> int:
        """Collect and send blocks until the replay says stop; return this actor's env steps.

        Ray restarts a killed actor (max_restarts) and calls `run` again on it (max_task_retries):
        it starts a new episode with the newest weights and goes on.
        """
        ray.get(self.replay.actor_started.remote(self.index))
        self.pull_weights()
        in_flight = None
        next_sync = self.config.weight_sync_every
        while True:
            block = self.collect_block()
            answer = "go" if in_flight is None else ray.get(in_flight)
            while answer == "wait":  # too far ahead of the learner (UPDATES_PER_STEP)
                time.sleep(IDLE_SLEEP)
                answer = ray.get(self.replay.pace.remote())
            if answer == "stop":
                return self.steps
            in_flight = self.replay.add_block.remote(self.index, *block)
            if self.steps >= next_sync:
                self.pull_weights()
                next_sync = self.steps + self.config.weight_sync_every


class BlockMemory(Memory):
    """`PER.Memory` that also takes an actor's block of transitions with the priorities the actor
    measured (`store_block`): the Ape-X replay's memory."""

    def store_block(self, transitions: tuple, abs_errors: np.ndarray, context: int = 0
                    ) -> np.ndarray:
        """Add k consecutive transitions with the priorities their actor computed; return the k
        slots that hold them. O(k log N).

        An actor computes the |TD errors| of its own transitions, so they enter with a measured
        priority instead of the maximum. `transitions` is (states, actions, rewards, next_states,
        dones) with leading dimension k, in the order they happened; `abs_errors` are the |TD
        errors| of the first k - `context`, turned into priorities as `batch_update` does. The
        last `context` transitions are stored only so that the n-step chains of the others run
        through to their end (the actor sends them again at the head of its next block): they get
        priority 0 and are never sampled. Slots the block frees get 0; a slot written twice keeps
        its last priority.

        Bad input (lengths, shapes, NaN, infinite or negative errors, a transition that `store`
        would refuse) raises ValueError and changes nothing, but for a frame storage's refusal of
        a next state that is not its state shifted by a frame: the transitions before it (a frame
        storage adds one at a time) stay, with their priorities.
        """
        columns = check_block(transitions, self.capacity)
        k = len(columns[0])
        if not is_integer(context) or not 0 <= context < k:
            raise ValueError(f"context must be an integer in 0..{k - 1} for a block of {k}, "
                             f"got {context!r}")
        errors = np.asarray(abs_errors, dtype=np.float64).ravel()
        if errors.size != k - context:
            raise ValueError(f"got {errors.size} errors for a block of {k} transitions with "
                             f"{context} of context (expected {k - context})")
        check_non_negative("absolute TD error", errors)
        priorities = np.concatenate([self.leaf_priorities(errors), np.zeros(context)])
        writes: list[tuple[np.ndarray, np.ndarray]] = []  # (slots, priorities), in write order
        stored = 0
        try:
            for slots, freed in self.storage.add_block(columns):
                writes += [(freed, np.zeros(len(freed))),
                           (slots, priorities[stored:stored + len(slots)])]
                stored += len(slots)
        finally:  # one tree update for the block: far cheaper than one per transition
            if writes:
                leaves = np.concatenate([slots for slots, _ in writes]).astype(np.int64)
                values = np.concatenate([values for _, values in writes])
                self.write_priorities(self.tree.leaf_index(leaves), values)
        return np.concatenate([slots for slots, _ in writes[1::2]]).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------------
class Replay:
    """The shared prioritized replay, as one Ray actor, plus the run's bookkeeping hub.

    Holds a `BlockMemory` (a `PER.Memory`: proportional, fixed beta) and, per slot, the
    insertion number of the transition in it, so that a priority update for a transition that
    has meanwhile been overwritten (the oldest go first) is dropped instead of landing on its
    successor. It also keeps the reference to the newest published weights (a few bytes; the
    weights themselves stay in the object store), the env steps and episode returns the actors
    report, and how long its own operations take (for benchmarks/bench_apex.py).
    """

    BYTES_PER_SLOT = 8  # `stamps`, beside the memory's own (Memory.check_fits)

    def __init__(self, config: argparse.Namespace, state_shape: tuple[int, ...]) -> None:
        self.config = config
        storage = replay_storage(config.env_name, state_shape, config.memory_size)
        self.memory = BlockMemory(config.memory_size, alpha=config.per_alpha,
                                  beta=config.per_beta, beta_increment=0.0, storage=storage,
                                  rng=np.random.default_rng([config.seed, 1]),
                                  n_step=config.n_step, gamma=config.gamma)
        self.stamps = np.full(config.memory_size, -1, dtype=np.int64)
        self.inserted = 0
        self.env_steps = np.zeros(config.num_actors, dtype=np.int64)
        self.starts = np.zeros(config.num_actors, dtype=np.int64)
        self.episodes: list[tuple[int, int, float]] = []  # (actor, env steps then, return)
        self.weights: tuple[int, list] | None = None
        self.stopping = False
        self.updates = 0  # priority updates received: one per learner update
        # seconds and calls per operation: store_block, sample, batch_update
        self.timings = {name: [0.0, 0] for name in ("add_block", "sample", "update")}

    def _timed(self, name: str, start: float) -> None:
        entry = self.timings[name]
        entry[0] += time.perf_counter() - start
        entry[1] += 1

    def add_block(self, actor: int, transitions: tuple, abs_errors: np.ndarray, context: int,
                  new_steps: int, returns: list[float]) -> str:
        """Insert an actor's block with its priorities; answer as `pace` does."""
        start = time.perf_counter()
        slots = self.memory.store_block(transitions, abs_errors, context)
        self.stamps[slots] = self.inserted + np.arange(len(slots))
        self.inserted += len(slots)
        self.env_steps[actor] += new_steps
        total = int(self.env_steps.sum())
        self.episodes += [(actor, total, float(score)) for score in returns]
        self._timed("add_block", start)
        return self.pace()

    def pace(self) -> str:
        """"stop" once the run ends; "wait" while the actors are more than a margin ahead of
        UPDATES_PER_STEP learner updates per env step (so on a small machine the learner gets
        the cores its share of updates needs); else "go"."""
        if self.stopping:
            return "stop"
        config = self.config
        margin = config.learning_starts + 2 * config.num_actors * config.block_size
        ahead = self.env_steps.sum() * config.updates_per_step - self.updates
        if config.updates_per_step and ahead > margin * config.updates_per_step:
            return "wait"
        return "go"

    def sample(self, n: int) -> tuple:
        """(tree_idx, stamps, batch, is_weights, env steps collected) of n prioritized draws."""
        start = time.perf_counter()
        tree_idx, batch, is_weights = self.memory.sample(n)
        stamps = self.stamps[self.memory.slots_of(tree_idx)]
        self._timed("sample", start)
        return tree_idx, stamps, batch, is_weights, int(self.env_steps.sum())

    def update_priorities(self, tree_idx: np.ndarray, stamps: np.ndarray,
                          abs_errors: np.ndarray) -> None:
        """New priorities from the learner, for the sampled transitions still in the memory."""
        start = time.perf_counter()
        current = self.stamps[self.memory.slots_of(tree_idx)] == stamps
        self.memory.batch_update(tree_idx[current], abs_errors[current])
        self.updates += 1
        self._timed("update", start)

    def publish(self, version: int, weights: list) -> None:
        """Keep [reference] to the learner's newest weights (the list keeps Ray from fetching)."""
        self.weights = (version, weights)

    def latest_weights(self, version_held: int) -> tuple[int, list] | None:
        """(version, [reference]) of the newest weights, or None if `version_held` is it."""
        if self.weights is None or self.weights[0] == version_held:
            return None
        return self.weights

    def actor_started(self, actor: int) -> int:
        """Count a (re)start of `actor`; return its number of starts."""
        self.starts[actor] += 1
        return int(self.starts[actor])

    def collected(self) -> int:
        """Env steps collected by all actors."""
        return int(self.env_steps.sum())

    def status(self, episodes_seen: int) -> dict[str, Any]:
        """Counters for the progress line, and the episodes reported after the first
        `episodes_seen` ones."""
        return {"env_steps": self.env_steps.tolist(), "size": len(self.memory),
                "starts": self.starts.tolist(), "episodes": self.episodes[episodes_seen:],
                "timings": {name: tuple(entry) for name, entry in self.timings.items()}}

    def stop(self) -> None:
        """Answer "stop" to the next block of every actor, so that each one returns."""
        self.stopping = True


# ---------------------------------------------------------------------------------------------
# Learner and the run
# ---------------------------------------------------------------------------------------------
def check_reachable(address: str, timeout: float) -> None:
    """ValueError unless a Ray cluster answers at `address` ("host:port", "ray://host:port")
    within `timeout` seconds. "auto" is left to Ray, which fails at once without a cluster.

    ray.init itself retries for minutes at an address that listens but is not Ray (an HTTP
    server, a socket that accepts and says nothing), so the probe (`ray_answer`) asks what Ray
    would: a TCP connection, a gRPC handshake and a request that Ray serves, where ray.init will
    look (for a loopback GCS address, at this machine's network address). It runs in a thread
    that the deadline abandons, so a name lookup that hangs is bounded too."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--address must be auto, host:port or ray://host:port, got {address!r}")
    client = address.startswith("ray://")
    where = ""
    if host in LOOPBACK and not client:  # ray.init looks for it at this machine's own address
        host = ray.util.get_node_ip_address()
        where = f" ({host}:{port}, where Ray looks for it)"
    answers: list[str] = []
    probe = threading.Thread(target=lambda: answers.append(ray_answer(
        host, int(port), timeout, client)), daemon=True)
    probe.start()
    probe.join(timeout + 0.5)  # its own steps end by the deadline; a name lookup may not
    reason = answers[0] if answers else "no answer: the name lookup did not finish"
    if reason:
        raise ValueError(f"cannot reach the Ray cluster at {address}{where} within {timeout:g} "
                         f"s ({reason})")


def ray_answer(host: str, port: int, timeout: float, client: bool = False) -> str:
    """"" if `host:port` answers as a Ray GCS (or with `client`, a Ray client server) within
    `timeout` seconds, else why not: the TCP error, no gRPC handshake, or a gRPC server that
    lacks Ray's services. An answer to the request of RAY_PROBES other than NOT_RAY_ANSWERS is
    Ray's (a cluster with token authentication answers UNAUTHENTICATED)."""
    deadline = time.monotonic() + timeout
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        return error.strerror or str(error) or type(error).__name__
    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=max(deadline - time.monotonic(), 0))
        method, request = RAY_PROBES["client" if client else "gcs"]
        channel.unary_unary(method)(request, timeout=max(deadline - time.monotonic(), 0))
    except grpc.FutureTimeoutError:
        return "it accepts connections but does not answer as Ray does: no gRPC handshake"
    except grpc.RpcError as error:
        if error.code() in NOT_RAY_ANSWERS:
            return f"it speaks gRPC, but not as Ray does: {error.code().name}"
    finally:
        channel.close()
    return ""


def connect_ray(config: argparse.Namespace, address: str | None) -> None:
    """Start a local Ray (address None) or join the cluster at `address`.

    Every worker runs TensorFlow on one thread (many actors share the cores) and imports this
    repository's modules: from this directory on a local Ray, from Ray's upload of it
    (working_dir, without models/, plots/, .git) on a cluster. Raises ValueError if joining fails.
    """
    env_vars = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
                "TF_CPP_MIN_LOG_LEVEL": "2"}
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address is None:
        # Logical CPUs: enough for every actor and the replay, even on fewer real cores.
        num_cpus = math.ceil(config.num_actors * config.actor_cpus) + 1
        # On a loaded machine Ray's own processes can miss their start-up deadline: try again.
        for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
            try:
                ray.init(num_cpus=num_cpus, object_store_memory=config.object_store_mb * 1024**2,
                         include_dashboard=False,
                         runtime_env={"env_vars": {**env_vars, "PYTHONPATH": str(ROOT)}}, **quiet)
                return
            except Exception as error:  # Ray raises several types for a start-up timeout
                ray.shutdown()
                if attempt == LOCAL_START_ATTEMPTS:
                    raise ValueError(f"cannot start a local Ray ({attempt} attempts): "
                                     f"{str(error).strip().splitlines()[-1]}") from error
    try:
        ray.init(address=address, runtime_env={"working_dir": str(ROOT),
                                               "excludes": UPLOAD_EXCLUDES,
                                               "env_vars": env_vars}, **quiet)
    except (ConnectionError, RuntimeError) as error:
        raise ValueError(f"cannot join the Ray cluster at {address}: "
                         f"{str(error).splitlines()[0]}") from error


class Learner:
    """The learner and the run's driver: builds the networks, launches the replay and the
    actors, trains, evaluates, logs and saves.

    The network, train step, target copy, evaluation and saving are a `DQNAgent`'s (built with
    this run's flags; its own replay memory stays empty, batch-sized). Cost per update: one
    `learn` (~3 ms for CartPole's defaults on this 2-core CPU), while the replay draws
    the next batch in its own process.
    """

    def __init__(self, config: argparse.Namespace) -> None:
        self.config = config
        # Building the agent checks the environment id (ValueError before any Ray starts).
        self.agent = DQNAgent(
            config.env_name, memory_size=config.batch_size, batch_size=config.batch_size,
            gamma=config.gamma, n_step=config.n_step, learning_rate=config.learning_rate,
            grad_clip=config.grad_clip, ddqn=config.ddqn, dueling=config.dueling,
            hidden_units=config.hidden_units, max_episode_steps=config.max_episode_steps,
            eval_episodes=config.eval_episodes, seed=config.seed, model_dir=config.model_dir,
            plot_dir=config.plot_dir, lr_decay=False, gradient_steps_per_call=1, bfloat16=False,
            xla=True)  # as shipped: d3qn_agent.py's Pong preset turns it off for its own runs
        # The replay's memory is allocated in its own Ray actor: check here that it fits.
        Memory.check_fits(config.memory_size, self.agent.state_shape, self.agent.state_dtype,
                          Replay.BYTES_PER_SLOT)
        name = run_name(config.env_name)
        # The same scalars as d3qn_agent.py's --tensorboard, at env steps collected as x-axis;
        # the writer checks its directory now, before any Ray starts.
        directory = tensorboard_dir(config.tensorboard, name)
        self.tensorboard = TensorBoardWriter(directory) if directory else None
        self._interval_sums = [0.0, 0.0, 0]  # loss, mean |TD error|, updates since last line
        self.model_path = os.path.join(config.model_dir, name + ".keras")
        self.last_model_path = os.path.join(config.model_dir, name + "_last.keras")
        self.plot_path = os.path.join(config.plot_dir, name + ".png")
        self.epsilons = [actor_epsilon(i, config.num_actors, config.epsilon,
                                       config.epsilon_alpha) for i in range(config.num_actors)]
        self.updates = 0
        self.env_steps = 0
        self.version = 0
        self.episodes: list[tuple[int, int, float]] = []  # (actor, env steps then, return)
        self.recent = [deque(maxlen=RECENT_EPISODES) for _ in range(config.num_actors)]
        self.evaluations: list[tuple[int, int, float, float]] = []  # (env steps, updates, mean, s)
        self.best = -math.inf
        self.solved: tuple[int, float] | None = None  # (env steps, seconds) at the first solve
        self.starts = [0] * config.num_actors  # (re)starts per actor, as the replay counted
        self.actor_steps = [0] * config.num_actors  # env steps per actor
        self.replay_size = 0
        self.replay_timings: dict[str, tuple[float, int]] = {}
        self.start_time = time.perf_counter()
        self._last_log = (self.start_time, 0, 0)  # (time, env steps, updates) of the last line
        self.training_start = self._last_log  # the same at the first update (rates leave out
        # the start-up: Ray, the actors' TensorFlow, the first LEARNING_STARTS transitions)
        self.training_end: tuple[float, int, int] | None = None  # and at the last one
        # What the run will cost, at the speed measured from the first update on.
        self.forecast = Forecast(config.total_steps, unit="env step")
        self.next_log = self.start_time  # when the next progress line is due
        self.replay: Any = None
        self.actors: list[Any] = []
        self.runs: list[Any] = []

    # ---- launching ---------------------------------------------------------------------------
    def launch(self) -> None:
        """Start the replay (on this node, near the learner) and the actors (anywhere)."""
        config = self.config
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        replay_name = f"apex_replay_{os.getpid()}_{time.time_ns()}"  # unique per run
        self.replay = ray.remote(Replay).options(
            name=replay_name, num_cpus=1, scheduling_strategy=here).remote(
            config, self.agent.state_shape)
        actor_class = ray.remote(Actor).options(num_cpus=config.actor_cpus,
                                                max_restarts=config.actor_restarts,
                                                max_task_retries=config.actor_restarts)
        self.actors = [actor_class.remote(i, config, replay_name)
                       for i in range(config.num_actors)]
        self.publish()
        self.runs = [actor.run.remote() for actor in self.actors]

    def publish(self) -> None:
        """Put (online, target) weights in the object store and tell the replay where."""
        self.version += 1
        weights = (self.agent.model.get_weights(), self.agent.target_model.get_weights())
        self.replay.publish.remote(self.version, [ray.put(weights)])

    # ---- training ----------------------------------------------------------------------------
    def train(self) -> None:
        """Update until TOTAL_STEPS env steps are collected (or solved, with STOP_WHEN_SOLVED),
        with an evaluation every EVAL_EVERY env steps and a progress line every LOG_EVERY s.

        Raises RuntimeError if an actor fails for good (an error in its code, or its restarts
        used up), noticed at the next progress line.
        """
        config = self.config
        print(f"Ape-X on {config.env_name}: {config.num_actors} actors (epsilon "
              + ", ".join(f"{e:.3g}" for e in self.epsilons)
              + f"), replay {config.memory_size:,}, batch {config.batch_size}, "
              f"{config.n_step}-step returns, until {config.total_steps:,} env steps", flush=True)
        self.next_log = time.perf_counter() + config.log_every
        while self.replay_size < max(config.learning_starts, 1):
            time.sleep(0.2)
            self.refresh_status()
            self.log_if_due()
        next_eval = config.eval_every
        self.training_start = (time.perf_counter(), self.env_steps, 0)
        self.forecast.begin(self.env_steps, self.training_start[0])
        pending = self.replay.sample.remote(config.batch_size)
        while self.env_steps < config.total_steps:
            tree_idx, stamps, batch, is_weights, self.env_steps = ray.get(pending)
            while config.updates_per_step and (
                    self.updates >= config.updates_per_step * self.env_steps):
                time.sleep(IDLE_SLEEP)  # the cap: wait for the actors' data
                self.env_steps = ray.get(self.replay.collected.remote())
                self.log_if_due()
            pending = self.replay.sample.remote(config.batch_size)  # drawn while we train
            (abs_errors,), (loss,) = self.agent.learn(Batches.dealt(batch, is_weights, 1),
                                                      self.env_steps)
            self._interval_sums[0] += loss
            self._interval_sums[1] += float(abs_errors.mean())
            self._interval_sums[2] += 1
            self.replay.update_priorities.remote(tree_idx, stamps, abs_errors)
            self.updates += 1
            if self.updates % config.target_update == 0:
                self.agent.update_target_model()
            if self.updates % config.publish_every == 0:
                self.publish()
            if self.env_steps >= next_eval:
                next_eval = (self.env_steps // config.eval_every + 1) * config.eval_every
                self.evaluate()
                if config.stop_when_solved and self.solved:
                    break
            self.log_if_due()

    def log_if_due(self) -> None:
        """Every LOG_EVERY seconds: fetch the status (raising if an actor failed) and log."""
        if time.perf_counter() >= self.next_log:
            self.refresh_status()
            self.log_progress()
            self.next_log = time.perf_counter() + self.config.log_every

    def rates(self) -> tuple[float, float]:
        """(env steps collected, learner updates) per second from the first update to the end
        of training (or to now, while training)."""
        then, steps, updates = self.training_start
        now, last_steps, last_updates = self.training_end or (
            time.perf_counter(), self.env_steps, self.updates)
        seconds = max(now - then, 1e-9)
        return (last_steps - steps) / seconds, (last_updates - updates) / seconds

    def refresh_status(self) -> None:
        """Fetch the replay's counters and new episodes; raise if an actor failed for good."""
        self.fetch_status()
        finished, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=0)
        for reference in finished:
            index = self.runs.index(reference)
            try:
                ray.get(reference)
            except ray.exceptions.RayError as error:
                raise RuntimeError(f"actor {index} failed: "
                                   f"{str(error).strip().splitlines()[-1]}") from error
            raise RuntimeError(f"actor {index} stopped before the run ended")

    def fetch_status(self) -> None:
        """The replay's counters, the actors' (re)starts and the episodes reported since."""
        status = ray.get(self.replay.status.remote(len(self.episodes)))
        self.env_steps = sum(status["env_steps"])
        self.actor_steps = status["env_steps"]
        self.replay_size = status["size"]
        self.starts = status["starts"]
        self.episodes += status["episodes"]
        for actor, _, score in status["episodes"]:
            self.recent[actor].append(score)
        self.replay_timings = status["timings"]

    def log_progress(self) -> None:
        """One line: rates since the last line and the time left, replay size, recent returns
        per actor; after the estimate when it is due."""
        now = time.perf_counter()
        estimate, left = self.forecast.tell(self.env_steps, now)
        if estimate:
            print(estimate, flush=True)
        last_time, last_steps, last_updates = self._last_log
        seconds = max(now - last_time, 1e-9)
        parts = []
        for actor in shown_actors(self.config.num_actors):
            recent = self.recent[actor]
            parts.append(f"actor {actor} (e {self.epsilons[actor]:.2g}) "
                         + (f"{np.mean(recent):.1f}" if recent else "-"))
        restarted = [f"actor {actor} {starts - 1}x" for actor, starts in enumerate(self.starts)
                     if starts > 1]
        print(f"[{now - self.start_time:5.0f} s] env steps {self.env_steps:,} "
              f"({(self.env_steps - last_steps) / seconds:.0f}/s"
              + (f", {left} left" if left else "") + f"), updates {self.updates:,} "
              f"({(self.updates - last_updates) / seconds:.0f}/s), replay "
              f"{self.replay_size:,}/{self.config.memory_size:,}; returns (last "
              f"{RECENT_EPISODES}): " + ", ".join(parts)
              + (f"; restarted: {', '.join(restarted)}" if restarted else ""), flush=True)
        scalars = {"train/env_steps_per_second": (self.env_steps - last_steps) / seconds,
                   "train/updates_per_second": (self.updates - last_updates) / seconds,
                   "replay/size": self.replay_size}
        loss_sum, abs_error_sum, updates = self._interval_sums
        if updates:
            scalars.update({"train/loss": loss_sum / updates,
                            "train/mean_abs_td_error": abs_error_sum / updates})
        for actor in shown_actors(self.config.num_actors):
            if self.recent[actor]:
                scalars[f"episode/actor_{actor}_average_score"] = float(np.mean(self.recent[actor]))
        self.log_scalars(scalars)
        self._interval_sums = [0.0, 0.0, 0]
        self._last_log = (now, self.env_steps, self.updates)

    def log_scalars(self, scalars: dict[str, float]) -> None:
        """Write `scalars` to TensorBoard at the env steps collected (no-op without it)."""
        if self.tensorboard is not None:
            self.tensorboard.write(self.env_steps, scalars)

    def evaluate(self) -> None:
        """Greedy evaluation with the agent's seeded episodes; save the best network."""
        returns = self.agent.evaluate(self.config.eval_episodes, len(self.evaluations))
        mean = float(returns.mean())
        seconds = time.perf_counter() - self.start_time
        self.evaluations.append((self.env_steps, self.updates, mean, seconds))
        note = ""
        if mean >= self.best:
            self.best = mean
            self.agent.save(self.model_path)
            note = f", best so far: saved {self.model_path}"
        threshold = self.agent.solved_score
        if self.solved is None and threshold and mean >= threshold:
            self.solved = (self.env_steps, seconds)
            note += f", solved (>= {threshold:g})"
        self.log_scalars({"eval/greedy_mean_score": mean})
        print(f"evaluation at env step {self.env_steps:,} (update {self.updates:,}, "
              f"{seconds:.0f} s): mean {mean:.1f} +/- {returns.std():.1f} over {len(returns)} "
              f"greedy episodes{note}", flush=True)

    def run(self) -> None:
        """Launch, train, stop the actors, evaluate the last network, save and summarise. A
        stop signal once the training ended lets the evaluation and the saving finish."""
        self.launch()
        try:
            self.train()
        finally:
            self.training_end = (time.perf_counter(), self.env_steps, self.updates)
            self.stop_actors()
        with training_session.stop_requests():
            self.fetch_status()
            if not self.evaluations or self.evaluations[-1][1] != self.updates:
                self.evaluate()  # the last network, unless evaluated already
            self.finish()

    # ---- ending ------------------------------------------------------------------------------
    def stop_actors(self, timeout: float = 30.0) -> None:
        """Ask every actor to stop after its current block; kill those that do not."""
        if self.replay is None:
            return
        try:
            ray.get(self.replay.stop.remote(), timeout=timeout)
            ray.wait(self.runs, num_returns=len(self.runs), timeout=timeout)
        except ray.exceptions.RayError:
            pass  # the replay is gone: the actors are killed below
        for actor in self.actors:
            ray.kill(actor, no_restart=True)

    def finish(self, ending: str | None = None) -> None:
        """Save the last network and the plot, release the replay (and its Ray CPU); print the
        summary line (or `ending`, e.g. "interrupted", and where things were saved)."""
        self.agent.save(self.last_model_path)
        self.save_plot()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.replay is not None:
            ray.kill(self.replay)
            self.replay = None
        seconds = time.perf_counter() - self.start_time
        if ending:
            best = (f"best {self.model_path}" if self.evaluations else
                    "no best network (no evaluation yet)")
            print(f"{ending} at env step {self.env_steps:,}: last network "
                  f"{self.last_model_path}, {best}, plot {self.plot_path}", flush=True)
            return
        solved = (f"solved at env step {self.solved[0]:,}, {self.solved[1]:.0f} s after start"
                  if self.solved else "not solved")
        steps_per_second, updates_per_second = self.rates()
        print(f"done: {self.env_steps:,} env steps and {self.updates:,} updates in {seconds:.0f} "
              f"s ({steps_per_second:.0f} env steps/s and {updates_per_second:.0f} updates/s "
              f"from the first update on); best evaluation {self.best:.1f}; {solved}; model "
              f"{self.model_path}, plot {self.plot_path}", flush=True)

    def save_plot(self) -> None:
        """Episode returns of each actor and the greedy evaluations against env steps."""
        figure = Figure(figsize=(10, 5), layout="constrained")
        axes = figure.add_subplot()
        episodes = np.array(self.episodes, dtype=np.float64).reshape(-1, 3)
        shown = shown_actors(self.config.num_actors)
        others = ~np.isin(episodes[:, 0], shown)
        if others.any():
            axes.plot(episodes[others, 1], episodes[others, 2], ".", color="tab:gray",
                      markersize=2, alpha=0.3, label="the other actors' episodes")
        for actor in shown:
            mine = episodes[:, 0] == actor
            axes.plot(episodes[mine, 1], episodes[mine, 2], ".", markersize=3, alpha=0.5,
                      label=f"actor {actor} episodes (epsilon {self.epsilons[actor]:.2g})")
        if self.evaluations:
            steps, _, means, _ = zip(*self.evaluations, strict=True)
            axes.plot(steps, means, "k-o", markersize=4,
                      label=f"learner's greedy evaluation ({self.config.eval_episodes} episodes)")
        axes.set_xlabel("environment steps collected by all actors")
        axes.set_ylabel("episode return")
        axes.set_title(f"Ape-X on {self.config.env_name}: {self.config.num_actors} actors, "
                       f"{self.updates:,} learner updates, seed {self.config.seed}", fontsize=10)
        axes.grid(alpha=0.3)
        axes.legend(loc="upper left", fontsize=8)
        with atomic_file(self.plot_path) as temporary:
            figure.savefig(temporary, dpi=100)


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


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point. Bad flags, an unknown environment or an unreachable cluster
    print one `error:` line and return 2 (before any actor starts); otherwise the run's own
    exit code (`run_until_stopped`)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = settings.build_parser(
        sys.modules[__name__], APEX_FLAGS,
        "Train a D3QN agent with Ape-X distributed prioritized replay on Ray.",
        [("Atari ids", APEX_ATARI_PRESET), ("MinAtar ids", APEX_MINATAR_PRESET)])
    flags = settings.explicit_flags(argv, parser)
    try:
        config, notes = resolve_config(flags)
        if notes:
            print(f"settings: {', '.join(notes)}", flush=True)
        first_update = max(config.learning_starts, 1) + 1  # Learner.train waits for the replay
        if warning := settings.no_training_warning(first_update, config.total_steps,
                                                   config.learning_starts):
            print(warning, file=sys.stderr)
        address = config.address or os.environ.get("RAY_ADDRESS") or None
        if address:
            check_reachable(address, config.connect_timeout)
        learner = Learner(config)
        connect_ray(config, address)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        return run_until_stopped(learner)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
