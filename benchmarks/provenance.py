"""What every results file says about how it was made, stamped by the code that measured it:
the command line, the commit (and whether Python files had uncommitted changes), the date, the
machine (CPU model, cores, the CPU features that change the arithmetic, any GPU), the Keras
backend and the versions of the packages that compute; and, for a script that times, the load
it was timed under. `benchmarks/render_docs.py` renders the pages' command, machine, commit and
load from these fields, so none of them is typed by hand.

A script that times calls `time_alone()` first: it holds one machine-wide lock until it exits, so
two timings never share the cores, waits for the load a finished timing leaves in the 1-minute
load average to fade, and its results file records the load average as it began and as it wrote
its results. A timing that began above the quiet line (it waited QUIET_WITHIN seconds) is marked
so in the pages, and one that began on a machine busier than its core count is refused
(`load_label`).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import filelock

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# /proc/cpuinfo flag -> its name in the tables: the units that decide which kernels TensorFlow
# and XLA pick (oneDNN turns itself on with AVX-512 VNNI or BF16 or AMX; bfloat16 needs
# AVX512_BF16 or AMX to be fast).
CPU_FEATURES = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_vnni": "AVX512_VNNI",
                "avx512_bf16": "AVX512_BF16", "amx_tile": "AMX"}
# Environment variables that change what a run computes or how fast, kept in its command line
# (OpenBLAS's threads: numpy's matrix products in the MLP's and MinAtar's greedy actions).
COMMAND_ENVIRONMENT = ("KERAS_BACKEND", "TF_ENABLE_ONEDNN_OPTS", "TF_NUM_INTRAOP_THREADS",
                       "TF_NUM_INTEROP_THREADS", "CUDA_VISIBLE_DEVICES", "OPENBLAS_NUM_THREADS",
                       "OMP_NUM_THREADS")
PACKAGES = ("tensorflow", "keras", "jax", "numpy")
MACHINE_NOT_RECORDED = "machine not recorded"
FIGURE_SOURCE = "Source"  # the PNG text chunk that names the results file a figure was drawn from
# In the system's temporary directory, not the checkout: two clones on one machine share it.
MEASURING_LOCK = Path(tempfile.gettempdir()) / "d3qn_measuring.lock"
# A timing begins once the 1-minute load average is down to this per core (it trails a finished
# timing's load by a minute or more), or after QUIET_WITHIN seconds with the load it has then.
QUIET_LOAD_PER_CORE = 0.5
QUIET_WITHIN = 300.0
ABOVE_QUIET = "began at load {load}, above the quiet line of {line}"  # a timing's mark in a page
# This process's hold on MEASURING_LOCK and the load average as it took it (`time_alone`).
timed_alone: dict[str, Any] = {}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=False).stdout.strip()


def commit() -> tuple[str, bool]:
    """The checked-out commit, and whether the work tree's Python files differ from it (a page
    or a result file changed beside it does not change what was measured)."""
    return git("rev-parse", "--short", "HEAD") or "unknown", bool(
        git("status", "--porcelain", "--", "*.py"))


def command_line(argv: list[str] | None = None) -> str:
    """This process's command as a reader would type it from the repository root, with the
    environment variables that change the computation in front."""
    argv = sys.argv if argv is None else argv
    script = Path(argv[0]).resolve()
    shown = script.relative_to(ROOT).as_posix() if script.is_relative_to(ROOT) else argv[0]
    environment = [f"{name}={os.environ[name]}" for name in COMMAND_ENVIRONMENT
                   if name in os.environ]
    return " ".join([*environment, shlex.join(["python", shown, *argv[1:]])])


def cpu_flags() -> set[str]:
    """The flags of /proc/cpuinfo's first processor (empty where there is none: not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it, else what Python knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpus() -> list[str]:
    """The NVIDIA GPUs `nvidia-smi` lists, by name; none without it."""
    if shutil.which("nvidia-smi") is None:
        return []
    listed = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                            capture_output=True, text=True, check=False).stdout
    return [line.strip() for line in listed.splitlines() if line.strip()]


