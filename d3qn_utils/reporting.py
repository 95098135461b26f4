"""What a training run shows besides its algorithm: its log lines, TensorBoard and its plots.

`DQNAgent` tells a `TrainingReport` what happened; a `Forecast` the time left. apex.py's report
(ape_x/report.py) shares the `Forecast`, the `TensorBoardWriter` and the `TrainingMeans`.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from argparse import Namespace
from typing import Any

import keras
import numpy as np
from matplotlib.figure import Figure

from d3qn_utils.atomic_files import atomic_file
from d3qn_utils.priority_figure import PriorityFigure

AVERAGE_WINDOW = 50  # episodes in the moving average that is printed and plotted (the tutorial's)
PLOT_REFRESH_SECONDS = 20.0  # redraw the learning curve at most this often during training
TENSORBOARD_ROOT = "runs"  # --tensorboard without a directory writes to runs/<run name>
BACKEND_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX"}  # the first line names the backend
ESTIMATE_AFTER_SECONDS = 30.0  # seconds of training measured before the estimate is given


def describe(config: Namespace, replay: str) -> str:
    """One line naming the flags that are on and the `replay` variant ("proportional PER"), for
    the plot title and the log."""
    parts = ["double DQN" if config.ddqn else "DQN", "dueling" if config.dueling else "", replay,
             f"{config.n_step}-step returns" if config.n_step > 1 else "",
             f"soft target (tau={config.tau})" if config.soft_update
             else f"target copy every {config.target_update} steps",
             "exponential epsilon" if config.epsilon_greedy else "linear epsilon",
             "bfloat16 convolutions" if config.bfloat16 else "",
             f"{config.n_envs} environments stepped together" if config.n_envs > 1 else ""]
    return ", ".join(part for part in parts if part)


def duration(seconds: float) -> str:
    """A duration as a reader plans with it: "45 s", "14 min", "2 h 55 min" (rounded)."""
    if seconds < 89.5:
        return f"{max(0, round(seconds))} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


class Forecast:
    """What the rest of a run will take at its speed since `begin` (called after the first
    gradient steps, so neither warm-up nor compilation counts); `now`: time.perf_counter()."""

    def __init__(self, total_steps: int, unit: str = "step") -> None:
        self.total_steps = total_steps
        self.unit = unit  # what a step is called: "step", apex.py's "env step"
        self.mark: tuple[float, int] | None = None  # (time, step) where the measurement began
        self.estimated = False

    def begin(self, step: int, now: float) -> None:
        """Start measuring at `step` (the first call counts; later ones do nothing)."""
        if self.mark is None:
            self.mark = (now, step)

    def tell(self, step: int, now: float) -> tuple[str | None, str | None]:
        """(the estimate line, the first time it is due; "2 h 50 min" to `total_steps` at the
        speed since `begin`, once the estimate was given), each None when not due."""
        if self.mark is None or now <= self.mark[0] or step <= self.mark[1]:
            return None, None  # no step or time measured yet
        speed = (step - self.mark[1]) / (now - self.mark[0])
        left = duration(max(0, self.total_steps - step) / speed)
        if self.estimated:
            return None, left
        if step >= self.total_steps or now - self.mark[0] < ESTIMATE_AFTER_SECONDS:
            return None, None
        self.estimated = True
        return (f"estimate: about {left} to {self.unit} {self.total_steps:,} at "
                f"{speed:,.{0 if speed >= 10 else 1}f} {self.unit}s/s"), left


def tensorboard_dir(flag: Any, name: str) -> str | None:
    """Where --tensorboard writes: None when off, TENSORBOARD_ROOT/<name> for the flag alone."""
    if not flag:
        return None
    return os.path.join(TENSORBOARD_ROOT, name) if flag is True else str(flag)


class TensorBoardWriter:
    """Scalars for TensorBoard, written with `tf.summary` to event files in `log_dir` (checked at
    once: ValueError naming it if it cannot be written). A scalar is costly: not every step."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        try:
            os.makedirs(log_dir, exist_ok=True)
            tempfile.TemporaryFile(dir=log_dir).close()
        except OSError as error:
            raise ValueError(f"cannot write TensorBoard logs to {log_dir!r}: "
                             f"{error.strerror or error}") from error
        self._writer: Any = None

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Write each `tag: value` of `scalars` at x-axis position `step`."""
        import tensorflow as tf  # on any Keras backend: tf.summary writes the event files

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        with self._writer.as_default(step=step):
            for tag, value in scalars.items():
                tf.summary.scalar(tag, float(value))

    def close(self) -> None:
        """Flush and close the event file; a later `write` opens a new one."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class TrainingMeans:
    """The loss and mean |TD error| of the updates since they were last taken: TensorBoard gets
    their means over an interval, not every update. O(1) an update."""

    def __init__(self) -> None:
        self._sums = np.zeros(3)  # loss, mean |TD error|, updates

    def add(self, loss: float, abs_errors: np.ndarray) -> None:
        """Note one update's loss and |TD errors|."""
        self._sums += (float(loss), float(abs_errors.mean()), 1)

    def take(self) -> dict[str, float]:
        """The means since the last take as TensorBoard scalars ({} after no update); the next
        interval starts."""
        if not self._sums[2]:
            return {}
        mean_loss, mean_error = self._sums[:2] / self._sums[2]
        self._sums[:] = 0.0
        return {"train/loss": mean_loss, "train/mean_abs_td_error": mean_error}


