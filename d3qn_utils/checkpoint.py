"""Checkpoints of a training run: crash-safe directories, a whole agent in them, the files a run
owns, and stopping on a signal with one written.

`save_agent(agent)` / `load_agent(agent)` write and restore everything a `d3qn_agent.DQNAgent`
needs to continue exactly (`--checkpoint-every`, `--resume`); `stop_requests()` turns Ctrl-C
(SIGINT) and SIGTERM (`kill`, `docker stop`, a cluster scheduler before preemption) into a
request the training loop sees after its current step, so the run can save and exit cleanly.

A run owns what it writes. `begin(agent)` starts a run (or with `--resume` continues one) and
takes the lock `models/<name>.lock`: a second run of the same name into the same model
directory is refused with one line naming the first while the first is alive (`flock`, which
the OS releases when its holder dies, so a killed run leaves nothing stuck). Every run has an
id, its start time (`run-20250101-120000`), and its checkpoints go to a directory of their own,
`models/<name>.checkpoints/<run id>/step-<N>`; pruning keeps the last two there, and
`--resume` continues the newest run whose flags match (see `MAY_CHANGE_ON_RESUME`), saying
which. `--resume PATH` takes the checkpoint given.

The directories are written whole or not at all. A checkpoint is first written as
`.tmp-<pid>-step-<N>`, its files flushed to disk, and only then renamed to `step-<N>`; a rename
within one file system is atomic, so a process killed at any moment leaves either the complete
new checkpoint or none, and the previous ones stay intact. A write that fails (disk full) removes
what it wrote and raises `WriteError`, one line naming the path and the errno; leftovers of
killed writers are removed when the next run begins. What goes inside is the caller's business;
the readers here turn every way a file can be missing or damaged into one ValueError that names
the file.

Nothing here unpickles: JSON for counters, `.npz` read with `allow_pickle=False` for arrays.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import sys
import time
import zipfile
from argparse import Namespace
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from d3qn_utils.replay_state import load_memory_state, memory_state
from d3qn_utils.replay_storage import all_finite

PREFIX = "step-"
RUN_PREFIX = "run-"
TEMPORARY_PREFIX = ".tmp-"
LATEST = "latest"  # --resume without a path: the newest checkpoint of this run
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# The flags a resumed run may give new values: its budget, the cadence of evaluations, checkpoints
# and logs, where files go, and the fast path (the same gradient steps per env step, taken in
# calls of another size, compiled with XLA or not). Any other difference from the checkpoint is
# refused, naming each flag (docs/usage.md lists these).
MAY_CHANGE_ON_RESUME = (
    "total_steps", "eval_every", "eval_episodes", "test_episodes", "checkpoint_every",
    "model_dir", "plot_dir", "tensorboard", "tensorboard_every", "gradient_steps_per_call", "xla",
)
# Room for what a checkpoint's arrays do not count: HDF5 and .npz headers, progress.json.
CHECKPOINT_HEADROOM_BYTES = 1 << 20


class WriteError(ValueError):
    """A file could not be written (disk full, no permission, ...); what the write had begun is
    removed and what was there before is untouched. A ValueError, so that the scripts print it as
    their one `error:` line and exit with code 2."""

    def __init__(self, path: str | Path, error: OSError, outcome: str) -> None:
        reason = " ".join(str(error.strerror or error).split())  # HDF5's messages span lines
        if error.errno is not None:
            reason += f" [errno {error.errno}, {errno.errorcode.get(error.errno, '?')}]"
        super().__init__(f"cannot write {path}: {reason}; {outcome}")


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


class TrainingSession:
    """What `training_session` yields: whether a stop was requested, and the periodic checkpoint."""

    def __init__(self, agent: Any, stop: StopRequest) -> None:
        self.agent = agent
        self.stop = stop

    @property
    def stop_requested(self) -> bool:
        """True once Ctrl-C or SIGTERM came: the loop ends after its current step."""
        return self.stop.requested

    def step_done(self) -> None:
        """After each env step: a checkpoint every CHECKPOINT_EVERY steps."""
        every = self.agent.config.checkpoint_every
        if every and self.agent.step % every == 0:
            print(f"checkpoint: {save_agent(self.agent)}", flush=True)


@contextlib.contextmanager
def training_session(agent: Any) -> Iterator[TrainingSession]:
    """Around `DQNAgent.run`'s loop: the run's first lines; Ctrl-C and SIGTERM set
    `stop_requested` instead of ending the process; a NonFiniteError saves a checkpoint of the
    last good state (`saved_on`). When the loop ends, a stopped run saves a checkpoint to
    --resume from and its last network; a finished one its last checkpoint (with
    CHECKPOINT_EVERY); both draw the plots and say so."""
    agent.report.start(agent)
    with stop_requests() as stop, agent.report, saved_on(NonFiniteError, agent):
        session = TrainingSession(agent, stop)
        yield session
    if agent.step < agent.config.total_steps:  # stopped before the budget was spent
        path = save_agent(agent)
        agent.save(agent.Last_model_name)
        agent.report.stopped(agent, stop.signal_name, path, agent.Last_model_name)
        return
    if agent.config.checkpoint_every:
        save_agent(agent)
    agent.report.finish(agent)


def exit_code(run: Callable[[], None]) -> int:
    """Run `run` (a started `DQNAgent.run`) to its end; 0, or after one `error:` line 2 for a
    failed write (disk full) or 3 for NaN or inf from training or the environment."""
    try:
        with stop_requests():  # a stop once the budget is spent: the run finishes
            run()
    except (NonFiniteError, WriteError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2 if isinstance(err, WriteError) else 3
    return 0


class FiniteSteps(gym.Wrapper):
    """The agent's environment, raising NonFiniteError (`check_environment_step`) as soon as
    a reward or an observation holds NaN or inf, before the transition is stored."""

    def __init__(self, env: gym.Env, agent: Any) -> None:
        super().__init__(env)
        self.agent = agent

    def step(self, action: Any) -> tuple:
        result = self.env.step(action)
        check_environment_step(self.agent.step + 1, result[1], result[0])
        return result

    def reset(self, **options: Any) -> tuple:
        observation, info = self.env.reset(**options)
        if not is_finite(observation):  # the checkpoint then holds the new, empty episode
            self.agent.state = observation
            check_environment_step(self.agent.step, 0.0, observation, reset=True)
        return observation, info


# ---- A run and the files it owns --------------------------------------------------------------
@dataclass
class TrainingRun:
    """The run a checkpoint belongs to: one run from its fresh start through every resumption."""

    run_id: str  # the directory of its checkpoints under the checkpoint root: run-20250101-120000
    started: str  # local time of its fresh start: 2025-01-01 12:00:00
    lock: RunLock | None = None  # held while it trains: taken by `begin`, let go after `run`


class RunLock:
    """The lock of a run's files: `path`, locked with flock and naming its holder inside.

    One process at a time holds it, and the OS lets go of it when that process dies, so a killed
    run leaves nothing stuck (its lock file is simply taken over). ValueError naming the holder
    if another process holds it; `release` removes the file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        while True:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                raise WriteError(path, error, "no run was started") from error
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(descriptor, 1000).decode(errors="replace").strip()
                os.close(descriptor)
                raise ValueError(
                    f"another run is writing {path.stem} to {path.parent}: "
                    f"{holder or 'a process that is starting'} (lock {path}); wait for it to end "
                    "or stop it, or give this run another --model-dir") from None
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(descriptor), os.stat(path)):
                    break
            os.close(descriptor)  # its holder removed the file as it let go: open it anew
        self.descriptor = descriptor
        holder = (f"pid {os.getpid()} on {socket.gethostname()}, started "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
        try:
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, holder.encode(), 0)
        except OSError as error:
            self.release()
            raise WriteError(path, error, "no run was started") from error

    def release(self) -> None:
        """Remove the lock file and let go of the lock."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self.descriptor)


def begin(agent: Any, resume: str | None = None) -> None:
    """Start `agent`'s training run, or with `resume` (LATEST or a `step-*` directory) continue
    one from its checkpoint; print which run it continues, or what of earlier runs a new one
    will replace.

    Takes the lock of the run's files (ValueError naming the run that holds it) and removes what
    killed writers left (`.tmp-*`). If the checkpoint cannot be resumed, raises ValueError and
    lets go of the lock, having changed nothing on disk.
    """
    lock = RunLock(Path(agent.Model_name).with_suffix(".lock"))
    try:
        remove_leftovers(agent)
        if resume:
            print(resume_from(agent, resume), flush=True)
        elif getattr(agent, "training_run", None) is None:
            agent.training_run = new_run(agent.checkpoint_root)
            for note in earlier_runs(agent):
                print(f"note: {note}", flush=True)
    except BaseException:
        lock.release()
        raise
    agent.training_run.lock = lock


def owns_its_files(run: Callable[[Any], None]) -> Callable[[Any], None]:
    """Decorate `DQNAgent.run`: the run trains holding the lock of its files, which `begin` took
    (here, if the caller did not), and lets go of it when it returns or raises."""

    @functools.wraps(run)
    def run_owning_its_files(agent: Any) -> None:
        training_run = getattr(agent, "training_run", None)
        if training_run is None or training_run.lock is None:
            begin(agent)
        try:
            run(agent)
        finally:
            agent.training_run.lock.release()
            agent.training_run.lock = None

    return run_owning_its_files


def new_run(checkpoint_root: str | Path) -> TrainingRun:
    """A run starting now, with an id that no earlier run under `checkpoint_root` has."""
    now = time.localtime()
    first = run_id = time.strftime(RUN_PREFIX + "%Y%m%d-%H%M%S", now)
    count = 1
    while (Path(checkpoint_root) / run_id).exists():  # another run started in the same second
        count += 1
        run_id = f"{first}-{count}"
    return TrainingRun(run_id, time.strftime("%Y-%m-%d %H:%M:%S", now))


def earlier_runs(agent: Any) -> list[str]:
    """What a new run finds of earlier ones: the best network it will replace, and their
    checkpoints, which it leaves alone."""
    notes = []
    if os.path.exists(agent.Model_name):
        saved = time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(agent.Model_name)))
        notes.append(f"{agent.Model_name} holds the best network of an earlier run (saved "
                     f"{saved}); this new run replaces it at its first evaluation (another "
                     "--model-dir keeps it)")
    earlier = newest_checkpoints(agent.checkpoint_root)
    if earlier:
        runs = "1 earlier run" if len(earlier) == 1 else f"{len(earlier)} earlier runs"
        notes.append(f"{agent.checkpoint_root} holds the checkpoints of {runs}, which this run "
                     "leaves alone (--resume continues one)")
    return notes


def remove_leftovers(agent: Any) -> None:
    """Remove the temporary files and directories (`.tmp-*`) that writers killed mid-write left
    of the run's files: its networks and plots, its checkpoints. Those a live process is writing
    stay, and so does every other file of the model and plot directories."""
    root = Path(agent.checkpoint_root)
    ours = f"{TEMPORARY_PREFIX}*{agent.name}*"
    everything = f"{TEMPORARY_PREFIX}*"  # only runs of this name write under `root`
    searches = [(Path(agent.config.model_dir), ours), (Path(agent.config.plot_dir), ours),
                (root, everything), *((run, everything) for run in root.glob(RUN_PREFIX + "*"))]
    for directory, pattern in searches:
        for leftover in directory.glob(pattern):
            if being_written(leftover):
                continue
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)


def being_written(path: Path) -> bool:
    """Whether the temporary `path` (`.tmp-<pid>-...`) is another live process's write."""
    match = re.match(re.escape(TEMPORARY_PREFIX) + r"([1-9][0-9]*)-", path.name)
    if match is None or int(match[1]) == os.getpid():
        return False
    try:
        os.kill(int(match[1]), 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's
        return True
    return True


def check_environment_step(step: int, reward: Any, observation: Any, reset: bool = False
                           ) -> None:
    """NonFiniteError naming env step `step` and the value if the environment returned a reward
    or an observation holding NaN or inf (`reset`: the observation of a reset after that step),
    so the run stops before the transition is stored and its last good state (`saved_on`) is
    the one before. ~0.5 us for CartPole."""
    if not (type(reward) is float and math.isfinite(reward)) and not np.isfinite(
            np.asarray(reward, dtype=np.float64)).all():
        raise NonFiniteError(f"the environment returned reward {reward!r} at env step {step}")
    if not is_finite(observation):
        observation = np.asarray(observation)
        value = observation[~np.isfinite(observation)].flat[0].item()
        where = f"its reset after env step {step}" if reset else f"env step {step}"
        raise NonFiniteError(f"the environment returned an observation holding {value!r} at "
                             f"{where}")


def is_finite(observation: Any) -> bool:
    """Whether `observation` holds no NaN or inf (integer observations, like frames, always)."""
    observation = observation if type(observation) is np.ndarray else np.asarray(observation)
    return observation.dtype.kind != "f" or all_finite(observation)


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


# ---- Saving and loading an agent ----------------------------------------------------------------
def save_agent(agent: Any) -> str:
    """Write everything needed to continue `agent`'s run to a new checkpoint of that run; return
    its path.

    Online and target weights (Keras `.weights.h5`), the optimizer's variables, the replay
    memory and the priority figure's counters (`.npz`), counters, scores, the random generators,
    the actions of the episode in progress, the run's id and flags (JSON). Written atomically;
    the run's last two are kept. WriteError if the disk has no room for it (checked first:
    HDF5 can crash the process when the disk fills during its write) or a write fails.
    """
    if agent.state is None:
        agent.start_episode()
    if getattr(agent, "training_run", None) is None:  # saved outside `run` (tests, benchmarks)
        agent.training_run = new_run(agent.checkpoint_root)
    run = agent.training_run
    memory = {**memory_state(agent.MEMORY), **agent.priority_figure.statistics.state_dict()}
    optimizer = {str(i): variable.numpy() for i, variable in enumerate(agent.optimizer.variables)}
    progress = json.dumps({
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
        # None for the observation of a reset that returned NaN: a fixed environment's differs.
        "state_sha256": state_digest(agent.state) if is_finite(agent.state) else None,
        **agent.priority_figure.progress(),
        "run": {"id": run.run_id, "started": run.started, "flags": vars(agent.config)},
    }, indent=1)
    weights = sum(variable.numpy().nbytes for variable in agent.model.weights)
    size = (sum(array.nbytes for array in (*memory.values(), *optimizer.values()))
            + 2 * weights + len(progress) + CHECKPOINT_HEADROOM_BYTES)

    def write(directory: Path) -> None:
        write_arrays(directory / "memory.npz", memory)  # the largest first
        write_arrays(directory / "optimizer.npz", optimizer)
        (directory / "progress.json").write_text(progress)
        agent.model.save_weights(directory / "online.weights.h5")
        agent.target_model.save_weights(directory / "target.weights.h5")

    root = Path(agent.checkpoint_root) / run.run_id
    return str(write_checkpoint(root, agent.step, write, size=size))


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
    """Continue `agent`'s run from a checkpoint: the newest of the run that wrote last among
    those whose flags match `agent`'s (`choose_checkpoint`), or the `step-*` directory given.
    Returns the checkpoint's path; `agent.training_run` becomes the run the checkpoint is of.

    Raises ValueError naming the file and what is wrong if there is no checkpoint, it was made
    with other flags (but those of MAY_CHANGE_ON_RESUME), for another environment, network or
    memory, or a file is missing or corrupt. Nothing on disk is written.
    """
    directory = choose_checkpoint(agent) if where == LATEST else Path(where)
    progress_file = directory / "progress.json"
    progress = read_json(progress_file)
    run = recorded_run(progress, progress_file)
    if run is not None:
        refused, _ = flag_changes(run["flags"], agent.config)
        if refused:
            raise ValueError(refusal(directory, run, refused))
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
        load_memory_state(agent.MEMORY, memory_arrays)
        agent.priority_figure.statistics.load_state_dict(memory_arrays, len(agent.MEMORY))
    except ValueError as error:
        raise ValueError(f"checkpoint file {directory / 'memory.npz'}: {error}") from error
    try:
        restore_progress(agent, progress)
    except NonFiniteError as error:  # a good checkpoint; the environment is not fixed yet
        raise ValueError(f"cannot resume from {directory}: {error}") from error
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"checkpoint file {progress_file} is corrupt: {error!r}") from error
    agent.training_run = (TrainingRun(run["id"], run["started"]) if run is not None
                          else new_run(agent.checkpoint_root))
    return str(directory)


