"""N_ENVS: environments stepped together. Each schedule counts environment steps and fires at the
first step past each of its periods, none skipped (`crossed`); each environment's transitions go
to its own stream, its episodes seeded in the order they start; a run with several environments
resumes from a checkpoint taken mid-episodes as if never stopped, and refuses another N_ENVS."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import (
    CARTPOLE,
    DATA,
    ROOT,
    assert_same_checkpoint,
    command_line,
    small_agent,
    small_flags,
    the_error_line,
)
from memory_helpers import ReservoirMemory, picked, registered_memories

import d3qn_agent
from benchmarks.same_log import without_timings
from d3qn_agent import episode_seed
from d3qn_utils import run_files
from d3qn_utils.environments import Environments, crossed
from d3qn_utils.replay_memory import replay_variant, variant_flags
from d3qn_utils.training_session import NonFiniteError

# --- Environments: the steps they took, counted by themselves ------------------------------


def test_environments_count_their_own_steps_and_name_the_one_that_returned_nan():
    import gymnasium as gym

    def nan_reward_on_its_third_step() -> gym.Env:
        steps = iter(range(1, 100))
        return gym.wrappers.TransformReward(
            gym.make(CARTPOLE), lambda reward: np.nan if next(steps) == 3 else reward)

    others = iter([nan_reward_on_its_third_step(), gym.make(CARTPOLE)])
    envs = Environments(gym.make(CARTPOLE), 3, lambda: next(others),
                        seed_of=lambda number: number)
    envs.start_episodes()
    for _ in range(2):
        envs.step([0, 0, 0])
    assert envs.state_dict()["steps_taken"] == 6
    # Environment 1 of 3 in the third step of all three: env step 6 + 1 + 1.
    with pytest.raises(NonFiniteError, match=r"reward nan at env step 8$"):
        envs.step([0, 0, 0])
    assert envs.steps_taken == 6  # the step that stopped counts nothing


def test_a_replay_of_open_episodes_names_the_env_step_the_run_took_and_ends_at_its_count():
    import gymnasium as gym

    def nan_reward_on_its_third_step() -> gym.Env:
        steps = iter(range(1, 100))
        return gym.wrappers.TransformReward(
            gym.make(CARTPOLE), lambda reward: np.nan if next(steps) == 3 else reward)

    envs = Environments(gym.make(CARTPOLE), 3, lambda: gym.make(CARTPOLE),
                        seed_of=lambda number: number)
    envs.start_episodes()
    for _ in range(5):  # CartPole cannot fail within 5 steps: three open episodes of 5 actions
        envs.step([0, 1, 0])
    state = envs.state_dict()
    assert state["steps_taken"] == 15
    replayed = Environments(gym.make(CARTPOLE), 3, lambda: gym.make(CARTPOLE),
                            seed_of=lambda number: number)
    replayed.load_state_dict(state)
    assert replayed.steps_taken == 15 and replayed.state_dict() == state
    assert replayed.replayed() == ("replayed 3 open episodes (15 env steps) from their seeds "
                                   "and actions, to go on mid-episode")
    # Environment 1's third action was the run's env step 2 * 3 + 1 + 1, in its third step.
    others = iter([nan_reward_on_its_third_step(), gym.make(CARTPOLE)])
    poisoned = Environments(gym.make(CARTPOLE), 3, lambda: next(others),
                            seed_of=lambda number: number)
    with pytest.raises(NonFiniteError, match=r"reward nan at env step 8$"):
        poisoned.load_state_dict(state)


def test_a_saved_episodes_started_not_past_every_open_episodes_number_is_refused_naming_it():
    import gymnasium as gym

    envs = Environments(gym.make(CARTPOLE), 3, lambda: gym.make(CARTPOLE),
                        seed_of=lambda number: number)
    envs.start_episodes()
    envs.step([0, 1, 0])
    state = envs.state_dict()
    assert state["episodes_started"] == 3  # episodes 0, 1 and 2 open
    for started in (2, 0):  # the next episode would be number 2 again, or 0
        loaded = Environments(gym.make(CARTPOLE), 3, lambda: gym.make(CARTPOLE),
                              seed_of=lambda number: number)
        with pytest.raises(ValueError, match=re.escape(
                f"saved episodes_started {started} is not more than the open episodes' numbers "
                "[0, 1, 2]: the next episode would reuse one's seed")):
            loaded.load_state_dict({**state, "episodes_started": started})
        assert (loaded.episodes_started, loaded.numbers, loaded.steps_taken) == (
            0, [None] * 3, 0)  # nothing taken
    loaded.load_state_dict({**state, "episodes_started": 4})  # an episode may have started since


# --- crossed: how often a schedule is due after a step of N environments -------------------


@pytest.mark.parametrize("period", [1, 2, 3, 7])
def test_with_one_environment_crossed_is_the_step_modulo_the_period(period):
    assert [list(crossed(step - 1, step, period)) for step in range(1, 60)] == [
        [step] if step % period == 0 else [] for step in range(1, 60)]


@pytest.mark.parametrize("n_envs", [2, 3, 4, 8])
@pytest.mark.parametrize("period", [1, 2, 3, 5, 7])
def test_crossed_gives_every_multiple_passed_at_the_first_step_past_it(n_envs, period):
    steps = range(0, 120, n_envs)
    due = {after: list(crossed(after - n_envs, after, period)) for after in steps[1:]}
    # none skipped, none twice
    assert [m for multiples in due.values() for m in multiples] == list(
        range(period, steps[-1] + 1, period))
    for after, multiples in due.items():  # each multiple at the first step at or past it
        assert multiples == [m for m in range(after - n_envs + 1, after + 1) if m % period == 0]
    assert list(crossed(5, 5, 2)) == list(crossed(-3, 0, 2)) == []


# --- the schedules of a run of several environments ----------------------------------------

SCHEDULE_RUN = {"total_steps": 90, "learning_starts": 20, "train_frequency": 2,
                "gradient_steps_per_call": 2, "target_update": 5, "eval_every": 20,
                "eval_episodes": 1, "checkpoint_every": 25, "max_episode_steps": 45}


def recording(calls: list[int], agent: Any, method: Callable) -> Callable:
    """`method` of `agent`, noting the env step of each call in `calls`."""
    def noted(*args: Any, **kwargs: Any) -> Any:
        calls.append(agent.step)
        return method(*args, **kwargs)
    return noted


def first_steps_past(period: int, start: int, end: int, n_envs: int) -> list[int]:
    """The step counts (multiples of n_envs) at which the multiples of `period` in [start, end]
    are first reached."""
    return [-(-multiple // n_envs) * n_envs for multiple in range(start, end + 1)
            if multiple % period == 0]


@pytest.mark.parametrize("n_envs", [3, 5])  # replay() every 4 steps: 0 or 1, or 1 to 3, a step
def test_every_period_n_envs_does_not_divide_fires_at_the_first_step_past_it(tmp_path, n_envs):
    agent = small_agent(tmp_path, n_envs=n_envs, **SCHEDULE_RUN)
    calls: dict[str, list[int]] = {"replay": [], "update_target_model": [],
                                   "save_checkpoint": []}
    for name, steps in calls.items():
        setattr(agent, name, recording(steps, agent, getattr(agent, name)))
    numbered: list[int] = []  # the gradient steps as the reports number them
    note_replay = agent.report.priority_figure.note_replay

    def noted(slots, held, step, last_gradient_step, beta, is_weights):
        numbered.extend(range(last_gradient_step - len(is_weights) + 1, last_gradient_step + 1))
        note_replay(slots, held, step, last_gradient_step, beta, is_weights)

    agent.report.priority_figure.note_replay = noted
    agent.run()
    assert agent.step == 90
    # As many replay() calls as periods of TRAIN_FREQUENCY * GRADIENT_STEPS_PER_CALL passed from
    # LEARNING_STARTS on: the gradient steps per env step of one environment.
    assert calls["replay"] == first_steps_past(4, 20, 90, n_envs)
    assert len(calls["replay"]) == len(first_steps_past(4, 20, 90, 1))
    # Numbered as one environment's run numbers them (step // TRAIN_FREQUENCY, 2 a call): each
    # once, in order, from the period ending at 20 to the one ending at 88.
    assert numbered == list(range(20 // 2 - 1, 88 // 2 + 1))
    assert calls["update_target_model"] == sorted(set(first_steps_past(5, 1, 90, n_envs)))
    assert [step for step, *_ in agent.evaluations] == [*first_steps_past(20, 1, 90, n_envs), 90]
    assert calls["save_checkpoint"] == [*first_steps_past(25, 1, 90, n_envs), 90]


# (flags, the step of the first replay()) for 3 environments, replay() due every 4 or 32 steps:
# LEARNING_STARTS 20 is first passed at 21; a batch of 16 is first held at 18, when 16 is passed;
# at 33 the multiple 32 past both.
@pytest.mark.parametrize(("flags", "first"), [
    ({"learning_starts": 20, "train_frequency": 2, "gradient_steps_per_call": 2}, 21),
    ({"learning_starts": 0, "train_frequency": 1, "gradient_steps_per_call": 4}, 18),
    ({"learning_starts": 10, "train_frequency": 2, "gradient_steps_per_call": 16}, 33),
])
def test_the_first_gradient_step_of_three_environments_is_where_run_first_trains(
        tmp_path, flags, first):
    agent = small_agent(tmp_path, n_envs=3, total_steps=36, eval_every=1_000, eval_episodes=1,
                        **flags)
    calls: list[int] = []
    agent.replay = recording(calls, agent, agent.replay)
    agent.run()
    assert agent.first_gradient_step() == calls[0] == first


def test_each_environment_has_its_stream_and_episodes_seeded_in_the_order_they_start(
        tmp_path, capsys):
    # CartPole cannot fail within 5 steps: every episode of each environment ends at its 5th.
    agent = small_agent(tmp_path, n_envs=3, total_steps=30, max_episode_steps=5,
                        learning_starts=1_000, eval_every=1_000, eval_episodes=1,
                        memory_size=100)  # streams of 33, 33 and 34 slots
    # The priority figure ages each transition within its stream: the memory's streams.
    segments, figure = agent.MEMORY.storage.segments, agent.report.priority_figure
    assert (figure.starts.tolist(), figure.sizes.tolist()) == ([0, 33, 66], [33, 33, 34])
    assert (segments.starts.tolist(), segments.sizes.tolist()) == ([0, 33, 66], [33, 33, 34])
    resets: list[tuple[int, int]] = []
    for i, env in enumerate(agent.envs.envs):
        reset = env.reset
        env.reset = lambda i=i, reset=reset, **options: (
            resets.append((i, options["seed"])) or reset(**options))
    streams: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {0: [], 1: [], 2: []}
    remember = agent.remember

    def noted(state, action, reward, next_state, done, stream):
        streams[stream].append((state, next_state))
        remember(state, action, reward, next_state, done, stream=stream)

    agent.remember = noted
    agent.run()
    assert resets == [(i % 3, episode_seed(0, 0, i)) for i in range(9)]  # 3 after the last step
    lines = [line for line in without_timings(capsys.readouterr().out)
             if line.startswith("episode:")]
    assert lines == [f"episode: {n}, step: {15 if n <= 3 else 30}/30, score: 5, e: 1.00, "
                     f"average: 5.0" for n in range(1, 7)]
    for transitions in streams.values():  # each stream one environment's, whole
        assert len(transitions) == 10
        for k in (0, 1, 2, 3, 5, 6, 7, 8):  # within each of its two episodes
            np.testing.assert_array_equal(transitions[k + 1][0], transitions[k][1])


BREAKOUT = "MinAtar/Breakout-v1"


@pytest.mark.parametrize("env_name", [CARTPOLE, BREAKOUT])
def test_an_n_step_return_stops_where_its_environments_episode_was_cut(tmp_path, env_name):
    # Every episode is cut by the time limit at its 5th step (CartPole cannot fail sooner, nor
    # Breakout's ball reach the bottom): a 3-step return from an episode's last two transitions
    # must stop there, not run on into the environment's next episode. With vector states
    # (CartPole) nothing stored marks the cut: only run's `MEMORY.end_episode` does.
    agent = small_agent(tmp_path, env_name, n_envs=3, total_steps=30, max_episode_steps=5,
                        n_step=3, learning_starts=1_000, eval_every=1_000, eval_episodes=1,
                        memory_size=150)  # streams of 50 slots: nothing overwritten
    stored: list[tuple[int, int, tuple]] = []  # (slot, stream, transition), as stored
    store = agent.MEMORY.store

    def noted(experience: tuple, stream: int) -> int:
        slot = store(experience, stream=stream)
        stored.append((slot, stream, experience))
        return slot

    agent.MEMORY.store = noted
    agent.run()
    gamma = agent.config.gamma
    for stream in range(3):
        slots = np.array([slot for slot, of, _ in stored if of == stream])
        transitions = [experience for _, of, experience in stored if of == stream]
        assert len(transitions) == 10 and not any(done for *_, done in transitions)
        _, _, returns, next_states, dones, discounts = agent.MEMORY.n_step_batch(slots)
        for k in range(10):
            steps = min(3, 5 - k % 5)  # no further than its episode's last transition
            last = transitions[k + steps - 1]
            np.testing.assert_array_equal(next_states[k], last[3])
            assert discounts[k] == pytest.approx(gamma**steps)
            assert returns[k] == pytest.approx(
                sum(gamma**j * transitions[k + j][2] for j in range(steps)))
            assert not dones[k]


# --- resuming a run of several environments ------------------------------------------------

# 120 steps of 3 environments: a checkpoint at the first step past 70 (72), mid-episodes (45
# steps at most), evaluations at 60 and 120, gradient steps from step 20 on.
RESUMED_RUN = {"n_envs": 3, "total_steps": 120, "checkpoint_every": 70, "eval_every": 60,
               "eval_episodes": 2, "max_episode_steps": 45, "memory_size": 300, "batch_size": 8,
               "learning_starts": 20, "train_frequency": 2, "gradient_steps_per_call": 2,
               "target_update": 10, "exploration_steps": 80, "hidden_units": (8,), "seed": 2}
LINE_STEP = re.compile(r"(?:episode: \d+, step: |evaluation at step )(\d+)")


def lines_after(step: int, output: str, directory: Path) -> list[str]:
    """The episode and evaluation lines of a log after env step `step`, timings left out and
    the run's `directory` (in the paths it names) as DIR."""
    return [line.replace(str(directory), "DIR") for line in without_timings(output)
            if (match := LINE_STEP.match(line)) and int(match[1]) > step]


