"""The study runner (benchmarks/study.py): its report on hand-made results, skipping finished
runs, resuming a killed one, and the fields a result file carries."""

import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import KILL_WHILE_CHECKPOINTING, ROOT

from benchmarks import study


@pytest.fixture(autouse=True)
def few_bootstrap_resamples(monkeypatch):
    """Enough resamples for the checks below, few enough for a quick test."""
    monkeypatch.setattr(study, "BOOTSTRAP_REPS", 200)
    monkeypatch.setattr(study, "CURVE_BOOTSTRAP_REPS", 20)


def test_iqm_and_its_interval_on_scores_checkable_by_hand():
    points, intervals = study.iqm_interval({"a": np.arange(1.0, 9.0), "b": [5.0] * 4})
    # IQM of 1..8: the middle half 3, 4, 5, 6, mean 4.5; of a constant: the constant.
    assert points == pytest.approx({"a": 4.5, "b": 5.0})
    assert intervals["b"] == pytest.approx([5.0, 5.0])
    low, high = intervals["a"]
    assert 1.0 <= low < 4.5 < high <= 8.0


def test_probability_of_improvement_checkable_by_hand():
    # Of the 4 pairs (3, 1), (3, 5), (6, 1), (6, 5) the first run wins 3.
    point, interval = study.improvement_interval([3.0, 6.0], [1.0, 5.0])
    assert point == pytest.approx(0.75)
    assert 0.0 <= interval[0] <= 0.75 <= interval[1] <= 1.0
    # Ties count half; a run that always wins has probability 1 in every resample.
    assert study.improvement_interval([2.0, 2.0], [2.0, 2.0])[0] == pytest.approx(0.5)
    assert study.improvement_interval([9.0, 8.0], [1.0, 2.0])[1] == pytest.approx([1.0, 1.0])


def test_intervals_repeat_call_after_call_and_leave_numpys_generator_alone():
    before = np.random.get_state()[1].copy()  # noqa: NPY002 (the generator rliable uses)
    better, baseline = [20.2, 21.0, 20.8, 21.0, 20.6], [20.9, 21.0, 21.0, 21.0, 20.1]
    first = study.improvement_interval(better, baseline)
    # rliable resamples two groups with numpy's global generator: seeded, and restored after.
    assert study.improvement_interval(better, baseline)[1] == pytest.approx(first[1])
    assert study.iqm_interval({"a": better})[1]["a"] == pytest.approx(
        study.iqm_interval({"a": better})[1]["a"])
    assert (np.random.get_state()[1] == before).all()  # noqa: NPY002


def write_result(results: Path, game: str, variant: str, seed: int, score: float,
                 solved: int | None, curve: list[float]) -> None:
    """A result file with the fields the report reads and made-up numbers: its training
    episodes average half its last network's score."""
    path = study.Run("handmade", game, variant, seed).result_path(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "game": game, "variant": variant, "seed": seed, "command": "python d3qn_agent.py",
        "target": 100.0, "evaluation": {"steps": [1000, 2000], "means": curve},
        "solved_score": 100.0, "steps_to_solve": solved, "final_score": score,
        "training_scores_last_100": [score / 2 - 1, score / 2 + 1], "wall_seconds": 10.0,
        "steps_per_second": 200.0, "load_average": [2.5, 2.0, 1.5],
        "settings": {"total_steps": 2000}}))