def machine() -> dict[str, Any]:
    flags = cpu_flags()
    return {"cpu": cpu_model(), "architecture": platform.machine(), "cores": os.cpu_count(),
            "cpu_features": [name for flag, name in CPU_FEATURES.items() if flag in flags],
            "gpus": gpus()}


def versions() -> dict[str, str | None]:
    """The installed versions of the packages that compute (None: not installed)."""
    found: dict[str, str | None] = {}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def backend() -> str:
    """Keras' backend for this process (importing Keras decides it: the variable, else its
    configuration file, else TensorFlow)."""
    import keras

    return keras.backend.backend()


def time_alone(lock_path: Path = MEASURING_LOCK, quiet_within: float = QUIET_WITHIN) -> None:
    """Hold the machine-wide measuring lock until this process exits, waiting (and saying so)
    while another script holds it, then up to `quiet_within` seconds for a quiet machine
    (`wait_for_quiet`); note the load average as the timing begins."""
    if timed_alone:
        return
    lock = filelock.FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        print(f"waiting for another script that times to finish ({lock_path})", flush=True)
        lock.acquire()
    wait_for_quiet(quiet_within)
    timed_alone.update(lock=lock, load_average_before=os.getloadavg())


def wait_for_quiet(within: float, poll_seconds: float = 5.0) -> None:
    """Wait up to `within` seconds for the 1-minute load average to fall to QUIET_LOAD_PER_CORE
    per core, checking every `poll_seconds`."""
    quiet = quiet_load(os.cpu_count() or 1)
    deadline = time.monotonic() + within
    load = os.getloadavg()[0]
    if load > quiet and within > 0:
        print(f"waiting up to {within:.0f} s for the 1-minute load average ({load:.2f}) to fall "
              f"to {quiet:.1f}", flush=True)
    while load > quiet and time.monotonic() < deadline:
        time.sleep(poll_seconds)
        load = os.getloadavg()[0]


def load_record() -> dict[str, Any]:
    """The stamp's "timed_alone" field: the load average (1, 5, 15 min) as the timing began and
    now; empty for a script that does not time."""
    if not timed_alone:
        return {}
    return {"timed_alone": {"load_average_before": list(timed_alone["load_average_before"]),
                            "load_average_after": list(os.getloadavg())}}


def stamp(command: str | None = None, code: tuple[str, bool] | None = None) -> dict[str, Any]:
    """The facts every results file carries. `command` and `code` (a `commit()` taken earlier:
    the checkout may move on during a long run) replace this process's own."""
    head, uncommitted = commit() if code is None else code
    return {"command": command or command_line(), "commit": head,
            "uncommitted_changes": uncommitted,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(), "backend": backend(), "versions": versions(),
            **load_record()}


def add_results_argument(parser: argparse.ArgumentParser, script: str) -> None:
    """`--results PATH`, by default benchmarks/results/<script>/<UTC date and time>.json: a new
    file per measurement, so one made on another machine is never overwritten."""
    name = Path(script).stem
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    parser.add_argument("--results", type=Path, default=RESULTS / name / f"{now}.json",
                        help="where the measurements and their stamp go (default: "
                             f"benchmarks/results/{name}/<UTC date and time>.json)")


def plain(value: Any) -> Any:
    """A numpy array or number as JSON writes it (json's `default`)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def write_results(path: Path, measured: dict[str, Any], **stamp_fields: Any) -> Path:
    """Write `measured` under "results", beside this process's stamp, atomically; say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({**stamp(**stamp_fields), "results": measured}, indent=1,
                                    default=plain) + "\n")
    os.replace(temporary, path)
    shown = path.resolve()
    print(f"results: {shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown}")
    return path


def machine_label(result: dict[str, Any]) -> str:
    """A results file's machine in a table cell. Files written before the stamp held the
    machine give what they have: "x86_64, 2 cores (CPU model not recorded)", a log's name for it
    ("machine_from_log"), or "machine not recorded"."""
    found = result.get("machine")
    if isinstance(found, dict):
        features = " ".join(found["cpu_features"]) or "none of " + " ".join(
            CPU_FEATURES.values())
        label = f"{found['cpu']}, {found['cores']} cores ({features})"
        return label + "".join(f", {gpu}" for gpu in found.get("gpus", []))
    if "machine_from_log" in result:
        return result["machine_from_log"]["name"]
    return f"{found} (CPU model not recorded)" if isinstance(found, str) else MACHINE_NOT_RECORDED


