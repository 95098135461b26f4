"""The suites listed in JAX_SUITES again on Keras' JAX backend: those that build, train, play,
save or resume a DQNAgent, every game family's straight-against-resumed run among them. Keras
picks its backend once per process, so they run in a subprocess with KERAS_BACKEND=jax; the rest
of the suite runs on TensorFlow. Left out: suites that build no agent; those that time things
(test_bfloat16_timing.py, test_bench_n_envs.py); those whose agent only carries another check
(test_read_along.py's reading order, test_run_files.py's lock); test_apex.py, and
test_flag_checks.py, whose Ape-X cases need TensorFlow: apex.py runs on TensorFlow only.

Minutes of re-running: the slow tier (`python -m pytest -m slow`). The subprocess runs those
suites whole, their own slow tests included (`-m ""` lifts pyproject.toml's `not slow`)."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT

JAX_SUITES = ("test_agent.py", "test_greedy_policy.py", "test_checkpoint.py", "test_minatar.py",
              "test_atari_agent.py", "test_play.py", "test_settings.py",
              "test_tensorboard_and_priorities.py", "test_n_envs.py", "test_checkpoint_format.py",
              "test_resume_checks.py", "test_replay_variants.py", "test_game_families.py")


@pytest.mark.slow
@pytest.mark.timeout(3600)  # thirteen suites whole, their slow tests included
def test_the_agent_suites_pass_on_the_jax_backend():
    pytest.importorskip("jax")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "",
         *(f"tests/{suite}" for suite in JAX_SUITES)],
        cwd=ROOT, env={**os.environ, "KERAS_BACKEND": "jax"}, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    print(result.stdout.splitlines()[-1])  # the JAX run's summary, for the test log