def rewrite_result(results: Path, game: str, variant: str, seed: int, **fields) -> None:
    """Overwrite some fields of a result file that write_result made."""
    path = study.Run("handmade", game, variant, seed).result_path(results)
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_report_from_hand_made_results(tmp_path):
    for seed, (per, uniform) in enumerate([(100, 10), (120, 20), (140, 30), (300, 40)]):
        write_result(tmp_path, "Game-v0", "per", seed, per, 1000 if per >= 100 else None,
                     [0.0, per])
        write_result(tmp_path, "Game-v0", "uniform", seed, uniform, None, [0.0, uniform])
        write_result(tmp_path, "Other-v0", "per", seed, 2.0 + seed, None, [0.0, 1.0])
        write_result(tmp_path, "Other-v0", "uniform", seed, 1.0 - seed, None, [0.0, 1.0])
    # A game whose uniform runs are still to come: in the tables, not yet in the figures, nor
    # in the probability of improvement over the games.
    write_result(tmp_path, "Later-v0", "per", 0, 50.0, None, [0.0, 50.0])
    text = study.report("handmade", tmp_path, tmp_path / "plots")
    assert "| Later-v0 | PER (proportional) | 1 | 50.0 [50.0, 50.0] |" in text
    scores_table = text.split("\n\n")[0]
    rows = {line.split(" | ")[1]: line for line in scores_table.splitlines()
            if "Game-v0" in line}
    # IQM of 4 runs: the middle two. PER 120, 140 -> 130; uniform 20, 30 -> 25.
    assert "| 130.0 [" in rows["PER (proportional)"]
    assert "| 65.0 [" in rows["PER (proportional)"]  # the training episodes: half of it
    assert "| 4/4 (>= 100) | 1,000 |" in rows["PER (proportional)"]
    assert "| 25.0 [" in rows["uniform"]
    assert "| 0/4 (>= 100) | not solved by 2,000 | `python d3qn_agent.py` |" in rows["uniform"]
    # Every PER run beats every uniform run.
    assert "| Game-v0 | PER (proportional) | 1.00 [1.00, 1.00] | 1.00 [1.00, 1.00] |" in text
    assert "| all 2 games | PER (proportional) | 1.00 [1.00, 1.00] | 1.00 [1.00, 1.00] |" in text
    assert (tmp_path / "handmade" / "report.md").read_text().endswith(
        text.split("\nfigure:")[0])
    for figure in ("handmade_iqm.png", "handmade_sample_efficiency.png"):
        assert (tmp_path / "plots" / figure).stat().st_size > 10_000


