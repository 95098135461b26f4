"""Files written whole or not at all, and the errors that say so.

`atomic_file(path)` gives a temporary path beside `path`, renamed into place once written and
flushed: a process killed at any moment leaves the old file or the new one, never half of one
(`save_model` writes a Keras model so); `replace_directory` puts a directory whole in place of
another.
A write that fails (disk full) removes what it wrote and raises `WriteError`; `being_written` tells
a live writer's temporary file from a killed one's. `read_arrays` never unpickles, and a missing
or damaged `.npz` file is one ValueError naming it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

TEMPORARY_PREFIX = ".tmp-"  # a file or directory being written: `.tmp-<pid>-<final name>`


class WriteError(ValueError):
    """A file could not be written (disk full, no permission, ...): what the write began is gone,
    what was there is untouched. A ValueError: the scripts print it as one `error:` line, exit 2."""

    def __init__(self, path: str | Path, error: OSError, outcome: str) -> None:
        super().__init__(f"cannot write {path}: {reason(error)}; {outcome}")


def reason(error: OSError) -> str:
    """What went wrong, on one line: "Permission denied [errno 13, EACCES]"."""
    said = " ".join(str(error.strerror or error).split())  # HDF5's messages span lines
    if error.errno is not None:
        said += f" [errno {error.errno}, {errno.errorcode.get(error.errno, '?')}]"
    return said


def temporary_path(path: Path) -> Path:
    """Where `path` is written before its rename: beside it, named for this process (two writing
    one file do not share it), keeping the suffix that Keras and matplotlib go by."""
    return path.with_name(f"{TEMPORARY_PREFIX}{os.getpid()}-{path.name}")


def being_written(path: Path) -> bool:
    """Whether the temporary `path` (`.tmp-<pid>-...`) is another live process's write."""
    match = re.match(re.escape(TEMPORARY_PREFIX) + r"([1-9][0-9]*)-", path.name)
    if match is None or int(match[1]) == os.getpid():
        return False
    try:
        os.kill(int(match[1]), 0)  # signal 0: only asks whether the process exists
    except (ProcessLookupError, PermissionError) as error:
        return isinstance(error, PermissionError)  # PermissionError: another user's, alive
    return True


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield the temporary path to write `path` to, renamed into place on success; WriteError
    if the write fails, with the temporary file removed and `path` as it was (a removal that
    fails, where the directory cannot be written at all, does not hide the WriteError)."""
    path = Path(path)
    temporary = temporary_path(path)
    outcome = "the file there before is unchanged" if path.exists() else "nothing was written"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield temporary
        fsync_file(temporary)
        os.replace(temporary, path)
    except OSError as error:
        raise WriteError(path, error, outcome) from error
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)


def save_model(model: Any, path: str | Path) -> None:
    """Save a Keras `model` as a `.keras` file (architecture and weights) at `path`, atomically:
    what both programs save, the best evaluated network and the last one."""
    with atomic_file(path) as temporary:
        model.save(temporary)


def write_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as file:
        np.savez(file, **arrays)


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Read every array of an `.npz` file without unpickling, or ValueError naming the file."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            return {key: saved[key] for key in saved.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise ValueError(f"{path} is missing or corrupt: {error}") from error


def fsync_file(path: Path) -> None:
    with open(path, "rb") as file:
        os.fsync(file.fileno())


def fsync_directory(directory: Path) -> None:
    """Make a rename inside `directory` durable, where the system can sync directories."""
    with contextlib.suppress(OSError):
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def replace_directory(source: Path, destination: Path) -> None:
    """Rename the directory `source` to `destination`, replacing one there whole: the old one is
    renamed aside (a temporary name), the new one into place, then the old one removed. At every
    moment `destination` is the old directory, the new one, or (a kill between the two renames,
    the aside one then removed as a leftover) absent; never a mix of the two."""
    if destination.exists():
        aside = temporary_path(destination.with_name("replaced-" + destination.name))
        os.replace(destination, aside)
        os.replace(source, destination)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(source, destination)
