"""Checkpoints: resume as if never stopped, survive kill -9, Ctrl-C and SIGTERM, refuse what does
not fit.

The runs are on CartPole with a tiny network. Those stopped from outside (kill -9, SIGTERM, a
lock's live holder) and the resumed side of the resumed run's match are real `python
d3qn_agent.py` subprocesses; the others run `d3qn_agent` in this process, since starting a
Python with TensorFlow takes longer than they do.
"""

import contextlib
import errno
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import (
    KILL_WHILE_CHECKPOINTING,
    ROOT,
    assert_same_checkpoint,
    command_line,
    small_agent,
    small_flags,
    the_error_line,
)

from d3qn_utils import agent_checkpoint, atomic_files, run_files, training_session

RUN_NAME = "DDQN_CartPole-v1_Dueling_PER"
CHECKPOINT_FILES = {
    "online.weights.h5", "target.weights.h5", "optimizer.npz", "memory.npz", "priority_figure.npz",
    "progress.json",
}
LEARNING_STARTS = 64
# Gradient steps from step 64 on, no evaluation; only the test of a resumed run's match turns
# XLA on (the default's path).
TINY = small_flags(None, learning_starts=LEARNING_STARTS, memory_size=400, batch_size=32,
                   train_frequency=1, target_update=50, exploration_steps=300,
                   eval_every=1_000_000, eval_episodes=1, seed=3)


def agent_command(directory: Path, *flags: str) -> list[str]:
    return [
        sys.executable, str(ROOT / "d3qn_agent.py"), *command_line(TINY),
        "--model-dir", str(directory / "models"), "--plot-dir", str(directory / "plots"), *flags,
    ]


