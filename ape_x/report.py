"""What an Ape-X run (apex.py) shows: a progress line every LOG_EVERY seconds, a line per greedy
evaluation, TensorBoard scalars at env steps collected, the plot of each actor's episodes and the
learner's evaluations, and the summary. The replay's status and the learner's events feed it.
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from d3qn_utils.atomic_files import atomic_file
from d3qn_utils.reporting import Forecast, TensorBoardWriter, TrainingMeans

RECENT_EPISODES = 10  # episodes per actor in a progress line's mean return
SHOWN_ACTORS = 8  # actors named in a progress line and the plot's legend, spread over the epsilons


def shown_actors(num_actors: int) -> list[int]:
    """At most SHOWN_ACTORS actor indices, from the most to the least exploring."""
    spread = np.linspace(0, num_actors - 1, min(num_actors, SHOWN_ACTORS))
    return sorted(set(spread.round().astype(int).tolist()))


class ApexReport:
    """The lines, TensorBoard scalars and plot of one Ape-X run of `config`, its actors exploring
    at `epsilons`; the same scalars as d3qn_agent.py's --tensorboard, at env steps collected.

    It keeps what the replay reported (`status`): each actor's episodes, (re)starts and env
    steps, the replay's size; and the clock marks of the run,
    of its first update and of its end, from which `rates` measures the training alone.
    """

    def __init__(self, config: argparse.Namespace, epsilons: list[float], plot_path: str,
                 tensorboard_dir: str | None) -> None:
        self.config, self.epsilons, self.plot_path = config, epsilons, plot_path
        # The writer checks its directory now, before any Ray starts.
        self.tensorboard = TensorBoardWriter(tensorboard_dir) if tensorboard_dir else None
        self.training_means = TrainingMeans()  # since the last progress line
        self.episodes: list[tuple[int, int, float]] = []  # (actor, env steps then, return)
        self.recent = [deque(maxlen=RECENT_EPISODES) for _ in range(config.num_actors)]
        self.starts = [0] * config.num_actors  # (re)starts per actor, as the replay counted
        self.actor_steps = [0] * config.num_actors  # env steps per actor
        self.replay_size = 0
        self.start_time = time.perf_counter()
        self._last_log = (self.start_time, 0, 0)  # (time, env steps, updates) of the last line
        self.training_start = self._last_log  # the same at the first update (rates leave out
        # the start-up: Ray, the actors' TensorFlow, the first LEARNING_STARTS transitions)
        self.training_end: tuple[float, int, int] | None = None  # and at the last one
        # What the run will cost, at the speed measured from the first update on.
        self.forecast = Forecast(config.total_steps, unit="env step")
        self.next_log = self.start_time  # when the next progress line is due

    def start(self) -> None:
        """The run's first line; the first progress line comes LOG_EVERY seconds later."""
        config = self.config
        print(f"Ape-X on {config.env_name}: {config.num_actors} actors (epsilon "
              + ", ".join(f"{e:.3g}" for e in self.epsilons)
              + f"), replay {config.memory_size:,}, batch {config.batch_size}, "
              f"{config.n_step}-step returns, until {config.total_steps:,} env steps", flush=True)
        self.next_log = time.perf_counter() + config.log_every

    def status(self, status: dict[str, Any]) -> int:
        """Take the replay's `Replay.status`; the env steps collected by all actors."""
        self.actor_steps = status["env_steps"]
        self.replay_size = status["size"]
        self.starts = status["starts"]
        self.episodes += status["episodes"]
        for actor, _, score in status["episodes"]:
            self.recent[actor].append(score)
        return sum(self.actor_steps)

    def log_due(self) -> bool:
        """Whether LOG_EVERY seconds passed since the last progress line."""
        return time.perf_counter() >= self.next_log

    def trained(self, loss: float, abs_errors: np.ndarray) -> None:
        """Note one learner update (for the next line's TensorBoard means)."""
        self.training_means.add(loss, abs_errors)

    def training_started(self, env_steps: int) -> None:
        """Mark the first update, from which `rates` and the estimate measure."""
        self.training_start = (time.perf_counter(), env_steps, 0)
        self.forecast.begin(env_steps, self.training_start[0])

    def training_ended(self, env_steps: int, updates: int) -> None:
        self.training_end = (time.perf_counter(), env_steps, updates)

    def rates(self, env_steps: int, updates: int) -> tuple[float, float]:
        """(env steps collected, learner updates) per second from the first update to the end
        of training (or, while training, to now with the counts given)."""
        then, steps, first_updates = self.training_start
        now, last_steps, last_updates = self.training_end or (
            time.perf_counter(), env_steps, updates)
        seconds = max(now - then, 1e-9)
        return (last_steps - steps) / seconds, (last_updates - first_updates) / seconds

    def progress(self, env_steps: int, updates: int, now: float | None = None) -> None:
        """One line at `now` (time.perf_counter(), by default now): rates since the last line
        and the time left, replay size, recent returns per actor; after the estimate when it is
        due. Its numbers go to TensorBoard too."""
        now = time.perf_counter() if now is None else now
        estimate, left = self.forecast.tell(env_steps, now)
        if estimate:
            print(estimate, flush=True)
        last_time, last_steps, last_updates = self._last_log
        seconds = max(now - last_time, 1e-9)
        shown = shown_actors(self.config.num_actors)
        parts = [f"actor {actor} (e {self.epsilons[actor]:.2g}) "
                 + (f"{np.mean(self.recent[actor]):.1f}" if self.recent[actor] else "-")
                 for actor in shown]
        restarted = [f"actor {actor} {starts - 1}x" for actor, starts in enumerate(self.starts)
                     if starts > 1]
        print(f"[{now - self.start_time:5.0f} s] env steps {env_steps:,} "
              f"({(env_steps - last_steps) / seconds:.0f}/s"
              + (f", {left} left" if left else "") + f"), updates {updates:,} "
              f"({(updates - last_updates) / seconds:.0f}/s), replay "
              f"{self.replay_size:,}/{self.config.memory_size:,}; returns (last "
              f"{RECENT_EPISODES}): " + ", ".join(parts)
              + (f"; restarted: {', '.join(restarted)}" if restarted else ""), flush=True)
        scalars = {"train/env_steps_per_second": (env_steps - last_steps) / seconds,
                   "train/updates_per_second": (updates - last_updates) / seconds,
                   "replay/size": self.replay_size, **self.training_means.take()}
        for actor in shown:
            if self.recent[actor]:
                scalars[f"episode/actor_{actor}_average_score"] = float(np.mean(self.recent[actor]))
        self.write(env_steps, scalars)
        self._last_log = (now, env_steps, updates)
        self.next_log = now + self.config.log_every

    def write(self, env_steps: int, scalars: dict[str, float]) -> None:
        """Write `scalars` to TensorBoard at `env_steps` collected (no-op without it)."""
        if self.tensorboard is not None:
            self.tensorboard.write(env_steps, scalars)

    def evaluation(self, env_steps: int, updates: int, returns: np.ndarray, seconds: float,
                   note: str) -> None:
        """The line and scalar of a greedy evaluation `seconds` after the start."""
        self.write(env_steps, {"eval/greedy_mean_score": float(returns.mean())})
        print(f"evaluation at env step {env_steps:,} (update {updates:,}, {seconds:.0f} s): mean "
              f"{returns.mean():.1f} +/- {returns.std():.1f} over {len(returns)} greedy "
              f"episodes{note}", flush=True)

    def draw(self, updates: int, evaluations: list[tuple[int, int, float, float]]) -> None:
        """Episode returns of each actor and the greedy `evaluations` (env steps, updates, mean,
        seconds) against env steps, to `plot_path`."""
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
        if evaluations:
            steps, _, means, _ = zip(*evaluations, strict=True)
            axes.plot(steps, means, "k-o", markersize=4,
                      label=f"learner's greedy evaluation ({self.config.eval_episodes} episodes)")
        axes.set_xlabel("environment steps collected by all actors")
        axes.set_ylabel("episode return")
        axes.set_title(f"Ape-X on {self.config.env_name}: {self.config.num_actors} actors, "
                       f"{updates:,} learner updates, seed {self.config.seed}", fontsize=10)
        axes.grid(alpha=0.3)
        axes.legend(loc="upper left", fontsize=8)
        with atomic_file(self.plot_path) as temporary:
            figure.savefig(temporary, dpi=100)

    def close(self) -> None:
        """Flush and close TensorBoard's event file."""
        if self.tensorboard is not None:
            self.tensorboard.close()

    def stopped(self, ending: str, env_steps: int, last_model: str, best_model: str | None
                ) -> None:
        """Where a run that ended early (`ending`: "interrupted by SIGTERM") left its files."""
        best = f"best {best_model}" if best_model else "no best network (no evaluation yet)"
        print(f"{ending} at env step {env_steps:,}: last network {last_model}, {best}, plot "
              f"{self.plot_path}", flush=True)

    def finish(self, env_steps: int, updates: int, best: float,
               solved: tuple[int, float] | None, model_path: str) -> None:
        """The summary line of a run that spent its budget (or was solved)."""
        seconds = time.perf_counter() - self.start_time
        solved_at = (f"solved at env step {solved[0]:,}, {solved[1]:.0f} s after start"
                     if solved else "not solved")
        steps_per_second, updates_per_second = self.rates(env_steps, updates)
        print(f"done: {env_steps:,} env steps and {updates:,} updates in {seconds:.0f} s "
              f"({steps_per_second:.0f} env steps/s and {updates_per_second:.0f} updates/s "
              f"from the first update on); best evaluation {best:.1f}; {solved_at}; model "
              f"{model_path}, plot {self.plot_path}", flush=True)
