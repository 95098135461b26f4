"""Checkpoint formats: a checkpoint of format 1, written before checkpoints had a version (commit
58876ad, `python d3qn_agent.py --total-steps 800 --learning-starts 200 --memory-size 500
--batch-size 16 --hidden-units 16 16 --checkpoint-every 400 --eval-every 400 --eval-episodes 2
--seed 5`, its step-400 checkpoint and the last network that run reached at step 800), resumes
to exactly that network; any other format is refused, naming it."""

import json
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest

from d3qn_agent import DQNAgent
from d3qn_utils import agent_checkpoint
from d3qn_utils.run_files import LATEST

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

FORMAT_1 = Path(__file__).parent / "data" / "checkpoint_format_1"
FLAGS = {"total_steps": 800, "learning_starts": 200, "memory_size": 500, "batch_size": 16,
         "hidden_units": (16, 16), "checkpoint_every": 400, "eval_every": 400,
         "eval_episodes": 2, "seed": 5}
RUN = "run-20261128-023953"


def format_1_checkpoint(model_dir: Path) -> Path:
    """The format-1 checkpoint, where the run that wrote it kept it under `model_dir`."""
    directory = model_dir / "DDQN_CartPole-v1_Dueling_PER.checkpoints" / RUN / "step-0000000400"
    shutil.copytree(FORMAT_1 / "step-0000000400", directory)
    return directory


def test_a_format_1_checkpoint_resumes_to_the_network_its_run_reached(tmp_path, capsys):
    format_1_checkpoint(tmp_path)
    agent = DQNAgent("CartPole-v1", model_dir=str(tmp_path), plot_dir=str(tmp_path), **FLAGS)
    agent.begin(LATEST)
    assert capsys.readouterr().out.splitlines()[1].startswith(f"continuing {RUN}, started ")
    assert agent.step == 400 and agent.report.priority_figure.recent_batches > 0
    agent.run()
    reached = keras.models.load_model(FORMAT_1 / "last_network_of_the_run.keras")
    for weights, expected in zip(agent.model.get_weights(), reached.get_weights(), strict=True):
        np.testing.assert_array_equal(weights, expected)
    newest = agent_checkpoint.read_state(Path(agent.save_checkpoint()))[0]
    assert newest["format"] == agent_checkpoint.FORMAT  # what it writes is the new format


@pytest.mark.parametrize(("edit", "said"), [
    (lambda progress: {**progress, "format": 3}, "has format 3, which this version cannot read"),
    (lambda progress: {key: value for key, value in progress.items() if key != "fingerprint"},
     "has format None, which this version cannot read"),
    (lambda progress: {key: value for key, value in progress.items()
                       if key != "priority_history"},
     "has no format number and is not of format 1"),
])
def test_a_checkpoint_of_another_format_is_refused_naming_it(tmp_path, edit, said):
    directory = format_1_checkpoint(tmp_path)
    progress_file = directory / "progress.json"
    progress_file.write_text(json.dumps(edit(json.loads(progress_file.read_text()))))
    agent = DQNAgent("CartPole-v1", model_dir=str(tmp_path), plot_dir=str(tmp_path), **FLAGS)
    with pytest.raises(ValueError, match=said):
        agent.resume(str(directory))
    assert agent.step == 0  # nothing was loaded


@pytest.mark.parametrize("changed", [{"total_steps": 600}, {"total_steps": 1000},
                                     {"gradient_steps_per_call": 8}])
def test_beta_reaches_1_at_the_end_of_a_resumed_run_whatever_its_new_budget(tmp_path, changed):
    format_1_checkpoint(tmp_path)
    agent = DQNAgent("CartPole-v1", model_dir=str(tmp_path), plot_dir=str(tmp_path),
                     **{**FLAGS, "eval_every": 1000, "checkpoint_every": 0, **changed})
    agent.begin(LATEST)
    beta = agent.MEMORY.beta
    assert 0.4 < beta < 1.0
    agent.run()
    assert agent.MEMORY.beta == pytest.approx(1.0)
