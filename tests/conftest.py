"""What the tests share: the repository's ROOT, the tests' DATA folder, small agents
(`small_flags`, `small_agent`, `command_line`), two checkpoints compared
(`assert_same_checkpoint`), a CPU without bfloat16 instructions and no real timing of them for
every test (so that a Pong agent is built alike on every machine; tests of the bfloat16 preset say
which CPU and which timing they mean) and one real `python d3qn_agent.py` run on CartPole for the
tests that read what the command writes.

This file imports no TensorFlow at its top: pytest-xdist's controller loads it and runs no test,
so TensorFlow's start-up lines, held by pytest's capture, would come out after the summary.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pytest

if TYPE_CHECKING:
    from d3qn_agent import DQNAgent

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"  # the tests' fixed files (checkpoints of past formats)
CARTPOLE = "CartPole-v1"
# A small network and memory; no XLA (seconds of compiling per agent), which the tests of it
# turn on.
SMALL = {"hidden_units": (16, 16), "memory_size": 1_000, "batch_size": 16, "seed": 0,
         "xla": False}

# The start of a `python -c` program that kills its own process (SIGKILL) at a point in writing
# checkpoint `sys.argv[2]` (a step), `sys.argv[1]`: as it starts to write that file of it, or
# "before the rename", its files written; as a kill -9 at that moment would, at a known moment.
# The program's last line runs a training.
KILL_WHILE_CHECKPOINTING = """
import os, signal, sys
from d3qn_utils import agent_checkpoint, atomic_files

where, step = sys.argv[1], f"step-{int(sys.argv[2]):010d}"
write_arrays, fsync_file = agent_checkpoint.write_arrays, atomic_files.fsync_file

def write_arrays_or_die(path, arrays):
    if where == path.name and path.parent.name.endswith(step):
        path.write_bytes(b"PK" * 1000)  # the first bytes of the file
        os.kill(os.getpid(), signal.SIGKILL)
    write_arrays(path, arrays)

def fsync_file_or_die(path):  # called for each file written, before the directory's rename
    if where == "before the rename" and path.parent.name.endswith(step):
        os.kill(os.getpid(), signal.SIGKILL)
    fsync_file(path)

agent_checkpoint.write_arrays, atomic_files.fsync_file = write_arrays_or_die, fsync_file_or_die
"""


def small_flags(directory: Path | None, **flags: Any) -> dict[str, Any]:
    """SMALL with `flags` over it, writing models and plots under `directory`."""
    where = {} if directory is None else {"model_dir": str(directory / "models"),
                                          "plot_dir": str(directory / "plots")}
    return {**SMALL, **where, **flags}


def small_agent(directory: Path, env_name: str = CARTPOLE, **flags: Any) -> DQNAgent:
    """An agent of `small_flags(directory, **flags)`."""
    from d3qn_agent import DQNAgent

    return DQNAgent(env_name, **small_flags(directory, **flags))


def command_line(flags: dict[str, Any]) -> list[str]:
    """`flags` as `python d3qn_agent.py` takes them: {"hidden_units": (16, 16), "xla": False}
    is ["--hidden-units", "16", "16", "--no-xla"]."""
    words = []
    for name, value in flags.items():
        option = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            words.append(option if value else option.replace("--", "--no-", 1))
        else:
            words += [option, *map(str, value if isinstance(value, (tuple, list)) else [value])]
    return words


def assert_same_arrays(expected: Path, got: Path) -> None:
    """Two checkpoints' `.npz` files (a memory's, the priority figure's, the optimizer's) hold
    the same arrays: integer and bool ones (transitions, counters, generator state) equal, float
    ones (priorities, beta, IS weights, Adam's moments) equal up to float rounding."""
    from d3qn_utils.atomic_files import read_arrays

    expected_arrays, got_arrays = read_arrays(expected), read_arrays(got)
    assert got_arrays.keys() == expected_arrays.keys(), got
    for key, array in expected_arrays.items():
        if array.dtype.kind == "f":
            np.testing.assert_allclose(got_arrays[key], array, rtol=1e-4, err_msg=f"{got}: {key}")
        else:
            np.testing.assert_array_equal(got_arrays[key], array, err_msg=f"{got}: {key}")


def assert_same_weights(expected: Path, got: Path) -> None:
    """Two networks' `.weights.h5` files hold the same weights up to float rounding (read as
    files: no network is built)."""
    from d3qn_utils.agent_checkpoint import weights_file

    for expected_array, got_array in zip(weights_file(expected), weights_file(got), strict=True):
        np.testing.assert_allclose(got_array, expected_array, rtol=1e-4, atol=1e-6, err_msg=got)


def assert_same_checkpoint(expected: Path, got: Path) -> None:
    """Two `step-*` checkpoints of one run hold the same state: every key of the progress, the
    memory, the priority figure and the optimizer (`assert_same_arrays`) and both networks
    (`assert_same_weights`)."""
    expected_progress, got_progress = (
        json.loads((directory / "progress.json").read_text())["progress"]
        for directory in (expected, got))
    assert got_progress.keys() == expected_progress.keys()
    for key, value in expected_progress.items():  # every counter, score and generator state
        assert got_progress[key] == value, key
    for name in ("memory.npz", "priority_figure.npz", "optimizer.npz"):
        assert_same_arrays(expected / name, got / name)
    for name in ("online.weights.h5", "target.weights.h5"):
        assert_same_weights(expected / name, got / name)


def unwritable_directory(tmp_path: Path) -> Path:
    """A directory this process cannot create files in (root can write anywhere but /sys)."""
    directory = tmp_path / "read-only"
    directory.mkdir()
    directory.chmod(0o555)
    for candidate in (directory, Path("/sys")):
        try:
            with open(candidate / "probe", "wb"):
                pass
            (candidate / "probe").unlink()
        except OSError:
            return candidate
    pytest.skip("no unwritable directory on this machine")


def the_error_line(stderr: str) -> str:
    """The one `error:` line of `stderr` (a failing assertion unless there is exactly one)."""
    error_lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, stderr
    return error_lines[0]


@pytest.fixture(autouse=True)
def cpu_without_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    """No bfloat16 units, and no real timing of them: a test that times says what it measured
    (a seconds-long, machine-dependent timing would decide a Pong agent's precision)."""
    from d3qn_utils import bfloat16_timing, settings

    def no_real_timing(*args: Any) -> tuple[float, float]:
        raise AssertionError("a test ran the real bfloat16 timing: patch time_gradient_steps")

    monkeypatch.setattr(settings, "native_bfloat16", lambda: None)
    monkeypatch.setattr(bfloat16_timing, "time_gradient_steps", no_real_timing)


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
