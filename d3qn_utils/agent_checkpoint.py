"""The agent's files: its checkpoints (what one holds, in which file, its format version, resuming
with the flags allowed to change) and the error for a `.keras` file that will not load.

A checkpoint is a directory `step-<N>` (run_files.py writes it atomically) holding

    progress.json        {"format": FORMAT, "run": {id, started, flags, networks},
                          "progress": {counters, open episodes, ...}}
    memory.npz           the replay memory's own `state_dict`
    priority_figure.npz  the priority figure's `state_dict`
    optimizer.npz        the optimizer's variables, "0", "1", ... in Keras' order
    online.weights.h5, target.weights.h5   the two networks (Keras)

The agent gives what goes in (`DQNAgent.state_dict`) and takes back what `load` returns
(`load_state_dict`, inside `restoring`). A state holding NaN or inf is never written; the run's
`networks` (the digests of the network files it saved) let a resume tell whether its best network
on disk is still the one it saved.

A checkpoint of an older format is read through `MIGRATIONS`, one step per format, in order (1 to
2, 2 to 3, ...); a newer or unknown format is refused. A format that only adds a field is a step
that leaves the layout as it is (`lambda progress, arrays: (progress, arrays)`) and one line in
the part that owns the field: in its `ADDED_KEYS`, the value that means what a checkpoint written
before the field did (`checks.with_added_keys`; a subclass's keys add to its bases',
`checks.added_keys`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import zipfile
from argparse import Namespace
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import h5py
import numpy as np

from d3qn_utils import run_files
from d3qn_utils.atomic_files import atomic_file, read_arrays, write_arrays
from d3qn_utils.checks import added_keys, is_integer, with_added_keys
from d3qn_utils.priority_figure import PriorityFigure
from d3qn_utils.replay_memory import ReplayMemory
from d3qn_utils.replay_storage import TransitionStorage
from d3qn_utils.training_session import NonFiniteError, PoisonedStateError, is_finite, state_digest

FORMAT = 5
NETWORK_FILES = ("online.weights.h5", "target.weights.h5")
# The flags a resumed run may change (docs/usage.md lists them): its budget, the cadence of
# evaluations, checkpoints and logs, where files go, and the fast path (the same gradient steps
# per env step, in calls of another size, with XLA or not). Any other change is refused.
MAY_CHANGE_ON_RESUME = ("total_steps", "eval_every", "eval_episodes", "test_episodes",
                        "checkpoint_every", "model_dir", "plot_dir", "tensorboard",
                        "tensorboard_every", "gradient_steps_per_call", "xla")
# Flags added after checkpoints began to record their run's flags, each with the value every run
# before it had: a checkpoint that does not record one was made with that value.
VALUES_BEFORE_THE_FLAG: dict[str, Any] = {"n_envs": 1}
# Room for what a checkpoint's arrays do not count: HDF5 and .npz headers, progress.json.
CHECKPOINT_HEADROOM_BYTES = 1 << 20


def save(checkpoint_root: str, run: run_files.TrainingRun, config: Namespace, step: int,
         state: dict[str, Any], networks: Sequence[Any]) -> str:
    """Write `state` (`DQNAgent.state_dict`) and the weights of `networks` (online, target) to
    checkpoint `step` of `run`; its path. PoisonedStateError, nothing written, if the weights or
    the optimizer's variables hold NaN or inf; WriteError if a write fails or the disk lacks room
    (checked first: HDF5 can crash the process when the disk fills mid-write)."""
    weights = [network.get_weights() for network in networks]
    checked = {"the online network's weights": weights[0], "the target network's weights":
               weights[1], "the optimizer's variables": list(state["optimizer"].values())}
    if poisoned := [name for name, arrays in checked.items() if not all(map(is_finite, arrays))]:
        this_step = f"{run_files.PREFIX}{step:010d}"
        earlier = [path for path in reversed(run_files.list_checkpoints(
            Path(checkpoint_root) / run.run_id)) if path.name <= this_step]
        raise PoisonedStateError(
            f"the state at step {step} holds NaN or inf ({', '.join(poisoned)}), so it was not "
            f"saved; {newest_intact(earlier, config, 'of this run')}")
    run_record = {"id": run.run_id, "started": run.started, "flags": vars(config),
                  "networks": run.networks}
    progress = json.dumps({"format": FORMAT, "run": run_record, "progress": state["progress"]},
                          indent=1)
    parts = {name: part for name, part in state.items() if name != "progress"}  # <name>.npz
    arrays = [*(value for part in parts.values() for value in part.values()),
              *(array for network_weights in weights for array in network_weights)]
    size = sum(array.nbytes for array in arrays) + len(progress) + CHECKPOINT_HEADROOM_BYTES

    def write(directory: Path) -> None:
        for name, part in parts.items():
            write_arrays(directory / f"{name}.npz", part)
        (directory / "progress.json").write_text(progress)
        for network, file in zip(networks, NETWORK_FILES, strict=True):
            network.save_weights(directory / file)

    def update(directory: Path) -> None:  # the networks saved since (a final evaluation's)
        saved = json.loads((directory / "progress.json").read_text())
        saved["run"]["networks"] = run.networks
        with atomic_file(directory / "progress.json") as temporary:
            temporary.write_text(json.dumps(saved, indent=1))

    return str(run_files.write_checkpoint(checkpoint_root, run, step, write, size=size,
                                          update_files=update))


def newest_intact(candidates: Iterable[Path], config: Namespace, where: str) -> str:
    """What to resume from instead: the first of `candidates` (newest first) that is intact
    (`is_intact`), with the --resume that takes it, or that none `where` ("of this run") is."""
    for directory in candidates:
        if is_intact(directory, config):
            return (f"the newest intact checkpoint {where} is {directory} (--resume {directory} "
                    "continues from it)")
    return f"there is no intact checkpoint {where} to resume from"


def is_intact(directory: Path, config: Namespace) -> bool:
    """Whether the checkpoint in `directory` reads whole, was made with flags that `config` may
    resume, and holds finite weights and optimizer variables."""
    try:
        saved, arrays = read_state(directory)
        values = [*arrays["optimizer"].values(),
                  *(array for file in NETWORK_FILES for array in weights_file(directory / file))]
    except (OSError, KeyError, ValueError):  # h5py: OSError for a damaged file
        return False
    return not flag_changes(saved["run"]["flags"], config)[0] and all(map(is_finite, values))


def weights_file(path: Path) -> list[np.ndarray]:
    """Every array of the Keras `.weights.h5` file at `path` (read with h5py, no network)."""
    arrays: list[np.ndarray] = []
    with h5py.File(path, "r") as file:
        file.visititems(lambda _, item: arrays.append(item[()])
                        if isinstance(item, h5py.Dataset) else None)
    return arrays


class Checkpoint(NamedTuple):
    """A checkpoint `load` read: the run it continues, its directory, the state for
    `DQNAgent.load_state_dict`, the flags it was made with and the lines saying which run it
    continues and what differs from it (after the agent's "resuming from <checkpoint> at step
    <N>")."""

    run: run_files.TrainingRun
    directory: Path
    state: dict[str, Any]
    flags: dict[str, Any]
    lines: str


def load(checkpoint_root: str, where: str, config: Namespace, networks: Sequence[Any],
         best_model: str) -> Checkpoint:
    """Read the checkpoint `where` (a `step-*` directory, or LATEST: `choose_checkpoint`): the
    weights into `networks` (online, target), the rest a `Checkpoint`, its lines saying what
    differs from the run that wrote it (flags, its best network at `best_model`, its checkpoints
    of later steps). ValueError if unusable, a corrupt LATEST naming the newest intact one."""
    directory = choose_checkpoint(checkpoint_root, where, config)
    with naming_an_intact_one(checkpoint_root, directory, config, where == run_files.LATEST):
        saved, arrays = read_state(directory)
        step = saved["progress"].get("step")
        if not is_integer(step):
            raise ValueError(f"checkpoint file {directory / 'progress.json'} is corrupt: step "
                             f"{step!r}")
    if config.total_steps < step or (config.total_steps == step and evaluated(saved["progress"])):
        raise ValueError(f"--total-steps {config.total_steps} leaves nothing to do from checkpoint "
                         f"{directory} at step {step}: a resumed run trains on to --total-steps, "
                         f"so give more than {step}")
    with naming_an_intact_one(checkpoint_root, directory, config, where == run_files.LATEST):
        for network, file in zip(networks, NETWORK_FILES, strict=True):
            try:
                network.load_weights(directory / file)
            except Exception as error:  # Keras raises several types for a bad weights file
                raise ValueError(f"checkpoint file {directory / file} is missing or does not "
                                 f"fit the network: {error}") from error
    run = saved["run"]
    training_run = run_files.TrainingRun(run["id"], run["started"], networks=run.get("networks"))
    _, changed, unrecorded = flag_changes(run["flags"], config)
    lines = (f"continuing {run['id']}, started {run['started']}; changed flags: "
             + (", ".join(changed) or "none"))
    if unrecorded:
        lines += ("; flags the checkpoint does not record (made before they were), at this run's "
                  "value: " + ", ".join(unrecorded))
    later = run_files.later_checkpoints(directory)
    notes = [best_model_note(best_model, training_run.networks, saved["progress"], later)]
    if later:
        notes.append(f"{directory.parent} holds checkpoints after step {step} "
                     f"({', '.join(path.name for path in later)}), of the branch this resume "
                     "leaves: this run's next checkpoint replaces them")
    lines += "".join(f"\nnote: {note}" for note in notes if note)
    return Checkpoint(training_run, directory, {"progress": saved["progress"], **arrays},
                      run["flags"], lines)


def evaluated(progress: dict[str, Any]) -> bool:
    """Whether a checkpoint's `progress` holds an evaluation at its step: resumed with that step
    as its budget, a run has nothing left to do (one stopped during that evaluation does it)."""
    evaluations = progress.get("evaluations")
    return bool(isinstance(evaluations, list) and evaluations
                and isinstance(evaluations[-1], list) and evaluations[-1][:1] == [progress["step"]])


def best_model_note(best_model: str, networks: dict[str, str] | None, progress: dict[str, Any],
                    later: Sequence[Path]) -> str | None:
    """The note for a resumed run whose best network, `best_model`, is not the one it saved (by
    the digests `networks`; None: not recorded; the run's `later` checkpoints tell whether its
    branch left replaced it). One that another network replaced counts its best afresh, so that
    it names no network it did not make as its best: progress's best evaluation becomes -inf and
    the file leaves `networks`. None if it is the run's, or if the run saved none."""
    best = progress.get("best_evaluation")
    if not (isinstance(best, (int, float)) and math.isfinite(best)):
        return None  # no evaluation yet, no best network saved
    if networks is None:
        return (f"{best_model} is not checked: the checkpoint records no digest of the networks "
                "its run saved (it was written before checkpoints did)")
    name, on_disk = os.path.basename(best_model), run_files.file_digest(best_model)
    if on_disk is None:
        return (f"{best_model}, the network this run saved as its best (mean {best:.1f}), is "
                f"missing: the resumed run saves one there when an evaluation reaches {best:.1f}")
    if networks.get(name) == on_disk:
        return None
    replaced_by = ("the branch this resume leaves" if on_disk in later_digests(later, name)
                   else "another run")
    networks.pop(name, None)
    progress["best_evaluation"] = -math.inf
    return (f"{best_model} is not the network this run saved as its best (mean {best:.1f}): "
            f"{replaced_by} replaced it; the resumed run saves its next evaluated network there "
            "and counts its best from it")


def later_digests(later: Sequence[Path], name: str) -> set[str]:
    """The digests of the network file `name` that the checkpoints `later` record (none from one
    that does not read)."""
    digests = set()
    for directory in later:
        with contextlib.suppress(ValueError):
            digests.add((read_progress(directory)["run"].get("networks") or {}).get(name))
    return digests - {None}


@contextlib.contextmanager
def naming_an_intact_one(checkpoint_root: str, directory: Path, config: Namespace,
                         latest: bool) -> Iterator[None]:
    """A ValueError reading `directory`, the checkpoint --resume chose itself if `latest`, with
    the newest intact checkpoint under `checkpoint_root` named (`newest_intact`)."""
    try:
        yield
    except ValueError as error:
        if not latest:
            raise
        others = [path for path in run_files.checkpoints_newest_first(checkpoint_root)
                  if path != directory]
        raise ValueError(f"{error}; {newest_intact(others, config, 'here')}") from error


@contextlib.contextmanager
def restoring(directory: Path) -> Iterator[None]:
    """Turn what the agent raises taking back a checkpoint's state into one ValueError naming it."""
    try:
        yield
    except NonFiniteError as error:  # a good checkpoint; the environment is not fixed yet
        raise ValueError(f"cannot resume from {directory}: {error}") from error
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"checkpoint {directory} is corrupt or does not fit this run: "
                         f"{error}") from error