def run_logged(agent: Any) -> str:
    """`agent.run()`'s log."""
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        agent.run()
    return log.getvalue()


def variant_run(kind: str) -> dict[str, Any]:
    """RESUMED_RUN with the replay variant `kind` (of `registered_memories()`, while `picked(kind)`
    is open). The reservoir gets 15 slots a stream for each environment's 40 transitions: once
    its segment is full, it drops some."""
    use_per, per_rank_based = variant_flags(kind)
    smaller = {"memory_size": 45} if kind == ReservoirMemory.kind else {}
    return {**RESUMED_RUN, "use_per": use_per, "per_rank_based": per_rank_based, **smaller}


@pytest.fixture(scope="module")
def straight_runs(tmp_path_factory) -> Callable[[str], tuple[Path, Any, str]]:
    """`variant_run(kind)` in one go, run once for the module: its directory, its agent and its
    log."""
    runs: dict[str, tuple[Path, Any, str]] = {}

    def straight_run(kind: str) -> tuple[Path, Any, str]:
        if kind not in runs:
            directory = tmp_path_factory.mktemp(f"straight-{kind}")
            with picked(kind):
                agent = small_agent(directory, **variant_run(kind))
                runs[kind] = directory, agent, run_logged(agent)
        return runs[kind]

    return straight_run


