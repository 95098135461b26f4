"""The agent's own training loop for a window of steps, shared by the benchmarks that time or use
it (`bench_atari.py`, `bench_checkpoint.py`)."""

from __future__ import annotations

import contextlib
import io
import math
import time
from typing import Any

# What the stubbed evaluations note: `run` passes the last evaluation's mean to the summary line,
# whose stub takes them back out.
NO_EVALUATION = (0, 0, math.nan)


def skip_end_of_run(agent: Any) -> None:
    """Stub out what `DQNAgent.run` does once its budget is spent: the final evaluation, saving
    the last network, the plots and the summary line. A real run does them once, at its end.
    The callers build the agent with CHECKPOINT_EVERY 0 (Pong's preset writes one every 25,000
    steps and at the end)."""

    def no_evaluation(stop: Any = None) -> bool:  # True, as `evaluate_and_keep_best`: not cut short
        agent.evaluations.append(NO_EVALUATION)
        return True

    agent.evaluate_and_keep_best = no_evaluation
    agent.save = lambda name: None
    agent.report.draw = lambda *values: ""

    def finish(*values: Any) -> None:
        agent.evaluations[:] = [done for done in agent.evaluations if done is not NO_EVALUATION]

    agent.report.finish = finish


def run_steps(agent: Any, count: int) -> float:
    """Run `count` more steps of the agent's own loop (`run`, its budget ending `count` steps
    on, after `skip_end_of_run`); return the wall time in seconds. Its lines go to a buffer.
    The budget moves as a resumed run's TOTAL_STEPS may (agent_checkpoint.MAY_CHANGE_ON_RESUME)."""
    agent.config.total_steps = agent.step + count
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # run's first line, the per-episode lines
        agent.run()
    return time.perf_counter() - start
