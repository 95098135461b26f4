"""The first line a script prints is its own: TensorFlow's harmless start-up lines are filtered,
and a start-up that cannot go on ends in one line.

TensorFlow 2.21 writes the `HARMLESS` lines from C++ before absl is initialised, straight to
descriptor 2, where TF_CPP_MIN_LOG_LEVEL does not reach them. In a script of this repository
(not pytest, Ray workers, notebooks) descriptor 2 goes through a forwarding process (this file
run as a script) that drops them and passes the rest on at once; a process, so that what a crash
writes last still gets out. Before that, a KERAS_BACKEND that `import keras` would fail on is one
`error:` line (exit 2), and Ctrl-C while the script imports is one `stopped:` line and exit 130
at once (`stop_at_once`), not a traceback; the script's `main` then takes Ctrl-C back
(`main_started`). Whoever imports it also gets OpenBLAS held to one thread
(OPENBLAS_NUM_THREADS=1, unless set), which numpy reads as it loads.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import importlib.util
import os
import re
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

# The prefix absl puts on a log line: severity and date (0000 before absl is initialised),
# time (seconds since the epoch before), thread id, then the source file and line.
ABSL_PREFIX = r"{severity}\d{{4}} \d\d:\d\d:\d+\.\d+ +\d+ {source}:\d+\] "
HARMLESS = re.compile("|".join([
    re.escape("WARNING: All log messages before absl::InitializeLog() is called are written to "
              "STDERR"),
    ABSL_PREFIX.format(severity="I", source=r"port\.cc") + re.escape(
        "oneDNN custom operations are on. You may see slightly different numerical results due "
        "to floating-point round-off errors from different computation orders. To turn them "
        "off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`."),
    ABSL_PREFIX.format(severity="I", source=r"cudart_stub\.cc") + re.escape(
        "Could not find cuda drivers on your machine, GPU will not be used."),
    # Error 303, as on this project's machine without a CUDA driver, where the cudart_stub line
    # comes too; any other cuInit failure (a driver that is there but fails) stays visible.
    ABSL_PREFIX.format(severity="E", source=r"cuda_platform\.cc") + re.escape(
        "failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)"),
]))
PARTIAL_LINE_SECONDS = 0.1  # a line without its newline yet (a prompt) waits at most this long
FINISH_SECONDS = 2.0  # at exit, wait at most this long for the forwarder to write the last lines
READ_BYTES = 65536
# Keras 3's backends, each named as its package is; Keras reads KERAS_BACKEND at its import.
KERAS_BACKENDS = ("tensorflow", "jax", "torch", "numpy", "openvino")

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's later INFO and WARNING lines
# numpy's OpenBLAS threads, once woken by a batch (the numpy forward pass that acts for N_ENVS
# environments, greedy_policy.py), keep spinning beside TensorFlow's gradient steps on a few
# cores and slow them (docs/benchmarks.md, "Many environments, one memory"). Set in this module,
# which the programs import before numpy, so that importing PER.py alone leaves a user's BLAS
# threading as it was; an OPENBLAS_NUM_THREADS set by the user wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def filtered(line: bytes) -> bytes:
    """What the terminal gets for one stderr line (without its newline): nothing if HARMLESS,
    else the line and its newline."""
    text = line.decode("utf-8", "replace").removesuffix("\r")
    return b"" if HARMLESS.fullmatch(text) else line + b"\n"


def forward(source: int, sink: int) -> None:
    """Copy lines from `source` to `sink` through `filtered` until the input ends (a piece
    without a newline after PARTIAL_LINE_SECONDS); once `sink` fails, read and drop the rest."""
    pending, sink_open = b"", True
    while True:
        if pending and not select.select([source], [], [], PARTIAL_LINE_SECONDS)[0]:
            out, pending = pending, b""
        elif chunk := os.read(source, READ_BYTES):
            *lines, pending = (pending + chunk).split(b"\n")
            out = b"".join(map(filtered, lines))
        else:
            out, pending = pending, None
        while out and sink_open:
            try:
                out = out[os.write(sink, out):]
            except OSError:
                sink_open = False
        if pending is None:
            return


def is_repository_script() -> bool:
    """True when the program running is a script of this repository or its benchmarks/."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    root = Path(__file__).resolve().parent.parent  # the repository, above d3qn_utils/
    return path is not None and Path(path).resolve().parent in (root, root / "benchmarks")


