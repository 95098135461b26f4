"""What a training run shows besides its algorithm: its log lines, TensorBoard and its plots.

`d3qn_agent.DQNAgent` calls a `TrainingReport` in one line where something happened (a gradient
step, an episode, an evaluation, the start and end of `run`); the report prints the progress
lines, writes TensorBoard scalars (`--tensorboard`), redraws the learning curve
`plots/<name>.png` and, at the end, the priority figure `plots/<name>_priorities.png`. What a run
will cost, an early "estimate: about 2 h 55 min to step 500,000 at 47 steps/s" line and the time
left on each progress line, is a `Forecast` (apex.py's too).
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

from d3qn_utils import checkpoint, settings

AVERAGE_WINDOW = 50  # episodes in the moving average that is printed and plotted (the tutorial's)
PLOT_REFRESH_SECONDS = 20.0  # redraw the learning curve at most this often during training
TENSORBOARD_ROOT = "runs"  # --tensorboard without a directory writes to runs/<run name>
BACKEND_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX"}  # the first line names the backend
ESTIMATE_AFTER_SECONDS = 30.0  # seconds of training measured before the estimate is given


def describe(config: Namespace) -> str:
    """One line naming the flags that are on, for the plot title and the log."""
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
    if config.bfloat16:
        parts.append("bfloat16 convolutions")
    return ", ".join(parts)


def duration(seconds: float) -> str:
    """A duration as a reader plans with it: "45 s", "14 min", "2 h 55 min" (rounded)."""
    if seconds < 89.5:
        return f"{max(0, round(seconds))} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


class Forecast:
    """What the rest of a run will take, at the speed it has had since its training began.

    The speed is measured from `begin`, which a script calls once its first gradient steps are
    done, so that neither the fast steps before learning starts nor the compilation count;
    evaluations count as they come. `estimate` gives the one early line, "estimate: about 2 h
    55 min to step 500,000 at 47 steps/s", once ESTIMATE_AFTER_SECONDS are measured; from then on
    `time_left` gives each progress line its time left. Times are `time.perf_counter()` values,
    passed in.
    """

    def __init__(self, total_steps: int, unit: str = "step") -> None:
        self.total_steps = total_steps
        self.unit = unit  # what a step is called: "step", apex.py's "env step"
        self.mark: tuple[float, int] | None = None  # (time, step) where the measurement began
        self.estimated = False

    def begin(self, step: int, now: float) -> None:
        """Start measuring at `step` (the first call counts; later ones do nothing)."""
        if self.mark is None:
            self.mark = (now, step)

    def speed(self, step: int, now: float) -> float | None:
        """Steps per second since `begin`; None before any step or time was measured."""
        if self.mark is None or now <= self.mark[0] or step <= self.mark[1]:
            return None
        return (step - self.mark[1]) / (now - self.mark[0])

    def estimate(self, step: int, now: float) -> str | None:
        """The estimate line, the first time it is due (None before, after, and at the end)."""
        speed = self.speed(step, now)
        if (self.estimated or speed is None or step >= self.total_steps
                or now - self.mark[0] < ESTIMATE_AFTER_SECONDS):
            return None
        self.estimated = True
        return (f"estimate: about {duration((self.total_steps - step) / speed)} to "
                f"{self.unit} {self.total_steps:,} at {speed:,.{0 if speed >= 10 else 1}f} "
                f"{self.unit}s/s")

    def time_left(self, step: int, now: float) -> str | None:
        """"2 h 50 min" to TOTAL_STEPS at the speed since `begin`, once the estimate was given."""
        speed = self.speed(step, now)
        if not self.estimated or speed is None:
            return None
        return duration(max(0, self.total_steps - step) / speed)


def onednn_enabled() -> bool | None:
    """Whether TensorFlow runs its oneDNN kernels in this process (None: it cannot tell).

    Decided when TensorFlow is imported: on Linux by itself on CPUs with neural-network
    instructions, elsewhere with TF_ENABLE_ONEDNN_OPTS=1 (docs/atari.md)."""
    try:
        from tensorflow.python.util import _pywrap_util_port  # not in TensorFlow's public API
        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return None


def tensorboard_dir(flag: Any, name: str) -> str | None:
    """Where --tensorboard writes: None when off, TENSORBOARD_ROOT/<name> for the flag alone."""
    if not flag:
        return None
    return os.path.join(TENSORBOARD_ROOT, name) if flag is True else str(flag)


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
        import tensorflow as tf  # on any Keras backend: tf.summary writes the event files

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


def draw_learning_curve(path: str, scores: list[float], average: list[float],
                        evaluations: list[tuple[int, int, float]], eval_episodes: int,
                        title: str) -> None:
    """Raw episode scores, their moving average and the greedy evaluations, saved to `path`."""
    figure = Figure(figsize=(10, 5), layout="constrained")  # Agg canvas, no GUI, no pyplot
    axes = figure.add_subplot()
    episodes = np.arange(1, len(scores) + 1)
    axes.plot(episodes, scores, color="tab:blue", alpha=0.45, label="episode score")
    axes.plot(episodes, average, color="tab:red", label=f"{AVERAGE_WINDOW}-episode average")
    if evaluations:
        _, eval_episodes_at, eval_means = zip(*evaluations, strict=True)
        axes.plot(eval_episodes_at, eval_means, "k.", markersize=7,
                  label=f"greedy evaluation ({eval_episodes} episodes)")
    axes.set_xlabel("Episode")
    axes.set_ylabel("Score")
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left")
    with checkpoint.atomic_file(path) as temporary:
        figure.savefig(temporary, dpi=100)


class TrainingReport:
    """The log lines, TensorBoard scalars and plots of one `DQNAgent` run.

    Used as a context manager around the training loop, so TensorBoard's buffered events reach
    the disk however the loop ends. Per gradient step it costs a few microseconds: the IS
    weights go to the priority figure, and with TensorBoard the loss and mean |TD error| are
    averaged over TENSORBOARD_EVERY steps before one write (~1 ms).
    """

    def __init__(self, agent: Any) -> None:
        config = agent.config
        self.tensorboard_dir = tensorboard_dir(config.tensorboard, agent.name)
        self.tensorboard = (TensorBoardWriter(self.tensorboard_dir) if self.tensorboard_dir
                            else None)
        self.evaluation_seconds = 0.0  # wall time spent in greedy evaluations by this process
        self._last_plot_time = time.perf_counter()
        self._start = (time.perf_counter(), 0)  # (time, env step) where this process began
        self._interval_sums = [0.0, 0.0, 0]  # loss, mean |TD error|, gradient steps since a write
        self._interval_start = (time.perf_counter(), 0)  # (time, env step) of the last write
        self.forecast = Forecast(config.total_steps)

    def __enter__(self) -> TrainingReport:
        return self

    def __exit__(self, *exception: object) -> None:
        if self.tensorboard is not None:
            self.tensorboard.flush()

    def start(self, agent: Any) -> None:
        """The run's first lines: what trains, the values presets decided, a warning if it will
        not train (`settings.no_training_warning`), TensorBoard's place."""
        print(f"training on {agent.config.env_name} until step {agent.config.total_steps:,}: "
              f"{describe(agent.config)}; Keras on {BACKEND_NAMES[keras.backend.backend()]}",
              flush=True)
        if agent.settings_notes:
            print(f"settings: {', '.join(agent.settings_notes)}", flush=True)
        if warning := settings.no_training_warning(agent.config):
            print(warning, file=sys.stderr, flush=True)
        if self.tensorboard_dir:
            print(f"TensorBoard logs: {self.tensorboard_dir} (tensorboard --logdir "
                  f"{os.path.dirname(self.tensorboard_dir) or '.'})", flush=True)
        if agent.config.bfloat16 and len(agent.state_shape) != 3:
            print("note: BFLOAT16 changes only the convolutions of an image torso; this game's "
                  "vector states keep their float32 MLP", flush=True)
        if (len(agent.state_shape) == 3 and not agent.config.xla
                and keras.backend.backend() == "tensorflow" and onednn_enabled() is False):
            print("note: oneDNN is off in this TensorFlow, and XLA too (--no-xla): the documented "
                  "Pong run had TF_ENABLE_ONEDNN_OPTS=1 set; without it, --xla is the faster "
                  "choice (docs/atari.md)", flush=True)
        now = time.perf_counter()
        self._last_plot_time = now
        self._start = self._interval_start = (now, agent.step)
        self.forecast = Forecast(agent.config.total_steps)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Write `scalars` to TensorBoard at env step `step` (nothing without TensorBoard)."""
        if self.tensorboard is not None:
            self.tensorboard.write(step, scalars)

    def gradient_steps(self, agent: Any, tree_idx: np.ndarray, losses: np.ndarray,
                       abs_errors: np.ndarray, is_weights: np.ndarray) -> None:
        """Note the gradient steps of one `replay` call: the transitions it drew (`tree_idx`,
        for the priority figure's replay counts), and per step the loss, |TD errors| and IS
        weights, as `gradient_step` notes each."""
        memory = agent.MEMORY
        agent.priority_figure.statistics.note_sample(tree_idx - (memory.capacity - 1), len(memory))
        self.forecast.begin(agent.step, time.perf_counter())
        last = agent.step // agent.config.train_frequency
        for k, loss in enumerate(losses):
            self.gradient_step(agent, last - len(losses) + 1 + k, float(loss), abs_errors[k],
                               is_weights[k])

    def gradient_step(self, agent: Any, gradient_step: int, loss: float, abs_errors: np.ndarray,
                      is_weights: np.ndarray) -> None:
        """Note gradient step number `gradient_step`: its IS weights for the priority figure;
        every TENSORBOARD_EVERY steps the averaged loss, |TD error|, epsilon, speed, IS weights."""
        beta = getattr(agent.MEMORY, "beta", 0.0)  # uniform replay: weights 1, as with beta = 0
        agent.priority_figure.note_batch(agent.step, gradient_step, beta, is_weights)
        if self.tensorboard is None:
            return
        sums = self._interval_sums
        sums[0] += loss
        sums[1] += float(abs_errors.mean())
        sums[2] += 1
        if gradient_step % agent.config.tensorboard_every:
            return
        now, (then, start_step) = time.perf_counter(), self._interval_start
        scalars = {
            "train/loss": sums[0] / sums[2],
            "train/mean_abs_td_error": sums[1] / sums[2],
            "train/epsilon": agent.epsilon,
            "train/env_steps_per_second": (agent.step - start_step) / max(now - then, 1e-9),
        }
        if agent.config.use_per:
            scalars.update({"replay/beta": beta, "replay/max_is_weight": is_weights.max(),
                            "replay/min_is_weight": is_weights.min()})
        self.write(agent.step, scalars)
        self._interval_sums = [0.0, 0.0, 0]
        self._interval_start = (now, agent.step)

    def episode(self, agent: Any, score: float, average: float) -> None:
        """The tutorial's line for a finished episode (with the speed and, once estimated, the
        time left), after the estimate when it is due; and its scalars."""
        self.write(agent.step, {"episode/score": score, "episode/average_score": average})
        now, (then, start_step) = time.perf_counter(), self._start
        if estimate := self.forecast.estimate(agent.step, now):
            print(estimate, flush=True)
        left = self.forecast.time_left(agent.step, now)
        print(f"episode: {agent.episode}, step: {agent.step}/{agent.config.total_steps}, "
              f"score: {score:g}, e: {agent.epsilon:.2f}, average: {average:.1f}, "
              f"{(agent.step - start_step) / (now - then):.0f} steps/s"
              + (f", {left} left" if left else ""), flush=True)

    def evaluation(self, agent: Any, returns: np.ndarray, seconds: float, note: str) -> None:
        """The line and scalar of a greedy evaluation that took `seconds`."""
        self.evaluation_seconds += seconds
        self.write(agent.step, {"eval/greedy_mean_score": float(returns.mean())})
        print(f"evaluation at step {agent.step}: mean {returns.mean():.1f} +/- "
              f"{returns.std():.1f} over {len(returns)} greedy episodes{note}", flush=True)

    def redraw_if_due(self, agent: Any) -> None:
        """Redraw the learning curve if PLOT_REFRESH_SECONDS passed (a redraw costs ~0.1 s)."""
        if time.perf_counter() - self._last_plot_time > PLOT_REFRESH_SECONDS:
            self.draw_learning_curve(agent)

    def draw_learning_curve(self, agent: Any) -> None:
        """Draw the learning curve to `agent.Plot_name`."""
        draw_learning_curve(agent.Plot_name, agent.scores, agent.average, agent.evaluations,
                            agent.config.eval_episodes,
                            f"{agent.config.env_name}: {describe(agent.config)}\nseed "
                            f"{agent.config.seed}, {agent.step:,} environment steps")
        self._last_plot_time = time.perf_counter()

    def draw(self, agent: Any) -> str:
        """Draw the learning curve and the priority figure (~0.4 s); return "plots A and B", or
        "plot A" before the first gradient step, when there is no priority figure yet."""
        self.draw_learning_curve(agent)
        config = agent.config
        kind = agent.MEMORY.kind
        title = (f"{config.env_name}: what {kind} replay did (alpha {config.per_alpha:g}), "
                 f"step {agent.step:,}" if config.use_per else
                 f"{config.env_name}: uniform replay, step {agent.step:,}")
        if agent.priority_figure.draw(agent.Priority_plot_name, agent.MEMORY, title):
            return f"plots {agent.Plot_name} and {agent.Priority_plot_name}"
        return f"plot {agent.Plot_name}"

    def stopped(self, agent: Any, signal_name: str, checkpoint_path: str, last_model: str) -> None:
        """Draw the plots and say where a run stopped by a signal left everything."""
        plots = self.draw(agent)
        print(f"interrupted by {signal_name} at step {agent.step}: checkpoint {checkpoint_path}, "
              f"last network {last_model}, {plots}; continue with --resume", flush=True)

    def finish(self, agent: Any) -> None:
        """Draw the plots and print the run's summary line."""
        plots = self.draw(agent)
        elapsed = time.perf_counter() - self._start[0]
        steps = agent.step - self._start[1]
        solved = (f"solved at step {agent.steps_to_solve}" if agent.steps_to_solve is not None
                  else "not solved")
        training = elapsed - self.evaluation_seconds
        print(f"done: {steps:,} steps in {elapsed:.0f} s, {self.evaluation_seconds:.0f} s of "
              f"them in evaluations ({steps / max(training, 1e-9):.0f} training steps/s); "
              f"final evaluation {agent.evaluations[-1][2]:.1f}, best "
              f"{agent.best_evaluation:.1f}; {solved}; model {agent.Model_name}, {plots}",
              flush=True)
