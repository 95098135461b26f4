"""An Ape-X actor (apex.py): its own environment, fixed exploration rate and copy of the networks;
it sends blocks of transitions, with the priorities it measured, to the replay (ape_x/replay.py).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import ray
import tensorflow as tf

from ape_x.replay import IDLE_SLEEP
from d3qn_agent import ADVANTAGE_LAYER, OurModel, episode_seed, td_errors
from d3qn_utils.games import make_env, torso
from d3qn_utils.greedy_policy import GreedyPolicy, epsilon_greedy, unclipped_score
from PER import UniformMemory


def actor_epsilon(index: int, num_actors: int, epsilon: float, alpha: float) -> float:
    """Exploration rate of actor `index` of `num_actors` (Horgan et al. 2018, section 4.1):
    eps_i = epsilon ** (1 + alpha * i / (N - 1)), from epsilon down to epsilon ** (1 + alpha).
    A single actor uses epsilon."""
    if num_actors == 1:
        return epsilon
    return epsilon ** (1.0 + alpha * index / (num_actors - 1))


class Actor:
    """One Ape-X actor: its own environment, exploration rate and copy of the networks.

    `collect_block` plays until a block is ready and returns it with the |TD errors| of its
    transitions, computed with the local networks exactly as the learner's train step computes
    them (`td_errors` on `PER`'s n-step batch). `run` (the Ray method) sends blocks to the
    replay until it answers stop, pulling fresh weights every WEIGHT_SYNC_EVERY env steps; it
    keeps one block in flight, so a slow replay slows the actor instead of queueing blocks.

    Cost per env step: one env step plus, unless exploring, one forward pass (`epsilon_greedy`
    with a `GreedyPolicy`, as DQNAgent acts: numpy for an MLP); per block, one batched TD-error
    computation (three forward passes of BLOCK_SIZE states).
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
        image_torso = torso(config.env_name)
        self.model = OurModel(state_shape, self.action_size, config.dueling, config.hidden_units,
                              image_torso=image_torso)
        self.target_model = OurModel(state_shape, self.action_size, config.dueling,
                                     config.hidden_units, image_torso=image_torso)
        self.rng = np.random.default_rng([config.seed, 2, index])
        self._compile_functions(tf.as_dtype(self.env.observation_space.dtype), state_shape)
        self.weights_version = -1
        self.steps = 0  # env steps taken by this actor
        self.episode = 0
        self.returns: list[float] = []  # scores of the episodes finished since the last block
        self.state = self._reset()
        self.score = 0.0  # the rewards summed as the env gives them (Atari's: clipped)
        self.outbox = self._new_outbox()
        self._unsent_steps = 0

    def _compile_functions(self, dtype: tf.DType, state_shape: tuple[int, ...]) -> None:
        """Build the greedy policy and trace the |TD errors| once, for blocks of any length (an
        episode's end cuts one short): a block's three forward passes are then one graph call.
        Closures, not methods: Ray's actor wrapper adds an argument to every method, which
        tf.function would trace."""
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
        return epsilon_greedy(self.greedy_actions, state, self.epsilon, self.rng, self.action_size)

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
        are the scores of the episodes finished meanwhile, unclipped as DQNAgent reports them
        (`unclipped_score`). Only a termination is stored as done.
        """
        while True:
            action = self.act(self.state)
            next_state, reward, terminated, truncated, info = self.env.step(action)
            self.steps += 1
            self._unsent_steps += 1
            self.score += reward
            self.outbox.store((self.state, action, reward, next_state, terminated))
            self.state = next_state
            if terminated or truncated:
                self.returns.append(unclipped_score(info, self.score))
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