def commit_label(result: dict[str, Any]) -> str:
    """A results file's commit in a table cell. Older study files wrote the uncommitted changes
    into the commit string itself; a hand-made test file may have none."""
    return result.get("commit", "no commit") + (" (with uncommitted changes)"
                                                if result.get("uncommitted_changes") else "")


def load_label(result: dict[str, Any], source: str = "a results file",
               with_cores: bool = True) -> str:
    """A timing's load in a page: the 1-minute load average as it began and as it ended, and on
    how many cores (not `with_cores`: a line that names the machine, whose label says them). A
    timing taken under the measuring lock that began with a load above the core count is refused
    (ValueError naming `source`): another process shared the cores. Files older than the lock
    give the load their script printed into them, marked so."""
    alone = result.get("timed_alone")
    if alone is None:
        found = result.get("results", {})
        if "load_average_before" not in found:
            return "load not recorded (timed before the measuring lock)"
        after = found.get("load_average_after")
        return (f"load average {found['load_average_before'][0]:.1f} before"
                + (f", {after[0]:.1f} after" if after else "") + " (timed before the lock)")
    before, after = alone["load_average_before"][0], alone["load_average_after"][0]
    cores = result["machine"]["cores"]
    if before > cores:
        raise ValueError(f"{source} was timed with a load average of {before:.2f} on {cores} "
                         "cores as it began: measure it again with the machine otherwise idle")
    label = f"load average {before:.1f} before, {after:.1f} after"
    if with_cores:
        label += f", {cores} cores"
    if before > quiet_load(cores):
        label += f" ({above_quiet_line(before, cores)})"
    return label


def quiet_load(cores: int) -> float:
    """The 1-minute load average a timing waits for on `cores` cores (`wait_for_quiet`)."""
    return QUIET_LOAD_PER_CORE * cores


def above_quiet_line(before: float, cores: int) -> str:
    """How the pages mark a timing that began above the quiet line: it waited QUIET_WITHIN
    seconds and began anyway."""
    return ABOVE_QUIET.format(load=f"{before:.2f}", line=f"{quiet_load(cores):.1f}")


def quiet_rule() -> str:
    """The quiet rule in words, from its constants, for the benchmarks page."""
    return (f"A timing waits for a quiet machine: a 1-minute load average of at most "
            f"{QUIET_LOAD_PER_CORE:g} per core ({quiet_load(2):.1f} on 2 cores). It waits up to "
            f"{QUIET_WITHIN:.0f} s for it, then begins anyway; a table marks such a timing "
            f"\"{ABOVE_QUIET.format(load='L', line='Q')}\" (L the load average it began at, Q "
            "the line on its cores), beside the load average as it began and ended. A timing "
            "that began above one load per core (another process had the cores) is not shown: "
            "`render_docs.py` refuses it.\n")


def results_name(path: Path, results: Path = RESULTS) -> str:
    """A results file under `results` as the pages name it: benchmarks/results/..."""
    return f"benchmarks/results/{path.relative_to(results).as_posix()}"


def name_figure_source(png: Path, results_file: Path, results: Path = RESULTS) -> None:
    """Write the results file a figure was drawn from into its PNG (FIGURE_SOURCE), named as the
    pages name it when it lies under `results` (`blind_cliffwalk.py` does this for its figure;
    `figure_stamps.py` reads it)."""
    from PIL import Image, PngImagePlugin

    path, results = results_file.resolve(), results.resolve()
    chunks = PngImagePlugin.PngInfo()
    chunks.add_text(FIGURE_SOURCE, results_name(path, results) if path.is_relative_to(results)
                    else str(path))
    with Image.open(png) as image:
        image.load()
    image.save(png, pnginfo=chunks)