@pytest.fixture(scope="module")
def straight_run(straight_runs) -> tuple[Path, Any, str]:
    """RESUMED_RUN in one go, with the default replay memory: its directory, agent and log."""
    return straight_runs(replay_variant(use_per=True, rank_based=False))


def checkpoints_of(directory: Path) -> list[Path]:
    """The `step-*` checkpoints a run wrote under `directory`, by step."""
    return sorted(directory.rglob("step-*"))


def halfway(directory: Path) -> Path:
    """The run's checkpoint at step 72 (the one at the end is the other one kept)."""
    [checkpoint, _] = checkpoints_of(directory)
    assert checkpoint.name == "step-0000000072"
    return checkpoint


def copy_checkpoint(checkpoint: Path, run_directory: Path, directory: Path) -> None:
    """Copy `checkpoint`, of the run writing under `run_directory`, to the same place under
    `directory`."""
    shutil.copytree(checkpoint, directory / checkpoint.relative_to(run_directory))


def assert_resumes_as_if_never_stopped(straight_run: tuple[Path, Any, str], directory: Path,
                                       env_name: str, flags: dict[str, Any]) -> None:
    """A run of `flags` on `env_name` resumed in `directory` from its newest checkpoint, taken
    mid-way, ends as the straight run did: its progress, online network, log lines after the
    checkpoint and last checkpoint (every key of its progress, its memory, priority figure,
    optimizer and both networks: `assert_same_checkpoint`)."""
    straight_directory, straight, log = straight_run
    resumed = small_agent(directory, env_name=env_name, **flags)
    resumed.begin(run_files.LATEST)
    step = resumed.step
    assert 0 < step < flags["total_steps"]
    resumed_log = run_logged(resumed)
    assert resumed.state_dict()["progress"] == straight.state_dict()["progress"]
    for got, expected in zip(resumed.model.get_weights(), straight.model.get_weights(),
                             strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    assert (lines_after(step, resumed_log, directory)
            == lines_after(step, log, straight_directory))
    assert lines_after(step, log, straight_directory)  # episodes ended, an evaluation after it
    expected, got = checkpoints_of(straight_directory)[-1], checkpoints_of(directory)[-1]
    assert got.name == expected.name == f"step-{flags['total_steps']:010d}"
    assert_same_checkpoint(expected, got)


@pytest.mark.parametrize("kind", registered_memories())  # each variant, the reservoir too
def test_a_run_of_three_environments_resumes_every_open_episode_as_if_never_stopped(
        straight_runs, tmp_path, kind):
    straight_run = straight_runs(kind)
    assert straight_run[1].MEMORY.kind == kind
    checkpoint = halfway(straight_run[0])
    progress = json.loads((checkpoint / "progress.json").read_text())["progress"]
    assert all(episode["actions"]  # all mid-episode
               for episode in progress["environments"]["open_episodes"])
    copy_checkpoint(checkpoint, straight_run[0], tmp_path)
    with picked(kind):
        assert_resumes_as_if_never_stopped(straight_run, tmp_path, CARTPOLE, variant_run(kind))


def test_a_resume_says_how_many_open_episodes_and_steps_it_replayed(straight_run, tmp_path):
    checkpoint = halfway(straight_run[0])
    progress = json.loads((checkpoint / "progress.json").read_text())["progress"]
    steps = [len(episode["actions"]) for episode in progress["environments"]["open_episodes"]]
    assert len(steps) == 3 and all(steps)
    said = small_agent(tmp_path, **RESUMED_RUN).resume(str(checkpoint)).splitlines()
    assert said[0] == f"resuming from {checkpoint} at step 72"
    assert [line for line in said if "replayed" in line] == [
        f"note: replayed 3 open episodes ({sum(steps)} env steps) from their seeds and actions, "
        "to go on mid-episode"]


def test_a_checkpoint_whose_two_counts_of_env_steps_differ_is_refused_naming_both(
        straight_run, tmp_path):
    copy_checkpoint(halfway(straight_run[0]), straight_run[0], tmp_path)
    [checkpoint] = checkpoints_of(tmp_path)
    saved = json.loads((checkpoint / "progress.json").read_text())
    saved["progress"]["environments"]["steps_taken"] = 75
    (checkpoint / "progress.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=re.escape(
            "progress step 72 != environments' steps_taken 75")):
        small_agent(tmp_path, **RESUMED_RUN).resume(str(checkpoint))


