"""Ape-X's learner (apex.py), in the driver: it launches the replay and the actors, trains on the
replay's batches, sends the new priorities back, publishes its weights, evaluates and saves.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ape_x.actor import Actor, actor_epsilon
from ape_x.replay import IDLE_SLEEP, Replay
from ape_x.report import ApexReport
from d3qn_agent import ADVANTAGE_LAYER, OurModel, episode_seed, weighted_loss
from d3qn_utils import training_session
from d3qn_utils.atomic_files import save_model
from d3qn_utils.checks import box_observations, discrete_actions
from d3qn_utils.games import make_env, storage_spec, torso
from d3qn_utils.gradient_steps import Batches, compiled_backend, make_optimizer
from d3qn_utils.greedy_policy import GreedyPolicy, keep_best, play_greedy
from d3qn_utils.network_size import check_mlp_fits
from d3qn_utils.reporting import tensorboard_dir
from PER import Memory


def run_name(env_name: str) -> str:
    """File stem of a run's model and plot: apex_CartPole-v1."""
    return "apex_" + env_name.replace("/", "-")


class Learner:
    """The learner and the run's driver: builds the networks, launches the replay and the
    actors, trains, evaluates, and saves; its `ApexReport` logs and plots.

    The network (`OurModel`), the optimizer (Adam) and the compiled double-DQN IS-weighted
    gradient step (`weighted_loss` in `compiled_backend().GradientSteps`) are d3qn_agent.py's,
    one step a call, without a `DQNAgent`'s memory, report or run lock. Cost per update: one
    compiled step, while the replay draws the next batch in its own process.
    """

    def __init__(self, config: argparse.Namespace) -> None:
        self.config = config
        keras.utils.set_random_seed(config.seed)  # the networks' first weights, as DQNAgent's
        env = make_env(config.env_name, config.max_episode_steps)  # ValueError before Ray starts
        self.action_size = discrete_actions(config.env_name, env.action_space)
        self.state_shape = box_observations(config.env_name, env.observation_space)
        self.state_dtype = env.observation_space.dtype
        self.solved_score = env.spec.reward_threshold if env.spec else None
        # The replay's memory is allocated in its own Ray actor: check here that it fits.
        Memory.check_fits(config.memory_size, storage_spec(config.env_name), self.state_shape,
                          self.state_dtype, Replay.BYTES_PER_SLOT)
        image_torso = torso(config.env_name)
        check_mlp_fits(self.state_shape, config.hidden_units, self.action_size, config.dueling,
                       config.batch_size)  # before the networks are built, here and in the actors
        self.model = OurModel(self.state_shape, self.action_size, config.dueling,
                              config.hidden_units, image_torso=image_torso)
        self.target_model = OurModel(self.state_shape, self.action_size, config.dueling,
                                     config.hidden_units, image_torso=image_torso)
        self.target_model.set_weights(self.model.get_weights())
        self.greedy_actions = GreedyPolicy(self.model, self.state_dtype, head=ADVANTAGE_LAYER)
        self.learn = compiled_backend().GradientSteps(
            functools.partial(weighted_loss, self.model, self.target_model, double=config.ddqn,
                              loss="huber"),
            self.model, self.target_model,
            make_optimizer("adam", config.learning_rate, config.adam_epsilon), config.grad_clip,
            None, 1, self.state_shape, self.state_dtype, xla=True,  # XLA: d3qn_agent's default
            after_call=self.greedy_actions.weights_changed)
        self.eval_envs = [env, *(make_env(config.env_name, config.max_episode_steps)
                                 for _ in range(config.eval_episodes - 1))]
        name = run_name(config.env_name)
        self.model_path = os.path.join(config.model_dir, name + ".keras")
        self.last_model_path = os.path.join(config.model_dir, name + "_last.keras")
        self.epsilons = [actor_epsilon(i, config.num_actors, config.epsilon,
                                       config.epsilon_alpha) for i in range(config.num_actors)]
        self.report = ApexReport(config, self.epsilons,
                                 os.path.join(config.plot_dir, name + ".png"),
                                 tensorboard_dir(config.tensorboard, name))
        self.updates = 0
        self.env_steps = 0
        self.version = 0  # of the weights published
        self.next_eval = config.eval_every  # the env step of the next evaluation
        self.evaluations: list[tuple[int, int, float, float]] = []  # (env steps, updates, mean, s)
        self.best = -math.inf
        self.solved: tuple[int, float] | None = None  # (env steps, seconds) at the first solve
        self.replay: Any = None
        self.actors: list[Any] = []
        self.runs: list[Any] = []

    def save(self, path: str) -> None:
        """Save the online network as a `.keras` file, atomically (as DQNAgent.save)."""
        save_model(self.model, path)

    def weights(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(online, target) weights, as an actor's `set_weights` takes them."""
        return self.model.get_weights(), self.target_model.get_weights()

    # ---- launching ---------------------------------------------------------------------------
    def launch(self) -> None:
        """Start the replay (on this node, near the learner) and the actors (anywhere)."""
        config = self.config
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        replay_name = f"apex_replay_{os.getpid()}_{time.time_ns()}"  # unique per run
        self.replay = ray.remote(Replay).options(
            name=replay_name, num_cpus=1, scheduling_strategy=here).remote(config)
        actor_class = ray.remote(Actor).options(num_cpus=config.actor_cpus,
                                                max_restarts=config.actor_restarts,
                                                max_task_retries=config.actor_restarts)
        self.actors = [actor_class.remote(i, config, replay_name)
                       for i in range(config.num_actors)]
        self.publish()
        self.runs = [actor.run.remote() for actor in self.actors]

    def publish(self) -> None:
        """Put (online, target) weights in the object store and tell the replay where (without
        a launched replay, as when a test runs the actors in this process, they take `weights`)."""
        if self.replay is None:
            return
        self.version += 1
        self.replay.publish.remote(self.version, [ray.put(self.weights())])

    # ---- training ----------------------------------------------------------------------------
    def update(self, batch: tuple[np.ndarray, ...], is_weights: np.ndarray) -> np.ndarray:
        """One gradient step on a batch the replay sampled; its |TD errors| from before the step
        (the new priorities). The target network is a copy every TARGET_UPDATE updates."""
        (abs_errors,), (loss,) = self.learn(Batches.dealt(batch, is_weights, 1), self.env_steps)
        self.report.trained(loss, abs_errors)
        self.updates += 1
        if self.updates % self.config.target_update == 0:
            self.target_model.set_weights(self.model.get_weights())
        return abs_errors

    def train(self) -> None:
        """Update until TOTAL_STEPS env steps are collected (or solved, with STOP_WHEN_SOLVED),
        with an evaluation every EVAL_EVERY env steps and a progress line every LOG_EVERY s.

        Raises RuntimeError if an actor fails for good (an error in its code, or its restarts
        used up), noticed at the next progress line.
        """
        config = self.config
        self.report.start()
        while self.report.replay_size < max(config.learning_starts, 1):
            time.sleep(0.2)
            self.refresh_status()
            self.log_if_due()
        self.report.training_started(self.env_steps)
        pending = self.replay.sample.remote(config.batch_size)
        while self.env_steps < config.total_steps:
            *sampled, self.env_steps = ray.get(pending)
            while config.updates_per_step and (
                    self.updates >= config.updates_per_step * self.env_steps):
                time.sleep(IDLE_SLEEP)  # the cap: wait for the actors' data
                self.env_steps = ray.get(self.replay.collected.remote())
                self.log_if_due()
            pending = self.replay.sample.remote(config.batch_size)  # drawn while we train
            if self.train_step(sampled, self.replay.update_priorities.remote):
                break
            self.log_if_due()

    def train_step(self, sampled: list, update_priorities: Callable[..., Any]) -> bool:
        """The training loop's body, with Ray or without: one update on `sampled`, the replay's
        (tree_idx, stamps, batch, is_weights), its new priorities to `update_priorities` (the
        replay's), the weights published every PUBLISH_EVERY updates and an evaluation every
        EVAL_EVERY env steps. True when the run should stop: solved, with STOP_WHEN_SOLVED."""
        config = self.config
        tree_idx, stamps, batch, is_weights = sampled
        update_priorities(tree_idx, stamps, self.update(batch, is_weights))
        if self.updates % config.publish_every == 0:
            self.publish()
        if self.env_steps >= self.next_eval:
            self.next_eval = (self.env_steps // config.eval_every + 1) * config.eval_every
            self.evaluate()
            return bool(config.stop_when_solved and self.solved)
        return False

    def log_if_due(self) -> None:
        """Every LOG_EVERY seconds: fetch the status (raising if an actor failed) and log."""
        if self.report.log_due():
            self.refresh_status()
            self.report.progress(self.env_steps, self.updates)

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
        status = self.replay.status.remote(len(self.report.episodes))
        self.env_steps = self.report.status(ray.get(status))

    def evaluate(self) -> None:
        """Greedy evaluation, its episodes seeded as DQNAgent's; save the best network."""
        number, config = len(self.evaluations), self.config
        seeds = [episode_seed(config.seed, 1, number, i) for i in range(config.eval_episodes)]
        returns = play_greedy(self.eval_envs, self.greedy_actions, seeds)
        mean, seconds = float(returns.mean()), time.perf_counter() - self.report.start_time
        self.evaluations.append((self.env_steps, self.updates, mean, seconds))
        self.best, self.solved, note = keep_best(
            mean, (self.env_steps, seconds), self.best, self.solved, self.solved_score,
            self.save, self.model_path)
        self.report.evaluation(self.env_steps, self.updates, returns, seconds, note)

    def run(self) -> None:
        """Launch, train, stop the actors, evaluate the last network, save and summarise. A
        stop signal once the training ended lets the evaluation and the saving finish."""
        self.launch()
        try:
            self.train()
        finally:
            self.report.training_ended(self.env_steps, self.updates)
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
        self.save(self.last_model_path)
        self.report.draw(self.updates, self.evaluations)
        self.report.close()
        if self.replay is not None:
            ray.kill(self.replay)
            self.replay = None
        if ending:
            self.report.stopped(ending, self.env_steps, self.last_model_path,
                                self.model_path if self.evaluations else None)
        else:
            self.report.finish(self.env_steps, self.updates, self.best, self.solved,
                               self.model_path)