def resume_from(agent: Any, where: str) -> str:
    """`load_agent(agent, where)`; return the lines that say from where, which run it continues
    (its id and start time) and which flags changed. The first, "resuming from <checkpoint> at
    step <N>", is the one logs are searched for (benchmarks/pong_logs.py)."""
    directory = choose_checkpoint(agent) if where == LATEST else Path(where)
    progress_file = directory / "progress.json"
    saved = recorded_run(read_json(progress_file), progress_file)
    path = load_agent(agent, str(directory))
    run = agent.training_run
    lines = f"resuming from {path} at step {agent.step}\n"
    if saved is None:
        return lines + f"continuing a checkpoint from before runs were recorded as {run.run_id}"
    _, changed = flag_changes(saved["flags"], agent.config)
    return (lines + f"continuing {run.run_id}, started {run.started}; changed flags: "
            + (", ".join(changed) or "none"))


def choose_checkpoint(agent: Any) -> Path:
    """For --resume without a path: the newest checkpoint of the run that wrote last among those
    whose flags match `agent`'s. ValueError if there is none, naming what differs in the run
    closest to `agent`'s flags."""
    newest = newest_checkpoints(agent.checkpoint_root)
    if not newest:
        raise ValueError(f"no checkpoint to resume from in {agent.checkpoint_root}")
    refusals = []
    for directory in newest:
        progress_file = directory / "progress.json"
        run = recorded_run(read_json(progress_file), progress_file)
        refused = flag_changes(run["flags"], agent.config)[0] if run is not None else []
        if not refused:
            return directory
        refusals.append((len(refused), refusal(directory, run, refused)))
    closest = min(refusals, key=lambda counted: counted[0])[1]
    if len(newest) == 1:
        raise ValueError(closest)
    others = "the other run differs" if len(newest) == 2 else f"the {len(newest) - 1} others differ"
    raise ValueError(f"{closest}; {others} more (--resume PATH takes any checkpoint)")