def write_pong_result(results: Path, study_name: str, variant: str, seed: int, score: float,
                      first_episode_end: int) -> None:
    """A Pong result whose ten training episodes all score `score`, the first ending at step
    `first_episode_end` and each next one 1,000 steps later."""
    path = study.Run(study_name, "PongNoFrameskip-v4", variant, seed).result_path(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = [first_episode_end + 1000 * episode for episode in range(10)]
    path.write_text(json.dumps({
        "game": "PongNoFrameskip-v4", "variant": variant, "seed": seed,
        "command": "python d3qn_agent.py", "target": 18.0,
        "evaluation": {"steps": [250_000, 500_000], "means": [score, score]},
        "solved_score": None, "steps_to_solve": None, "final_score": score,
        "training_scores_last_100": [score] * 10, "wall_seconds": 10.0,
        "steps_per_second": 200.0, "load_average": [2.0, 2.0, 2.0],
        "settings": {"total_steps": 500_000},
        "training_curve": {"steps": steps, "scores": [score] * 10}}))


def test_pong_steps_to_the_target_are_censored_at_the_budget(tmp_path):
    # PER's runs score 20 from their first episode, which ends at step 100 * (seed + 1): the
    # 100-episode mean (fewer at the start) is at 18 there. Uniform's never get there.
    for seed in range(4):
        write_pong_result(tmp_path, "pong", "per", seed, 20.0, 100 * (seed + 1))
        write_pong_result(tmp_path, "pong", "uniform", seed, -21.0, 100 * (seed + 1))
    text = study.report("pong", tmp_path, tmp_path / "plots")
    # IQM of 100, 200, 300, 400: the mean of 200 and 300; the censored runs count 500,000.
    assert "| PongNoFrameskip-v4 | PER (proportional) | 4 | 250 [" in text
    assert "| 4/4 (target 18) |" in text
    assert "| uniform | 4 | 500,000 [500,000, 500,000] | 0/4 (target 18) |" in text
    assert "counts as getting there at its last step (censored at its budget)" in text
    assert "| PongNoFrameskip-v4 | PER (proportional) | 1.00 [1.00, 1.00] |" in text
    assert (tmp_path / "plots" / "pong_training_curves.png").exists()
    # bfloat16's runs against them: as good at the end, always first to the target.
    for seed in range(4):
        write_pong_result(tmp_path, "pong_bf16", "per", seed, 20.0, 50)
    text = study.compare("pong_bf16", "pong", "PongNoFrameskip-v4", "per", tmp_path)
    assert "last networks: 0.50 [0.50, 0.50]" in text
    assert "fewer steps to a 100-episode training mean at the target: 1.00 [1.00, 1.00]" in text
    assert "| pong_bf16 | 4 | 20.0 [20.0, 20.0] | 20.0 [20.0, 20.0] | 50 [50, 50] | 4/4 |" in text
    assert "| pong | 4 | 20.0 [20.0, 20.0] | 20.0 [20.0, 20.0] | 250 [" in text


def test_figure_titles_count_each_variants_seeds_while_a_study_is_under_way():
    assert study.seeds_label({"per": [{}] * 5, "uniform": [{}] * 5}) == "5 seeds"
    assert study.seeds_label({"per": [{}] * 4, "uniform": [{}] * 3}) == "per 4, uniform 3 seeds"


def test_a_resumed_runs_training_curve_keeps_each_episode_once(tmp_path):
    log = tmp_path / "training.log"
    log.write_text("training on Pong\n"
                   "episode: 1, step: 900/2000, score: -21, e: 0.99, average: -21.0, 9 steps/s\n"
                   "episode: 2, step: 1700/2000, score: -20, e: 0.98, average: -20.5, 9 steps/s\n"
                   "resuming from step-1000 at step 1000\n"
                   "training on Pong\n"
                   "episode: 2, step: 1700/2000, score: -20, e: 0.98, average: -20.5, 9 steps/s\n"
                   "episode: 3, step: 1990/2000, score: -19, e: 0.97, average: -20.0, 9 steps/s\n")
    assert study.training_curve(log) == {"steps": [900, 1700, 1990],
                                         "scores": [-21.0, -20.0, -19.0]}


def test_status_tells_done_resumed_stopped_started_and_to_do_runs(tmp_path):
    runs = [study.Run("s", "CartPole-v1", "per", seed) for seed in range(4)]
    path = runs[0].result_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"final_score": 475.25, "resumed": 2}))
    (runs[1].work_dir(tmp_path) / "x.checkpoints" / "run-1" / "step-0000025000").mkdir(
        parents=True)
    runs[2].work_dir(tmp_path).mkdir(parents=True)
    (runs[2].work_dir(tmp_path) / "training.log").write_text("")
    assert study.status(runs, tmp_path, tmp_path).splitlines() == [
        "CartPole-v1/per/seed0: done, last network 475.2, resumed 2 times",
        "CartPole-v1/per/seed1: stopped, newest checkpoint at step 25,000; `run` resumes it there",
        "CartPole-v1/per/seed2: stopped before its first checkpoint; `run` starts it anew",
        "CartPole-v1/per/seed3: to do"]
    # A run whose lock is held (here by this process, through another open file) is training.
    with (runs[1].work_dir(tmp_path) / "x.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert study.status(runs[1:2], tmp_path, tmp_path) == (
            "CartPole-v1/per/seed1: training now, newest checkpoint at step 25,000\n")
    assert not study.is_training(runs[1].work_dir(tmp_path))  # the lock is let go


def test_targets_on_training_returns_count_the_seeds_by_those(tmp_path):
    for seed, score in enumerate([100.0, 120.0, 140.0, 300.0]):  # training 50, 60, 70, 150
        write_result(tmp_path, "Game-v0", "per", seed, score, None, [0.0, score])
    found = study.load_results("handmade", tmp_path)
    assert "| 4/4 (>= 100) |" in study.report_tables(found)
    text = study.report_tables(found, study.TRAINING)
    assert "seeds at target (last 100 training episodes)" in text
    assert "| 1/4 (>= 100) |" in text


