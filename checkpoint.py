"""Crash-safe checkpoint directories: written whole or not at all, the last few kept.

A checkpoint is a directory `step-<N>` under a root such as
`models/DDQN_CartPole-v1_Dueling_PER.checkpoints/`. It is first written as `.tmp-step-<N>`, its
files flushed to disk, and only then renamed to `step-<N>`; a rename within one file system is
atomic, so a process killed at any moment leaves either the complete new checkpoint or none, and
the previous ones stay intact. Leftover `.tmp-*` directories are ignored and removed by the next
save. What goes inside is the caller's business; the readers here turn every way a file can be
missing or damaged into one ValueError that names the file.

Nothing here unpickles: JSON for counters, `.npz` read with `allow_pickle=False` for arrays.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

PREFIX = "step-"
TEMPORARY_PREFIX = ".tmp-"


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