def read_state(directory: Path) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    """(progress.json, the arrays of each `<name>.npz`) of the checkpoint in `directory`, brought
    to this FORMAT by `MIGRATIONS`; ValueError naming a file missing or corrupt, or a format this
    version cannot read."""
    progress = read_progress(directory)
    arrays = {path.stem: read_arrays(path) for path in sorted(directory.glob("*.npz"))}
    for version in range(progress.get("format", 1), FORMAT):
        try:
            progress, arrays = MIGRATIONS[version](progress, arrays)
        except (KeyError, ValueError) as error:
            raise ValueError(f"checkpoint {directory} is not of format {version} (it lacks "
                             f"{error}); this version cannot read it") from error
        progress["format"] = version + 1
    return progress, arrays


def read_progress(directory: Path) -> dict[str, Any]:
    """The progress.json in `directory`, of FORMAT or one `MIGRATIONS` converts (format 1: no
    number, a "fingerprint"), with a valid run record (id, start time, flags) and counters; else
    ValueError naming the file."""
    path = directory / "progress.json"
    try:
        progress = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"checkpoint file {path} is missing or corrupt: {error}") from error
    if not isinstance(progress, dict):
        raise ValueError(f"checkpoint file {path} is corrupt: expected a JSON object")
    version = progress.get("format", 1 if "fingerprint" in progress else None)
    readable = [n for n in range(1, FORMAT + 1) if set(range(n, FORMAT)) <= set(MIGRATIONS)]
    if version not in readable:
        raise ValueError(f"checkpoint {directory} has format {version!r}, which this version "
                         f"cannot read (it reads formats {', '.join(map(str, readable))})")
    run = progress.get("run")
    if not (isinstance(run, dict) and run_files.is_run_id(run.get("id"))
            and isinstance(run.get("started"), str) and isinstance(run.get("flags"), dict)
            and isinstance(run.get("networks"), dict | None)
            and (version == 1 or isinstance(progress.get("progress"), dict))):
        raise ValueError(f"checkpoint file {path} has no valid run record or counters (corrupt, "
                         "or older than format 1)")
    return progress


