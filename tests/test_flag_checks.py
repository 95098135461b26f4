"""Tests that bad input is refused up front and that Ctrl-C is a stop, never a traceback: each
flag's rule (finite floats, bounded integers, ranges, sizes that fit), the games the agent cannot
read, KERAS_BACKEND, Ctrl-C before training (d3qn_agent.py, apex.py) and a stop signal during a
long evaluation."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import ray
from conftest import ROOT, small_agent, small_flags

import apex
import d3qn_agent
from d3qn_agent import OurModel, main
from d3qn_utils import agent_checkpoint, atomic_files, network_size, quiet_startup, settings
from d3qn_utils.games import make_env
from d3qn_utils.greedy_policy import play_greedy
from d3qn_utils.training_session import StopRequest

GiB = 2**30


FINITE = "a finite number within float32's range, not one it rounds to 0"  # a float flag's rule

def b_command(directory) -> list[str]:
    """The short run the adversarial runs started from (`B`), writing under `directory`/D."""
    return ["--total-steps", "1500", "--learning-starts", "200", "--eval-every", "500",
            "--eval-episodes", "2", "--model-dir", str(directory / "D" / "m"),
            "--plot-dir", str(directory / "D" / "p")]


def one_error_line(capsys) -> str:
    """The one line the program wrote to stderr (nothing else there, nothing on stdout)."""
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.endswith("\n"), captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    return captured.err.rstrip("\n")


def exit_code(program, argv: list[str]) -> int:
    """`program(argv)`'s return, or the code argparse exits with for a word it cannot convert."""
    try:
        return program(argv)
    except SystemExit as exit:
        return exit.code


@pytest.mark.parametrize(("argv", "message"), [
    (["--adam-epsilon", "inf"], f"ADAM_EPSILON (--adam-epsilon) must be {FINITE}, got inf"),
    (["--epsilon-decay", "inf"],
     f"EPSILON_DECAY (--epsilon-decay) must be {FINITE}, got inf"),
    (["--failure-reward", "nan"],
     f"FAILURE_REWARD (--failure-reward) must be {FINITE} or None, got nan"),
    (["--failure-reward=-inf"],  # with "=": argparse reads a lone "-inf" as a flag
     f"FAILURE_REWARD (--failure-reward) must be {FINITE} or None, got -inf"),
    (["--learning-rate", "inf"],
     f"LEARNING_RATE (--learning-rate) must be {FINITE}, got inf"),
    (["--grad-clip", "inf"], f"GRAD_CLIP (--grad-clip) must be {FINITE}, got inf"),
    (["--learning-rate", "1e308"],
     f"LEARNING_RATE (--learning-rate) must be {FINITE}, got 1e+308"),
    (["--learning-rate", "1e-50"],
     f"LEARNING_RATE (--learning-rate) must be {FINITE}, got 1e-50"),
    (["--learning-rate", "fast"],
     f"LEARNING_RATE (--learning-rate) must be {FINITE}, got 'fast'"),
    (["--n-step", "1000000"], "N_STEP (1000000) must not exceed MEMORY_SIZE (50000)"),
    (["--target-update", "1e22"],
     "TARGET_UPDATE (--target-update) must be an integer, got '1e22'"),
    (["--target-update", str(10**22)], "TARGET_UPDATE (--target-update) must be at most 2**53 "
     f"(9,007,199,254,740,992), got {10**22}"),
    (["--eval-episodes", "1e8"], "EVAL_EPISODES (--eval-episodes) must be an integer, got '1e8'"),
    (["--eval-episodes", "100000000"], "EVAL_EPISODES (--eval-episodes) must be in [1, 1,000] "
     "(one environment each, side by side), got 100000000"),
    (["--hidden-units", "64", "6.5"],
     "HIDDEN_UNITS (--hidden-units) must be an integer, got '6.5'"),
    (["--tensorboard", ""],
     "TENSORBOARD (--tensorboard) must be a directory name, not empty, got ''"),
    (["--seed", "-1"], "SEED (--seed) must be in [0, 2**32 - 1], got -1"),
    (["--seed", str(2**32)], f"SEED (--seed) must be in [0, 2**32 - 1], got {2**32}"),
    (["--test", "--resume"], "--test and --resume exclude each other: --test plays a saved "
     "network (--model picks which), --resume continues a training; give one of them"),
    (["--env-name", "Blackjack-v1"], "Blackjack-v1 has observation space Tuple(Discrete(32), "
     "Discrete(11), Discrete(2)); this agent needs Box observations (an array of numbers)"),
    (["--env-name", "Taxi-v4"], "Taxi-v4 has observation space Discrete(500); this agent needs "
     "Box observations (an array of numbers)"),
    (["--env-name", "FrozenLake-v1"], "FrozenLake-v1 has observation space Discrete(16); this "
     "agent needs Box observations (an array of numbers)"),
])
def test_bad_flags_of_the_short_run_end_in_one_error_line_before_any_work(
        tmp_path, capsys, argv, message):
    assert exit_code(main, [*b_command(tmp_path), *argv]) == 2
    assert one_error_line(capsys) == f"error: {message}"
    assert not (tmp_path / "D").exists()  # no directory made, nothing written


