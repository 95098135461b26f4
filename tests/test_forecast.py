"""What a run will cost (reporting.Forecast): the estimate and the time left, checked by hand on
times passed in, and on d3qn_agent.py's episode line."""

from __future__ import annotations

import time

import pytest
from conftest import small_agent

from d3qn_utils.reporting import Forecast, duration


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (-3, "0 s"), (44.6, "45 s"), (89.4, "89 s"), (89.6, "1 min"), (150, "2 min"),
    (3569, "59 min"), (3571, "1 h 0 min"), (10_557, "2 h 56 min"), (3 * 86_400, "72 h 0 min"),
])
def test_duration_rounds_to_what_a_reader_plans_with(seconds, text):
    assert duration(seconds) == text


def test_estimate_after_half_a_minute_of_training_then_time_left_on_every_line():
    forecast = Forecast(500_000)
    assert forecast.tell(20_000, 99.0) == (None, None)  # not begun: nothing measured
    forecast.begin(1_000, now=100.0)  # the first gradient steps are done
    forecast.begin(1_500, now=110.0)  # later calls do not move the start
    assert forecast.tell(1_000, 110.0) == (None, None)  # no step measured
    # 29 s measured: too early for an estimate, and no time left before it.
    assert forecast.tell(2_363, 129.0) == (None, None)
    # 30 s at 47 steps/s: 1,410 steps; 497,590 left take 10,587 s.
    assert forecast.tell(2_410, 130.0) == (
        "estimate: about 2 h 56 min to step 500,000 at 47 steps/s", "2 h 56 min")
    assert forecast.tell(2_410, 130.0) == (None, "2 h 56 min")  # the estimate is given once
    # 9,400 steps in 200 s: still 47 steps/s; 489,600 left take 10,417 s.
    assert forecast.tell(10_400, 300.0) == (None, "2 h 54 min")
    assert forecast.tell(500_000, 10_738.0) == (None, "0 s")


def test_a_slow_run_gets_a_decimal_and_apex_counts_env_steps():
    forecast = Forecast(1_000, unit="env step")
    forecast.begin(0, now=0.0)
    # 75 steps in 30 s: 2.5 steps/s; 925 left take 370 s.
    assert forecast.tell(75, 30.0)[0] == (
        "estimate: about 6 min to env step 1,000 at 2.5 env steps/s")


def test_no_estimate_once_the_budget_is_spent():
    forecast = Forecast(300)
    forecast.begin(100, now=0.0)
    assert forecast.tell(300, 60.0) == (None, None)


def test_an_episode_line_after_the_estimate_carries_the_time_left(tmp_path, capsys):
    agent = small_agent(tmp_path)
    agent.step, agent.episode = 2_000, 7
    start = time.perf_counter()  # after the report's own start: its steps/s stays positive
    agent.report.forecast.begin(0, start)
    agent.report.episode(agent.step, agent.episode, 20.0, agent.epsilon, 15.0, now=start + 100.0)
    # 2,000 steps in 100 s: 20 steps/s; 48,000 left take 2,400 s.
    estimate, line = capsys.readouterr().out.splitlines()
    assert estimate == "estimate: about 40 min to step 50,000 at 20 steps/s"
    assert line.startswith("episode: 7, step: 2000/50000, score: 20, e: 1.00, average: 15.0, ")
    assert line.endswith(" steps/s, 40 min left")