def install() -> None:
    """Point descriptor 2 at a forwarding process running `forward`; nothing where it cannot
    work (not POSIX, not the main thread, descriptor 2 closed, no Python executable)."""
    if (os.name != "posix" or not sys.executable
            or threading.current_thread() is not threading.main_thread()):
        return
    try:
        real_stderr = os.dup(2)
    except OSError:
        return
    # The forwarder inherits ignored SIGINT and SIGTERM: Ctrl-C or a kill of the process group
    # stops the script, whose last lines the forwarder still writes before it ends.
    handlers = {number: signal.signal(number, signal.SIG_IGN)
                for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        forwarder = subprocess.Popen([sys.executable, "-I", "-S", __file__],
                                     stdin=subprocess.PIPE, stdout=real_stderr, stderr=real_stderr)
    except OSError:
        os.close(real_stderr)
        return
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    if sys.stderr is not None:
        sys.stderr.flush()
    os.dup2(forwarder.stdin.fileno(), 2)
    forwarder.stdin.close()  # descriptor 2 is now the pipe's only write end
    atexit.register(finish, forwarder, real_stderr)


def finish(forwarder: subprocess.Popen, real_stderr: int) -> None:
    """At exit: give descriptor 2 back (closing our end of the pipe), let the forwarder finish."""
    if sys.stderr is not None:
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stderr
            sys.stderr.flush()
    os.dup2(real_stderr, 2)
    # On a timeout a child process still holds the pipe; the forwarder ends when it does.
    with contextlib.suppress(subprocess.TimeoutExpired):
        forwarder.wait(timeout=FINISH_SECONDS)


def keras_backend_error(environ: Mapping[str, str]) -> str | None:
    """Why `import keras` would fail with `environ`'s KERAS_BACKEND (a name Keras does not know,
    or a backend whose package is not installed), or None (unset or empty: Keras' own choice)."""
    name = environ.get("KERAS_BACKEND")
    if not name:
        return None
    installed = [backend for backend in KERAS_BACKENDS if importlib.util.find_spec(backend)]
    if name in installed:
        return None
    missing = f" ({name} is not installed)" if name in KERAS_BACKENDS else ""
    return (f"KERAS_BACKEND (environment variable) must be a Keras backend installed here "
            f"({', '.join(installed)}), got {name!r}{missing}")


def ctrl_c_in_one_line(kind: type[BaseException], value: BaseException,
                       traceback: TracebackType | None) -> None:
    """A script's `sys.excepthook`: Ctrl-C (KeyboardInterrupt) that reaches the top, as while it
    imports, is one line (the exit status stays SIGINT's, 130 in a shell); anything else as
    Python shows it."""
    if issubclass(kind, KeyboardInterrupt):
        print("stopped: Ctrl-C", file=sys.stderr, flush=True)
    else:
        sys.__excepthook__(kind, value, traceback)


def stop_at_once(signal_number: int, frame: Any) -> None:
    """A script's SIGINT handler while it imports: one line, exit 130 at once. Nothing is
    written before its `main` runs, and a KeyboardInterrupt raised there could land in native
    code (TensorFlow's, JAX's), which aborts the process or swallows it."""
    os.write(2, b"stopped: Ctrl-C\n")
    os._exit(130)


def main_started() -> None:
    """A script's `main` calls this first: from here Ctrl-C raises KeyboardInterrupt, which
    `main` turns into a stop, and one that a callback swallowed (JAX's garbage-collection
    callback) is raised again in the main thread. Nothing outside a script (pytest, notebooks)."""
    if signal.getsignal(signal.SIGINT) is stop_at_once:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = raise_lost_ctrl_c_again


def raise_lost_ctrl_c_again(unraisable: Any) -> None:
    """`sys.unraisablehook`: a KeyboardInterrupt a callback could not raise is raised again in
    the main thread; anything else as Python reports it."""
    if issubclass(unraisable.exc_type, KeyboardInterrupt):
        _thread.interrupt_main()
    else:
        sys.__unraisablehook__(unraisable)


if __name__ == "__main__":  # the forwarding process that `install` starts
    forward(sys.stdin.fileno(), sys.stdout.fileno())
elif is_repository_script():
    if error := keras_backend_error(os.environ):
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    sys.excepthook = ctrl_c_in_one_line
    signal.signal(signal.SIGINT, stop_at_once)
    install()