# 120 steps of 3 MinAtar Breakout environments, each frame stored once in its stream: gradient
# steps from step 30 on, a checkpoint and an evaluation at 60 and 120, episodes of 40 steps at most.
MINATAR_RUN = {"n_envs": 3, "total_steps": 120, "checkpoint_every": 60, "eval_every": 60,
               "eval_episodes": 1, "max_episode_steps": 40, "memory_size": 150, "batch_size": 8,
               "n_step": 3, "learning_starts": 30, "train_frequency": 2,
               "gradient_steps_per_call": 2, "target_update": 20, "exploration_steps": 90,
               "seed": 1}


def test_a_minatar_run_of_three_environments_resumes_as_if_never_stopped(tmp_path):
    straight = small_agent(tmp_path / "straight", env_name=BREAKOUT, **MINATAR_RUN)
    straight_run = (tmp_path / "straight", straight, run_logged(straight))
    [checkpoint, _] = checkpoints_of(tmp_path / "straight")
    progress = json.loads((checkpoint / "progress.json").read_text())["progress"]
    assert checkpoint.name == "step-0000000060" and progress["episode"] > 0
    assert any(episode["actions"]  # mid-episode
               for episode in progress["environments"]["open_episodes"])
    copy_checkpoint(checkpoint, tmp_path / "straight", tmp_path / "resumed")
    assert_resumes_as_if_never_stopped(straight_run, tmp_path / "resumed", BREAKOUT, MINATAR_RUN)