def recorded_run(progress: dict[str, Any], progress_file: Path) -> dict[str, Any] | None:
    """The run record of a checkpoint's progress.json (id, start time, flags), or None for a
    checkpoint from before runs were recorded. ValueError naming the file if it is damaged."""
    run = progress.get("run")
    if run is None:
        return None
    if not (isinstance(run, dict) and isinstance(run.get("id"), str)
            and re.fullmatch(re.escape(RUN_PREFIX) + r"[0-9-]+", run["id"])
            and isinstance(run.get("started"), str) and isinstance(run.get("flags"), dict)):
        raise ValueError(f"checkpoint file {progress_file} is corrupt: no valid run record")
    return run


def flag_changes(saved: dict[str, Any], config: Namespace) -> tuple[list[str], list[str]]:
    """The flags of `config` whose value differs from `saved` (a checkpoint's), each as
    "name saved -> new": (those that may not change on resume, those that may)."""
    current = json.loads(json.dumps(vars(config)))  # as a checkpoint holds them: tuples as lists
    refused, changed = [], []
    for name, value in current.items():
        if name in saved and saved[name] != value:
            entry = f"{name} {saved[name]!r} -> {value!r}"
            (changed if name in MAY_CHANGE_ON_RESUME else refused).append(entry)
    return refused, changed


