"""TensorBoard logging (--tensorboard) and the priority figure: the event file read back, the
figure's inputs by hand, and both written by a short CartPole run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA, small_agent
from tensorboard_helpers import read_events

import d3qn_agent
from d3qn_agent import DQNAgent, main
from d3qn_utils import reporting, settings
from d3qn_utils.atomic_files import read_arrays
from d3qn_utils.priority_figure import PriorityFigure, draw_priority_figure
from d3qn_utils.reporting import TensorBoardWriter, TrainingMeans
from PER import Memory, UniformMemory

RUN_NAME = "DDQN_CartPole-v1_Dueling_PER"
FORMAT_1 = DATA / "checkpoint_format_1" / "step-0000000400"


def tiny_agent(tmp_path: Path, **flags) -> DQNAgent:
    """A small agent that learns from step 100 to 600, evaluated at 300 and 600."""
    return small_agent(tmp_path, **{"total_steps": 600, "learning_starts": 100, "eval_every": 300,
                                    "eval_episodes": 2, **flags})


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[DQNAgent, Path]:
    """One short run with TensorBoard on: 600 steps, 250 gradient steps, one per call so that
    each is noted at its own env step."""
    tmp_path = tmp_path_factory.mktemp("run")
    agent = tiny_agent(tmp_path, tensorboard=str(tmp_path / "tb"), tensorboard_every=10,
                       gradient_steps_per_call=1)
    agent.run()
    return agent, tmp_path


def test_event_file_holds_every_tag_and_the_agents_own_numbers(trained):
    agent, tmp_path = trained
    events = read_events(tmp_path / "tb")
    assert set(events) == {
        "episode/score", "episode/average_score", "eval/greedy_mean_score", "train/loss",
        "train/mean_abs_td_error", "train/epsilon", "train/env_steps_per_second",
        "replay/beta", "replay/max_is_weight", "replay/min_is_weight",
    }
    # Episode scores are whole numbers on CartPole, exact in float32.
    assert [value for _, value in events["episode/score"]] == agent.scores
    steps = [step for step, _ in events["episode/score"]]
    assert steps == sorted(steps) and steps[-1] <= agent.step
    np.testing.assert_allclose([value for _, value in events["episode/average_score"]],
                               agent.average, rtol=1e-6)
    assert events["eval/greedy_mean_score"] == [
        (step, pytest.approx(mean)) for step, _, mean in agent.evaluations]
    # A gradient step every 2 env steps from step 100; a write every 10th: env steps 100, 120, ...
    assert [step for step, _ in events["train/loss"]] == list(range(100, 601, 20))
    betas = [value for _, value in events["replay/beta"]]
    assert 0.4 < betas[0] < betas[-1] <= 1.0
    assert all(0 < value <= 1 for _, value in events["replay/min_is_weight"])
    assert all(value > 0 for _, value in events["train/env_steps_per_second"])
    epsilon_at = dict(events["train/epsilon"])
    assert epsilon_at[500] == pytest.approx(agent.epsilon_at(499))  # of the 500th action


def test_run_writes_the_priority_figure_from_its_history(trained):
    agent, tmp_path = trained
    figure = tmp_path / "plots" / f"{RUN_NAME}_priorities.png"
    assert agent.Priority_plot_name == str(figure)
    assert figure.read_bytes()[:4] == b"\x89PNG"
    # A point every 50 gradient steps (every 100 env steps), beta rising to 1 at the end.
    figure_data = agent.report.priority_figure
    steps, betas, smallest, mean = zip(*figure_data.history, strict=True)
    assert list(steps) == [100, 200, 300, 400, 500, 600]
    assert list(betas) == sorted(betas) and betas[-1] == pytest.approx(1.0)
    assert all(0 < low <= average <= 1 for low, average in zip(smallest, mean, strict=True))
    assert figure_data.recent_batches == 251  # gradient steps at env steps 100, 102, ..., 600
    assert figure_data.stores == 600
    assert figure_data.replays_by_age.sum() == 251 * 16
    assert figure_data.replay_counts.sum() == 251 * 16  # nothing overwritten in a 1,000-slot memory


def test_tensorboard_flag_alone_writes_under_runs(tmp_path, monkeypatch):
    parser = settings.d3qn_parser(d3qn_agent)
    assert settings.explicit_flags(["--tensorboard"], parser) == {"tensorboard": True}
    assert settings.explicit_flags(["--tensorboard", "logs/a"], parser) == {
        "tensorboard": "logs/a"}
    monkeypatch.chdir(tmp_path)
    agent = tiny_agent(tmp_path, tensorboard=True)
    assert agent.report.tensorboard.log_dir == f"{reporting.TENSORBOARD_ROOT}/{RUN_NAME}" == (
        f"runs/{RUN_NAME}")
    assert (tmp_path / "runs" / RUN_NAME).is_dir()
    default = tiny_agent(tmp_path)  # TensorBoard is off unless asked for
    assert default.config.tensorboard is None and default.report.tensorboard is None


def test_unwritable_tensorboard_directory_is_one_error_before_training(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match=f"cannot write TensorBoard logs to '{blocker}/runs'"):
        TensorBoardWriter(str(blocker / "runs"))
    argv = ["--tensorboard", str(blocker / "runs"), "--hidden-units", "8",
            "--model-dir", str(tmp_path / "models"), "--plot-dir", str(tmp_path / "plots")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot write TensorBoard logs") and "\n" not in err
    assert not (tmp_path / "models").exists()


def test_writer_writes_what_it_is_given(tmp_path):
    writer = TensorBoardWriter(str(tmp_path / "tb"))
    writer.write(7, {"a/b": 0.25, "a/c": 3})
    writer.write(9, {"a/b": 0.5})
    writer.close()
    assert read_events(tmp_path / "tb") == {"a/b": [(7, 0.25), (9, 0.5)], "a/c": [(7, 3.0)]}


def test_training_means_average_each_interval_once():
    means = TrainingMeans()  # both programs' train/loss and train/mean_abs_td_error
    assert means.take() == {}
    means.add(1.0, np.array([0.5, 1.5]))
    means.add(3.0, np.array([2.0]))
    assert means.take() == {"train/loss": 2.0, "train/mean_abs_td_error": 1.5}
    assert means.take() == {}
    means.add(0.5, np.array([4.0]))
    assert means.take() == {"train/loss": 0.5, "train/mean_abs_td_error": 4.0}


def test_priority_figure_inputs_by_hand():
    stats = PriorityFigure(8, batch_size=2)
    memory = Memory(8, rng=0)  # alpha 0.6, epsilon 0.01
    for i in range(4):
        state = np.full(2, i, np.float32)
        stats.note_store(memory.store((state, 0, 0.0, state, False)))
    memory.batch_update(np.array([7, 8, 9, 10]), np.array([0.0, 0.0, 0.0, 0.99]))
    stats.note_sample(np.array([3, 3]), held=4)  # the newest, twice
    data = stats.data(memory)
    priorities = np.array([0.01, 0.01, 0.01, 1.0]) ** 0.6
    np.testing.assert_allclose(data["relative_probabilities"], 4 * priorities / priorities.sum())
    np.testing.assert_allclose(data["floor"], 4 * 0.01**0.6 / priorities.sum())
    # Ages 0 | 1-2 | 3 held 1 | 2 | 1 transitions; both replays were of age 0.
    np.testing.assert_array_equal(data["age_low"], [0, 1, 3])
    np.testing.assert_array_equal(data["age_high"], [1, 3, 7])
    np.testing.assert_allclose(data["replay_rate"], [2.0, 0.0, 0.0])
    np.testing.assert_allclose(data["uniform_rate"], [0.5, 0.5, 0.5])  # 2 draws / 4 held
    uniform_stats = PriorityFigure(8, batch_size=2)
    uniform = UniformMemory(8)
    uniform_stats.note_store(
        uniform.store((np.zeros(2, np.float32), 0, 0.0, np.zeros(2, np.float32), False)))
    uniform_data = uniform_stats.data(uniform)
    assert uniform_data["floor"] is None and uniform_data["relative_probabilities"].tolist() == [1]


def test_priority_history_survives_a_checkpoint_and_format_1_ones_still_load(trained, tmp_path):
    agent, _ = trained
    agent.checkpoint_root = str(tmp_path / "checkpoints")
    directory = Path(agent.save_checkpoint())
    restored = tiny_agent(tmp_path, total_steps=700)  # a resume must have steps left to train
    restored.resume(str(directory))
    figure, restored_figure = agent.report.priority_figure, restored.report.priority_figure
    assert restored_figure.history == figure.history
    assert restored_figure.recent_batches == figure.recent_batches
    np.testing.assert_array_equal(restored_figure.recent_is_weights, figure.recent_is_weights)
    np.testing.assert_array_equal(restored_figure.replays_by_age, figure.replays_by_age)
    # Format 1 kept the history and recent weights in progress.json, the replay statistics in
    # memory.npz (older checkpoints are refused: test_checkpoint.py).
    saved = json.loads((FORMAT_1 / "progress.json").read_text())
    # The run's flags, but its files go under tmp_path.
    old = small_agent(tmp_path, **{name: value for name, value in saved["run"]["flags"].items()
                                   if name not in ("model_dir", "plot_dir")})
    assert old.resume(str(FORMAT_1)).startswith(f"resuming from {FORMAT_1} at step 400\n")
    old_figure, memory = old.report.priority_figure, read_arrays(FORMAT_1 / "memory.npz")
    assert old_figure.history == [tuple(point) for point in saved["priority_history"]]
    assert old_figure.recent_batches == saved["recent_batches"] == 96
    np.testing.assert_array_equal(old_figure.recent_is_weights,
                                  np.array(saved["recent_is_weights"], np.float32))
    np.testing.assert_array_equal(old_figure.replays_by_age, memory["stats.replays_by_age"])
    assert old_figure.stores == memory["stats.stores"] and old.step == 400


@pytest.mark.filterwarnings("error::UserWarning")
def test_priority_figure_draws_without_history_or_replays(tmp_path):
    stats = PriorityFigure(8, batch_size=4)
    memory = Memory(8)
    state = np.zeros(2, np.float32)
    stats.note_store(memory.store((state, 0, 0.0, state, False)))
    path = tmp_path / "plots" / "p.png"
    draw_priority_figure(str(path), stats.data(memory), [],
                         np.ones((1, 4), np.float32), "no gradient step yet")
    assert path.read_bytes()[:4] == b"\x89PNG"