# 60 steps of 2 Pong environments (84x84 frames, 4 to a stack on the last axis, each stored once
# in its stream): episodes cut at 20 steps, a checkpoint and an evaluation at 30 (each episode 15
# steps in) and at 60, gradient steps from step 20 on.
ATARI_RUN = {"n_envs": 2, "total_steps": 60, "checkpoint_every": 30, "eval_every": 30,
             "eval_episodes": 1, "max_episode_steps": 20, "memory_size": 200, "batch_size": 8,
             "learning_starts": 20, "train_frequency": 2, "gradient_steps_per_call": 1,
             "target_update": 10, "exploration_steps": 40, "seed": 3}
PONG = "PongNoFrameskip-v4"


@pytest.mark.slow
def test_an_atari_run_of_two_environments_resumes_as_if_never_stopped(tmp_path):
    straight = small_agent(tmp_path / "straight", env_name=PONG, **ATARI_RUN)
    straight_run = (tmp_path / "straight", straight, run_logged(straight))
    [checkpoint, _] = checkpoints_of(tmp_path / "straight")
    progress = json.loads((checkpoint / "progress.json").read_text())["progress"]
    assert checkpoint.name == "step-0000000030"
    assert [len(episode["actions"]) for episode in
            progress["environments"]["open_episodes"]] == [15, 15]  # mid-episode
    copy_checkpoint(checkpoint, tmp_path / "straight", tmp_path / "resumed")
    assert_resumes_as_if_never_stopped(straight_run, tmp_path / "resumed", PONG, ATARI_RUN)


