"""Every test sees a CPU without bfloat16 instructions, so that a Pong agent is built alike on
every machine; tests of the bfloat16 preset say which CPU they mean. One real `python
d3qn_agent.py` run on CartPole serves the tests that read what the command writes."""

import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from d3qn_utils import settings

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def cpu_without_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings, "native_bfloat16", lambda: None)


class CommandLineRun(NamedTuple):
    exit_code: int
    output: str  # stdout and stderr as a terminal shows them, interleaved
    models: Path
    plots: Path


@pytest.fixture(scope="session")
def cartpole_command_line_run(tmp_path_factory) -> CommandLineRun:
    """`python d3qn_agent.py` for 200 steps (gradient steps from step 100, an evaluation at the
    end) in a directory of its own: one Python with TensorFlow started for every test of it."""
    directory = tmp_path_factory.mktemp("command_line_run")
    models, plots = directory / "models", directory / "plots"
    command = [sys.executable, str(ROOT / "d3qn_agent.py"), "--total-steps", "200",
               "--learning-starts", "100", "--eval-every", "200", "--eval-episodes", "2",
               "--hidden-units", "16", "--model-dir", str(models), "--plot-dir", str(plots)]
    done = subprocess.run(command, cwd=directory, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    return CommandLineRun(done.returncode, done.stdout, models, plots)