def from_format_1(progress: dict[str, Any], arrays: dict[str, dict[str, np.ndarray]]
                  ) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    """Format 1 to 2: the counters move from the top of progress.json (beside a "fingerprint",
    which the flags now say) under "progress"; the priority figure's state, spread over
    progress.json and memory.npz (`PriorityFigure.format_1_state`), gets its own file."""
    figure = PriorityFigure.format_1_state(arrays["memory"], progress)
    run = progress.pop("run")
    del progress["fingerprint"]
    return {"run": run, "progress": progress}, {**arrays, "priority_figure": figure}


def from_format_2(progress: dict[str, Any], arrays: dict[str, dict[str, np.ndarray]]
                  ) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    """Format 2 to 3: the one episode in progress (its actions, score and observation's digest,
    its number the count of finished episodes) becomes the first and only of "open_episodes",
    one per environment (N_ENVS), and "episodes_started" counts it."""
    counters = progress["progress"]
    counters["open_episodes"] = [{
        "number": counters["episode"], "actions": counters.pop("episode_actions"),
        "score": counters.pop("episode_score"), "state_sha256": counters.pop("state_sha256")}]
    counters["episodes_started"] = counters["episode"] + 1
    return progress, arrays


def from_format_3(progress: dict[str, Any], arrays: dict[str, dict[str, np.ndarray]]
                  ) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    """Format 3 to 4: the environments' state ("episodes_started", "open_episodes") moves from
    the counters under their own "environments", with the environment steps they took (the
    step). A memory of vector states gets the ends of its episodes, which format 3 did not
    record, as format 3's code inferred them (`TransitionStorage.episode_ends_by_state`): the
    next slot's state is not a transition's next_state, or, for a stream's newest, its
    environment's observation (`open_episodes`' digest) is not; a frame memory's format 3
    state is already whole (its next `add` still compares the pending next state)."""
    counters = progress["progress"]
    episodes = counters.pop("open_episodes")
    counters["environments"] = {"steps_taken": counters["step"],
                                "episodes_started": counters.pop("episodes_started"),
                                "open_episodes": episodes}
    memory = with_added_keys(arrays["memory"], added_keys(ReplayMemory))
    if "storage.frames" not in memory:
        ends = TransitionStorage.episode_ends_by_state(
            {key.removeprefix("storage."): value for key, value in memory.items()
             if key.startswith("storage.")},
            lambda stream, state: state_digest(state) == episodes[stream]["state_sha256"])
        arrays = {**arrays, "memory": {**memory, "storage.episode_ends": ends}}
    return progress, arrays


