"""D3QN (Double + Dueling DQN) with Prioritized Experience Replay, in Keras 3 (TensorFlow or JAX).

`python d3qn_agent.py` trains on CartPole-v1 (best network to `models/`, learning curve to
`plots/`); `--test` plays the saved network. A flag edited below acts as the same flag on the
command line (`--help`). Presets (other games' values: d3qn_utils/games.py; rank-based PER's and
TUTORIAL's: d3qn_utils/settings.py, which applies them all) fill only the flags still at their
shipped value; the command line always wins. The
pylessons tutorial "D3QN Agent with Prioritized Experience Replay" reads alongside: its names, in
its order (README: Reading along).
The replay memories come from PER.py and rank_based.py; what the tutorial lacks (flags and presets,
games, compiled gradient steps, reports and plots, checkpoints) from d3qn_utils/, one module a job
(README: Files).
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from typing import Any, ClassVar

# First, before numpy and TensorFlow: it hides TensorFlow's harmless start-up lines, makes a
# Ctrl-C during the imports one line, and sets OPENBLAS_NUM_THREADS=1 unless it is set (numpy's
# matrix library on one thread) (d3qn_utils/quiet_startup.py)
from d3qn_utils import quiet_startup  # isort: skip
import gymnasium as gym
import keras
import numpy as np
from keras import ops

from d3qn_utils import agent_checkpoint, recording, run_files, settings, training_session
from d3qn_utils.atomic_files import save_model
from d3qn_utils.checks import (
    added_keys,
    box_observations,
    check_run_fits,
    discrete_actions,
    with_added_keys,
)
from d3qn_utils.environments import Environments, check_steps_taken, crossed
from d3qn_utils.games import make_env, storage_spec, torso
from d3qn_utils.gradient_steps import Batches, compiled_backend, deal, make_optimizer
from d3qn_utils.greedy_policy import (
    GreedyPolicy,
    epsilon_greedy_actions,
    keep_best,
    play_greedy,
    unclipped_score,
)
from d3qn_utils.replay_memory import replay_variant
from d3qn_utils.reporting import AVERAGE_WINDOW, TrainingReport, tensorboard_dir
from d3qn_utils.training_session import NonFiniteError, StopRequest
from PER import Memory, UniformMemory
from rank_based import RankBasedMemory

# ---- Hyperparameters -----------------------------------------------------------------------------
# Each is also a command-line flag (ENV_NAME -> --env-name; USE_PER -> --per/--no-per,
# PER_RANK_BASED -> --rank-based); an edit here (a value other than the shipped one) wins over the
# presets for other games (d3qn_utils/games.py), as the command line does.
ENV_NAME = "CartPole-v1"  # gymnasium id; Atari ("ALE/Pong-v5"), MinAtar ("MinAtar/Breakout-v1")
TUTORIAL = False  # True: the tutorial's value for each flag it has one for, if still as shipped
TOTAL_STEPS = 50_000  # training budget in environment steps (the tutorial counted 1000 episodes)
USE_PER = True  # prioritized experience replay; False: uniform replay with the same interface
PER_RANK_BASED = False  # rank-based priorities 1/rank(i) instead of proportional |delta| + eps
PER_ALPHA = 0.6  # how strongly priorities shape sampling (0 = uniform); rank-based preset 0.7
PER_BETA = 0.4  # initial importance-sampling exponent, annealed to 1 over the run; rank-based: 0.5
DDQN = True  # double DQN target: online net picks the next action, target net evaluates it
DUELING = True  # dueling head Q = V + (A - mean A) instead of a plain Q layer
SOFT_UPDATE = False  # Polyak-average the target net after each gradient step instead of copying
TAU = 0.005  # soft-update rate: target <- TAU * online + (1 - TAU) * target
TARGET_UPDATE = 500  # env steps between hard copies online -> target (when SOFT_UPDATE is off)
EPSILON_GREEDY = False  # False: linear (the tutorial's False: eps *= 1 - decay); True: exponential
EPSILON_START = 1.0  # exploration probability at the first step
EPSILON_MIN = 0.01  # exploration probability at the end of the schedule
EXPLORATION_STEPS = 10_000  # linear schedule: steps to go from EPSILON_START to EPSILON_MIN
EPSILON_DECAY = 0.0005  # exponential schedule: decay rate per step (the tutorial's value)
MEMORY_SIZE = 50_000  # replay capacity in transitions
BATCH_SIZE = 128  # transitions per gradient step
GAMMA = 0.99  # discount factor
N_STEP = 3  # rewards summed per TD target: r_t + ... + gamma^(n-1) r_t+n-1 + gamma^n Q(s_t+n)
OPTIMIZER = "adam"  # or "rmsprop", the tutorial's (rho 0.95, epsilon 0.01)
LOSS = "huber"  # of each TD error: Huber, or "mse", the tutorial's squared error
LEARNING_RATE = 1e-3  # the optimizer's step size
ADAM_EPSILON = 1e-7  # Adam's epsilon: a floor under its per-weight step scaling (Keras' default)
LR_DECAY = True  # anneal the step size linearly from LEARNING_RATE to near 0 by the last step
GRAD_CLIP = 10.0  # clip the gradient's global norm to this value
LEARNING_STARTS = 1_000  # environment steps collected before the first gradient step
# replay() runs once every TRAIN_FREQUENCY * GRADIENT_STEPS_PER_CALL env steps and takes
# GRADIENT_STEPS_PER_CALL gradient steps at once: one per TRAIN_FREQUENCY env steps on average.
TRAIN_FREQUENCY = 2  # env steps per gradient step, on average: replay() takes several at once
# GRADIENT_STEPS_PER_CALL's gain and cost (priorities up to that many - 1 gradient steps old):
# docs/benchmarks.md, "Several gradient steps per call".
GRADIENT_STEPS_PER_CALL = 16  # gradient steps per replay() call, compiled as one (the tutorial: 1)
# N_ENVS environments play side by side (1: the tutorial's one), stepped in turn
# (d3qn_utils/environments.py); one forward pass picks all their actions. Each environment's
# transitions go to its own *stream*: a ring of about MEMORY_SIZE / N_ENVS neighbouring slots
# of the one replay memory (`Segments`, d3qn_utils/replay_storage.py), so an n-step return or a
# frame stack never mixes two environments, while the one sum tree draws by P(i) over all streams.
# Every step count (TOTAL_STEPS, a multiple of N_ENVS; LEARNING_STARTS, TRAIN_FREQUENCY,
# TARGET_UPDATE, EVAL_EVERY, CHECKPOINT_EVERY, the epsilon schedule) counts each environment's
# steps: one step of all of them adds N_ENVS.
N_ENVS = 1  # environments played side by side, their transitions in one replay memory
XLA = True  # compile replay()'s gradient steps with XLA (an optimizing compiler; JAX always does)
# bfloat16: a 16-bit float with float32's exponent range and fewer digits, meant to be faster on
# CPUs with bfloat16 units (docs/usage.md, Atari games, "bfloat16.").
BFLOAT16 = False  # convolutions in bfloat16 (weights float32); Pong preset: on if timed faster
HIDDEN_UNITS = (256, 256)  # MLP torso for vector observations (the tutorial: 512, 256, 64)
MAX_EPISODE_STEPS = None  # None keeps the env's own time limit (CartPole: 500); the tutorial 4000
FAILURE_REWARD = None  # None keeps the env's reward; the tutorial replaced it by -100 on failure
EVAL_EVERY = 1_000  # environment steps between greedy evaluations (they pick the saved model)
EVAL_EPISODES = 20  # greedy episodes per evaluation, run side by side
TEST_EPISODES = 10  # greedy episodes played by --test
SEED = 0  # seeds Python, NumPy, TensorFlow, the environments and the replay memory
# A stop (Ctrl-C, SIGTERM, a NaN loss, reward or observation, caught before it reaches the
# weights or the memory) writes a checkpoint for --resume whatever this is; NaN already in the
# weights writes none (docs/reference.md, Stops). With a period the run's end writes one too.
CHECKPOINT_EVERY = 0  # env steps between checkpoints; 0: none on a schedule (a stop writes one)
MODEL_DIR = "models"  # where the .keras files and the checkpoints go
PLOT_DIR = "plots"  # where the learning curve and the priority figure go
TENSORBOARD = None  # TensorBoard event-file directory; None: off (--tensorboard alone: runs/<name>)
TENSORBOARD_EVERY = 100  # gradient steps between TensorBoard's training scalars (loss, |TD|, ...)

# The replay variants by name (a memory's `kind`); USE_PER and PER_RANK_BASED pick one of them,
# `replay_variant(USE_PER, PER_RANK_BASED)`: proportional PER, rank-based with PER_RANK_BASED,
# uniform without USE_PER (d3qn_utils/replay_memory.py's VARIANT_PICKS, the presets' too).
REPLAY_MEMORIES = {memory.kind: memory for memory in (UniformMemory, Memory, RankBasedMemory)}


# ---- Network -------------------------------------------------------------------------------------
@keras.saving.register_keras_serializable(package="d3qn")
class DuelingCombine(keras.layers.Layer):
    """Combine the dueling streams [value (batch, 1), advantage (batch, n_actions)]: Q(s, a) =
    V(s) + A(s, a) - mean over a' of A(s, a'), the mean per sample (the tutorial's Lambda averaged
    over the batch too), which fixes the split between V and A (without it, any constant could
    move from V into every A(s, a) and Q would not change). A registered layer, not a `Lambda`,
    so `.keras` files load in Keras' safe mode (the default, which refuses to run Python code
    stored in a file, such as a `Lambda`'s)."""

    def call(self, inputs: list) -> Any:
        value, advantage = inputs
        return value + advantage - keras.ops.mean(advantage, axis=-1, keepdims=True)


