"""How N environments are stepped (benchmarks/bench_vector_envs.py): its flags, a tiny run's
results file and its rendering, and the frame check behind the page's AtariVectorEnv sentence."""

from __future__ import annotations

import json

import pytest
from test_bench_n_envs import BAD_FLAGS

from benchmarks import bench_vector_envs, benchmark_tables


@pytest.mark.parametrize("flags, said", BAD_FLAGS)
def test_a_bad_flag_is_one_error_line_before_any_timing(capsys, monkeypatch, flags, said):
    monkeypatch.setattr(bench_vector_envs.provenance, "time_alone",
                        lambda: pytest.fail("timed"))
    try:
        code = bench_vector_envs.main([*flags, "--results", "/nonexistent/x.json"])
    except SystemExit as stop:  # --rounds: timing.check_rounds's line, as every script's
        code = stop.code
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(said)


def test_a_tiny_run_times_every_stepper_at_each_n_and_its_file_renders(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_vector_envs.provenance, "time_alone", lambda: None)  # not a timing
    results = tmp_path / "bench_vector_envs" / "20261129T000000Z.json"
    assert bench_vector_envs.main(["--env-name", "CartPole-v1", "--n-envs", "3", "1",
                                   "--steps", "10", "--rounds", "2",
                                   "--results", str(results)]) == 0
    found = json.loads(results.read_text())["results"]
    assert (found["n_envs"], found["steps"], found["rounds"]) == ([1, 3], 12, 2)  # 10 -> 3 x 4
    assert list(found["env_steps_per_second"]) == [  # no AtariVectorEnv for CartPole
        "Environments (the agent's, in turn)", "gymnasium SyncVectorEnv",
        "gymnasium AsyncVectorEnv"]
    for by_n in found["env_steps_per_second"].values():
        assert list(by_n) == ["1", "3"]
        assert all(len(speeds) == 2 and min(speeds) > 0 for speeds in by_n.values())
    assert "frames" not in found
    page = benchmark_tables.vector_envs_game("CartPole-v1", tmp_path).splitlines()
    assert page[0] == "**CartPole**"
    assert page[2] == "| stepper | N = 1, env steps/s | N = 3, env steps/s |"
    assert page[4].startswith("| Environments (the agent's, in turn) | ")
    assert page[-1].startswith("2 alternating rounds of 12 env steps per stepper and N")
    assert benchmark_tables.vector_envs_game("MinAtar/Breakout-v1", tmp_path) == (
        "**MinAtar Breakout**: none at this commit; `python benchmarks/bench_vector_envs.py "
        "--env-name MinAtar/Breakout-v1` measures it.\n")


def test_ale_vector_frames_are_atari_preprocessings_only_without_random_resets():
    """What docs/benchmarks.md says of AtariVectorEnv: the same pixels step for step from a reset
    without no-ops or FIRE; the random no-ops make other episodes; its first stack is blank."""
    game = "PongNoFrameskip-v4"
    assert bench_vector_envs.first_difference(game, 0, noop_max=0, fire=False) is None
    assert bench_vector_envs.first_difference(game, 0, noop_max=30, fire=False) is not None
    frames = bench_vector_envs.compare_frames(game)
    assert frames["agent_first_stack_repeats_first_frame"]
    assert frames["ale_first_stack_older_frames_blank"]
    sentence = benchmark_tables.frame_check(frames)
    assert ("equal to the last pixel at every step, from every seed (no random no-ops and no "
            "FIRE on reset)") in sentence
    assert sentence.endswith("The first episode's first stack: the agent's repeats its first "
                             "frame; AtariVectorEnv's older frames are blank (zeros).\n")