# 2,000 steps of 4 environments: checkpoints every 400 steps, evaluations every 800, gradient
# steps from step 100 on; a real `python d3qn_agent.py` stopped from outside at a moment it
# does not choose (its output unbuffered, so the signal follows the line it waits for closely).
SIGNALLED_RUN = {"n_envs": 4, "total_steps": 2_000, "checkpoint_every": 400, "eval_every": 800,
                 "eval_episodes": 1, "max_episode_steps": 60, "memory_size": 600,
                 "batch_size": 8, "learning_starts": 100, "train_frequency": 2,
                 "gradient_steps_per_call": 2, "target_update": 20, "exploration_steps": 800,
                 "hidden_units": (8,), "seed": 4}


@pytest.fixture(scope="module")
def signalled_straight_run(tmp_path_factory) -> tuple[Path, Any, str]:
    """SIGNALLED_RUN in one go: its directory, its agent and its log."""
    directory = tmp_path_factory.mktemp("signalled_straight")
    agent = small_agent(directory, **SIGNALLED_RUN)
    return directory, agent, run_logged(agent)


@pytest.mark.slow
@pytest.mark.parametrize(("signal_number", "after_step"),
                         [(signal.SIGTERM, 200), (signal.SIGKILL, 900)],
                         ids=["SIGTERM", "SIGKILL"])