def test_a_network_that_cannot_fit_is_refused_before_it_is_built(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(network_size, "machine_memory_bytes", lambda: 64 * GiB)
    monkeypatch.setattr(d3qn_agent, "OurModel", None)  # never reached
    assert main([*b_command(tmp_path), "--hidden-units", "100000000"]) == 2
    # 800,000,003 weights (4 inputs, 100M units, a value and 2 advantages), 6 copies of 4 bytes,
    # and 4 activations of 4 bytes per unit for each of 128 samples: about 208.6 GiB.
    assert one_error_line(capsys) == (
        "error: HIDDEN_UNITS (--hidden-units) (100000000,) needs about 208.6 GiB (800,000,003 "
        "parameters, each held 6 times: the two networks, a gradient, the optimizer's slots, "
        "the greedy copy; and a minibatch of 128's activations), more than this machine's "
        "64.0 GiB")
    assert not (tmp_path / "D").exists()


@pytest.mark.parametrize("dueling", [True, False])
def test_the_estimate_counts_the_parameters_keras_builds(dueling):
    model = OurModel((4,), 3, dueling, (16, 8))
    assert network_size.mlp_parameters(4, (16, 8), 3, dueling) == model.count_params()


def test_apex_refuses_a_network_that_cannot_fit_before_ray_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(network_size, "machine_memory_bytes", lambda: 64 * GiB)
    monkeypatch.setattr(apex, "connect_ray", None)  # never reached
    assert apex.main(["--hidden-units", "100000000", "--model-dir", str(tmp_path / "m")]) == 2
    assert one_error_line(capsys).startswith(
        "error: HIDDEN_UNITS (--hidden-units) (100000000,) needs about 208.6 GiB (800,000,003 "
        "parameters")
    assert not ray.is_initialized() and list(tmp_path.iterdir()) == []


def test_a_network_that_fits_or_an_image_torso_passes(monkeypatch):
    monkeypatch.setattr(network_size, "machine_memory_bytes", lambda: 1 * GiB)
    network_size.check_mlp_fits((4,), (256, 256), 2, True, 128)
    network_size.check_mlp_fits((84, 84, 4), (10**8,), 6, True, 32)  # HIDDEN_UNITS unused


def flags_of(table: dict[str, settings.Flag], kind: type) -> list[str]:
    """The flags of `table` whose values are of `kind` (a tuple's items, for a tuple flag)."""
    return [name for name, flag in table.items() if (
        flag.kind if flag.shipped is None or isinstance(flag.shipped, tuple)
        else type(flag.shipped)) is kind]


TABLES = {"d3qn_agent.py": settings.D3QN_FLAGS, "apex.py": apex.APEX_FLAGS}


@pytest.mark.parametrize("script", TABLES)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e308, 1e-50, -1e-46])
def test_every_float_flag_refuses_nan_inf_and_what_float32_cannot_hold(script, value):
    table = TABLES[script]
    names = flags_of(table, float)
    assert "adam_epsilon" in names and "learning_rate" in names  # the table's float flags
    for name in names:
        values = {key: flag.shipped for key, flag in table.items()}
        with pytest.raises(ValueError, match=rf"^{name.upper()} \(--[a-z-]+\) must be a finite "
                                             rf"number.*, got {re.escape(str(value))}$"):
            settings.check({**values, name: value}, table)


@pytest.mark.parametrize("script", TABLES)
def test_every_integer_flag_refuses_a_count_beyond_2_to_the_53(script):
    table = TABLES[script]
    names = flags_of(table, int)
    assert "target_update" in names and "hidden_units" in names
    for name in names:
        values = {key: flag.shipped for key, flag in table.items()}
        too_large = (2**53 + 1,) if isinstance(table[name].shipped, tuple) else 2**53 + 1
        with pytest.raises(ValueError, match=rf"^{name.upper()} \(--[a-z-]+\) must be at most "
                                             r"2\*\*53"):
            settings.check({**values, name: too_large}, table)


