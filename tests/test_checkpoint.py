"""Checkpoints: resume as if never stopped, survive kill -9, Ctrl-C and SIGTERM, refuse what does
not fit.

The runs are real `python d3qn_agent.py` subprocesses on CartPole with a tiny network, but for
the NaN tests, the stops at the end of a run and the resumption after a stop signal, which run
`d3qn_agent` in this process.
"""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import checkpoint

ROOT = Path(__file__).resolve().parent.parent
RUN_NAME = "DDQN_CartPole-v1_Dueling_PER"
CHECKPOINT_FILES = {
    "online.weights.h5", "target.weights.h5", "optimizer.npz", "memory.npz", "progress.json"
}
LEARNING_STARTS = 64
TINY = [
    "--learning-starts", str(LEARNING_STARTS), "--memory-size", "400", "--batch-size", "32",
    "--hidden-units", "16", "16", "--train-frequency", "1", "--target-update", "50",
    "--exploration-steps", "300", "--eval-every", "1000000", "--eval-episodes", "1", "--seed", "3",
]
# Keras 3.15 itself triggers this NumPy 2 warning when saving a model (the in-process runs).
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def agent_command(directory: Path, *flags: str) -> list[str]:
    return [
        sys.executable, str(ROOT / "d3qn_agent.py"), *TINY,
        "--model-dir", str(directory / "models"), "--plot-dir", str(directory / "plots"), *flags,
    ]