def test_published_readings_stand_beside_each_variants_training_returns(tmp_path):
    for seed in range(4):  # training episodes: PER 10, 10, 10, 10; uniform 5, 5, 5, 5
        write_result(tmp_path, "Game-v0", "per", seed, 20.0, None, [0.0, 1.0])
        write_result(tmp_path, "Game-v0", "uniform", seed, 10.0, None, [0.0, 1.0])
        write_result(tmp_path, "Other-v0", "per", seed, 4.0, None, [0.0, 1.0])
    published = {"paper at 2M": {"Game-v0": 15.0}, "at 5M": {"Game-v0": 17.5}}
    text = study.report_tables(study.load_results("handmade", tmp_path), study.TRAINING,
                               published)
    table = text.split("\n\n")[-1]
    assert table.splitlines()[0] == (
        "| game | PER (proportional): IQM of last 100 training episodes | uniform: IQM of last "
        "100 training episodes | paper at 2M | at 5M |")
    assert "| Game-v0 | 10.0 [10.0, 10.0] | 5.0 [5.0, 5.0] | 15 | 17.5 |" in table
    assert "| Other-v0 | 2.0 [2.0, 2.0] | n/a | n/a | n/a |" in table
    assert "paper at 2M" not in study.report_tables(study.load_results("handmade", tmp_path))


def test_improvement_is_judged_on_last_networks_and_on_training_episodes_apart(tmp_path):
    # PER's last networks beat uniform's in every pair; its training episodes lose every pair.
    for seed in range(3):
        write_result(tmp_path, "Game-v0", "per", seed, 10.0 + seed, None, [0.0, 1.0])
        write_result(tmp_path, "Game-v0", "uniform", seed, 5.0 - seed, None, [0.0, 1.0])
        rewrite_result(tmp_path, "Game-v0", "uniform", seed,
                       training_scores_last_100=[50.0 + seed])
    text = study.report_tables(study.load_results("handmade", tmp_path))
    assert "| Game-v0 | PER (proportional) | 1.00 [1.00, 1.00] | 0.00 [0.00, 0.00] |" in text


def test_over_the_games_each_game_gives_the_seeds_they_all_have(tmp_path):
    # Game-v0 has seeds 0-3, Other-v0 only 0-1: over both, PER wins every pair of seeds 0-1;
    # Game-v0's seeds 2-3, where uniform wins, are left out.
    for seed in range(4):
        write_result(tmp_path, "Game-v0", "per", seed, 10.0 if seed < 2 else 1.0, None, [0.0])
        write_result(tmp_path, "Game-v0", "uniform", seed, 5.0, None, [0.0])
    for seed in range(2):
        write_result(tmp_path, "Other-v0", "per", seed, 3.0, None, [0.0])
        write_result(tmp_path, "Other-v0", "uniform", seed, 2.0, None, [0.0])
    text = study.report_tables(study.load_results("handmade", tmp_path))
    assert "| Game-v0 | PER (proportional) | 0.50 [" in text
    assert ("| all 2 games (seeds 0, 1) | PER (proportional) | 1.00 [1.00, 1.00] | "
            "1.00 [1.00, 1.00] |") in text


def test_a_game_without_a_solved_score_has_no_steps_to_solve(tmp_path):
    write_result(tmp_path, "Game-v0", "per", 0, 1.0, None, [0.0, 1.0])
    rewrite_result(tmp_path, "Game-v0", "per", 0, solved_score=None)
    text = study.report_tables(study.load_results("handmade", tmp_path))
    assert "| n/a (no solved score) |" in text and "not solved" not in text


def test_report_refuses_a_result_file_without_a_field_it_reads(tmp_path):
    write_result(tmp_path, "Game-v0", "per", 0, 1.0, None, [0.0, 1.0])
    path = study.Run("handmade", "Game-v0", "per", 0).result_path(tmp_path)
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items()
                                if k != "final_score"}))
    with pytest.raises(ValueError, match=r"seed0.json lacks final_score"):
        study.load_results("handmade", tmp_path)


def test_finished_runs_are_skipped(tmp_path):
    runs = [study.Run("handmade", "Game-v0", variant, seed) for variant in ("per", "uniform")
            for seed in (0, 1)]
    write_result(tmp_path, "Game-v0", "uniform", 0, 1.0, None, [0.0, 1.0])
    assert study.pending_runs(runs, tmp_path) == [runs[0], runs[1], runs[3]]