def test_an_edit_at_the_top_to_inf_names_the_constant(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(d3qn_agent, "ADAM_EPSILON", math.inf)
    assert main(b_command(tmp_path)) == 2
    assert one_error_line(capsys) == (
        f"error: ADAM_EPSILON (--adam-epsilon) must be {FINITE}, got inf")


@pytest.mark.parametrize(("argv", "message"), [
    (["--updates-per-step", "inf"],
     f"UPDATES_PER_STEP (--updates-per-step) must be {FINITE}, got inf"),
    (["--log-every", "nan"], f"LOG_EVERY (--log-every) must be {FINITE}, got nan"),
    (["--seed", "-1"], "SEED (--seed) must be in [0, 2**32 - 1], got -1"),
    (["--tensorboard", ""],
     "TENSORBOARD (--tensorboard) must be a directory name, not empty, got ''"),
    (["--eval-episodes", "100000000"], "EVAL_EPISODES (--eval-episodes) must be in [1, 1,000] "
     "(one environment each, side by side), got 100000000"),
    (["--env-name", "Blackjack-v1"], "Blackjack-v1 has observation space Tuple(Discrete(32), "
     "Discrete(11), Discrete(2)); this agent needs Box observations (an array of numbers)"),
])
def test_apex_refuses_bad_flags_in_one_error_line_before_ray_starts(
        tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setattr(apex, "connect_ray", None)  # never reached
    assert apex.main([*argv, "--model-dir", str(tmp_path / "m"), "--plot-dir",
                      str(tmp_path / "p")]) == 2
    assert one_error_line(capsys) == f"error: {message}"
    assert not ray.is_initialized() and list(tmp_path.iterdir()) == []


# --- KERAS_BACKEND ------------------------------------------------------------------------------


def test_a_keras_backend_that_keras_cannot_import_is_named(monkeypatch):
    installed = {"tensorflow", "jax"}
    monkeypatch.setattr(quiet_startup.importlib.util, "find_spec",
                        lambda name: object() if name in installed else None)
    assert quiet_startup.keras_backend_error({"KERAS_BACKEND": "bogus"}) == (
        "KERAS_BACKEND (environment variable) must be a Keras backend installed here "
        "(tensorflow, jax), got 'bogus'")
    assert quiet_startup.keras_backend_error({"KERAS_BACKEND": "torch"}) == (
        "KERAS_BACKEND (environment variable) must be a Keras backend installed here "
        "(tensorflow, jax), got 'torch' (torch is not installed)")
    for environ in ({}, {"KERAS_BACKEND": ""}, {"KERAS_BACKEND": "jax"}):  # Keras' own choice
        assert quiet_startup.keras_backend_error(environ) is None


@pytest.mark.parametrize(("script", "backend"), [("d3qn_agent.py", "bogus"), ("apex.py", "torch")])
def test_a_bad_keras_backend_is_one_error_line_before_keras_loads(script, backend):
    if quiet_startup.importlib.util.find_spec(backend):
        pytest.skip(f"{backend} is installed here")
    # Refused as the script's first import runs: a fresh Python that loads no TensorFlow.
    done = subprocess.run([sys.executable, str(ROOT / script), "--total-steps", "1500"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "KERAS_BACKEND": backend})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("error: KERAS_BACKEND (environment variable) must be a Keras "
                                  "backend installed here (") and done.stderr.count("\n") == 1


# --- Ctrl-C before training ---------------------------------------------------------------------


def interrupt(*args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt


def test_ctrl_c_while_the_agent_is_built_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(d3qn_agent, "OurModel", interrupt)
    assert main(b_command(tmp_path)) == 130
    assert capsys.readouterr().err == "stopped: Ctrl-C before training started\n"
    assert not (tmp_path / "D").exists()


def test_ctrl_c_while_a_resume_loads_lets_go_of_the_lock_and_writes_nothing(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(agent_checkpoint, "load", interrupt)
    argv = ["--resume", "--hidden-units", "16", "16", "--no-xla", *b_command(tmp_path)]
    assert main(argv) == 130
    assert capsys.readouterr().err == "stopped: Ctrl-C before training started\n"
    assert list((tmp_path / "D" / "m").iterdir()) == []  # the lock taken for the resume: gone


@pytest.mark.parametrize("during", ["an episode", "the GIF's write"])
def test_ctrl_c_during_test_is_one_line_and_exit_130_with_nothing_half_written(
        tmp_path, capsys, monkeypatch, during):
    agent = small_agent(tmp_path)
    agent.save(agent.Model_name)
    saved = sorted((tmp_path / "models").iterdir())
    (tmp_path / "films").mkdir()
    flags = small_flags(tmp_path)
    argv = ["--test", "--hidden-units", "16", "16", "--model-dir", flags["model_dir"],
            "--plot-dir", flags["plot_dir"]]
    if during == "an episode":
        monkeypatch.setattr(d3qn_agent, "play_greedy", interrupt)
    else:  # the GIF's bytes written to its temporary file, not yet in place
        monkeypatch.setattr(atomic_files, "fsync_file", interrupt)
        argv += ["--record", str(tmp_path / "films" / "episode.gif")]
    assert main(argv) == 130
    assert capsys.readouterr().err == "stopped: Ctrl-C during --test\n"
    assert sorted((tmp_path / "models").iterdir()) == saved
    assert list((tmp_path / "films").glob("*")) == []  # no GIF, no temporary file


def test_ctrl_c_before_an_apex_run_starts_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(apex, "Learner", interrupt)
    assert apex.main(["--model-dir", str(tmp_path / "m"), "--plot-dir", str(tmp_path / "p")]) == 130
    assert capsys.readouterr().err == "stopped: Ctrl-C before the run started\n"
    assert not ray.is_initialized() and list(tmp_path.iterdir()) == []


def test_ctrl_c_reaching_the_top_of_a_script_is_one_line(capsys):
    quiet_startup.ctrl_c_in_one_line(KeyboardInterrupt, KeyboardInterrupt(), None)
    assert capsys.readouterr().err == "stopped: Ctrl-C\n"
    try:
        raise ValueError("kept")
    except ValueError as error:
        quiet_startup.ctrl_c_in_one_line(ValueError, error, error.__traceback__)
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "ValueError: kept" in err


# --- A stop signal during an evaluation ---------------------------------------------------------


def test_play_greedy_ends_at_the_first_step_after_a_stop():
    envs = [make_env("CartPole-v1") for _ in range(3)]
    stop, calls = StopRequest(), []

    def policy(states: np.ndarray) -> np.ndarray:
        calls.append(len(states))
        stop.requested = len(calls) == 2  # a stop signal during the second step
        return np.zeros(len(states), dtype=int)  # CartPole falls after about 10 steps

    assert play_greedy(envs, policy, [0, 1, 2], stop) is None
    assert calls == [3, 3]
    assert play_greedy(envs, policy, [0, 1, 2], stop) is None and calls == [3, 3]  # not begun
    always_left = lambda states: np.zeros(len(states), dtype=int)  # noqa: E731
    assert play_greedy(envs, always_left, [0, 1, 2]).shape == (3,)  # no stop: every return


@pytest.mark.parametrize("total_steps", [200, 100], ids=["mid-run", "final evaluation"])
def test_sigterm_during_an_evaluation_stops_the_run_at_once_and_resume_goes_on_with_it(
        tmp_path, capsys, total_steps):
    # No gradient step (none traced: seconds saved); the evaluations' seeds are what is checked.
    flags = {"total_steps": total_steps, "learning_starts": 1_000, "eval_every": 100,
             "eval_episodes": 5}
    agent = small_agent(tmp_path, **flags)
    policy, evaluation_steps = agent.greedy_actions, []

    def signalled_in_evaluation(states: np.ndarray) -> np.ndarray:
        if len(states) == 5:  # the evaluation's episodes, side by side (acting passes one state)
            evaluation_steps.append(agent.step)
            if len(evaluation_steps) == 3:
                os.kill(os.getpid(), signal.SIGTERM)
        return policy(states)

    agent.greedy_actions = signalled_in_evaluation
    agent.run()
    assert evaluation_steps == [100, 100, 100]  # no step of the evaluation after the signal
    assert agent.step == 100 and agent.evaluations == []  # the cut evaluation is not recorded
    assert "interrupted by SIGTERM at step 100: checkpoint " in capsys.readouterr().out

    resumed = small_agent(tmp_path, **flags)
    resumed.begin("latest")
    resumed.run()  # the evaluation at step 100 first, then on as if never stopped
    assert "done: " in capsys.readouterr().out
    whole = small_agent(tmp_path / "whole", **flags)
    whole.run()
    assert [step for step, *_ in resumed.evaluations] == list(range(100, total_steps + 1, 100))
    np.testing.assert_allclose([mean for *_, mean in resumed.evaluations],
                               [mean for *_, mean in whole.evaluations])
