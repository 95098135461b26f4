"""Checkpoints of a training run: crash-safe directories, a whole agent in them, and stopping on
a signal with one written.

`save_agent(agent)` / `load_agent(agent)` write and restore everything a `d3qn_agent.DQNAgent`
needs to continue exactly (`--checkpoint-every`, `--resume`); `stop_requests()` turns Ctrl-C
(SIGINT) and SIGTERM (`kill`, `docker stop`, a cluster scheduler before preemption) into a
request the training loop sees after its current step, so the run can save and exit cleanly.

The directories are written whole or not at all, and the last few are kept. A checkpoint is
a directory `step-<N>` under a root such as `models/DDQN_CartPole-v1_Dueling_PER.checkpoints/`.
It is first written as `.tmp-step-<N>`, its files flushed to disk, and only then renamed to
`step-<N>`; a rename within one file system is
atomic, so a process killed at any moment leaves either the complete new checkpoint or none, and
the previous ones stay intact. Leftover `.tmp-*` directories are ignored and removed by the next
save. What goes inside is the caller's business; the readers here turn every way a file can be
missing or damaged into one ValueError that names the file.

Nothing here unpickles: JSON for counters, `.npz` read with `allow_pickle=False` for arrays.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import signal
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from replay_storage import all_finite

PREFIX = "step-"
TEMPORARY_PREFIX = ".tmp-"
LATEST = "latest"  # --resume without a path: the newest checkpoint of this run
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class NonFiniteError(RuntimeError):
    """A training step produced NaN or inf, or the environment returned one; the run stops with
    its last good state saved (`saved_on`)."""


class StopRequest:
    """Set by a stop signal: `requested` is True and `signal_name` says which ("SIGTERM")."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""

    def __call__(self, signum: int, frame: Any) -> None:
        self.requested = True
        self.signal_name = signal.Signals(signum).name