def refusal(directory: Path, run: dict[str, Any], refused: list[str]) -> str:
    """The error for resuming a checkpoint with other flags than those in `refused`."""
    return (f"checkpoint {directory} (run started {run['started']}) was made with other flags "
            f"(its value -> this run's): {', '.join(refused)}; a resumed run may change only "
            f"{', '.join(MAY_CHANGE_ON_RESUME)}")


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
    if progress["state_sha256"] not in (None, state_digest(agent.state)):
        raise ValueError("replaying the episode in progress did not reproduce its observation "
                         "(is the environment deterministic under a seed?)")


def write_checkpoint(
    root: str | Path, step: int, write_files: Callable[[Path], None], keep: int = 2,
    size: int = 0,
) -> Path:
    """Write checkpoint `step` under `root` atomically and keep only the newest `keep`.

    `write_files(directory)` fills a fresh temporary directory; it is renamed into place only
    after it returned and its files reached the disk. A checkpoint of the same step that exists
    already is kept as it is: nothing can have changed without a step. If the disk has less
    than `size` bytes free or a write fails, raises WriteError with nothing of the new checkpoint
    left and the earlier ones untouched.
    """
    root = Path(root)
    final = root / f"{PREFIX}{step:010d}"
    temporary = root / f"{TEMPORARY_PREFIX}{os.getpid()}-{final.name}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        for leftover in root.glob(TEMPORARY_PREFIX + "*"):  # only this run writes here
            shutil.rmtree(leftover, ignore_errors=True)
        if final.exists():  # saved already at this step (e.g. Ctrl-C right after a checkpoint)
            return final
        free = shutil.disk_usage(root).free
        if size > free:
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (it needs about "
                          f"{size / 2**20:.1f} MB, {free / 2**20:.1f} MB are free)")
        temporary.mkdir()
        write_files(temporary)
        for path in temporary.iterdir():
            _fsync_file(path)
        os.replace(temporary, final)
    except OSError as error:
        shutil.rmtree(temporary, ignore_errors=True)
        raise WriteError(final, error, "nothing of it was kept, and the checkpoints before it "
                         "are intact (--resume continues from the newest)") from error
    _fsync_directory(root)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints right under `root`, oldest first (empty if there is none)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [path for path in root.iterdir() if path.is_dir() and path.name.startswith(PREFIX)]
    return sorted(found, key=lambda path: path.name)


def newest_checkpoints(root: str | Path) -> list[Path]:
    """The newest checkpoint of each run under the checkpoint root `root`, the most recently
    written first (`step-*` directories right under `root`, from before runs had directories of
    their own, count as one run)."""
    root = Path(root)
    runs = [root, *sorted(root.glob(RUN_PREFIX + "*"))]
    newest = [checkpoints[-1] for run in runs if (checkpoints := list_checkpoints(run))]
    return sorted(newest, key=lambda path: path.stat().st_mtime_ns, reverse=True)


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` to write to; on success it replaces `path` at once.

    The temporary name keeps the suffix, so writers that go by it (Keras' `.keras`, matplotlib's
    `.png`) still work, and holds the process id, so that two processes writing one file do not
    share it. If the write fails, raises WriteError; the temporary file is removed and `path`
    is left as it was.
    """
    path = Path(path)
    temporary = path.with_name(f"{TEMPORARY_PREFIX}{os.getpid()}-{path.name}")
    outcome = "the file there before is unchanged" if path.exists() else "nothing was written"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield temporary
        _fsync_file(temporary)
        os.replace(temporary, path)
    except OSError as error:
        raise WriteError(path, error, outcome) from error
    finally:
        temporary.unlink(missing_ok=True)


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
