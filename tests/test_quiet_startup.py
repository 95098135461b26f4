"""quiet_startup.py keeps TensorFlow's known start-up lines off stderr and lets every other line
through: the filter fed by hand (no TensorFlow), the forwarding process on a real descriptor 2
(exit codes and tracebacks kept), and `python d3qn_agent.py`, whose first line is its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import types

import pytest
from conftest import ROOT

from d3qn_utils import quiet_startup

# The lines TensorFlow 2.21 printed on importing on this project's CPU-only machine.
HARMLESS_LINES = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795603320.601570   13363 port.cc:153] oneDNN custom operations are on. You may "
    "see slightly different numerical results due to floating-point round-off errors from "
    "different computation orders. To turn them off, set the environment variable "
    "`TF_ENABLE_ONEDNN_OPTS=0`.",
    "I0000 00:00:1795603320.601873   13363 cudart_stub.cc:31] Could not find cuda drivers on your "
    "machine, GPU will not be used.",
    "E0000 00:00:1795603324.059660   13363 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
]
OTHER_LINES = [
    # TensorFlow's, but not known to be harmless: another cuInit failure, another message.
    "E0000 00:00:1795603324.059660   13363 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    "CUDA error: Failed call to cuInit: CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803)",
    "I0000 00:00:1795603687.581224   16148 cpu_feature_guard.cc:227] This TensorFlow binary is "
    "optimized to use available CPU instructions in performance-critical operations.",
    # A known message quoted inside another line.
    "error: WARNING: All log messages before absl::InitializeLog() is called are written to "
    "STDERR",
    "Traceback (most recent call last):",
    "",
]


def test_the_known_lines_are_dropped_and_every_other_line_kept():
    for line in HARMLESS_LINES:
        assert quiet_startup.filtered(line.encode()) == b"", line
        assert quiet_startup.filtered(line.encode() + b"\r") == b""  # written with CRLF
    for line in OTHER_LINES:
        assert quiet_startup.filtered(line.encode()) == line.encode() + b"\n", line
    assert quiet_startup.filtered(b"\xff\xfe not utf-8") == b"\xff\xfe not utf-8\n"


def test_forward_copies_a_pipe_through_the_filter_to_its_end(tmp_path):
    lines = [*HARMLESS_LINES[:2], "keep me", HARMLESS_LINES[2], "keep me too"]
    source, writer = os.pipe()
    with os.fdopen(writer, "wb") as pipe:
        pipe.write("\n".join(lines).encode() + b"\nno newline at the end")
    with open(tmp_path / "out", "wb") as sink:
        quiet_startup.forward(source, sink.fileno())
    os.close(source)
    assert (tmp_path / "out").read_bytes() == b"keep me\nkeep me too\nno newline at the end"


def run_with_filter(code: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh Python with the filter installed on its descriptor 2."""
    program = f"from d3qn_utils import quiet_startup; quiet_startup.install()\n{code}"
    return subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_installed_the_filter_keeps_exit_codes_tracebacks_and_unknown_lines():
    noise = "".join(line + "\n" for line in HARMLESS_LINES)
    done = run_with_filter(f"import os\nos.write(2, {noise!r}.encode() + b'keep me\\n')\n"
                           "print('out')\nraise ValueError('boom')")
    assert done.returncode == 1 and done.stdout == "out\n"
    assert done.stderr.splitlines()[0] == "keep me"
    assert done.stderr.splitlines()[-1] == "ValueError: boom"
    assert "Traceback (most recent call last):" in done.stderr
    assert not any(line in done.stderr for line in HARMLESS_LINES)
    done = run_with_filter("import sys\nsys.stderr.write('no newline')\nsys.exit(4)")
    assert (done.returncode, done.stderr) == (4, "no newline")


def test_not_active_under_pytest():
    assert not quiet_startup.is_repository_script()


def test_the_first_line_of_a_training_run_is_the_programs(cartpole_command_line_run):
    done = cartpole_command_line_run  # `python d3qn_agent.py`, stderr with stdout (conftest.py)
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0].startswith("training on CartPole-v1 until step 200: double DQN"), lines[:3]
    assert lines[-1].startswith("done: 200 steps")
    for known in ("absl::InitializeLog", "oneDNN custom operations", "cuda drivers", "cuInit"):
        assert known not in done.output


def test_ctrl_c_while_a_script_imports_is_one_line_and_exit_130_at_once():
    # The handler a script has until its main starts: no KeyboardInterrupt to land in native code.
    program = ("import os, signal\n"
               "from d3qn_utils import quiet_startup\n"
               "signal.signal(signal.SIGINT, quiet_startup.stop_at_once)\n"
               "os.kill(os.getpid(), signal.SIGINT)\n"
               "while True:\n"
               "    pass\n")
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "stopped: Ctrl-C\n")


def test_main_takes_ctrl_c_back_and_a_swallowed_one_is_raised_again(monkeypatch):
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # restored after the test
    before = signal.signal(signal.SIGINT, quiet_startup.stop_at_once)
    try:
        quiet_startup.main_started()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert sys.unraisablehook is quiet_startup.raise_lost_ctrl_c_again
    finally:
        signal.signal(signal.SIGINT, before)
    # A KeyboardInterrupt that a callback could not raise comes back in the main thread, where
    # Ctrl-C raises it (as `main_started` leaves it; another test may have left SIGINT ignored).
    swallowed = types.SimpleNamespace(exc_type=KeyboardInterrupt)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            quiet_startup.raise_lost_ctrl_c_again(swallowed)
            for _ in range(10**6):  # the interrupt is raised between two bytecodes
                pass
    finally:
        signal.signal(signal.SIGINT, before)


def test_main_started_changes_nothing_outside_a_script(monkeypatch):
    hook = sys.unraisablehook
    handler = signal.getsignal(signal.SIGINT)
    quiet_startup.main_started()  # pytest's handler is not stop_at_once
    assert (sys.unraisablehook, signal.getsignal(signal.SIGINT)) == (hook, handler)


def test_openblas_threads_are_set_by_quiet_startup_not_by_importing_per():
    # Importing PER.py (the package d3qn_utils with it) leaves a user's BLAS threading alone; a
    # program importing quiet_startup first gets one thread, unless the variable was set.
    program = ("import importlib, os\nimport PER\n"
               "print(os.environ.get('OPENBLAS_NUM_THREADS'))\n"
               "from d3qn_utils import quiet_startup\n"
               "print(os.environ.get('OPENBLAS_NUM_THREADS'))\n"
               "os.environ['OPENBLAS_NUM_THREADS'] = '3'\n"
               "importlib.reload(quiet_startup)\n"
               "print(os.environ.get('OPENBLAS_NUM_THREADS'))\n")
    environment = {name: value for name, value in os.environ.items()
                   if name != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=environment)
    assert (done.returncode, done.stdout) == (0, "None\n1\n3\n"), done.stderr