# MIGRATIONS[n] turns a checkpoint of format n into one of format n + 1 (`read_state`); a format
# that only adds a key leaves the layout as it is: 4 to 5 adds the prioritized memories'
# "beta_increment" (their ADDED_KEYS).
MIGRATIONS = {1: from_format_1, 2: from_format_2, 3: from_format_3,
              4: lambda progress, arrays: (progress, arrays)}


def choose_checkpoint(checkpoint_root: str, where: str, config: Namespace) -> Path:
    """The checkpoint `where` (a `step-*` directory, or LATEST: the newest of the run that wrote
    last among those whose flags match `config`) if its flags match `config`; else ValueError
    naming what differs (in the closest run)."""
    candidates = ([Path(where)] if where != run_files.LATEST
                  else run_files.newest_checkpoints(checkpoint_root))
    if not candidates:
        raise ValueError(f"no checkpoint to resume from in {checkpoint_root}")
    refusals = []
    for directory in candidates:
        with naming_an_intact_one(checkpoint_root, directory, config, where == run_files.LATEST):
            run = read_progress(directory)["run"]
        refused = flag_changes(run["flags"], config)[0]
        if not refused:
            return directory
        refusals.append((len(refused), (
            f"checkpoint {directory} (run started {run['started']}) was made with other flags "
            f"(its value -> this run's): {', '.join(refused)}; a resumed run may change only "
            f"{', '.join(MAY_CHANGE_ON_RESUME)}")))
    closest = min(refusals, key=lambda counted: counted[0])[1]
    others = "; each other run differs more (--resume PATH takes any checkpoint)"
    raise ValueError(closest + (others if len(candidates) > 1 else ""))