def train(directory: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        agent_command(directory, *flags), cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def checkpoints(directory: Path) -> list[Path]:
    """The complete checkpoints of every run under `directory`, by run, then by step."""
    root = directory / "models" / f"{RUN_NAME}.checkpoints"
    return sorted(root.glob(f"{run_files.RUN_PREFIX}*/{run_files.PREFIX}*"))


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
    for path in step_directory.glob("*.npz"):
        atomic_files.read_arrays(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished 200-step run with checkpoints at steps 100 and 200 (in-process)."""
    import d3qn_agent

    directory = tmp_path_factory.mktemp("trained")
    errors = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
        code = d3qn_agent.main(
            agent_command(directory, "--total-steps", "200", "--checkpoint-every", "100")[2:])
    assert code == 0, errors.getvalue()
    return directory


def test_resumed_run_matches_an_uninterrupted_one(tmp_path, capsys):
    # One go (in this process): 400 steps, checkpointing at 200 on the way. Then a fresh process
    # resumes from that step-200 checkpoint and trains the other 200 steps. (The budget stays
    # 400 in both, since beta is annealed over the budget.)
    # XLA on, as by default: its compiled steps must resume as exactly as the plain ones.
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    code, _, err = run_main(straight, capsys, "--total-steps", "400", "--checkpoint-every", "200",
                            "--xla")
    assert code == 0, err
    halfway = checkpoints(straight)[0]
    assert halfway.name == "step-0000000200"
    shutil.copytree(halfway, resumed / halfway.relative_to(straight))
    result = train(resumed, "--total-steps", "400", "--checkpoint-every", "200", "--xla",
                   "--resume")
    assert result.returncode == 0, result.stderr
    assert "resuming from" in result.stdout and "at step 200" in result.stdout

    expected, got = checkpoints(straight)[-1], checkpoints(resumed)[-1]
    assert expected.name == got.name == "step-0000000400"
    assert_same_checkpoint(expected, got)


@pytest.mark.parametrize("where", ["memory.npz", "before the rename"])
def test_a_run_killed_while_checkpointing_resumes_from_its_last_complete_checkpoint(
        tmp_path, capsys, where):
    root = tmp_path / "models" / f"{RUN_NAME}.checkpoints"
    flags = agent_command(tmp_path, "--total-steps", "100", "--checkpoint-every", "10")[2:]
    program = (KILL_WHILE_CHECKPOINTING
               + "import d3qn_agent\nsys.exit(d3qn_agent.main(sys.argv[3:]))")
    killed = subprocess.run([sys.executable, "-c", program, where, "30", *flags], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # What the kill left: two complete checkpoints and the third's temporary directory.
    assert [path.name for path in checkpoints(tmp_path)] == ["step-0000000010", "step-0000000020"]
    for step_directory in checkpoints(tmp_path):
        assert_complete(step_directory)
    [half] = root.glob(f"{run_files.RUN_PREFIX}*/{atomic_files.TEMPORARY_PREFIX}*")
    assert half.name.endswith("step-0000000030")
    assert (where == "memory.npz") == (len(list(half.iterdir())) < len(CHECKPOINT_FILES))
    # The resumption in-process: the subprocess start-up is the slow part.
    code, out, err = run_main(tmp_path, capsys, "--total-steps", "40", "--checkpoint-every",
                              "10", "--resume")
    assert code == 0, err
    assert "at step 20" in out
    assert not list(root.rglob(atomic_files.TEMPORARY_PREFIX + "*"))
    assert [path.name for path in checkpoints(tmp_path)] == ["step-0000000030", "step-0000000040"]


def episode_lines(output: str) -> list[tuple[int, int]]:
    """(episode, step) of every "episode: N, step: S/T, ..." line of a run's output."""
    return [(int(episode), int(step)) for episode, step in
            re.findall(r"^episode: (\d+), step: (\d+)/", output, flags=re.MULTILINE)]


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM],
                         ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_and_sigterm_become_a_stop_request_and_the_old_handlers_come_back(signal_number):
    before = signal.getsignal(signal_number)
    with training_session.stop_requests() as stop:
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
        else:  # the run ended before such an episode: say why, not a later confusing failure
            pytest.fail(f"the run ended first (exit {process.wait()}): {process.stderr.read()}")
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
    assert step_directory in error and "env_name 'CartPole-v1' -> 'Acrobot-v1'" in error
    error = resume_fails(tmp_path, capsys, "--hidden-units", "32", "32", "--resume", step_directory)
    assert "hidden_units [16, 16] -> [32, 32]" in error
    error = resume_fails(tmp_path, capsys, "--no-per", "--resume", step_directory)
    assert "use_per True -> False" in error
    # A checkpoint older than format 1 (a fingerprint, no run record) or of an unknown format is
    # refused, naming it.
    progress = json.loads((Path(step_directory) / "progress.json").read_text())
    (Path(step_directory) / "progress.json").write_text(json.dumps(
        {"fingerprint": {"env_name": "CartPole-v1"}, **progress["progress"]}))
    error = resume_fails(tmp_path, capsys, "--resume", step_directory)
    assert (f"checkpoint file {Path(step_directory) / 'progress.json'} has no valid run record"
            in error)
    newer = agent_checkpoint.FORMAT + 1
    (Path(step_directory) / "progress.json").write_text(json.dumps({**progress, "format": newer}))
    error = resume_fails(tmp_path, capsys, "--resume", step_directory)
    assert (f"checkpoint {step_directory} has format {newer}, which this version cannot read"
            in error)


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

    agent = small_agent(tmp_path, learning_starts=64, memory_size=400, batch_size=32,
                        eval_every=10**6, total_steps=1000)
    env_step = agent.env.step

    def exploding_step(action):  # from step 100 on, rewards are finite but overflow float32
        observation, reward, terminated, truncated, info = env_step(action)
        return observation, 1e39 if agent.step >= 99 else reward, terminated, truncated, info

    agent.env.step = exploding_step
    with pytest.raises(training_session.NonFiniteError,
                       match=r"non-finite loss.*Last good state saved"):
        agent.run()
    assert 100 <= agent.step < 1000
    assert all(np.isfinite(weights).all() for weights in agent.model.get_weights())
    saved = checkpoints(tmp_path)
    assert [path.name for path in saved] == [f"step-{agent.step:010d}"]
    assert_complete(saved[0])
    memory = atomic_files.read_arrays(saved[0] / "memory.npz")
    assert np.isfinite(memory["tree.sums"]).all()


# ---- A run owns what it writes -----------------------------------------------------------------
def run_main(directory: Path, capsys: pytest.CaptureFixture, *flags: str) -> tuple[int, str, str]:
    """`python d3qn_agent.py` with the tiny flags, in-process: (exit code, stdout, stderr)."""
    import d3qn_agent

    capsys.readouterr()
    code = d3qn_agent.main(agent_command(directory, *flags)[2:])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_lock_names_its_holder_and_a_dead_holders_lock_is_taken_over(tmp_path):
    path = tmp_path / "models" / "run.lock"
    path.parent.mkdir()
    path.write_text("pid 999999 on gone, started long ago")  # left by a killed run: no flock
    lock = run_files.RunLock(path)
    assert path.read_text().startswith(f"pid {os.getpid()} on ")
    with pytest.raises(ValueError, match=rf"another run .*: pid {os.getpid()} on .*--model-dir"):
        run_files.RunLock(path)  # another open file: flock refuses it, even in this process
    lock.release()
    assert not path.exists()
    run_files.RunLock(path).release()


def test_a_second_run_into_the_same_model_directory_is_refused_while_the_first_lives(
        tmp_path, capsys):
    first = subprocess.Popen(agent_command(tmp_path, "--total-steps", "100000"), cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in first.stdout:  # its first line comes after it took the lock
            if line.startswith("training on"):
                break
        code, _, err = run_main(tmp_path, capsys, "--total-steps", "100")
        assert code == 2
        error = the_error_line(err)
        assert f"pid {first.pid} on " in error
        assert str(tmp_path / "models" / f"{RUN_NAME}.lock") in error
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # Killed, it leaves its lock file behind, but not its lock: the next run starts.
    assert (tmp_path / "models" / f"{RUN_NAME}.lock").exists()
    code, out, err = run_main(tmp_path, capsys, "--total-steps", "10")
    assert code == 0, err
    assert "done: 10 steps in" in out
    assert not (tmp_path / "models" / f"{RUN_NAME}.lock").exists()


def test_runs_into_one_directory_keep_their_own_checkpoints_and_resume_says_which(
        tmp_path, trained, capsys):
    # `trained` is run A (learning rate 0.001, checkpoints at 100 and 200); run B follows it
    # into the same directory with another learning rate and checkpoints every 25 steps.
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    [a_run] = {path.parent for path in checkpoints(tmp_path)}
    run_a_files = snapshot(a_run)
    code, out, err = run_main(tmp_path, capsys, "--total-steps", "100", "--checkpoint-every",
                              "25", "--learning-rate", "1e-4")
    assert code == 0, err
    lines = out.splitlines()
    best = tmp_path / "models" / f"{RUN_NAME}.keras"
    assert lines[0].startswith(f"note: {best} holds the best network of an earlier run")
    assert lines[1].startswith(f"note: {a_run.parent} holds the checkpoints of 1 earlier run")
    assert lines[2].startswith("training on")
    # Pruning kept B's last two and left A's alone.
    [b_run] = {path.parent for path in checkpoints(tmp_path)} - {a_run}
    assert [path.name for path in run_files.list_checkpoints(b_run)] == [
        "step-0000000075", "step-0000000100"]
    assert snapshot(a_run) == run_a_files

    # --resume continues the run whose flags match, newest first, and says which it is.
    code, out, err = run_main(tmp_path, capsys, "--total-steps", "110", "--learning-rate",
                              "1e-4", "--resume")
    assert code == 0, err
    b_started = json.loads((b_run / "step-0000000100" / "progress.json").read_text())["run"]
    assert out.startswith(f"resuming from {b_run / 'step-0000000100'} at step 100\n"
                          f"continuing {b_run.name}, started {b_started['started']}; changed "
                          "flags: total_steps 100 -> 110, checkpoint_every 25 -> 0\n")
    code, out, err = run_main(tmp_path, capsys, "--total-steps", "210", "--resume")
    assert code == 0, err
    assert out.startswith(f"resuming from {a_run / 'step-0000000200'} at step 200\n"
                          f"continuing {a_run.name}, started ")
    # No run has these flags: the error names what differs in the closest run (A, though B
    # wrote last), and that the other differs more.
    error = resume_fails(tmp_path, capsys, "--gamma", "0.5", "--resume")
    assert error.startswith(f"error: checkpoint {a_run / 'step-0000000200'} (run started ")
    assert "(its value -> this run's): gamma 0.99 -> 0.5; " in error
    assert error.endswith("; each other run differs more (--resume PATH takes any checkpoint)")


def test_resume_with_changed_flags_refuses_each_flag_that_may_not_change(
        tmp_path, trained, capsys):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    step_directory = checkpoints(tmp_path)[-1]
    for where in ([], [str(step_directory)]):  # the newest, and the checkpoint given
        error = resume_fails(tmp_path, capsys, "--batch-size", "128", "--learning-rate", "0.5",
                             "--gamma", "0.5", "--n-step", "1", "--resume", *where)
        assert f"checkpoint {step_directory} (run started " in error
        for change in ("batch_size 32 -> 128", "learning_rate 0.001 -> 0.5", "gamma 0.99 -> 0.5",
                       "n_step 3 -> 1"):
            assert change in error
        assert "corrupt" not in error and "total_steps 200 -> 400" not in error
    # The budget and the evaluation and checkpoint cadence may change.
    code, out, err = run_main(tmp_path, capsys, "--total-steps", "250", "--eval-every", "50",
                              "--checkpoint-every", "50", "--resume")
    assert code == 0, err
    assert ("; changed flags: total_steps 200 -> 250, eval_every 1000000 -> 50, "
            f"checkpoint_every 100 -> 50, model_dir '{trained / 'models'}' -> "
            f"'{tmp_path / 'models'}'") in out
    assert "evaluation at step 250" in out and checkpoints(tmp_path)[-1].name == "step-0000000250"


def test_the_flags_that_may_change_on_resume_are_flags_and_documented():
    from d3qn_utils import settings

    assert set(agent_checkpoint.MAY_CHANGE_ON_RESUME) <= set(settings.D3QN_FLAGS)
    usage = (ROOT / "docs" / "usage.md").read_text()
    section = usage[usage.index("## Checkpoints and resuming long runs"):]
    for name in agent_checkpoint.MAY_CHANGE_ON_RESUME:
        assert f"`{name.upper()}`" in section, name


def disk_full(*_: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("full", ["writing", "before writing"])
def test_a_full_disk_while_checkpointing_keeps_everything_and_resume_works(
        tmp_path, trained, capsys, monkeypatch, full):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    before = snapshot(tmp_path)
    if full == "writing":  # the disk fills up in the middle of a checkpoint
        write_arrays = agent_checkpoint.write_arrays

        def write_until_full(path: Path, arrays: dict) -> None:
            if path.name != "memory.npz":
                write_arrays(path, arrays)
                return
            path.write_bytes(b"PK" * 1000)
            disk_full()

        monkeypatch.setattr(agent_checkpoint, "write_arrays", write_until_full)
    else:  # the disk has less room than the checkpoint needs
        monkeypatch.setattr(run_files.shutil, "disk_usage",
                            lambda path: types.SimpleNamespace(free=1000))
    code, _, err = run_main(tmp_path, capsys, "--total-steps", "300", "--checkpoint-every", "50",
                            "--resume")
    assert code == 2
    error = the_error_line(err)
    failed = checkpoints(tmp_path)[-1].parent / "step-0000000250"
    assert error.startswith(f"error: cannot write {failed}: No space left on device")
    assert "[errno 28, ENOSPC]" in error
    assert snapshot(tmp_path) == before  # no .tmp-*, the checkpoints and networks as they were
    monkeypatch.undo()
    code, out, err = run_main(tmp_path, capsys, "--total-steps", "300", "--checkpoint-every", "50",
                              "--resume")
    assert code == 0, err
    assert "at step 200" in out and checkpoints(tmp_path)[-1].name == "step-0000000300"


def test_a_full_disk_while_saving_the_best_network_keeps_the_old_one(
        tmp_path, trained, capsys, monkeypatch):
    import keras

    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    before = snapshot(tmp_path)

    def save_until_full(model: object, path: str) -> None:
        Path(path).write_bytes(b"PK" * 1000)
        disk_full()

    monkeypatch.setattr(keras.Model, "save", save_until_full)
    code, _, err = run_main(tmp_path, capsys, "--total-steps", "100", "--eval-every", "50")
    assert code == 2
    best = tmp_path / "models" / f"{RUN_NAME}.keras"
    assert the_error_line(err) == (f"error: cannot write {best}: No space left on device "
                                   "[errno 28, ENOSPC]; the file there before is unchanged")
    assert snapshot(tmp_path) == before


def test_a_new_run_removes_what_killed_writers_left_of_its_files(tmp_path):
    finished = subprocess.Popen(["true"])  # a process that ended: its pid is no writer's
    finished.wait()
    models, plots = tmp_path / "models", tmp_path / "plots"
    leftovers = [models / f".tmp-{finished.pid}-{RUN_NAME}.keras",
                 plots / f".tmp-{RUN_NAME}.png",  # named as before the writer's pid was in it
                 models / f"{RUN_NAME}.checkpoints" / "run-1" / f".tmp-{os.getpid()}-step-1"]
    others = [plots / f".tmp-{os.getppid()}-{RUN_NAME}.png",  # a live process's write
              plots / ".tmp-notes.txt", models / f".tmp-{finished.pid}-DQN_CartPole-v1.keras"]
    for path in (*leftovers, *others):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half")
    agent = small_agent(tmp_path)
    agent.begin()
    agent.training_run.lock.release()
    assert not any(path.exists() for path in leftovers)
    assert all(path.exists() for path in others)  # not this run's to remove


# An environment with a bug: its reward or observation turns into POISON["value"] after
# POISON["after"] steps (no poison while POISON["field"] is "": the bug fixed).
POISON: dict[str, Any] = {"field": "", "value": 0.0, "after": 0}
POISONED = "PoisonedCartPole-v0"


class PoisonedCartPole(gym.Wrapper):
    """CartPole-v1 with POISON applied to its steps ("reward", "observation") or its resets."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(gym.make("CartPole-v1", **kwargs))
        self.steps = 0

    def reset(self, **kwargs):
        observation, info = self.env.reset(**kwargs)
        if POISON["field"] == "reset" and self.steps > POISON["after"]:
            observation = observation.copy()
            observation[0] = POISON["value"]
        return observation, info

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if POISON["field"] in ("reward", "observation") and self.steps > POISON["after"]:
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
    [saved] = sorted(root.glob(f"{run_files.RUN_PREFIX}*/{run_files.PREFIX}*"))
    assert saved.name == "step-0000000150"  # the step before the bad one, which is not stored
    assert capsys.readouterr().err.splitlines() == [
        f"error: the environment returned {said} at env step 151. Last good state saved to "
        f"{saved}"]
    assert_complete(saved)
    memory = atomic_files.read_arrays(saved / "memory.npz")
    assert memory["storage.written"] == 150
    for key in ("storage.state", "storage.reward", "storage.next_state", "tree.sums"):
        assert np.isfinite(memory[key]).all(), key

    monkeypatch.setitem(POISON, "field", "")  # the environment fixed
    assert d3qn_agent.main([*flags, "--resume"]) == 0
    resumed = capsys.readouterr().out
    assert f"resuming from {saved} at step 150" in resumed and "done: 150 steps in" in resumed


@pytest.mark.filterwarnings("ignore:.*is not within the observation space")  # the NaN, on purpose
def test_nan_from_a_reset_stops_the_run_and_resume_works_once_it_is_fixed(
        tmp_path, capsys, monkeypatch):
    import d3qn_agent

    monkeypatch.setitem(POISON, "field", "reset")
    monkeypatch.setitem(POISON, "value", float("nan"))
    monkeypatch.setitem(POISON, "after", 150)
    flags = agent_command(tmp_path, "--env-name", POISONED, "--total-steps", "300")[2:]
    assert d3qn_agent.main(flags) == 3
    root = tmp_path / "models" / f"DDQN_{POISONED}_Dueling_PER.checkpoints"
    [saved] = sorted(root.glob(f"{run_files.RUN_PREFIX}*/{run_files.PREFIX}*"))
    step = int(saved.name.removeprefix(run_files.PREFIX))
    assert step > 150  # the first reset after step 150 ends the episode running then
    assert capsys.readouterr().err.splitlines() == [
        f"error: the environment returned an observation holding nan at its reset after env "
        f"step {step}. Last good state saved to {saved}"]
    memory = atomic_files.read_arrays(saved / "memory.npz")
    assert memory["storage.written"] == step
    assert np.isfinite(memory["storage.state"]).all()

    # Still broken (every reset now): one line that says so, and no "corrupt" checkpoint.
    monkeypatch.setitem(POISON, "after", -1)
    error = resume_fails(tmp_path, capsys, "--env-name", POISONED, "--total-steps", "300",
                         "--resume")
    assert "observation holding nan" in error and "corrupt" not in error
    monkeypatch.setitem(POISON, "field", "")  # the environment fixed
    assert d3qn_agent.main([*flags, "--resume"]) == 0
    assert "done: " in capsys.readouterr().out


def test_a_stop_while_the_last_networks_are_saved_lets_the_run_finish(
        tmp_path, capsys, monkeypatch):
    import d3qn_agent

    # (A stop during an evaluation, the final one too, stops the run: tests/test_flag_checks.py.)
    during = "save"
    original = getattr(d3qn_agent.DQNAgent, during)

    def then_sigterm(agent, *args):  # at the end: saving a network
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


def test_a_stop_before_a_nested_stop_requests_is_that_blocks_request():
    # `exit_code` installs the handler before the run installs its own: a stop between the two
    # is the run's.
    with training_session.stop_requests():
        os.kill(os.getpid(), signal.SIGTERM)
        with training_session.stop_requests() as stop:
            assert stop.requested and stop.signal_name == "SIGTERM"


def test_a_stop_as_the_first_episodes_start_stops_the_run_at_step_0_with_a_checkpoint(
        tmp_path, capsys, monkeypatch):
    import d3qn_agent

    start_episodes = d3qn_agent.DQNAgent.start_episodes

    def then_sigterm(agent):  # the run's first call, before the settings line
        if agent.step == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        start_episodes(agent)

    monkeypatch.setattr(d3qn_agent.DQNAgent, "start_episodes", then_sigterm)
    code, out, err = run_main(tmp_path, capsys, "--total-steps", "300")
    assert code == 0, err
    [saved] = checkpoints(tmp_path)
    assert saved.name == "step-0000000000"
    assert_complete(saved)
    lines = out.splitlines()
    assert lines[0].startswith("training on CartPole-v1 until step 300: "), lines
    assert lines[-1].startswith(f"interrupted by SIGTERM at step 0: checkpoint {saved}, "), lines
    assert not episode_lines(out)


@pytest.mark.filterwarnings("ignore:.*is not within the observation space")  # the NaN, on purpose
def test_nan_from_the_first_reset_stops_the_run_with_a_checkpoint_of_step_0(
        tmp_path, capsys, monkeypatch):
    import d3qn_agent

    monkeypatch.setitem(POISON, "field", "reset")
    monkeypatch.setitem(POISON, "value", float("nan"))
    monkeypatch.setitem(POISON, "after", -1)  # every reset, the first too
    flags = agent_command(tmp_path, "--env-name", POISONED, "--total-steps", "300")[2:]
    capsys.readouterr()
    assert d3qn_agent.main(flags) == 3
    root = tmp_path / "models" / f"DDQN_{POISONED}_Dueling_PER.checkpoints"
    [saved] = sorted(root.glob(f"{run_files.RUN_PREFIX}*/{run_files.PREFIX}*"))
    assert saved.name == "step-0000000000"
    assert capsys.readouterr().err.splitlines() == [
        f"error: the environment returned an observation holding nan at its reset after env "
        f"step 0. Last good state saved to {saved}"]
    assert_complete(saved)

    monkeypatch.setitem(POISON, "field", "")  # the environment fixed
    assert d3qn_agent.main([*flags, "--resume"]) == 0
    resumed = capsys.readouterr().out
    assert f"resuming from {saved} at step 0" in resumed and "done: 300 steps in" in resumed