def test_a_run_of_four_environments_stopped_or_killed_mid_episodes_resumes_as_if_never_stopped(
        signalled_straight_run, tmp_path, signal_number, after_step):
    # SIGTERM: the run stops after the step it is in, with a checkpoint there. SIGKILL (kill
    # -9): it dies where it is, and the resume takes its newest complete checkpoint (800 or
    # later). Either way the checkpoint resumed from holds episodes in progress.
    command = [sys.executable, str(ROOT / "d3qn_agent.py"),
               *command_line(small_flags(tmp_path, **SIGNALLED_RUN))]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        for line in process.stdout:
            if (match := LINE_STEP.match(line)) and int(match[1]) > after_step:
                process.send_signal(signal_number)
                break
        output = process.communicate(timeout=120)[0]
    finally:
        process.kill()
        process.wait()
    if signal_number == signal.SIGTERM:
        assert process.returncode == 0 and "interrupted by SIGTERM at step" in output, output
    else:
        assert process.returncode == -signal.SIGKILL
    newest = checkpoints_of(tmp_path)[-1]
    progress = json.loads((newest / "progress.json").read_text())["progress"]
    assert int(newest.name.removeprefix("step-")) < SIGNALLED_RUN["total_steps"]
    assert any(episode["actions"] for episode in progress["environments"]["open_episodes"])
    assert_resumes_as_if_never_stopped(signalled_straight_run, tmp_path, CARTPOLE,
                                       SIGNALLED_RUN)


def test_a_resume_with_another_n_envs_is_one_error_line_naming_both(straight_run, tmp_path,
                                                                     capsys):
    flags = command_line(small_flags(tmp_path, **{**RESUMED_RUN, "n_envs": 2}))
    assert d3qn_agent.main([*flags, "--resume", str(halfway(straight_run[0]))]) == 2
    assert "n_envs 3 -> 2" in the_error_line(capsys.readouterr().err)


def test_a_checkpoint_from_before_n_envs_resumes_only_with_one_environment(tmp_path):
    fixture = DATA / "checkpoint_format_2" / "step-0000000400"
    flags = {"total_steps": 800, "learning_starts": 200, "memory_size": 500, "batch_size": 16,
             "hidden_units": (16, 16), "checkpoint_every": 400, "eval_every": 400,
             "eval_episodes": 2, "seed": 5}
    with pytest.raises(ValueError, match="n_envs 1 -> 2"):
        small_agent(tmp_path / "two", n_envs=2, **flags).resume(str(fixture))
    agent = small_agent(tmp_path / "one", **flags)
    agent.resume(str(fixture))
    [episode] = agent.state_dict()["progress"]["environments"]["open_episodes"]
    assert episode["number"] == agent.episode and episode["actions"]


# --- bad values: one error line before any step --------------------------------------------