def train(directory: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        agent_command(directory, *flags), cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def checkpoints(directory: Path) -> list[Path]:
    return checkpoint.list_checkpoints(directory / "models" / f"{RUN_NAME}.checkpoints")


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` with a hash of its bytes."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def assert_complete(step_directory: Path) -> None:
    assert {path.name for path in step_directory.iterdir()} == CHECKPOINT_FILES
    json.loads((step_directory / "progress.json").read_text())
    checkpoint.read_arrays(step_directory / "memory.npz")
    checkpoint.read_arrays(step_directory / "optimizer.npz")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished 200-step run with checkpoints at steps 100 and 200."""
    directory = tmp_path_factory.mktemp("trained")
    result = train(directory, "--total-steps", "200", "--checkpoint-every", "100")
    assert result.returncode == 0, result.stderr
    return directory


def test_resumed_run_matches_an_uninterrupted_one(tmp_path):
    # One go: 400 steps, checkpointing at 200 on the way. Then a fresh process resumes from that
    # step-200 checkpoint and trains the other 200 steps. (The budget stays 400 in both, since
    # beta is annealed over the budget.)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    result = train(straight, "--total-steps", "400", "--checkpoint-every", "200")
    assert result.returncode == 0, result.stderr
    halfway = checkpoints(straight)[0]
    assert halfway.name == "step-0000000200"
    shutil.copytree(halfway, resumed / halfway.relative_to(straight))
    result = train(resumed, "--total-steps", "400", "--checkpoint-every", "200", "--resume")
    assert result.returncode == 0, result.stderr
    assert "resuming from" in result.stdout and "at step 200" in result.stdout

    expected, got = checkpoints(straight)[-1], checkpoints(resumed)[-1]
    assert expected.name == got.name == "step-0000000400"
    expected_progress = json.loads((expected / "progress.json").read_text())
    got_progress = json.loads((got / "progress.json").read_text())
    for key in ("step", "episode", "epsilon", "scores", "rng", "episode_actions"):
        assert got_progress[key] == expected_progress[key], key
    expected_memory = checkpoint.read_arrays(expected / "memory.npz")
    got_memory = checkpoint.read_arrays(got / "memory.npz")
    assert got_memory.keys() == expected_memory.keys()
    for key, array in expected_memory.items():
        if array.dtype.kind == "f":  # priorities and beta: same up to float rounding
            np.testing.assert_allclose(got_memory[key], array, rtol=1e-4, err_msg=key)
        else:  # transitions, counters, generator state: identical
            np.testing.assert_array_equal(got_memory[key], array, err_msg=key)
    for name in ("online.weights.h5", "target.weights.h5"):
        assert_same_weights(expected / name, got / name)


def assert_same_weights(expected: Path, got: Path) -> None:
    import d3qn_agent

    networks = []
    for path in (expected, got):
        network = d3qn_agent.OurModel((4,), 2, dueling=True, hidden_units=(16, 16))
        network.load_weights(path)
        networks.append(network.get_weights())
    for expected_array, got_array in zip(*networks, strict=True):
        np.testing.assert_allclose(got_array, expected_array, rtol=1e-4, atol=1e-6)


def test_kill_while_checkpointing_leaves_a_complete_checkpoint(tmp_path):
    process = subprocess.Popen(
        agent_command(tmp_path, "--total-steps", "100000", "--checkpoint-every", "10"),
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while len(checkpoints(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        # A third is complete for a moment before the oldest is deleted.
        assert len(checkpoints(tmp_path)) >= 2, "no checkpoints were written"
        time.sleep(0.37)  # checkpoints are written every few ms: kill in the middle of things
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    # Only complete checkpoints count; a half-written one can only be a .tmp-* directory.
    for step_directory in checkpoints(tmp_path):
        assert_complete(step_directory)
    for path in (tmp_path / "models").glob("*.keras"):
        assert not path.name.startswith(checkpoint.TEMPORARY_PREFIX)
    last = int(checkpoints(tmp_path)[-1].name.removeprefix("step-"))
    result = train(
        tmp_path, "--total-steps", str(last + 20), "--checkpoint-every", "10", "--resume"
    )
    assert result.returncode == 0, result.stderr
    assert f"at step {last}" in result.stdout
    root = tmp_path / "models" / f"{RUN_NAME}.checkpoints"
    assert not list(root.glob(checkpoint.TEMPORARY_PREFIX + "*"))
    assert [path.name for path in checkpoints(tmp_path)][-1] == f"step-{last + 20:010d}"
    assert len(checkpoints(tmp_path)) == 2  # the last two are kept


def episode_lines(output: str) -> list[tuple[int, int]]:
    """(episode, step) of every "episode: N, step: S/T, ..." line of a run's output."""
    return [(int(episode), int(step)) for episode, step in
            re.findall(r"^episode: (\d+), step: (\d+)/", output, flags=re.MULTILINE)]


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM],
                         ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_and_sigterm_become_a_stop_request_and_the_old_handlers_come_back(signal_number):
    before = signal.getsignal(signal_number)
    with checkpoint.stop_requests() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal_number)
        assert stop.requested and stop.signal_name == signal_number.name
    assert signal.getsignal(signal_number) is before


def test_sigterm_writes_a_checkpoint_and_exits_cleanly_then_resume_continues(tmp_path, capsys):
    # `kill` (SIGTERM; Ctrl-C's SIGINT takes the same path, see the test above) while training:
    # the run stops after the current step.
    signal_number = signal.SIGTERM
    process = subprocess.Popen(
        agent_command(tmp_path, "--total-steps", "100000", "--tensorboard", str(tmp_path / "tb")),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        for line in process.stdout:  # wait for an episode that ended after gradient steps
            if episode_lines(line) and episode_lines(line)[0][1] > LEARNING_STARTS:
                break
        process.send_signal(signal_number)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    stdout = line + stdout
    assert process.returncode == 0, stderr
    stopped = re.search(rf"^interrupted by {signal_number.name} at step (\d+): checkpoint (\S+), "
                        r"last network (\S+), plots (\S+) and (\S+); continue with --resume$",
                        stdout, flags=re.MULTILINE)
    assert stopped, stdout
    step = int(stopped[1])
    [saved] = checkpoints(tmp_path)
    assert stopped[2] == str(saved) and saved.name == f"step-{step:010d}"
    assert_complete(saved)
    assert stopped[3] == str(tmp_path / "models" / f"{RUN_NAME}_last.keras")
    assert stopped[4] == str(tmp_path / "plots" / f"{RUN_NAME}.png")
    for path in stopped.group(3, 4, 5):  # the last network and both plots
        assert Path(path).is_file(), path
    # The TensorBoard events written before the signal were flushed: the first episode is there.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert "episode/score" in events.Tags()["tensors"]

    # --resume picks up at that step, inside the episode it was in (in-process: the subprocess
    # start-up is the slow part); its budget ends 300 steps later, time for a few episodes.
    episodes_before = episode_lines(stdout)
    import d3qn_agent

    flags = agent_command(tmp_path, "--total-steps", str(step + 300), "--resume")[2:]
    assert d3qn_agent.main(flags) == 0
    resumed = capsys.readouterr().out
    assert f"resuming from {saved} at step {step}" in resumed
    episodes_after = episode_lines(resumed)
    assert episodes_after, resumed
    (last_episode, last_step), (next_episode, next_step) = episodes_before[-1], episodes_after[0]
    assert next_episode == last_episode + 1 and last_step <= step < next_step
    assert [episode for episode, _ in episodes_after] == list(
        range(next_episode, next_episode + len(episodes_after)))
    assert "done: 300 steps in" in resumed


def resume_fails(directory: Path, capsys: pytest.CaptureFixture, *flags: str) -> str:
    """Run a bad --resume (in-process: a subprocess would spend its time starting up); check it
    fails with one error line and changes no file."""
    import d3qn_agent

    before = snapshot(directory)
    capsys.readouterr()
    assert d3qn_agent.main(agent_command(directory, "--total-steps", "400", *flags)[2:]) == 2
    assert snapshot(directory) == before
    stderr = capsys.readouterr().err
    error_lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, stderr
    return error_lines[0]


def test_resume_without_a_checkpoint(tmp_path, capsys):
    (tmp_path / "models").mkdir()
    assert "no checkpoint to resume from" in resume_fails(tmp_path, capsys, "--resume")


def test_resume_refuses_another_environment_or_network(tmp_path, trained, capsys):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    step_directory = str(checkpoints(tmp_path)[-1])
    error = resume_fails(tmp_path, capsys, "--env-name", "Acrobot-v1", "--resume", step_directory)
    assert step_directory in error and "env_name='CartPole-v1'" in error
    error = resume_fails(tmp_path, capsys, "--hidden-units", "32", "32", "--resume", step_directory)
    assert "hidden_units=[16, 16]" in error
    error = resume_fails(tmp_path, capsys, "--no-per", "--resume", step_directory)
    assert "memory='proportional'" in error


@pytest.mark.parametrize("damaged", sorted(CHECKPOINT_FILES))
def test_resume_refuses_a_corrupt_checkpoint(tmp_path, trained, capsys, damaged):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    step_directory = checkpoints(tmp_path)[-1]
    path = step_directory / damaged
    path.write_bytes(path.read_bytes()[: os.path.getsize(path) // 2])
    error = resume_fails(tmp_path, capsys, "--resume")
    assert str(path) in error


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # on purpose
def test_a_diverging_training_step_stops_with_the_last_good_state_saved(tmp_path):
    import d3qn_agent

    agent = d3qn_agent.DQNAgent(
        "CartPole-v1", learning_starts=64, memory_size=400, batch_size=32, hidden_units=(16, 16),
        eval_every=10**6, total_steps=1000, model_dir=str(tmp_path / "models"),
        plot_dir=str(tmp_path / "plots"),
    )
    env_step = agent.env.step

    def exploding_step(action):  # from step 100 on, rewards are finite but overflow float32
        observation, reward, terminated, truncated, info = env_step(action)
        return observation, 1e39 if agent.step >= 99 else reward, terminated, truncated, info

    agent.env.step = exploding_step
    with pytest.raises(d3qn_agent.NonFiniteError, match=r"non-finite loss.*Last good state saved"):
        agent.run()
    assert 100 <= agent.step < 1000
    assert all(np.isfinite(weights).all() for weights in agent.model.get_weights())
    saved = checkpoints(tmp_path)
    assert [path.name for path in saved] == [f"step-{agent.step:010d}"]
    assert_complete(saved[0])
    memory = checkpoint.read_arrays(saved[0] / "memory.npz")
    assert np.isfinite(memory["tree.sums"]).all()


# An environment with a bug: its reward or observation turns into POISON["value"] after
# POISON["after"] steps (no poison while POISON["field"] is "": the bug fixed).
POISON: dict[str, Any] = {"field": "", "value": 0.0, "after": 0}
POISONED = "PoisonedCartPole-v0"


class PoisonedCartPole(gym.Wrapper):
    """CartPole-v1 with POISON applied to its steps."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(gym.make("CartPole-v1", **kwargs))
        self.steps = 0

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if POISON["field"] and self.steps > POISON["after"]:
            if POISON["field"] == "reward":
                reward = POISON["value"]
            else:
                observation = observation.copy()
                observation[2] = POISON["value"]
        return observation, reward, terminated, truncated, info


if POISONED not in gym.registry:
    gym.register(POISONED, entry_point=PoisonedCartPole)


@pytest.mark.parametrize(("field", "value", "said"), [
    ("reward", float("nan"), "reward nan"), ("observation", -np.inf, "an observation holding -inf"),
])
def test_nan_from_the_environment_stops_the_run_and_resume_works_once_it_is_fixed(
        tmp_path, capsys, monkeypatch, field, value, said):
    import d3qn_agent

    monkeypatch.setitem(POISON, "field", field)
    monkeypatch.setitem(POISON, "value", value)
    monkeypatch.setitem(POISON, "after", 150)
    flags = agent_command(tmp_path, "--env-name", POISONED, "--total-steps", "300")[2:]
    assert d3qn_agent.main(flags) == 3
    root = tmp_path / "models" / f"DDQN_{POISONED}_Dueling_PER.checkpoints"
    [saved] = checkpoint.list_checkpoints(root)
    assert saved.name == "step-0000000150"  # the step before the bad one, which is not stored
    assert capsys.readouterr().err.splitlines() == [
        f"error: the environment returned {said} at env step 151. Last good state saved to "
        f"{saved}"]
    assert_complete(saved)
    memory = checkpoint.read_arrays(saved / "memory.npz")
    assert memory["storage.written"] == 150
    for key in ("storage.state", "storage.reward", "storage.next_state", "tree.sums"):
        assert np.isfinite(memory[key]).all(), key

    monkeypatch.setitem(POISON, "field", "")  # the environment fixed
    assert d3qn_agent.main([*flags, "--resume"]) == 0
    resumed = capsys.readouterr().out
    assert f"resuming from {saved} at step 150" in resumed and "done: 150 steps in" in resumed


@pytest.mark.parametrize("during", ["evaluate", "save"])
def test_a_stop_during_the_final_evaluation_or_save_lets_the_run_finish(
        tmp_path, capsys, monkeypatch, during):
    import d3qn_agent

    original = getattr(d3qn_agent.DQNAgent, during)

    def then_sigterm(agent, *args):  # at the end: the final evaluation, or saving a network
        if agent.step == 200:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(agent, *args)

    def outside_the_run(signum, frame):
        raise AssertionError("SIGTERM reached the handler from before the run")

    monkeypatch.setattr(d3qn_agent.DQNAgent, during, then_sigterm)
    previous = signal.signal(signal.SIGTERM, outside_the_run)
    try:
        assert d3qn_agent.main(agent_command(tmp_path, "--total-steps", "200")[2:]) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("done: 200 steps in"), lines[-3:]
    assert (tmp_path / "models" / f"{RUN_NAME}_last.keras").is_file()