# The dueling head's A layer: argmax_a A = argmax_a Q, so acting in numpy stops there.
ADVANTAGE_LAYER = "action_advantage"


def OurModel(input_shape: tuple[int, ...], action_space: int, dueling: bool,  # tutorial's name
             hidden_units: tuple[int, ...] = HIDDEN_UNITS, bfloat16: bool = False,
             image_torso: Any = None) -> keras.Model:
    """Q-network: state -> one Q-value per action. A vector state gets an MLP with
    `hidden_units`, a game of uint8 images its `image_torso` (games.py), its convolutions in
    bfloat16 if `bfloat16`. The head is one linear layer, or the dueling pair V, A combined by
    `DuelingCombine`. Named "d3qn" or "dqn" (the tutorial's: 'CartPole D3QN model') and not
    compiled: the tutorial's `compile` (MSE, RMSprop, accuracy) is the agent's `compile()`."""
    if image_torso is not None:
        inputs = keras.Input(shape=input_shape, dtype="uint8", name="frames")
        x = image_torso(inputs, bfloat16)
    elif len(input_shape) == 1:
        inputs = keras.Input(shape=input_shape, dtype="float32", name="state")
        x = inputs
        for units in hidden_units:
            x = keras.layers.Dense(units, activation="relu", kernel_initializer="he_uniform")(x)
    else:
        raise ValueError(f"input_shape must be (features,) for the MLP, got {input_shape}: a "
                         "game of images has a torso in its family's record (d3qn_utils/games.py)")
    if dueling:
        state_value = keras.layers.Dense(1, name="state_value")(x)
        action_advantage = keras.layers.Dense(action_space, name=ADVANTAGE_LAYER)(x)
        q_values = DuelingCombine(name="q_values")([state_value, action_advantage])
    else:
        q_values = keras.layers.Dense(action_space, name="q_values")(x)
    return keras.Model(inputs, q_values, name="d3qn" if dueling else "dqn")