def recorded_flag(checkpoint_root: str, where: str, values: dict[str, Any], name: str
                  ) -> tuple[Any, Path] | None:
    """The value of flag `name` that the checkpoint --resume `where` takes was made with, and
    that checkpoint, for a run of `values` that leaves `name` to it; None if no checkpoint there
    reads and records it (`load` then says what is wrong). LATEST takes it as `choose_checkpoint`
    would: from the first of `run_files.newest_checkpoints` whose flags, but for `name`, match
    `values`, else (a resume it refuses for other flags) from the first."""
    candidates = ([Path(where)] if where != run_files.LATEST
                  else run_files.newest_checkpoints(checkpoint_root))
    recorded = []
    for directory in candidates:
        with contextlib.suppress(ValueError):
            flags = read_progress(directory)["run"]["flags"]
            if name in flags:
                recorded.append((flags, directory))
    for flags, directory in recorded:
        if not flag_changes(flags, Namespace(**{**values, name: flags[name]}))[0]:
            return flags[name], directory
    return (recorded[0][0][name], recorded[0][1]) if recorded else None


def flag_changes(saved: dict[str, Any], config: Namespace
                 ) -> tuple[list[str], list[str], list[str]]:
    """The flags of `config` that differ from `saved` (a checkpoint's) as "name saved -> new":
    (those that may not change on resume, those that may), and those `saved` lacks (flags newer
    than the checkpoint, but those whose earlier value VALUES_BEFORE_THE_FLAG gives) as "name
    value"."""
    current = json.loads(json.dumps(vars(config)))  # as a checkpoint holds them: tuples as lists
    saved = {**VALUES_BEFORE_THE_FLAG, **saved}
    refused, changed, unrecorded = [], [], []
    for name, value in current.items():
        if name not in saved:
            unrecorded.append(f"{name} {value!r}")
        elif saved[name] != value:
            entry = f"{name} {saved[name]!r} -> {value!r}"
            (changed if name in MAY_CHANGE_ON_RESUME else refused).append(entry)
    return refused, changed, unrecorded


def load_variables(variables: Sequence[Any], arrays: dict[str, np.ndarray], what: str) -> None:
    """Assign `arrays` ("0", "1", ...) to `variables` in order; ValueError naming `what` unless
    they match in number and shapes, checked before any is assigned."""
    if sorted(arrays, key=int) != [str(i) for i in range(len(variables))] or any(
            arrays[str(i)].shape != tuple(v.shape) for i, v in enumerate(variables)):
        raise ValueError(f"the saved {what} does not fit this run's")
    for i, variable in enumerate(variables):
        variable.assign(arrays[str(i)])


def model_load_error(path: str, error: Exception) -> ValueError:
    """The one-line error for a `.keras` file Keras could not load (with `error`): none there,
    unreadable, or not a valid .keras file (Keras says "File not found" for a non-zip file)."""
    if not os.path.exists(path):
        return ValueError(f"no saved model at {path!r}; train first (python d3qn_agent.py)")
    if not os.access(path, os.R_OK):
        return ValueError(f"cannot read model {path!r}: permission denied")
    first_line = (str(error).strip().splitlines() or [""])[0]
    is_zip = zipfile.is_zipfile(path)
    reason = f"{type(error).__name__}: {first_line}" if is_zip else "not a zip archive"
    return ValueError(f"cannot load model {path!r}: not a valid .keras file ({reason})")