@contextlib.contextmanager
def on_stop_signals(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """While inside, Ctrl-C and SIGTERM call `handler(signum, frame)`; the previous handlers
    come back on exit. (Only the main thread can do this.)"""
    previous = {number: signal.signal(number, handler) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, earlier in previous.items():
            signal.signal(number, earlier)


@contextlib.contextmanager
def stop_requests() -> Iterator[StopRequest]:
    """While inside, Ctrl-C and SIGTERM set the yielded `StopRequest` instead of ending the
    process, so a training loop can finish its step and save."""
    request = StopRequest()
    with on_stop_signals(request):
        yield request


@contextlib.contextmanager
def saved_on(error_type: type[Exception], agent: Any) -> Iterator[None]:
    """If the block raises `error_type`, save a checkpoint of `agent` (its last good state) and
    raise the error again with the checkpoint's path added to its message."""
    try:
        yield
    except error_type as error:
        raise error_type(f"{error}. Last good state saved to {save_agent(agent)}") from error


def check_environment_step(step: int, reward: Any, observation: Any) -> None:
    """NonFiniteError naming env step `step` and the value if the environment returned a reward
    or an observation holding NaN or inf, so the run stops before the transition is stored and
    its last good state (`saved_on`) is the one before this step. ~0.5 us for CartPole."""
    if not (type(reward) is float and math.isfinite(reward)) and not np.isfinite(
            np.asarray(reward, dtype=np.float64)).all():
        raise NonFiniteError(f"the environment returned reward {reward!r} at env step {step}")
    observation = observation if type(observation) is np.ndarray else np.asarray(observation)
    if observation.dtype.kind == "f" and not all_finite(observation):
        value = observation[~np.isfinite(observation)].flat[0].item()
        raise NonFiniteError(f"the environment returned an observation holding {value!r} at env "
                             f"step {step}")


def model_load_error(path: str, error: Exception) -> ValueError:
    """The one-line error for a `.keras` file that Keras could not load (with `error`): there is
    none, it cannot be read, or it is not a valid .keras file (for a file that is not a zip
    archive Keras itself says "File not found")."""
    if not os.path.exists(path):
        return ValueError(f"no saved model at {path!r}; train first (python d3qn_agent.py)")
    try:
        with open(path, "rb") as file:
            is_zip = zipfile.is_zipfile(file)
    except OSError as os_error:
        return ValueError(f"cannot read model {path!r}: {os_error.strerror or os_error}")
    first_line = (str(error).strip().splitlines() or [""])[0]
    reason = f"{type(error).__name__}: {first_line}" if is_zip else "not a zip archive"
    return ValueError(f"cannot load model {path!r}: not a valid .keras file ({reason})")


def save_agent(agent: Any) -> str:
    """Write everything needed to continue `agent`'s run to a new checkpoint; return its path.

    Online and target weights (Keras `.weights.h5`), the optimizer's variables, the replay
    memory and the priority figure's counters (`.npz`), counters, scores, the random generators
    and the actions of the episode in progress (JSON). Written atomically; the last two are kept.
    """
    def write(directory: Path) -> None:
        agent.model.save_weights(directory / "online.weights.h5")
        agent.target_model.save_weights(directory / "target.weights.h5")
        write_arrays(directory / "optimizer.npz", {
            str(i): variable.numpy() for i, variable in enumerate(agent.optimizer.variables)})
        write_arrays(directory / "memory.npz", {
            **agent.MEMORY.state_dict(), **agent.priority_figure.statistics.state_dict()})
        write_json(directory / "progress.json", {
            "fingerprint": fingerprint(agent),
            "step": agent.step,
            "episode": agent.episode,
            "epsilon": agent.epsilon,
            "scores": agent.scores,
            "average": agent.average,
            "evaluations": agent.evaluations,
            "best_evaluation": agent.best_evaluation,
            "steps_to_solve": agent.steps_to_solve,
            "rng": agent.rng.bit_generator.state,
            "episode_actions": agent.episode_actions,
            "episode_score": agent.episode_score,
            "state_sha256": state_digest(agent.state),
            **agent.priority_figure.progress(),
        })

    if agent.state is None:
        agent.start_episode()
    return str(write_checkpoint(agent.checkpoint_root, agent.step, write))


def state_digest(state: np.ndarray) -> str:
    """SHA-256 of an observation: a resumed episode must reproduce it exactly."""
    return hashlib.sha256(np.ascontiguousarray(state)).hexdigest()


def fingerprint(agent: Any) -> dict[str, Any]:
    """What a checkpoint must share with `agent` to be loaded into it."""
    config = agent.config
    return {
        "env_name": config.env_name,
        "observation_shape": list(agent.state_shape),
        "actions": agent.action_size,
        "dueling": config.dueling,
        "hidden_units": list(config.hidden_units) if len(agent.state_shape) == 1 else None,
        "memory": agent.MEMORY.kind,
        "memory_size": config.memory_size,
    }


def load_agent(agent: Any, where: str = LATEST) -> str:
    """Continue `agent`'s run from a checkpoint: the newest of its run, or the `step-*`
    directory given. Returns the checkpoint's path.

    Raises ValueError naming the file and what is wrong if there is no checkpoint, it was made
    for another environment, network or memory, or a file is missing or corrupt. Nothing on
    disk is written.
    """
    directory = latest_checkpoint(agent.checkpoint_root) if where == LATEST else Path(where)
    progress_file = directory / "progress.json"
    progress = read_json(progress_file)
    saved, current = progress.get("fingerprint"), fingerprint(agent)
    if not isinstance(saved, dict) or saved.keys() != current.keys():
        raise ValueError(f"checkpoint file {progress_file} is corrupt: no valid fingerprint")
    differences = [f"{key}={saved[key]!r} (this run: {current[key]!r})"
                   for key in current if saved[key] != current[key]]
    if differences:
        raise ValueError(f"checkpoint {directory} was made for another setup: "
                         + ", ".join(differences))
    optimizer_arrays = read_arrays(directory / "optimizer.npz")
    memory_arrays = read_arrays(directory / "memory.npz")
    for network, file in ((agent.model, "online.weights.h5"),
                          (agent.target_model, "target.weights.h5")):
        try:
            network.load_weights(directory / file)
        except Exception as error:  # Keras raises several types for a bad weights file
            raise ValueError(f"checkpoint file {directory / file} is missing or does not "
                             f"fit the network: {error}") from error
    agent.greedy_actions.weights_changed()
    variables = agent.optimizer.variables
    if sorted(optimizer_arrays, key=int) != [str(i) for i in range(len(variables))] or any(
            optimizer_arrays[str(i)].shape != tuple(v.shape) for i, v in enumerate(variables)):
        raise ValueError(f"checkpoint file {directory / 'optimizer.npz'} does not fit the "
                         "optimizer")
    for i, variable in enumerate(variables):
        variable.assign(optimizer_arrays[str(i)])
    try:
        agent.MEMORY.load_state_dict(memory_arrays)
        agent.priority_figure.statistics.load_state_dict(memory_arrays, len(agent.MEMORY))
    except ValueError as error:
        raise ValueError(f"checkpoint file {directory / 'memory.npz'}: {error}") from error
    try:
        restore_progress(agent, progress)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"checkpoint file {progress_file} is corrupt: {error!r}") from error
    return str(directory)


def restore_progress(agent: Any, progress: dict[str, Any]) -> None:
    """Counters, scores and generators from progress.json; then replay the open episode."""
    agent.step = int(progress["step"])
    agent.episode = int(progress["episode"])
    agent.epsilon = float(progress["epsilon"])
    agent.scores = [float(score) for score in progress["scores"]]
    agent.average = [float(average) for average in progress["average"]]
    agent.evaluations = [(int(a), int(b), float(c)) for a, b, c in progress["evaluations"]]
    agent.best_evaluation = float(progress["best_evaluation"])
    agent.steps_to_solve = progress["steps_to_solve"]
    agent.rng.bit_generator.state = progress["rng"]
    # Rebuild the episode in progress: same seed, same actions, same observation.
    agent.start_episode()
    for action in progress["episode_actions"]:
        agent.state, *_ = agent.env.step(int(action))
    agent.episode_actions = [int(action) for action in progress["episode_actions"]]
    agent.episode_score = float(progress["episode_score"])
    agent.priority_figure.restore_progress(progress)
    if state_digest(agent.state) != progress["state_sha256"]:
        raise ValueError("replaying the episode in progress did not reproduce its observation "
                         "(is the environment deterministic under a seed?)")


def write_checkpoint(
    root: str | Path, step: int, write_files: Callable[[Path], None], keep: int = 2
) -> Path:
    """Write checkpoint `step` under `root` atomically and keep only the newest `keep`.

    `write_files(directory)` fills a fresh temporary directory; it is renamed into place only
    after it returned and its files reached the disk. A checkpoint of the same step that exists
    already is kept as it is: nothing can have changed without a step.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob(TEMPORARY_PREFIX + "*"):
        shutil.rmtree(leftover, ignore_errors=True)
    final = root / f"{PREFIX}{step:010d}"
    if final.exists():  # saved already at this step (e.g. Ctrl-C right after a checkpoint)
        return final
    temporary = root / f"{TEMPORARY_PREFIX}{final.name}"
    temporary.mkdir()
    write_files(temporary)
    for path in temporary.iterdir():
        _fsync_file(path)
    os.replace(temporary, final)
    _fsync_directory(root)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first (empty if there is none)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [path for path in root.iterdir() if path.is_dir() and path.name.startswith(PREFIX)]
    return sorted(found, key=lambda path: path.name)


def latest_checkpoint(root: str | Path) -> Path:
    """The newest complete checkpoint under `root`, or ValueError saying there is none."""
    checkpoints = list_checkpoints(root)
    if not checkpoints:
        raise ValueError(f"no checkpoint to resume from in {root}")
    return checkpoints[-1]


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` to write to; on success it replaces `path` at once.

    The temporary name keeps the suffix, so writers that go by it (Keras' `.keras`, matplotlib's
    `.png`) still work. On an error the temporary file is removed and `path` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(TEMPORARY_PREFIX + path.name)
    try:
        yield temporary
        _fsync_file(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write `data` as indented JSON."""
    path.write_text(json.dumps(data, indent=1))


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object, or ValueError naming the file if it is missing or damaged."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"checkpoint file {path} is missing or corrupt: {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"checkpoint file {path} is corrupt: expected a JSON object")
    return data


def write_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write named arrays to an uncompressed `.npz` file."""
    with open(path, "wb") as file:
        np.savez(file, **arrays)


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Read every array of an `.npz` file without unpickling, or ValueError naming the file."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            return {key: saved[key] for key in saved.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise ValueError(f"checkpoint file {path} is missing or corrupt: {error}") from error


def _fsync_file(path: Path) -> None:
    """Flush a written file's contents to the disk."""
    with open(path, "rb") as file:
        os.fsync(file.fileno())


def _fsync_directory(directory: Path) -> None:
    """Make a rename inside `directory` durable (a no-op where directories cannot be opened)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