@pytest.mark.parametrize(("flags", "said"), [
    (["--n-envs", "0"], ["N_ENVS (--n-envs) must be in [1, 1,000] (one environment each, side "
                         "by side), got 0"]),
    (["--n-envs", "500", "--memory-size", "400"], ["MEMORY_SIZE", "N_ENVS"]),  # < 1 slot each
    (["--n-envs", "3"], ["TOTAL_STEPS (50000) must be a multiple of N_ENVS (3), such as "
                         "49998 or 50001 (--total-steps)"]),
    (["--n-envs", "3", "--total-steps", "2"], ["TOTAL_STEPS (2) must be a multiple of N_ENVS "
                                               "(3), such as 3 (--total-steps)"]),
    (["--env-name", "MinAtar/Breakout-v1", "--n-envs", "10", "--memory-size", "100",
      "--batch-size", "95"], ["BATCH_SIZE (95) must not exceed the 90 transitions that "
                              "MEMORY_SIZE (100) slots of a FrameStackStorage hold in N_ENVS "
                              "(10) streams"]),
])
def test_a_bad_n_envs_is_one_error_line_before_any_step(tmp_path, capsys, flags, said):
    directories = ["--model-dir", str(tmp_path / "m"), "--plot-dir", str(tmp_path / "p")]
    assert d3qn_agent.main([*directories, *flags]) == 2
    error = the_error_line(capsys.readouterr().err)
    assert all(part in error for part in said), error
    assert not (tmp_path / "m").exists()


# --- NaN in training at a step that ends episodes --------------------------------------------

# 3 environments in episodes of 5 steps (CartPole cannot fail sooner): all three end at step 15,
# the step of the first replay() (one a step from LEARNING_STARTS on, the memory holding a batch).
ENDING_RUN = {"n_envs": 3, "total_steps": 30, "max_episode_steps": 5, "learning_starts": 15,
              "batch_size": 8, "train_frequency": 1, "gradient_steps_per_call": 1,
              "eval_every": 1_000, "eval_episodes": 1}


def steps_past_an_end(agent: Any) -> list[int]:
    """Fill, as `agent` runs, a list of the environments stepped after their episode ended (a
    terminated or truncated step) and before their next reset."""
    ended, stepped = [False] * len(agent.envs.envs), []
    for i, env in enumerate(agent.envs.envs):
        def step(action: int, i: int = i, env_step: Callable = env.step) -> tuple:
            if ended[i]:
                stepped.append(i)
            result = env_step(action)
            ended[i] = result[2] or result[3]
            return result

        def reset(i: int = i, env_reset: Callable = env.reset, **options: Any) -> tuple:
            ended[i] = False
            return env_reset(**options)

        env.step, env.reset = step, reset
    return stepped


def test_nan_in_training_at_a_step_that_ends_episodes_checkpoints_them_ended(tmp_path):
    agent = small_agent(tmp_path, **ENDING_RUN)
    learn = agent.learn

    def diverging(batches: Any, step: int) -> Any:
        if step == 15:
            raise NonFiniteError("non-finite loss at env step 15")
        return learn(batches, step)

    agent.learn = diverging
    with pytest.raises(NonFiniteError, match="Last good state saved"):
        run_logged(agent)
    [checkpoint] = checkpoints_of(tmp_path)
    progress = json.loads((checkpoint / "progress.json").read_text())["progress"]
    assert (progress["step"], progress["episode"], progress["scores"]) == (15, 3, [5.0] * 3)
    # The three ended episodes counted, their successors open and not yet stepped.
    open_episodes = progress["environments"]["open_episodes"]
    assert [(episode["number"], episode["actions"]) for episode in open_episodes] == [
        (3, []), (4, []), (5, [])]

    resumed = small_agent(tmp_path, **ENDING_RUN)
    stepped_past_an_end = steps_past_an_end(resumed)
    resumed.begin(run_files.LATEST)
    log = run_logged(resumed)
    assert stepped_past_an_end == []
    assert (resumed.step, resumed.episode) == (30, 6)
    assert [line for line in lines_after(15, log, tmp_path) if line.startswith("episode:")] == [
        f"episode: {n}, step: 30/30, score: 5, e: 1.00, average: 5.0" for n in (4, 5, 6)]
