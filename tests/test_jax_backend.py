"""The agent's suites again on Keras' JAX backend. Keras picks its backend once per process, so
they run in a subprocess with KERAS_BACKEND=jax; the rest of the suite runs on TensorFlow.

Minutes of re-running: the slow tier (`python -m pytest -m slow`). The subprocess runs those
suites whole, their own slow tests included (`-m ""` lifts pyproject.toml's `not slow`)."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT

# Every suite that builds, trains, plays, saves or resumes an agent (apex.py is TensorFlow's).
JAX_SUITES = ("test_agent.py", "test_greedy_policy.py", "test_checkpoint.py", "test_minatar.py",
              "test_atari_agent.py", "test_play.py", "test_settings.py",
              "test_tensorboard_and_priorities.py", "test_n_envs.py", "test_checkpoint_format.py",
              "test_resume_checks.py", "test_replay_variants.py")


@pytest.mark.slow
@pytest.mark.timeout(3600)  # twelve suites whole, their slow tests included
def test_the_agent_suites_pass_on_the_jax_backend():
    pytest.importorskip("jax")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "",
         *(f"tests/{suite}" for suite in JAX_SUITES)],
        cwd=ROOT, env={**os.environ, "KERAS_BACKEND": "jax"}, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    print(result.stdout.splitlines()[-1])  # the JAX run's summary, for the test log