class TrainingReport:
    """The log lines, TensorBoard scalars and plots of one `DQNAgent` run of `config` (what its
    replay statistics add to a sample: docs/classic_control.md). A context manager, so that
    TensorBoard's event file is closed however the loop ends. Its `state_dict` is the priority
    figure's data."""

    BYTES_PER_SLOT = PriorityFigure.BYTES_PER_SLOT  # the priority figure's counters per slot

    def __init__(self, config: Namespace, plot_path: str, priority_plot_path: str, *, replay: str,
                 prioritized: bool, tensorboard_dir: str | None, image_states: bool,
                 warning: str | None, ring: bool = True, streams: int = 1) -> None:
        self.config, self.description = config, describe(config, replay)
        self.prioritized = prioritized  # the memory's PRIORITIZED: beta and IS weights to log
        self.plot_path, self.priority_plot_path = plot_path, priority_plot_path
        self.image_states, self.warning = image_states, warning
        # The memory's streams (one per environment), laid out as its storage lays them out
        self.priority_figure = PriorityFigure(config.memory_size, config.batch_size, ring,
                                              streams)
        self.tensorboard = TensorBoardWriter(tensorboard_dir) if tensorboard_dir else None
        self.evaluation_seconds = 0.0  # wall time spent in greedy evaluations by this process
        self.training_means = TrainingMeans()  # since TensorBoard's last training scalars
        self._start_clocks(0)

    def __enter__(self) -> TrainingReport:
        return self

    def __exit__(self, *exception: object) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()

    def state_dict(self) -> dict[str, np.ndarray]:
        """What the report keeps across a checkpoint: the priority figure's data."""
        return self.priority_figure.state_dict()

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        self.priority_figure.load_state_dict(arrays)

    def start(self, step: int, settings_notes: list[str]) -> None:
        """The run's first lines (what trains, notes, warnings, TensorBoard's place) at `step`."""
        print(f"training on {self.config.env_name} until step {self.config.total_steps:,}: "
              f"{self.description}; Keras on {BACKEND_NAMES[keras.backend.backend()]}",
              flush=True)
        if settings_notes:
            print(f"settings: {', '.join(settings_notes)}", flush=True)
        if self.warning:
            print(self.warning, file=sys.stderr, flush=True)
        if self.tensorboard is not None:
            log_dir = self.tensorboard.log_dir
            print(f"TensorBoard logs: {log_dir} (tensorboard --logdir "
                  f"{os.path.dirname(log_dir) or '.'})", flush=True)
        if self.config.bfloat16 and not self.image_states:
            print("note: BFLOAT16 changes only the convolutions of an image torso; this game's "
                  "vector states keep their float32 MLP", flush=True)
        self._start_clocks(step)

    def _start_clocks(self, step: int) -> None:
        """Measure the speed, the time left and the time since the last plot from now on."""
        now = time.perf_counter()
        self._last_plot_time = now
        self._start = self._interval_start = (now, step)  # (time, env step) of this process
        self.forecast = Forecast(self.config.total_steps)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if self.tensorboard is not None:
            self.tensorboard.write(step, scalars)

    def stored(self, slot: int | None) -> None:
        """A transition went into `slot` of the memory (for the priority figure's ages); None:
        the memory dropped it."""
        self.priority_figure.note_store(slot)

    def gradient_steps(self, step: int, slots: np.ndarray, held_per_stream: int | np.ndarray,
                       losses: np.ndarray, abs_errors: np.ndarray, is_weights: np.ndarray,
                       epsilon: float, beta: float) -> None:
        """Note one `replay` call's gradient steps (one row each), numbered by env step (step //
        TRAIN_FREQUENCY: the same in every run, learning started or not), drawn from the
        transitions each stream holds, `held_per_stream` (`ReplayMemory.held_per_stream`); every
        TENSORBOARD_EVERY steps their averaged scalars go to TensorBoard."""
        last = step // self.config.train_frequency
        self.priority_figure.note_replay(slots, held_per_stream, step, last, beta, is_weights)
        self.forecast.begin(step, time.perf_counter())
        if self.tensorboard is None:
            return
        for gradient_step, loss, errors, weights in zip(
                range(last - len(losses) + 1, last + 1), losses, abs_errors, is_weights,
                strict=True):
            self.training_means.add(loss, errors)
            if gradient_step % self.config.tensorboard_every:
                continue
            now, (then, start_step) = time.perf_counter(), self._interval_start
            scalars = {**self.training_means.take(), "train/epsilon": epsilon,
                       "train/env_steps_per_second": (step - start_step) / max(now - then, 1e-9)}
            if self.prioritized:
                scalars.update({"replay/beta": beta, "replay/max_is_weight": weights.max(),
                                "replay/min_is_weight": weights.min()})
            self.write(step, scalars)
            self._interval_start = (now, step)

    def episode(self, step: int, episode: int, score: float, epsilon: float,
                average: float, now: float | None = None) -> None:
        """The tutorial's line for a finished episode at `now` (time.perf_counter(), by default
        now), after the estimate when due."""
        self.write(step, {"episode/score": score, "episode/average_score": average})
        now = time.perf_counter() if now is None else now
        then, start_step = self._start
        estimate, left = self.forecast.tell(step, now)
        if estimate:
            print(estimate, flush=True)
        print(f"episode: {episode}, step: {step}/{self.config.total_steps}, "
              f"score: {score:g}, e: {epsilon:.2f}, average: {average:.1f}, "
              f"{(step - start_step) / (now - then):.0f} steps/s"
              + (f", {left} left" if left else ""), flush=True)

    def evaluation(self, step: int, returns: np.ndarray, seconds: float, note: str) -> None:
        """The line and scalar of a greedy evaluation at env step `step` that took `seconds`."""
        self.evaluation_seconds += seconds
        self.write(step, {"eval/greedy_mean_score": float(returns.mean())})
        print(f"evaluation at step {step}: mean {returns.mean():.1f} +/- "
              f"{returns.std():.1f} over {len(returns)} greedy episodes{note}", flush=True)

    def redraw_if_due(self, step: int, scores: list[float], average: list[float],
                      evaluations: list[tuple[int, int, float]]) -> None:
        """Redraw the learning curve if PLOT_REFRESH_SECONDS passed (a redraw is slow)."""
        if time.perf_counter() - self._last_plot_time > PLOT_REFRESH_SECONDS:
            self.draw_learning_curve(step, scores, average, evaluations)

    def draw_learning_curve(self, step: int, scores: list[float], average: list[float],
                            evaluations: list[tuple[int, int, float]]) -> None:
        """Raw episode scores, their moving average and the greedy evaluations, to `plot_path`."""
        figure = Figure(figsize=(10, 5), layout="constrained")  # Agg canvas, no GUI, no pyplot
        axes = figure.add_subplot()
        episodes = np.arange(1, len(scores) + 1)
        axes.plot(episodes, scores, color="tab:blue", alpha=0.45, label="episode score")
        axes.plot(episodes, average, color="tab:red", label=f"{AVERAGE_WINDOW}-episode average")
        if evaluations:
            _, eval_episodes_at, eval_means = zip(*evaluations, strict=True)
            axes.plot(eval_episodes_at, eval_means, "k.", markersize=7,
                      label=f"greedy evaluation ({self.config.eval_episodes} episodes)")
        axes.set(xlabel="Episode", ylabel="Score")
        axes.set_title(f"{self.config.env_name}: {self.description}\nseed {self.config.seed}, "
                       f"{step:,} environment steps", fontsize=10)
        axes.grid(alpha=0.3)
        axes.legend(loc="upper left")
        with atomic_file(self.plot_path) as temporary:
            figure.savefig(temporary, dpi=100)
        self._last_plot_time = time.perf_counter()

    def draw(self, step: int, scores: list[float], average: list[float],
             evaluations: list[tuple[int, int, float]], memory: Any) -> str:
        """Draw the learning curve and `memory`'s priority figure: "plots A and B" (or "plot A")."""
        self.draw_learning_curve(step, scores, average, evaluations)
        title = f"{self.config.env_name}: what {memory.describe()} did, step {step:,}"
        if self.priority_figure.draw(self.priority_plot_path, memory, title):
            return f"plots {self.plot_path} and {self.priority_plot_path}"
        return f"plot {self.plot_path}"

    def stopped(self, step: int, signal_name: str, checkpoint_path: str, last_model: str,
                plots: str) -> None:
        """Say where a run stopped by a signal left everything (`plots`: what `draw` drew)."""
        print(f"interrupted by {signal_name} at step {step}: checkpoint {checkpoint_path}, "
              f"last network {last_model}, {plots}; continue with --resume", flush=True)

    def finish(self, step: int, final_evaluation: float, best_evaluation: float,
               steps_to_solve: int | None, model_path: str, plots: str) -> None:
        """The run's summary line (`plots`: what `draw` drew)."""
        elapsed, steps = time.perf_counter() - self._start[0], step - self._start[1]
        solved = "not solved" if steps_to_solve is None else f"solved at step {steps_to_solve}"
        training = elapsed - self.evaluation_seconds
        # A resumed run whose best network's file was gone (its first note said so) keeps that
        # best without the file, unless it evaluates a better network
        model = (f"model {model_path}" if os.path.exists(model_path)
                 else f"no model at {model_path} (the best network's file was missing)")
        print(f"done: {steps:,} steps in {elapsed:.0f} s, {self.evaluation_seconds:.0f} s of "
              f"them in evaluations ({steps / max(training, 1e-9):.0f} training steps/s); "
              f"final evaluation {final_evaluation:.1f}, best {best_evaluation:.1f}; {solved}; "
              f"{model}, {plots}", flush=True)
