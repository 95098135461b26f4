"""The Pong log reader reads resumed logs as the run's history; the table and its command line."""

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import pong_logs as report

# A run that logged episodes 1-3, was stopped at step 350 after its checkpoint at step 200,
# and was resumed from that checkpoint: episodes 2 and 3 were replayed, 3 with another score;
# the resumed chunk gave its estimate, and its last episode line the time left.
LOG = """\
training on PongNoFrameskip-v4 until step 500: double DQN, dueling, uniform replay
episode: 1, step: 100/500, score: -21, e: 0.50, average: -21.0, 10 steps/s
episode: 2, step: 200/500, score: -19, e: 0.10, average: -20.0, 10 steps/s
checkpoint: models/DDQN_PongNoFrameskip-v4_Dueling.checkpoints/step-0000000200
evaluation at step 250: mean -20.0 +/- 1.0 over 10 greedy episodes
episode: 3, step: 300/500, score: -15, e: 0.01, average: -18.3, 10 steps/s
interrupted at step 350: checkpoint models/step-0000000350, plots ...; continue with --resume
resuming from models/DDQN_PongNoFrameskip-v4_Dueling.checkpoints/step-0000000200 at step 200
training on PongNoFrameskip-v4 until step 500: double DQN, dueling, uniform replay
evaluation at step 250: mean -18.0 +/- 2.0 over 10 greedy episodes
episode: 3, step: 300/500, score: -13, e: 0.01, average: -17.7, 20 steps/s
estimate: about 5 s to step 500 at 20 steps/s
episode: 4, step: 400/500, score: 21, e: 0.01, average: -8.0, 25 steps/s, 5 s left
checkpoint: models/DDQN_PongNoFrameskip-v4_Dueling.checkpoints/step-0000000450
"""
# The committed logs' stop line is the one above; d3qn_agent.py now names the signal that
# stopped it (Ctrl-C or SIGTERM) and the last network it saved.
SIGNAL_LOG = LOG.replace(
    "interrupted at step 350: checkpoint models/step-0000000350, plots ...",
    "interrupted by SIGTERM at step 350: checkpoint models/step-0000000350, last network "
    "models/DDQN_PongNoFrameskip-v4_Dueling_last.keras, plots ... and ...")


@pytest.mark.parametrize("log", [LOG, SIGNAL_LOG], ids=["stop-line", "stop-line-with-signal"])
def test_resumed_lines_replace_the_lost_ones(log: str) -> None:
    assert log.count("interrupted ") == 1
    run = report.parse_log(log)
    np.testing.assert_array_equal(run.steps, [100, 200, 300, 400])
    np.testing.assert_array_equal(run.scores, [-21, -19, -13, 21])
    assert run.evaluations == {250: (-18.0, 2.0)}
    assert run.reached == 450
    # Chunk times: 350 steps at 10 steps/s (the last speed printed), then 200 at 25 steps/s.
    assert [(c.start_step, c.end_step) for c in run.chunks] == [(0, 350), (200, 400)]
    assert run.seconds == pytest.approx(35 + 8)


def test_means_and_first_step_at_a_target() -> None:
    run = report.parse_log(LOG)
    assert run.mean_at(250, window=2) == pytest.approx(-20.0)  # episodes 1 and 2
    assert run.mean_at(400, window=2) == pytest.approx(4.0)  # episodes 3 and 4
    assert run.mean_at(400, window=100) == pytest.approx(-8.0)  # all four
    assert run.mean_at(450, window=2) == pytest.approx(4.0)  # reached: checkpoint at 450
    assert run.mean_at(451, window=2) is None  # past the end of the log
    assert run.first_step_with_mean(4.0, window=2) == 400
    assert run.first_step_with_mean(4.1, window=2) is None
    np.testing.assert_allclose(run.moving_average(2), [-21, -20, -16, 4])


def test_table_says_what_a_short_run_has_not_reached() -> None:
    run = report.parse_log(LOG)
    rows = {row[0]: row[1:] for row in report.table_rows({"PER": run, "uniform": run})}
    assert rows["100- / 50-episode mean at step 100,000"] == ["not reached (log ends at 450)"] * 2
    assert rows["steps to a 100-episode mean of 18"] == ["not within 450"] * 2


def test_a_log_without_episodes_is_refused() -> None:
    with pytest.raises(ValueError, match="no 'episode: N"):
        report.parse_log("training on CartPole-v1 until step 10\n")


@pytest.mark.parametrize("name", ["pong_per_preset.log", "pong_bf16_preset.log",
                                  "pong_per_fast_path.log"])
def test_committed_pong_logs_hold_the_whole_run(name: str) -> None:
    """docs/atari.md's table is redrawn from these logs: each runs to 500,000 with both
    evaluations and names only repository-relative paths."""
    text = (Path(report.__file__).parent / "logs" / name).read_text()
    run = report.parse_log(text)
    assert run.reached == 500_000
    assert sorted(run.evaluations) == [250_000, 500_000]
    assert not [word for word in text.split() if word.startswith("/")]


def test_committed_fast_path_log_reaches_18_across_a_resume() -> None:
    """The oneDNN run, stopped at step 374,790 and resumed from its checkpoint there, reached the
    100-episode mean of 18 at step 370,674 (docs/atari.md): the replayed lines do not move it."""
    text = (Path(report.__file__).parent / "logs" / "pong_per_fast_path.log").read_text()
    assert report.parse_log(text).first_step_with_mean(18.0, window=100) == 370_674
    assert "resuming from" in text


def test_command_line_puts_one_column_per_log(tmp_path: Path, capsys) -> None:
    (tmp_path / "first.log").write_text(LOG)
    (tmp_path / "second.log").write_text(SIGNAL_LOG)
    logs = [str(tmp_path / "first.log"), str(tmp_path / "second.log")]
    report.main(logs)
    assert "|  | first | second |" in capsys.readouterr().out
    report.main([*logs, "--names", "PER", "uniform", "--plot", str(tmp_path / "runs.png")])
    assert "|  | PER | uniform |" in capsys.readouterr().out
    assert (tmp_path / "runs.png").stat().st_size > 0


@pytest.mark.parametrize("names, message", [(["PER"], "gives 1 names for 2 logs"),
                                            (["PER", "PER"], "repeats a name")])
def test_command_line_refuses_names_that_do_not_fit_the_logs(
        tmp_path: Path, capsys, names: list[str], message: str) -> None:
    (tmp_path / "run.log").write_text(LOG)
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "run.log")] * 2 + ["--names", *names])
    assert message in capsys.readouterr().err


def test_results_file_holds_what_the_table_says_run_by_run_with_the_stamp(tmp_path: Path,
                                                                          capsys) -> None:
    (tmp_path / "first.log").write_text(LOG)
    results = tmp_path / "runs.json"
    report.main([str(tmp_path / "first.log"), "--names", "PER", "--results", str(results)])
    written = json.loads(results.read_text())
    assert {"command", "commit", "machine", "backend", "versions"} <= set(written)
    assert written["results"]["windows"] == list(report.WINDOWS)
    [run] = written["results"]["runs"]
    assert run["name"] == "PER" and run["log"].endswith("first.log")
    assert (run["episodes"], run["reached"], run["seconds"]) == (4, 450, pytest.approx(43))
    assert run["chunks"] == [[0, 350, 10.0], [200, 400, 25.0]]
    assert run["solved_at_step"] is None and run["evaluations"] == {}
    assert all(means == [None, None] for means in run["means"].values())  # never at 100,000
    assert "results: " in capsys.readouterr().out