def test_a_namespaced_game_gets_one_folder_and_is_read_back_by_its_id(tmp_path):
    run = study.Run("handmade", "MinAtar/Breakout-v1", "per", 3)
    assert run.result_path(tmp_path) == tmp_path / "handmade/MinAtar-Breakout-v1/per/seed3.json"
    write_result(tmp_path, "MinAtar/Breakout-v1", "per", 3, 7.0, None, [0.0, 7.0])
    found = study.load_results("handmade", tmp_path)
    assert [result["final_score"] for result in found["MinAtar/Breakout-v1"]["per"]] == [7.0]
    assert study.pending_runs([run], tmp_path) == []


# A tiny CartPole run: a small network, checkpoints every 200 steps (a fifth) with gradient
# steps from step 100 on, so that the resumed part trains; no XLA to compile.
TINY = ("--total-steps", "1000", "--eval-every", "250", "--eval-episodes", "5",
        "--learning-starts", "100", "--exploration-steps", "500", "--hidden-units", "64", "64",
        "--batch-size", "32", "--no-xla")


@pytest.mark.slow  # three trainings, two of them in Pythons of their own
def test_a_killed_run_resumes_and_ends_as_an_uninterrupted_one(tmp_path):
    run = study.Run("tiny", "CartPole-v1", "per", 3, TINY)
    # Killed as it writes its second checkpoint (step 400): it resumes from the first.
    program = KILL_WHILE_CHECKPOINTING + "from benchmarks import study\nstudy.main(sys.argv[3:])"
    killed = subprocess.run(
        [sys.executable, "-c", program, "memory.npz", "400", "train", "tiny", "CartPole-v1",
         "per", "3", "--work-dir", str(tmp_path / "work"), "--results", str(tmp_path / "results"),
         "--", *TINY], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    checkpoints = run.work_dir(tmp_path / "work") / "DDQN_CartPole-v1_Dueling_PER.checkpoints"
    assert [path.name for path in checkpoints.glob("run-*/step-*")] == ["step-0000000200"]
    assert not run.result_path(tmp_path / "results").exists()

    kept = tmp_path / "pretrained" / "CartPole-v1.keras"
    assert study.run_all([run], 1, tmp_path / "work", tmp_path / "results", {run: kept}) == 0
    resumed = json.loads(run.result_path(tmp_path / "results").read_text())
    log = (run.work_dir(tmp_path / "work") / "training.log").read_text()
    assert "resuming from" in log
    assert resumed["resumed"] == 1
    # run_all gives one run at a time all the cores, unless the caller chose.
    assert resumed["threads"] == int(os.environ.get("TF_NUM_INTRAOP_THREADS") or os.cpu_count())
    assert all(field in resumed for field in study.RESULT_FIELDS)
    assert resumed["command"] == ("python d3qn_agent.py --env-name CartPole-v1 --seed 3 "
                                  + " ".join(TINY))
    assert len(resumed["final_returns"]) == study.FINAL_EPISODES
    assert resumed["evaluation"]["steps"] == [250, 500, 750, 1000]

    # The same run without a kill: the same training episodes and curve, the same last network
    # (weights up to float rounding) and its score.
    uninterrupted = study.train(run, tmp_path / "work2", tmp_path / "results2")
    assert uninterrupted["training_curve"] == resumed["training_curve"]
    assert uninterrupted["evaluation"]["means"] == resumed["evaluation"]["means"]
    assert uninterrupted["final_returns"] == resumed["final_returns"]
    import keras

    last = "DDQN_CartPole-v1_Dueling_PER_last.keras"
    for got, expected in zip(
            keras.models.load_model(run.work_dir(tmp_path / "work") / last).get_weights(),
            keras.models.load_model(run.work_dir(tmp_path / "work2") / last).get_weights(),
            strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    # The kept network is the last one: it plays as the one the run scored.
    assert kept.read_bytes() == (run.work_dir(tmp_path / "work")
                                 / "DDQN_CartPole-v1_Dueling_PER_last.keras").read_bytes()
    # A second run_all finds nothing to do.
    assert study.pending_runs([run], tmp_path / "results") == []