# ---- The TD error and the loss that replay() minimises -------------------------------------------
def td_errors(model: Any, target_model: Any, batch: tuple, double: bool,
              training: bool = False) -> Any:
    """TD errors delta = y - Q(s, a) of a batch (states, actions, rewards, next_states, dones,
    discounts) from `Memory.sample`, the target y = r + discount * (1 - done) * Q_next held fixed;
    discount = gamma^k for a reward summed over k steps (N_STEP). Double DQN (van Hasselt et al.
    2016): the online network picks a' = argmax Q(s', .), the target network evaluates it; plain
    DQN: Q_next = max_a' Q_target(s', a'). `done` is 1 only for a real termination: a time-limit
    cut still bootstraps. The tutorial looped over the samples; this is one graph."""
    states, actions, rewards, next_states, dones, discounts = batch
    next_q_target = target_model(next_states, training=False)
    # Q(s, a) of each row's own action: one gather from the Q-values laid out flat.
    rows = ops.arange(ops.shape(next_q_target)[0]) * next_q_target.shape[-1]
    if double:
        next_actions = ops.cast(ops.argmax(model(next_states, training=False), axis=1), "int32")
        next_q = ops.take(ops.reshape(next_q_target, (-1,)), rows + next_actions)
    else:
        next_q = ops.max(next_q_target, axis=1)
    targets = ops.cast(rewards, "float32") + discounts * (1.0 - ops.cast(dones, "float32")) * next_q
    q_values = ops.reshape(model(states, training=training), (-1,))
    q_taken = ops.take(q_values, rows + ops.cast(actions, "int32"))
    return ops.stop_gradient(targets) - q_taken


def huber(errors: Any, delta: float = 1.0) -> Any:
    """Elementwise Huber loss: quadratic for |error| <= delta, linear beyond (bounded gradient)."""
    abs_errors = ops.abs(errors)
    quadratic = ops.minimum(abs_errors, delta)
    return 0.5 * ops.square(quadratic) + delta * (abs_errors - quadratic)


def weighted_loss(model: Any, target_model: Any, batch: Batches, double: bool, loss: str
                  ) -> tuple[Any, Any]:
    """The loss replay() minimises, L = mean_i w_i * huber(delta_i) (LOSS "mse": delta_i^2),
    and the TD errors delta_i.

    The importance-sampling weights w_i = (N P(i))^-beta / max_j w_j undo PER's sampling bias,
    one per sample's loss (Schaul et al. 2016, Algorithm 1; the tutorial had none)."""
    errors = td_errors(model, target_model, batch[:6], double, training=True)  # not w_i
    losses = huber(errors) if loss == "huber" else ops.square(errors)
    return ops.mean(batch.is_weights * losses), errors


# ---- Seeds ---------------------------------------------------------------------------------------
def episode_seed(seed: int, *indices: int) -> int:
    """A reset seed for one episode (indices: 0 and the episode's number for training; 1, the
    evaluation's number and the episode's place in it for evaluations; 2 and the episode's number
    for --test), so it replays from its seed alone (SeedSequence: nearby seeds share no
    episodes)."""
    return int(np.random.SeedSequence([seed, *indices]).generate_state(1)[0])


