"""The speed benchmark of N environments (benchmarks/bench_n_envs.py, with bench_atari.py's
stopwatches): a window counts environment steps, every part is per env step, and SB3's DQN makes
the same gradient steps per env step as ours at every N."""

import json
from fractions import Fraction

import pytest
from conftest import small_agent, the_error_line

from benchmarks import bench_atari, bench_n_envs, bench_vs_sb3, benchmark_tables
from benchmarks.agent_loop import run_steps, skip_end_of_run


@pytest.mark.parametrize("n_envs", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("train_frequency", [1, 2, 4])
def test_sb3_s_train_freq_in_vector_steps_keeps_the_gradient_steps_per_env_step(
        n_envs, train_frequency):
    train_freq, gradient_steps = bench_vs_sb3.sb3_train_frequency(n_envs, train_frequency)
    assert Fraction(gradient_steps, train_freq * n_envs) == Fraction(1, train_frequency)
    assert (train_freq, gradient_steps) == (  # in lowest terms: as often and as few as can be
        Fraction(train_frequency, n_envs).numerator, Fraction(train_frequency, n_envs).denominator)


@pytest.mark.parametrize("n_envs", [1, 4])
def test_sb3_s_dqn_makes_a_gradient_step_every_train_frequency_env_steps(n_envs):
    pytest.importorskip("stable_baselines3")
    settings = {"learning_rate": 1e-3, "memory_size": 1_000, "learning_starts": 100,
                "batch_size": 16, "train_frequency": 2, "target_update": 100,
                "epsilon_min": 0.01, "gamma": 0.99, "hidden_units": (16, 16)}
    model = bench_vs_sb3.sb3_dqn("CartPole-v1", settings, seed=0, threads=1, n_envs=n_envs)
    assert model.n_envs == n_envs
    model.learn(total_timesteps=500)
    assert model.num_timesteps == 500
    assert model._n_updates == (500 - 100) // 2  # a gradient step per 2 env steps past 100


def test_a_window_of_three_environments_is_timed_per_env_step(tmp_path):
    agent = small_agent(tmp_path, n_envs=3, total_steps=3_000, learning_starts=32,
                        exploration_steps=1, checkpoint_every=0)
    skip_end_of_run(agent)
    watches = bench_atari.instrument(agent)
    run_steps(agent, 48)  # past LEARNING_STARTS: the window trains
    steps = bench_atari.window_steps(100, 3)
    measured = bench_atari.new_measurement(steps, agent.config.gradient_steps_per_call)
    start = agent.step
    wall = bench_atari.time_round(agent, watches, measured)
    assert steps == 102 and agent.step - start == 102  # whole iterations of 3 env steps
    parts = measured["parts"]
    assert parts["env step"]["calls"] == [34]  # one call steps all three environments
    assert parts["act"]["calls"] == [34]  # one forward pass for the three states
    assert parts["store"]["calls"] == [102]  # a transition per env step
    assert parts["train"]["calls"][0] >= 1
    assert measured["wall_seconds"] == [wall]
    assert measured["steps_per_second"] == [102 / wall]
    assert sum(part["seconds"][0] for part in parts.values()) <= wall


# Bad flags and the start of their one error line, here and in bench_vector_envs.py
BAD_FLAGS = [
    (["--n-envs", "0", "2"], "error: --n-envs must be distinct positive integers, got 0 2"),
    (["--n-envs", "2", "2"], "error: --n-envs must be distinct positive integers, got 2 2"),
    (["--steps", "0"], "error: --steps must be positive, got 0"),
    (["--rounds", "0"], "error: --rounds must be at least 1, got 0"),
    (["--env-name", "NoSuchGame-v0"], "error: "),
]


@pytest.mark.parametrize("flags, said", BAD_FLAGS)
def test_a_bad_flag_is_one_error_line_before_any_timing(capsys, monkeypatch, flags, said):
    monkeypatch.setattr(bench_n_envs.provenance, "time_alone", lambda: pytest.fail("timed"))
    try:
        code = bench_n_envs.main([*flags, "--no-sb3", "--results", "/nonexistent/x.json"])
    except SystemExit as stop:  # --rounds: timing.check_rounds's line, as every script's
        code = stop.code
    assert code == 2
    assert the_error_line(capsys.readouterr().err).startswith(said)


def test_one_tiny_run_measures_each_n_in_turn_and_its_file_renders(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_n_envs.provenance, "time_alone", lambda: None)  # not a timing
    results = tmp_path / "bench_n_envs" / "20261129T000000Z.json"
    assert bench_n_envs.main(["--env-name", "CartPole-v1", "--n-envs", "3", "1", "--steps", "1",
                              "--rounds", "2", "--warmup-train", "0", "--no-sb3",
                              "--results", str(results)]) == 0
    found = json.loads(results.read_text())["results"]
    # Warm-up and window: whole replay periods (2 x 16 env steps) and iterations of each N.
    assert (found["n_envs"], found["steps"], found["warmup"]) == ([1, 3], 96, 1_056)
    assert found["sb3"] is None
    for n, measured in found["ours"].items():
        assert measured["steps"] == 96 and len(measured["wall_seconds"]) == 2
        assert measured["parts"]["env step"]["calls"] == [96 // int(n)] * 2
        assert measured["parts"]["train"]["calls"] == [3, 3]  # 96 env steps: 3 replay calls
    page = benchmark_tables.n_envs_game("CartPole-v1", tmp_path).splitlines()
    assert page[0].startswith("**CartPole**: the gradient step takes ")
    assert [row.split(" | ")[0] for row in page[4:6]] == ["| 1", "| 3"]
    assert page[-1].startswith("2 alternating rounds of 96 timed env steps per N after 1,056 "
                               "untimed; a gradient step every 2 env steps, 16 per call")
