"""D3QN (Double + Dueling DQN) with Prioritized Experience Replay, in Keras 3 / TensorFlow.

`python d3qn_agent.py` trains on CartPole-v1, saves the model to `models/` and draws the learning
curve to `plots/`; `python d3qn_agent.py --test` plays the saved model greedily. Edit a flag below
or give it on the command line (`python d3qn_agent.py --help`): the two do the same.

Reading along with the tutorial (pylessons, "D3QN Agent with Prioritized Experience Replay"),
its names in its order, and where they are here:
  self.ddqn, self.dueling, ...  the flag block below: DDQN, DUELING, SOFT_UPDATE, TAU, USE_PER,
                                EPSILON_GREEDY, GAMMA, BATCH_SIZE, MEMORY_SIZE; EPISODES became
                                TOTAL_STEPS, a budget in environment steps
  OurModel                      OurModel: the dueling head averages A over the actions of each
                                sample (a registered layer, no Lambda)
  the target in replay()        td_errors: double-DQN target, computed for the whole batch
  DQNAgent.__init__             the same, with the memory PER.Memory or PER.UniformMemory
  update_target_model           a hard copy, or Polyak averaging with TAU (SOFT_UPDATE)
  remember                      one MEMORY.store for both memories (no deque)
  act                           epsilon-greedy; the greedy action from greedy_policy.py, a
                                numpy forward pass for an MLP (no model.predict)
  replay                        MEMORY.sample -> GRADIENT_STEPS_PER_CALL gradient steps on the
                                importance-weighted Huber loss in one compiled call ->
                                MEMORY.batch_update (no model.fit)
  load, save                    .keras files that load in Keras' safe mode
  PlotModel                     records the score; the learning curve is drawn by reporting.py
  run                           gymnasium's terminated/truncated: bootstrap through truncation;
                                greedy evaluations choose the saved model
  test                          greedy episodes of a saved model (--record FILE.gif films one)
The plumbing a tutorial reader does not need lives beside this file: settings.py (command line,
presets), reporting.py (log lines, the time left, TensorBoard, plots), priority_figure.py,
recording.py (GIF), checkpoint.py (--checkpoint-every, --resume, stopping on Ctrl-C or SIGTERM),
quiet_startup.py (TensorFlow's start-up lines kept off the terminal).
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

import quiet_startup  # isort: skip  # noqa: F401 -- before TensorFlow, to filter its start-up lines
import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

import atari_wrappers
import checkpoint
import minatar_wrappers
import recording
import settings
from checkpoint import NonFiniteError
from greedy_policy import GreedyPolicy
from patch_conv import PatchConv2D
from PER import Memory, UniformMemory
from priority_figure import PriorityFigure, ReplayStatistics
from replay_storage import storage_for
from reporting import AVERAGE_WINDOW, TrainingReport

# ---------------------------------------------------------------------------------------------
# Hyperparameters. Each one is also a command-line flag: ENV_NAME -> --env-name, and so on. An
# edit here wins over the presets for other games (settings.py), as the command line does.
# ---------------------------------------------------------------------------------------------
ENV_NAME = "CartPole-v1"  # gymnasium id; Atari ("ALE/Pong-v5"), MinAtar ("MinAtar/Breakout-v1")
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
ADAM_EPSILON = 1e-7  # Adam's epsilon: a floor under its per-weight step scaling (Keras' default)
LR_DECAY = True  # anneal the step size linearly to 0 over the run's gradient steps
GRAD_CLIP = 10.0  # clip the gradient's global norm to this value
LEARNING_STARTS = 1_000  # environment steps collected before the first gradient step
TRAIN_FREQUENCY = 2  # environment steps per gradient step (half a gradient step per env step)
GRADIENT_STEPS_PER_CALL = 16  # gradient steps per replay() call, traced into one TensorFlow call
XLA = True  # compile replay()'s gradient steps with XLA, which fuses their ~400 small ops
HIDDEN_UNITS = (256, 256)  # MLP torso for vector observations (the tutorial: 512, 256, 64)
MAX_EPISODE_STEPS = None  # None keeps the env's own time limit (500); the tutorial used 4000
FAILURE_REWARD = None  # None keeps the env's reward; the tutorial replaced it by -100 on failure
EVAL_EVERY = 1_000  # environment steps between greedy evaluations (they pick the saved model)
EVAL_EPISODES = 20  # greedy episodes per evaluation, run side by side
TEST_EPISODES = 10  # greedy episodes played by --test
SEED = 0  # seeds Python, NumPy, TensorFlow, the environments and the replay memory
CHECKPOINT_EVERY = 0  # env steps between checkpoints for --resume (0: only on Ctrl-C, SIGTERM)
MODEL_DIR = "models"  # where the .keras files and the checkpoints go
PLOT_DIR = "plots"  # where the learning curve and the priority figure go
TENSORBOARD = None  # TensorBoard event-file directory; None: off (--tensorboard alone: runs/<name>)
TENSORBOARD_EVERY = 100  # gradient steps between TensorBoard's training scalars (loss, |TD|, ...)


def make_env(env_name: str, max_episode_steps: int | None = None,
             render_mode: str | None = None) -> gym.Env:
    """Create the environment (Atari and MinAtar ids through their wrappers' modules); an
    unknown id raises ValueError. `render_mode="rgb_array"`: `env.render()` gives the screen."""
    if render_mode == "rgb_array":  # drawn off-screen, so no display (nor SDL errors) is needed
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    if atari_wrappers.is_atari(env_name):
        return atari_wrappers.make_env(env_name, max_episode_steps=max_episode_steps,
                                       render_mode=render_mode)
    if minatar_wrappers.is_minatar(env_name):
        return minatar_wrappers.make_env(env_name, max_episode_steps, render_mode)
    try:
        return gym.make(env_name, max_episode_steps=max_episode_steps, render_mode=render_mode)
    except gym.error.Error as err:
        raise ValueError(f"cannot make environment {env_name!r}: {err}") from err


# ---- Network -------------------------------------------------------------------------------------
@keras.saving.register_keras_serializable(package="d3qn")
class DuelingCombine(keras.layers.Layer):
    """Combine the dueling streams: Q(s, a) = V(s) + A(s, a) - mean over a' of A(s, a').

    Inputs [value (batch, 1), advantage (batch, n_actions)]. The mean is per sample, over the
    actions (the tutorial's Lambda averaged over the batch too); it makes V and A identifiable.
    A registered layer, not a `Lambda`, so `.keras` files load in Keras' safe mode.
    """

    def call(self, inputs: list) -> Any:
        value, advantage = inputs
        return value + advantage - keras.ops.mean(advantage, axis=-1, keepdims=True)


def OurModel(  # the tutorial's name
    input_shape: tuple[int, ...],
    action_space: int,
    dueling: bool,
    hidden_units: tuple[int, ...] = HIDDEN_UNITS,
) -> keras.Model:
    """Q-network: state -> one Q-value per action (uncompiled; the agent trains it itself).

    A vector state gets an MLP with `hidden_units`, a (height, width, channels) uint8 image the
    Nature-DQN torso (1/255, conv 32x8x8/4, 64x4x4/2, 64x3x3/1, dense 512), or for an image too
    small for its strides the MinAtar paper's (1/255, conv 16x3x3/1, dense 128). The head is one
    linear layer, or the dueling pair V, A combined by `DuelingCombine`.
    """
    if len(input_shape) == 3:
        inputs = keras.Input(shape=input_shape, dtype="uint8", name="frames")
        x = keras.layers.Rescaling(1.0 / 255.0)(inputs)
        if min(input_shape[:2]) < 36:  # too small for the Nature strides (MinAtar's 10x10)
            x = PatchConv2D(16, 3, activation="relu")(x)  # a 3x3 conv as one product: faster
            units = 128
        else:
            for filters, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
                x = keras.layers.Conv2D(filters, kernel, strides=stride, activation="relu")(x)
            units = 512
        x = keras.layers.Flatten()(x)
        x = keras.layers.Dense(units, activation="relu")(x)
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


# ---- The TD error and the loss that replay() minimises -------------------------------------------
def td_errors(model: Any, target_model: Any, batch: tuple, double: bool,
              training: bool = False) -> tf.Tensor:
    """TD errors delta = y - Q(s, a) of a batch, with the target y held fixed.

    `batch` is (states, actions, rewards, next_states, dones, discounts) as `Memory.sample`
    returns it: y = r + discount * (1 - done) * Q_next, discount = gamma^k for a reward summed
    over k steps (N_STEP). Double DQN (van Hasselt et al. 2016): the online network picks
    a' = argmax Q(s', .), the target network evaluates it, Q_next = Q_target(s', a'); plain DQN:
    Q_next = max_a' Q_target(s', a'). `done` is 1 only for a real termination: a time-limit
    truncation still bootstraps. The tutorial looped over samples and three `model.predict`
    outputs; this is one graph. apex.py's actors use it for their transitions' first priorities.
    """
    states, actions, rewards, next_states, dones, discounts = batch
    next_q_target = target_model(next_states, training=False)
    if double:
        next_actions = tf.argmax(model(next_states, training=False), axis=1, output_type=tf.int32)
        next_q = tf.gather(next_q_target, next_actions, axis=1, batch_dims=1)
    else:
        next_q = tf.reduce_max(next_q_target, axis=1)
    dones = tf.cast(dones, tf.float32)
    targets = tf.cast(rewards, tf.float32) + discounts * (1.0 - dones) * tf.cast(next_q, tf.float32)
    q_taken = tf.gather(model(states, training=training), actions, axis=1, batch_dims=1)
    return tf.stop_gradient(targets) - q_taken


def huber(errors: tf.Tensor, delta: float = 1.0) -> tf.Tensor:
    """Elementwise Huber loss: quadratic for |error| <= delta, linear beyond (bounded gradient)."""
    abs_errors = tf.abs(errors)
    quadratic = tf.minimum(abs_errors, delta)
    return 0.5 * tf.square(quadratic) + delta * (abs_errors - quadratic)


def deal(array: np.ndarray, steps: int) -> np.ndarray:
    """Deal a draw of steps x batch items into `steps` batches, as cards: (steps * batch, ...)
    -> (steps, batch, ...), batch k holding items k, k + steps, k + 2 steps, ..."""
    return array.reshape(-1, steps, *array.shape[1:]).swapaxes(0, 1)


def episode_seed(seed: int, *indices: int) -> int:
    """A reset seed for one episode, so that every episode can be replayed from its seed alone
    (numpy's SeedSequence: runs with nearby seeds do not share episodes)."""
    return int(np.random.SeedSequence([seed, *indices]).generate_state(1)[0])


# ---- Agent ---------------------------------------------------------------------------------------
class DQNAgent:
    """D3QN agent with prioritized (or uniform) replay; `run()` trains, `test()` plays.

    `DQNAgent("CartPole-v1", use_per=False, seed=3)`: keyword flags are the lower-case names of
    the constants at the top of this file and win over them, as command-line flags do. All state
    of a run lives on the object (networks, optimizer, memory, `step`, `episode`, `epsilon`,
    `scores`, `average`, `evaluations`, `rng`), so checkpoint.py can save and restore it whole.
    """

    def __init__(self, env_name: str | None = None, **flags: Any) -> None:
        given = flags if env_name is None else {"env_name": env_name, **flags}
        self.config, self.settings_notes = settings.resolve(
            sys.modules[__name__], settings.D3QN_FLAGS, settings.d3qn_presets, given)
        config = self.config
        self.env_name = config.env_name
        keras.utils.set_random_seed(config.seed)
        self.env = make_env(config.env_name, config.max_episode_steps)
        if not isinstance(self.env.action_space, gym.spaces.Discrete):
            raise ValueError(f"{config.env_name} has action space {self.env.action_space}; "
                             "DQN needs a discrete one")
        self.env.action_space.seed(config.seed)
        self.state_shape = tuple(self.env.observation_space.shape)
        self.state_dtype = self.env.observation_space.dtype
        self.action_size = int(self.env.action_space.n)
        self.solved_score = self.env.spec.reward_threshold if self.env.spec else None
        self.rng = np.random.default_rng(config.seed)  # epsilon-greedy draws

        # The replay memory: PER's Memory or UniformMemory, one interface. Images keep each frame
        # once (Atari's 4 stacked on the last axis); the priority figure counts who is replayed.
        settings.check_replay_memory(config, self.state_shape, self.state_dtype,
                                     ReplayStatistics.BYTES_PER_SLOT)  # before allocating it
        self.priority_figure = PriorityFigure(config.memory_size, config.batch_size)
        replay_options = dict(
            storage=storage_for(self.state_shape, config.memory_size,
                                stacked=atari_wrappers.is_atari(config.env_name)),
            rng=np.random.default_rng([config.seed, 1]), n_step=config.n_step,
            gamma=config.gamma, observer=self.priority_figure.statistics)
        self.planned_gradient_steps = max(
            1, (config.total_steps - config.learning_starts) // config.train_frequency)
        if config.use_per:
            # Beta anneals linearly to 1 over the run's gradient steps (Schaul et al. 2016); it
            # grows once a draw, and a draw serves GRADIENT_STEPS_PER_CALL steps.
            planned_draws = max(1, self.planned_gradient_steps // config.gradient_steps_per_call)
            beta_increment = (1.0 - config.per_beta) / planned_draws
            self.MEMORY = Memory(config.memory_size, alpha=config.per_alpha, beta=config.per_beta,
                                 beta_increment=beta_increment, rank_based=config.per_rank_based,
                                 **replay_options)
        else:
            self.MEMORY = UniformMemory(config.memory_size, **replay_options)

        self.model = OurModel(self.state_shape, self.action_size, config.dueling,
                              config.hidden_units)
        self.target_model = OurModel(self.state_shape, self.action_size, config.dueling,
                                     config.hidden_units)
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
        # The episode in progress. Every episode starts from a reset with its own seed and its
        # actions are recorded, so a checkpoint taken mid-episode can replay it exactly.
        self.state: np.ndarray | None = None
        self.episode_score = 0.0
        self.episode_actions: list[int] = []

        # File names as the tutorial builds them: DDQN_CartPole-v1_Dueling_PER.
        name = ("DDQN_" if config.ddqn else "DQN_") + config.env_name.replace("/", "-")
        name += "_soft" if config.soft_update else ""
        name += "_Dueling" if config.dueling else ""
        name += "_Greedy" if config.epsilon_greedy else ""
        if config.use_per:
            name += "_PERrank" if config.per_rank_based else "_PER"
        self.name = name
        self.Model_name = os.path.join(config.model_dir, self.name + ".keras")
        self.Last_model_name = os.path.join(config.model_dir, self.name + "_last.keras")
        self.Plot_name = os.path.join(config.plot_dir, self.name + ".png")
        self.Priority_plot_name = os.path.join(config.plot_dir, self.name + "_priorities.png")
        self.checkpoint_root = os.path.join(config.model_dir, self.name + ".checkpoints")
        self.report = TrainingReport(self)

    def update_target_model(self) -> None:
        """Copy online -> target; with SOFT_UPDATE, target <- TAU online + (1 - TAU) target."""
        tau = self.config.tau if self.config.soft_update else 1.0
        self._blend_target(tf.constant(tau, tf.float32))

    def remember(self, state: np.ndarray, action: int, reward: float, next_state: np.ndarray,
                 done: bool) -> None:
        """Store one transition; `done` must mean terminated (not truncated by a time limit)."""
        self.MEMORY.store((state, action, reward, next_state, done))

    def act(self, state: np.ndarray) -> int:
        """Epsilon-greedy action for one state (greedy_policy.py: a numpy forward pass for an
        MLP, so acting costs ~20 µs instead of a ~300 µs TensorFlow call)."""
        self.epsilon = self.epsilon_at(self.step)
        if self.rng.random() < self.epsilon:
            return int(self.rng.integers(self.action_size))
        return int(self.greedy_actions(state[np.newaxis])[0])

    def epsilon_at(self, step: int) -> float:
        """Exploration rate after `step` env steps: linear from EPSILON_START to EPSILON_MIN over
        EXPLORATION_STEPS, or with EPSILON_GREEDY the tutorial's exponential decay."""
        config = self.config
        if config.epsilon_greedy:
            decay = math.exp(-config.epsilon_decay * step)
            return config.epsilon_min + (config.epsilon_start - config.epsilon_min) * decay
        fraction = min(1.0, step / config.exploration_steps)
        return config.epsilon_start + fraction * (config.epsilon_min - config.epsilon_start)

    def replay(self) -> np.ndarray:
        """Sample GRADIENT_STEPS_PER_CALL batches, take a gradient step on each, give each
        batch's |TD errors| back as its priorities; return the losses.

        The tutorial sampled, fitted and updated one batch at a time. Here one draw of
        steps x BATCH_SIZE transitions is dealt into the batches (batch k gets draws k,
        k + steps, ..., so it spans the whole priority range as a draw of its own would), and
        one compiled call trains on them all: TensorFlow's fixed cost of ~1 ms a call and the
        memory's cost a draw are paid once (docs/benchmarks.md). The price: batch k comes
        from priorities that miss the k - 1 updates before it. Its IS weights are those of
        the probabilities it was drawn with, so the correction stays exact.
        """
        steps = self.config.gradient_steps_per_call
        tree_idx, batch, is_weights = self.MEMORY.sample(steps * self.config.batch_size)
        batches = tuple(deal(array, steps) for array in batch)
        is_weights = deal(is_weights, steps)
        abs_errors, losses = self.train_on_batch(batches, is_weights)
        # Written in the order of the steps: a transition drawn twice keeps its later error.
        self.MEMORY.batch_update(deal(tree_idx, steps).ravel(), abs_errors.ravel())
        self.report.gradient_steps(self, losses, abs_errors, is_weights)
        return losses

    def train_on_batch(self, batches: tuple[np.ndarray, ...], is_weights: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
        """A compiled `gradient_step` on each batch in turn (~1.1 ms a CartPole step here, ~38 ms
        a Pong step); `batches` holds `Memory.sample`'s arrays with a leading axis of
        GRADIENT_STEPS_PER_CALL (`deal`). Returns the |TD errors| (steps, batch size) and the
        losses, each from before its step. Raises NonFiniteError if a loss or gradient is NaN
        or inf: that step and the ones after it are not applied."""
        states, actions, rewards, next_states, dones, discounts = batches
        abs_errors, losses, applied = self._gradient_steps(
            states, actions.astype(np.int32), rewards.astype(np.float32), next_states,
            dones.astype(np.float32), discounts.astype(np.float32),
            is_weights.astype(np.float32))
        self.greedy_actions.weights_changed()
        if not applied:
            raise NonFiniteError(f"training at env step {self.step} gave a non-finite loss or "
                                 f"gradient (losses {losses.numpy().tolist()}); from there on the "
                                 "call's steps were not applied")
        return abs_errors.numpy(), losses.numpy()

    def gradient_step(self, batch: tuple, is_weights: tf.Tensor, allowed: tf.Tensor
                      ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """One step of the graph `train_on_batch` runs: loss = mean_i w_i * huber(delta_i),
        then Adam (and with SOFT_UPDATE the target's blend).

        The IS weights w_i = (N P(i))^-beta / max_j w_j undo PER's sampling bias, one per
        sample's loss (Schaul et al. 2016, Algorithm 1); the gradient's norm is clipped to
        GRAD_CLIP. A NaN or inf would poison the weights and, through the TD errors, the sum
        tree: such a step is not applied (nor is any while `allowed` is False), and `applied`
        says so.
        """
        with tf.GradientTape() as tape:
            errors = td_errors(self.model, self.target_model, batch, self.config.ddqn,
                               training=True)
            loss = tf.reduce_mean(is_weights * huber(errors))
        variables = self.model.trainable_variables
        gradients, norm = tf.clip_by_global_norm(tape.gradient(loss, variables),
                                                 self.config.grad_clip)

        def apply() -> tf.Tensor:
            self.optimizer.apply_gradients(zip(gradients, variables, strict=True))
            if self.config.soft_update:
                self.blend_target(tf.constant(self.config.tau, tf.float32))
            return tf.constant(True)

        finite = tf.math.is_finite(loss) & tf.math.is_finite(norm)
        applied = tf.cond(allowed & finite, apply, lambda: tf.constant(False))
        return tf.abs(errors), loss, applied

    def blend_target(self, tau: tf.Tensor) -> None:
        """The graph of `update_target_model`: target <- tau * online + (1 - tau) * target."""
        for target, online in zip(self.target_model.weights, self.model.weights, strict=True):
            target.assign(tau * online + (1.0 - tau) * target)

    def load(self, name: str) -> None:
        """Load a `.keras` file saved by `save` into the online and target networks: the
        architecture comes from the file (HIDDEN_UNITS need not match), the optimizer starts
        afresh. ValueError if the file is missing, unreadable, or for another environment."""
        try:
            model = keras.models.load_model(name)
        except Exception as err:  # Keras raises several types for a corrupt or foreign file
            raise checkpoint.model_load_error(name, err) from err
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
        with checkpoint.atomic_file(name) as temporary:
            self.model.save(temporary)

    def PlotModel(self, score: float) -> float:  # the tutorial's name
        """Record an episode's score; return the average of the last AVERAGE_WINDOW (50). The
        learning curve `Plot_name` is redrawn every 20 s (reporting.py) and at the end."""
        self.scores.append(score)
        window = self.scores[-AVERAGE_WINDOW:]
        self.average.append(sum(window) / len(window))
        self.report.redraw_if_due(self)
        return self.average[-1]

    @checkpoint.owns_its_files  # holds MODEL_DIR/<name>.lock: no second run writes its files
    def run(self) -> None:
        """Train until TOTAL_STEPS environment steps, printing one line per episode.

        Greedy evaluations every EVAL_EVERY steps pick the network saved to `Model_name` (the
        last one goes beside it, `..._last.keras`). Ctrl-C or SIGTERM stops after the current
        step with a checkpoint, the last network and the plots; NaN or inf in a loss, a reward
        or an observation raises NonFiniteError after a checkpoint of the last good state.
        """
        config = self.config
        self.report.start(self)
        if self.state is None:
            self.start_episode()
        with (checkpoint.stop_requests() as stop, self.report,
              checkpoint.saved_on(NonFiniteError, self)):
            while self.step < config.total_steps and not stop.requested:
                action = self.act(self.state)
                next_state, reward, terminated, truncated, info = self.env.step(action)
                checkpoint.check_environment_step(self.step + 1, reward, next_state)  # no NaN
                self.step += 1
                self.episode_actions.append(action)
                self.episode_score += reward
                if terminated and config.failure_reward is not None:
                    reward = config.failure_reward  # the tutorial's -100 for a fallen pole
                # Only a real termination stops bootstrapping; a time-limit cut does not.
                self.remember(self.state, action, reward, next_state, terminated)
                self.state = next_state
                if (self.step >= config.learning_starts and len(self.MEMORY) >= config.batch_size
                        and self.step % (config.train_frequency
                                         * config.gradient_steps_per_call) == 0):
                    self.replay()
                if not config.soft_update and self.step % config.target_update == 0:
                    self.update_target_model()
                if terminated or truncated:
                    self.episode += 1
                    score = info.get("episode", {}).get("r", self.episode_score)  # Atari: unclipped
                    self.report.episode(self, score, self.PlotModel(score))
                    self.start_episode()
                if self.step % config.eval_every == 0:
                    self.evaluate_and_keep_best()
                if config.checkpoint_every and self.step % config.checkpoint_every == 0:
                    print(f"checkpoint: {checkpoint.save_agent(self)}", flush=True)
        if stop.requested:
            path = checkpoint.save_agent(self)
            self.save(self.Last_model_name)
            self.report.stopped(self, stop.signal_name, path, self.Last_model_name)
            return
        if not self.evaluations or self.evaluations[-1][0] != self.step:
            self.evaluate_and_keep_best()
        self.save(self.Last_model_name)
        if config.checkpoint_every:
            checkpoint.save_agent(self)
        self.report.finish(self)

    def test(self, model: str | None = None, record: str | None = None) -> list[float]:
        """Play TEST_EPISODES greedy episodes with the network saved in `model` (by default
        `Model_name`), printing each score; return the scores.

        With `record` (a .gif path), the first episode is also written there as an animated GIF
        of the environment's screens, as soon as it ends. Raises ValueError before playing if
        `record` cannot be written or `model` is missing or made for another environment.
        """
        if record is not None:
            recording.check_gif_path(record)
        self.load(self.Model_name if model is None else model)
        env = self.env if record is None else make_env(  # rendering is chosen at creation
            self.env_name, self.config.max_episode_steps, render_mode="rgb_array")
        scores = []
        for episode in range(1, self.config.test_episodes + 1):
            state, _ = env.reset(seed=episode_seed(self.config.seed, 2, episode))
            recorder = recording.start(env, record) if episode == 1 else None
            score, done, info, steps = 0.0, False, {}, 0
            while not done:
                action = int(self.greedy_actions(state[np.newaxis])[0])
                state, reward, terminated, truncated, info = env.step(action)
                score, steps, done = score + reward, steps + 1, terminated or truncated
                if recorder:
                    recorder.capture(env, steps, last=done)
            scores.append(float(info.get("episode", {}).get("r", score)))  # Atari: unclipped
            print(f"episode: {episode}/{self.config.test_episodes}, score: {scores[-1]:g}",
                  flush=True)
            if recorder:
                recorder.finish(record)
        if env is not self.env:
            env.close()
        print(f"mean score {np.mean(scores):.1f} over {len(scores)} episodes", flush=True)
        return scores

    def evaluate(self, episodes: int) -> np.ndarray:
        """Returns of `episodes` greedy episodes played side by side (one batched forward pass a
        step), each evaluation with seeds of its own, so a run repeats exactly, resumed or not."""
        while len(self._eval_envs) < episodes:
            self._eval_envs.append(make_env(self.env_name, self.config.max_episode_steps))
        envs = self._eval_envs[:episodes]
        evaluation = len(self.evaluations)
        states = np.stack([env.reset(seed=episode_seed(self.config.seed, 1, evaluation, i))[0]
                           for i, env in enumerate(envs)])
        returns = np.zeros(episodes)
        running = np.ones(episodes, dtype=bool)
        while running.any():
            actions = self.greedy_actions(states)
            for i in np.flatnonzero(running):
                states[i], reward, terminated, truncated, info = envs[i].step(actions[i])
                returns[i] += reward
                if terminated or truncated:
                    running[i] = False
                    returns[i] = info.get("episode", {}).get("r", returns[i])  # unclipped score
        return returns

    def evaluate_and_keep_best(self) -> None:
        """Greedy evaluation; save the model when it is the best so far; note when solved."""
        start = time.perf_counter()
        returns = self.evaluate(self.config.eval_episodes)
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
        self.report.evaluation(self, returns, time.perf_counter() - start, note)

    # ---- plumbing ----------------------------------------------------------------------------
    def compile(self) -> None:
        """Build Adam, the greedy policy, and trace the gradient steps and the target update
        (again after `load`). Where the tutorial compiled with RMSprop and called `predict` /
        `fit` at ~70-90 ms a call, a traced graph costs ~1 ms; a concrete function (one fixed
        signature, autograph off) also skips tf.function's argument matching, ~0.3-1 ms."""
        config = self.config
        learning_rate = config.learning_rate
        if config.lr_decay:
            # Late updates get small, so a policy that has been learned is no longer
            # overwritten by the noise of bootstrapped targets (the optimizer's step counter
            # drives the schedule, and it is part of every checkpoint).
            learning_rate = keras.optimizers.schedules.PolynomialDecay(
                learning_rate, self.planned_gradient_steps, end_learning_rate=0.0)
        self.optimizer = keras.optimizers.Adam(learning_rate, epsilon=config.adam_epsilon)
        self.optimizer.build(self.model.trainable_variables)  # no variable created in a graph
        self.greedy_actions = GreedyPolicy(self.model, self.state_dtype)

        def gradient_steps(*batches: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            # A graph loop (tf.scan) over the batches, traced and compiled once whatever their
            # number: step k sees the weights step k - 1 left, and whether it was applied.
            # Convolutions run several times slower inside a graph loop, so one step runs bare.
            def step(previous: tuple, batch: tuple) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
                *transitions, is_weights = batch
                return self.gradient_step(tuple(transitions), is_weights, previous[2])

            first = (tf.zeros_like(batches[-1][0]), tf.constant(0.0), tf.constant(True))
            if config.gradient_steps_per_call == 1:
                abs_errors, loss, applied = step(first, [batch[0] for batch in batches])
                return abs_errors[tf.newaxis], loss[tf.newaxis], applied
            abs_errors, losses, applied = tf.scan(step, batches, first)
            return abs_errors, losses, applied[-1]

        steps = config.gradient_steps_per_call
        states = tf.TensorSpec((steps, None, *self.state_shape), tf.as_dtype(self.state_dtype))
        per_sample = tf.TensorSpec((steps, None), tf.float32)
        self._gradient_steps = tf.function(
            gradient_steps, autograph=False, jit_compile=config.xla).get_concrete_function(
                states, tf.TensorSpec((steps, None), tf.int32), per_sample, states, per_sample,
                per_sample, per_sample)
        self._blend_target = tf.function(self.blend_target, autograph=False).get_concrete_function(
            tf.TensorSpec((), tf.float32))

    def start_episode(self) -> None:
        """Reset the environment with this episode's own seed; clear the episode's record."""
        self.state, _ = self.env.reset(seed=episode_seed(self.config.seed, 0, self.episode))
        self.episode_score = 0.0
        self.episode_actions = []
        checkpoint.check_environment_step(self.step, 0.0, self.state, reset=True)  # no NaN


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; bad input or a failed write (disk full) prints one `error:` line
    and returns 2, NaN or inf from training or the environment returns 3 (after saving the last
    good state)."""
    parser = settings.d3qn_parser(sys.modules[__name__])
    flags = settings.explicit_flags(sys.argv[1:] if argv is None else argv, parser)
    try:
        test_mode, resume, model, record = settings.pop_modes(flags)
        agent = DQNAgent(**flags)
        if test_mode:
            agent.test(model, record)
            return 0
        checkpoint.begin(agent, resume)  # lock the run's files; continue a checkpoint or start
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        with checkpoint.stop_requests():  # a stop once the budget is spent: the run finishes
            agent.run()
    except (NonFiniteError, checkpoint.WriteError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2 if isinstance(err, checkpoint.WriteError) else 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