# ---- Agent ---------------------------------------------------------------------------------------
class DQNAgent:
    """D3QN agent with prioritized (or uniform) replay; `run()` trains, `test()` plays.
    `DQNAgent("CartPole-v1", use_per=False, seed=3)`: keyword flags, the flags above in lower
    case, win over them. All state of a run lives on the object, so a checkpoint can hold it."""

    def __init__(self, env_name: str | None = None, **flags: Any) -> None:
        given = flags if env_name is None else {"env_name": env_name, **flags}
        self.config, self.settings_notes = settings.resolve(
            sys.modules[__name__], settings.D3QN_FLAGS, settings.d3qn_presets, given)
        config = self.config
        self.env_name = config.env_name
        keras.utils.set_random_seed(config.seed)
        env = make_env(config.env_name, config.max_episode_steps)  # the first of N_ENVS (below)
        self.action_size = discrete_actions(config.env_name, env.action_space)
        self.state_shape = box_observations(config.env_name, env.observation_space)
        self.state_dtype = env.observation_space.dtype
        self.solved_score = env.spec.reward_threshold if env.spec else None
        self.rng = np.random.default_rng(config.seed)  # epsilon-greedy draws

        # The replay memory the flags pick from REPLAY_MEMORIES: all have the tutorial's interface.
        memory_class = REPLAY_MEMORIES[replay_variant(config.use_per, config.per_rank_based)]
        storage = storage_spec(config.env_name)  # the game's storage, sized before it is made
        # The memory's, the batch's and the networks' sizes (with the priority figure's counters
        # per slot), refused before anything is allocated
        check_run_fits(config, memory_class, storage, self.state_shape, self.state_dtype,
                       self.action_size, TrainingReport.BYTES_PER_SLOT)
        replay_options = dict(  # a stream per environment: N_ENVS rings in MEMORY_SIZE slots
            storage=storage(config.memory_size, streams=config.n_envs),
            rng=np.random.default_rng([config.seed, 1]), n_step=config.n_step, gamma=config.gamma)
        self.planned_gradient_steps = max(
            1, (config.total_steps - config.learning_starts) // config.train_frequency)
        if memory_class.PRIORITIZED:  # the tutorial's PER_a, PER_b, PER_b_increment_per_sampling
            replay_options.update(alpha=config.per_alpha, beta=config.per_beta,
                                  beta_increment=self.beta_increment(config.per_beta, 0))
        self.MEMORY = memory_class(config.memory_size, **replay_options)

        image_torso = torso(config.env_name)  # None: vector states, the MLP
        self.model = OurModel(self.state_shape, self.action_size, config.dueling,
                              config.hidden_units, config.bfloat16, image_torso)
        self.target_model = OurModel(self.state_shape, self.action_size, config.dueling,
                                     config.hidden_units, config.bfloat16, image_torso)
        # DQN starts with theta- = theta (the tutorial's two networks began unrelated, until its
        # first copy)
        self.target_model.set_weights(self.model.get_weights())
        self.compile()

        self.step = 0  # environment steps taken in training
        self.episode = 0  # finished training episodes
        self.epsilon = config.epsilon_start
        self.scores: list[float] = []  # return of every training episode
        self.average: list[float] = []  # moving average of `scores` after every episode
        self.evaluations: list[tuple[int, int, float]] = []  # (step, episode, mean greedy return)
        self.best_evaluation = -math.inf
        self.steps_to_solve: int | None = None  # first evaluation step with mean >= threshold
        self._eval_envs: list[gym.Env] = []
        # N_ENVS environments stepped together, each with its episode in progress. Every episode
        # starts from a reset with its own seed and its actions are recorded, so a checkpoint
        # taken mid-episode can replay it exactly; NaN or inf from an environment stops the run,
        # checkpointed (environments.py, training_session.py).
        self.envs = Environments(
            env, config.n_envs, functools.partial(make_env, config.env_name,
                                                  config.max_episode_steps),
            seed_of=functools.partial(episode_seed, config.seed, 0))
        self.env = self.envs.envs[0]  # the first: --test plays in it

        self.name = settings.run_name(config, memory_class.RUN_SUFFIX)  # the tutorial's: DDQN_...
        self.Model_name = os.path.join(config.model_dir, self.name + ".keras")
        self.Last_model_name = os.path.join(config.model_dir, self.name + "_last.keras")
        self.Plot_name = os.path.join(config.plot_dir, self.name + ".png")
        self.Priority_plot_name = os.path.join(config.plot_dir, self.name + "_priorities.png")
        self.checkpoint_root = settings.checkpoint_root(vars(config), REPLAY_MEMORIES)
        self.training_run = run_files.new_run(self.checkpoint_root)  # or the one `resume` finds
        # The priority figure, plots/<name>_priorities.png: how often transitions are replayed by
        # age, N·P(i), beta and the IS weights (d3qn_utils/priority_figure.py)
        self.report = TrainingReport(  # the log lines, TensorBoard and the plots (reporting.py)
            config, self.Plot_name, self.Priority_plot_name, replay=memory_class.title(),
            prioritized=memory_class.PRIORITIZED, ring=memory_class.WRITES_RING,
            streams=self.MEMORY.streams,
            tensorboard_dir=tensorboard_dir(config.tensorboard, self.name),
            image_states=image_torso is not None, warning=settings.no_training_warning(
                self.first_gradient_step(), config.total_steps, config.learning_starts,
                config.n_envs))

    def compile(self) -> None:
        """Adam (or OPTIMIZER "rmsprop", the tutorial's), the greedy policy and the compiled
        gradient steps on `weighted_loss` (the tutorial's `fit`); again after `load`."""
        config = self.config
        self.optimizer = make_optimizer(config.optimizer, config.learning_rate, config.adam_epsilon,
                                        self.planned_gradient_steps if config.lr_decay else None)
        self.greedy_actions = GreedyPolicy(self.model, self.state_dtype, head=ADVANTAGE_LAYER)
        self.learn = compiled_backend().GradientSteps(  # tensorflow_backend.py or jax_backend.py
            functools.partial(weighted_loss, self.model, self.target_model, double=config.ddqn,
                              loss=config.loss),
            self.model, self.target_model, self.optimizer, config.grad_clip,
            self.update_target_model if config.soft_update else None,
            config.gradient_steps_per_call, self.state_shape, self.state_dtype, config.xla,
            after_call=self.greedy_actions.weights_changed)

    def beta_increment(self, beta: float, step: int) -> float:
        """Beta's growth per draw that takes it from `beta` at env step `step` to 1 by the run's
        end: annealed linearly over the gradient steps (Schaul et al. 2016), a draw serving
        GRADIENT_STEPS_PER_CALL of them (when exactly: the changes page's row on β's growth)."""
        config = self.config
        draws = (config.total_steps - max(step, config.learning_starts)) // (
            config.train_frequency * config.gradient_steps_per_call)
        return (1.0 - beta) / max(1, draws)

    def update_target_model(self) -> None:
        """Copy online -> target; with SOFT_UPDATE, target <- TAU online + (1 - TAU) target
        (traced into the compiled gradient steps, after each one). Whatever DDQN is: the
        tutorial's acted only with DDQN, and its plain-DQN target read the online network, so
        its target network went unused."""
        tau, soft = ops.convert_to_tensor(self.config.tau, "float32"), self.config.soft_update
        for target, online in zip(self.target_model.weights, self.model.weights, strict=True):
            target.assign(tau * online + (1.0 - tau) * target if soft else online)

    def remember(self, state: np.ndarray, action: int, reward: float, next_state: np.ndarray,
                 done: bool, stream: int = 0) -> None:
        """Store one transition in the stream of the environment `stream` that made it; `done`
        must mean terminated (not truncated by a time limit)."""
        slot = self.MEMORY.store((state, action, reward, next_state, done), stream=stream)
        self.report.stored(slot)  # for the priority figure: who gets replayed, at what age

    def act(self, states: list[np.ndarray]) -> list[int]:
        """Epsilon-greedy, one action per environment's state: with probability eps =
        `epsilon_at(step)` a uniformly random action, else the greedy argmax_a Q(s, a)
        (`GreedyPolicy`, without model.predict: one forward pass for all the states)."""
        self.epsilon = self.epsilon_at(self.step)
        return epsilon_greedy_actions(self.greedy_actions, states, self.epsilon, self.rng,
                                      self.action_size)

    def epsilon_at(self, step: int) -> float:
        """Exploration rate after `step` env steps: linear from EPSILON_START to EPSILON_MIN over
        EXPLORATION_STEPS, or with EPSILON_GREEDY the tutorial's exponential decay."""
        config = self.config
        if config.epsilon_greedy:
            decay = math.exp(-config.epsilon_decay * step)
            return config.epsilon_min + (config.epsilon_start - config.epsilon_min) * decay
        fraction = min(1.0, step / config.exploration_steps)
        return config.epsilon_start + fraction * (config.epsilon_min - config.epsilon_start)

    def replay(self, due: int | None = None) -> np.ndarray:
        """The tutorial's replay for K = GRADIENT_STEPS_PER_CALL minibatches; returns K losses.
        `due`: the env step whose period this call is (default `self.step`; with N_ENVS > 1 one
        step can pass several), which numbers its gradient steps in the reports.

        1. Sample K x BATCH_SIZE transitions by P(i) = p_i^alpha / sum_k p_k^alpha, each with
           its IS weight w_i = (N P(i))^-beta / max_j w_j (`Memory.sample`; uniform: w_i = 1).
        2. Double-DQN n-step targets: delta_i = R_i + gamma^k (1 - done_i)
           Q_target(s'_i, argmax_a Q(s'_i, a)) - Q(s_i, a_i), R_i the k <= N_STEP rewards summed
           with gamma^j (`td_errors`; DDQN off: max_a Q_target(s'_i, a)).
        3. IS-weighted Huber loss L = mean_i w_i huber(delta_i) (`weighted_loss`).
        4. An optimizer step on grad L, its global norm clipped to GRAD_CLIP.
        5. New priorities from each |delta_i|, measured with the weights before that gradient
           step (the tutorial's |target_old - target| before its `fit`): p_i^alpha,
           p_i = min(|delta_i| + epsilon, abs_err_upper) for proportional PER.
        Steps 2-4 run K times in one compiled call, `self.learn` from `compile()`
        (tensorflow_backend.py or jax_backend.py: the gradient of `weighted_loss`, clipped, applied
        by the optimizer, then the soft update if SOFT_UPDATE), which returns (|delta| per
        minibatch, losses).
        The draw is dealt round-robin: minibatch k holds draws k, k + K, k + 2K, ..., so each
        minibatch spans the whole priority range; together the K minibatches are one draw by
        P(i), and their IS weights correct the K steps together (docs/changes_from_the_tutorial.md,
        the fast path)."""
        steps = self.config.gradient_steps_per_call
        # 1. one stratified draw for the call, with its importance-sampling weights
        tree_idx, minibatch, is_weights = self.MEMORY.sample(steps * self.config.batch_size)
        batches = Batches.dealt(minibatch, is_weights, steps)
        # 2-4, K times, compiled (self.step: named in the error if a step is not finite)
        abs_errors, losses = self.learn(batches, self.step)
        # 5. Written in the order of the steps: a transition drawn twice keeps its later error.
        self.MEMORY.batch_update(deal(tree_idx, steps).ravel(), abs_errors.ravel())
        self.report.gradient_steps(self.step if due is None else due,
                                   self.MEMORY.slots_of(tree_idx),
                                   self.MEMORY.held_per_stream(), losses, abs_errors,
                                   batches.is_weights, self.epsilon, self.MEMORY.beta)
        return losses

    def load(self, name: str) -> None:
        """Load a `.keras` file saved by `save` into both networks (the optimizer starts afresh);
        ValueError if the file is missing, unreadable, or for another environment."""
        try:
            model = keras.models.load_model(name)
        except Exception as err:  # Keras raises several types for a corrupt or foreign file
            raise agent_checkpoint.model_load_error(name, err) from err
        expected = (None, *self.state_shape)
        if tuple(model.input_shape) != expected or model.output_shape[-1] != self.action_size:
            raise ValueError(f"model {name!r} maps {model.input_shape} -> {model.output_shape}, "
                             f"but {self.env_name} needs {expected} -> {self.action_size} actions")
        self.model = model
        self.target_model = keras.models.clone_model(model)
        self.target_model.set_weights(model.get_weights())
        self.compile()

    def save(self, name: str) -> None:
        """Save the online network as a `.keras` file (architecture + weights), atomically."""
        save_model(self.model, name)
        self.training_run.wrote(name)  # its digest: a resume checks the file is still this one

    def PlotModel(self, score: float) -> float:  # the tutorial's name
        """Record an episode's score; return the average of the last AVERAGE_WINDOW scores."""
        self.scores.append(score)
        window = self.scores[-AVERAGE_WINDOW:]
        self.average.append(sum(window) / len(window))
        self.report.redraw_if_due(self.step, self.scores, self.average, self.evaluations)
        return self.average[-1]

    def run(self) -> None:
        """Train until the N_ENVS environments have taken TOTAL_STEPS steps between them, printing
        one line per episode. Greedy evaluations every EVAL_EVERY steps pick the network saved to
        `Model_name`; Ctrl-C, SIGTERM and a NaN caught before the weights stop with a checkpoint
        to --resume from (training_session.py; NaN already in the weights: docs/reference.md,
        Stops)."""
        config = self.config
        if self.training_run.lock is None:
            self.begin()  # as main() does: no second run may write this run's files
        with (self.training_run,  # holds the lock of the run's files; lets it go when the run ends
              training_session.stop_requests() as stop,  # Ctrl-C, SIGTERM: stop after this step
              self.report,  # closes TensorBoard's writer at the end
              # NaN or inf from training or the environment: checkpoint the last good state, stop
              training_session.saved_on(NonFiniteError, self.save_checkpoint)):
            self.start_episodes()  # the first episodes (a resumed run goes on with its open ones)
            self.report.start(self.step, self.settings_notes)
            self.redo_evaluation_cut_short(stop)  # a resumed run: the evaluation a stop cut short
            replay_period = config.train_frequency * config.gradient_steps_per_call  # env steps
            while self.step < config.total_steps and not stop.requested:
                # N_ENVS environments step together (1 by default: the tutorial's one, one entry
                # in each list below). One step of all of them adds N_ENVS env steps; `before`
                # keeps the count before it for the schedules' `crossed` below.
                # Each environment's state: envs.step keeps its next_state there (the tutorial's
                # `state = next_state`), a reset its first.
                states = self.envs.states
                actions = self.act(states)
                next_states, rewards, terminated, truncated, infos = self.envs.step(actions)
                before, self.step = self.step, self.step + config.n_envs
                for i in range(config.n_envs):  # each environment's transition to its own stream
                    reward = rewards[i]
                    if terminated[i] and config.failure_reward is not None:
                        reward = config.failure_reward  # the tutorial's -100 for a fallen pole
                    # Only a real termination stops bootstrapping; a time-limit cut does not.
                    self.remember(states[i], actions[i], reward, next_states[i], terminated[i],
                                  stream=i)
                ended = [i for i in range(config.n_envs) if terminated[i] or truncated[i]]
                for i in ended:
                    self.episode += 1
                    score = unclipped_score(infos[i], self.envs.scores[i])  # Atari: unclipped
                    average = self.PlotModel(score)  # the tutorial's: the score, its average
                    self.report.episode(self.step, self.episode, score, self.epsilon, average)
                    self.envs.end_episode(i)
                    # No n-step return runs past the episode's last transition, not even past
                    # a time-limit cut, whose transition is stored with done False.
                    self.MEMORY.end_episode(i)
                # Reset now (the tutorial: at its next episode's top); replay() reads no environment
                if ended:
                    self.start_episodes()
                # A schedule is due once per multiple of its period the step passed (`crossed`);
                # with N_ENVS = 1, when self.step is a multiple of it (step % period == 0).
                # replay()'s period: TRAIN_FREQUENCY * GRADIENT_STEPS_PER_CALL env steps, from
                # LEARNING_STARTS on (the memory holding a batch).
                if len(self.MEMORY) >= config.batch_size:
                    # The periods' ends passed since the last step, from LEARNING_STARTS on (an
                    # end at LEARNING_STARTS itself counts: it is past LEARNING_STARTS - 1).
                    for due in crossed(max(before, config.learning_starts - 1), self.step,
                                       replay_period):
                        self.replay(due)  # first at env step `first_gradient_step()`
                if not config.soft_update and crossed(before, self.step, config.target_update):
                    self.update_target_model()
                if crossed(before, self.step, config.eval_every):
                    self.evaluate_and_keep_best(stop)
                if config.checkpoint_every and crossed(before, self.step, config.checkpoint_every):
                    print(f"checkpoint: {self.save_checkpoint()}", flush=True)
            self.finish(stop)

    def finish(self, stop: StopRequest) -> None:
        """What the tutorial's run lacked at its end: the final greedy evaluation (unless the
        last step had one), a checkpoint (always after a stop signal; with CHECKPOINT_EVERY at
        the end too), the last network to `Last_model_name`, the plots and the last line: the
        run's summary, or where a stop left everything."""
        stopped = self.step < self.config.total_steps  # by a signal: --resume goes on from here
        if not stopped and self.unevaluated():
            stopped = not self.evaluate_and_keep_best(stop)  # a stop signal cuts it short
        checkpoint = self.save_checkpoint() if stopped or self.config.checkpoint_every else ""
        self.save(self.Last_model_name)
        plots = self.report.draw(self.step, self.scores, self.average, self.evaluations,
                                 self.MEMORY)
        if stopped:
            self.report.stopped(self.step, stop.signal_name, checkpoint, self.Last_model_name,
                                plots)
        else:
            self.report.finish(self.step, self.evaluations[-1][2], self.best_evaluation,
                               self.steps_to_solve, self.Model_name, plots)

    def test(self, model: str | None = None, record: str | None = None) -> list[float]:
        """Play TEST_EPISODES greedy episodes of the network in `model` (default `Model_name`),
        printing each score; with `record` (a .gif path) the first is filmed (recording.py).
        ValueError before playing if `record` or `model` is unusable."""
        if record is not None:
            recording.check_gif_path(record)
        self.load(self.Model_name if model is None else model)
        env = self.env if record is None else make_env(  # rendering is chosen at creation
            self.env_name, self.config.max_episode_steps, render_mode="rgb_array")
        scores = []
        for episode in range(1, self.config.test_episodes + 1):
            seed = episode_seed(self.config.seed, 2, episode)
            if record is not None and episode == 1:
                scores.append(recording.record_episode(env, self.greedy_actions, seed, record))
            else:
                scores.append(float(play_greedy([env], self.greedy_actions, [seed])[0]))
            print(f"episode: {episode}/{self.config.test_episodes}, score: {scores[-1]:g}",
                  flush=True)
        print(f"mean score {np.mean(scores):.1f} over {len(scores)} episodes", flush=True)
        return scores

    def first_gradient_step(self) -> int:
        """The first env step at which `run` trains: the step count (a multiple of N_ENVS) that
        first passes a multiple of TRAIN_FREQUENCY * GRADIENT_STEPS_PER_CALL at or past
        LEARNING_STARTS with a batch collected (N_ENVS transitions a step)."""
        config = self.config
        period, n = config.train_frequency * config.gradient_steps_per_call, config.n_envs
        # -(-a // b) * b rounds a up to a multiple of b (Python's // rounds down, so negate twice).
        batch_step = -(-config.batch_size // n) * n  # the first step count holding a batch
        # A multiple passed at batch_step or later is one past batch_step - N.
        due = -(-max(config.learning_starts, batch_step - n + 1, 1) // period) * period
        return -(-due // n) * n

    def evaluate(self, episodes: int, number: int, stop: StopRequest | None = None
                 ) -> np.ndarray | None:
        """Returns of `episodes` greedy episodes played side by side, seeded by the evaluation's
        `number` (0, 1, ...), so a run repeats exactly, resumed or not; None once `stop` is
        requested (a stop signal does not wait for a long evaluation)."""
        while len(self._eval_envs) < episodes and not (stop and stop.requested):
            self._eval_envs.append(make_env(self.env_name, self.config.max_episode_steps))
        seeds = [episode_seed(self.config.seed, 1, number, i) for i in range(episodes)]
        return play_greedy(self._eval_envs[:episodes], self.greedy_actions, seeds, stop)

    def evaluate_and_keep_best(self, stop: StopRequest | None = None) -> bool:
        """Greedy evaluation; save the model when its mean is at least the best so far (a tie
        keeps the later network); note when solved.
        False, nothing recorded, if `stop` was requested before it ended."""
        start = time.perf_counter()
        returns = self.evaluate(self.config.eval_episodes, len(self.evaluations), stop)
        if returns is None:
            return False
        mean = float(returns.mean())
        self.evaluations.append((self.step, self.episode, mean))
        self.best_evaluation, self.steps_to_solve, note = keep_best(
            mean, self.step, self.best_evaluation, self.steps_to_solve, self.solved_score,
            self.save, self.Model_name)
        self.report.evaluation(self.step, returns, time.perf_counter() - start, note)
        return True

    def unevaluated(self) -> bool:
        """Whether the step reached has no evaluation yet (at the end, or where one was cut)."""
        return not self.evaluations or self.evaluations[-1][0] != self.step

    def redo_evaluation_cut_short(self, stop: StopRequest) -> None:
        """Play the evaluation due at the step reached if a stop cut it short: only a resumed
        run has one (a fresh one at step 0 has crossed no EVAL_EVERY period)."""
        config = self.config
        if crossed(self.step - config.n_envs, self.step, config.eval_every) and self.unevaluated():
            self.evaluate_and_keep_best(stop)

    def start_episodes(self) -> None:
        """Reset each environment whose episode ended (at first, all) with its next episode's
        own seed, numbered in the order episodes start; clear their records."""
        self.envs.start_episodes()

    # ---- Checkpoints: the agent gives its state out and takes it back (agent_checkpoint.py) ---
    # Keys a later checkpoint format adds to `state_dict`'s progress, each with the value that
    # means what an older checkpoint did (empty: d3qn_utils/agent_checkpoint.py).
    ADDED_KEYS: ClassVar[dict[str, Any]] = {}

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs besides the networks' weights: the counters, scores
        and generator, the episodes in progress (their actions, to replay them), the optimizer's
        variables, the memory's and the report's own state."""
        progress = {
            "step": self.step, "episode": self.episode, "epsilon": self.epsilon,
            "scores": self.scores, "average": self.average, "evaluations": self.evaluations,
            "best_evaluation": self.best_evaluation, "steps_to_solve": self.steps_to_solve,
            "rng": self.rng.bit_generator.state, "environments": self.envs.state_dict()}
        optimizer = {str(i): var.numpy() for i, var in enumerate(self.optimizer.variables)}
        return {"progress": progress, "optimizer": optimizer, "memory": self.MEMORY.state_dict(),
                "priority_figure": self.report.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what `state_dict` gave (ValueError for a part that does not fit), then
        replay each episode in progress: the same seed and actions give the same observation."""
        agent_checkpoint.load_variables(self.optimizer.variables, state["optimizer"], "optimizer")
        self.MEMORY.load_state_dict(state["memory"])
        self.report.load_state_dict(state["priority_figure"])
        # JSON, its types checked here: a corrupt file says so
        progress = with_added_keys(state["progress"], added_keys(type(self)))
        self.step, self.episode = int(progress["step"]), int(progress["episode"])
        check_steps_taken(self.step, progress["environments"])  # one count, saved twice
        self.epsilon, self.rng.bit_generator.state = float(progress["epsilon"]), progress["rng"]
        self.scores = [float(score) for score in progress["scores"]]
        self.average = [float(average) for average in progress["average"]]
        self.evaluations = [(int(step), int(episode), float(mean))
                            for step, episode, mean in progress["evaluations"]]
        self.best_evaluation = float(progress["best_evaluation"])
        solved = progress["steps_to_solve"]
        self.steps_to_solve = None if solved is None else int(solved)
        self.envs.load_state_dict(progress["environments"])  # replays the episodes in progress

    def save_checkpoint(self) -> str:
        """Write the networks and `state_dict` to a new checkpoint of this run; its path."""
        return agent_checkpoint.save(self.checkpoint_root, self.training_run, self.config,
                                     self.step, self.state_dict(), (self.model, self.target_model))

    def resume(self, where: str = run_files.LATEST) -> str:
        """Continue the run of checkpoint `where` (LATEST or a `step-*` directory); what to say."""
        checkpoint = agent_checkpoint.load(self.checkpoint_root, where, self.config,
                                           (self.model, self.target_model), self.Model_name)
        with agent_checkpoint.restoring(checkpoint.directory):
            self.load_state_dict(checkpoint.state)
        budget = ("total_steps", "gradient_steps_per_call")  # they set the draws left: beta's step
        if any(checkpoint.flags.get(flag) != getattr(self.config, flag) for flag in budget):
            self.MEMORY.set_beta_increment(self.beta_increment(self.MEMORY.beta, self.step))
        self.training_run = checkpoint.run
        self.greedy_actions.weights_changed()  # acting reads a copy of the restored weights
        replayed = f"\nnote: {note}" if (note := self.envs.replayed()) else ""
        return (f"resuming from {checkpoint.directory} at step {self.step}\n{checkpoint.lines}"
                f"{replayed}")

    def begin(self, resume: str | None = None) -> None:
        """Start the run holding the lock of its files, so that no second run writes them
        (run_files.py), or with `resume` continue one from its checkpoint; say which run it
        continues, or what of earlier runs a new one replaces."""
        outputs = (self.Model_name, self.Last_model_name, self.Plot_name, self.Priority_plot_name)
        lock = run_files.take_lock(outputs, self.checkpoint_root)
        with lock.released_on_error():
            if resume:
                print(self.resume(resume), flush=True)
            else:
                for note in run_files.earlier_runs(self.Model_name, self.checkpoint_root,
                                                   outputs[1:]):
                    print(f"note: {note}", flush=True)
        self.training_run.hold(lock)


def main(argv: list[str] | None = None) -> int:
    """The command line: train, or play a saved network with --test. Returns the exit code: 2
    after one `error:` line for bad input, 130 after one line for Ctrl-C before training (or
    during --test), `training_session.exit_code`'s for a training run."""
    quiet_startup.main_started()  # Ctrl-C from here is a KeyboardInterrupt, a stop
    flags = settings.explicit_flags(sys.argv[1:] if argv is None else argv,
                                    settings.d3qn_parser(sys.modules[__name__]))
    stage = "during --test" if flags.get("test") else "before training started"
    try:
        test, resume, model, record = settings.pop_modes(flags)  # ValueError before any agent
        agent = DQNAgent(**settings.for_mode(flags, test, resume, REPLAY_MEMORIES))
        if test:
            agent.test(model, record)
            return 0
        agent.begin(resume)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the run's own stop (a checkpoint) has not begun
        return training_session.stopped_by_ctrl_c(stage)
    return training_session.exit_code(agent.run)


if __name__ == "__main__":
    sys.exit(main())
