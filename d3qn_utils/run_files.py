"""The files a training run owns: its lock, its id, its checkpoint directories, and what writers
killed mid-write left behind.

A run holds the lock `models/<name>.lock` (`RunLock`) while it trains: a second run of the same
name into the same model directory is refused, naming the first. Its id is its start time
(`run-20250101-120000`); its checkpoints, `models/<name>.checkpoints/<run id>/step-<N>`, the
last two kept, are written as `.tmp-<pid>-step-<N>` and renamed into place once on disk.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from d3qn_utils.atomic_files import (
    TEMPORARY_PREFIX,
    WriteError,
    fsync_directory,
    fsync_file,
    temporary_path,
)

PREFIX = "step-"
RUN_PREFIX = "run-"
LATEST = "latest"  # --resume without a path: the newest checkpoint of this run


class RunLock:
    """The lock of a run's files: `path`, locked with flock and naming its holder inside; the OS
    lets go of it when its process dies, so a killed run leaves nothing stuck. ValueError naming
    the holder if another process holds it; `release` removes the file."""

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
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self.descriptor)

    @contextlib.contextmanager
    def released_on_error(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self.release()
            raise


@dataclass
class TrainingRun:
    """The run a checkpoint belongs to, from its fresh start through every resumption; as a
    context manager it lets go of its lock on exit."""

    run_id: str  # the directory of its checkpoints under the checkpoint root: run-20250101-120000
    started: str  # local time of its fresh start: 2025-01-01 12:00:00
    lock: RunLock | None = None  # held while it trains

    def __enter__(self) -> TrainingRun:
        return self

    def __exit__(self, *exception: object) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def new_run(checkpoint_root: str | Path) -> TrainingRun:
    """A run starting now, with an id that no earlier run under `checkpoint_root` has."""
    now = time.localtime()
    first = run_id = time.strftime(RUN_PREFIX + "%Y%m%d-%H%M%S", now)
    count = 1
    while (Path(checkpoint_root) / run_id).exists():  # another run started in the same second
        count += 1
        run_id = f"{first}-{count}"
    return TrainingRun(run_id, time.strftime("%Y-%m-%d %H:%M:%S", now))


def take_lock(model_path: str, checkpoint_root: str, plot_dir: str) -> RunLock:
    """The lock of the files of the run whose best network is `model_path` (ValueError naming
    its holder), with what killed writers left of them removed (`remove_leftovers`)."""
    lock = RunLock(Path(model_path).with_suffix(".lock"))
    with lock.released_on_error():
        remove_leftovers(model_path, checkpoint_root, plot_dir)
    return lock


def earlier_runs(model_path: str, checkpoint_root: str) -> list[str]:
    """What a new run finds of earlier ones: the best network it will replace, and their
    checkpoints, which it leaves alone."""
    notes = []
    if os.path.exists(model_path):
        saved = time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(model_path)))
        notes.append(f"{model_path} holds the best network of an earlier run (saved "
                     f"{saved}); this new run replaces it at its first evaluation (another "
                     "--model-dir keeps it)")
    earlier = newest_checkpoints(checkpoint_root)
    if earlier:
        runs = "1 earlier run" if len(earlier) == 1 else f"{len(earlier)} earlier runs"
        notes.append(f"{checkpoint_root} holds the checkpoints of {runs}, which this run "
                     "leaves alone (--resume continues one)")
    return notes


def remove_leftovers(model_path: str, checkpoint_root: str, plot_dir: str) -> None:
    """Remove what writers killed mid-write left (`.tmp-*`) of a run's networks and plots (named
    after `model_path`'s stem) and checkpoints; not those a live process is writing."""
    root = Path(checkpoint_root)
    ours = f"{TEMPORARY_PREFIX}*{Path(model_path).stem}*"
    everything = f"{TEMPORARY_PREFIX}*"  # only runs of this name write under `root`
    searches = [(Path(model_path).parent, ours), (Path(plot_dir), ours),
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
        pass
    return True


def write_checkpoint(root: str | Path, step: int, write_files: Callable[[Path], None],
                     keep: int = 2, size: int = 0) -> Path:
    """Write checkpoint `step` under `root` atomically (`write_files` fills a fresh temporary
    directory, renamed into place once on disk) and keep only the newest `keep`. One of the same
    step is kept as it is: nothing changes without a step. WriteError if the disk has less than
    `size` bytes free or a write fails, nothing of the new checkpoint left, the others intact."""
    root = Path(root)
    final = root / f"{PREFIX}{step:010d}"
    temporary = temporary_path(final)
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
            fsync_file(path)
        os.replace(temporary, final)
    except OSError as error:
        shutil.rmtree(temporary, ignore_errors=True)
        raise WriteError(final, error, "nothing of it was kept, and the checkpoints before it "
                         "are intact (--resume continues from the newest)") from error
    fsync_directory(root)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints right under `root`, oldest first (empty if there is none)."""
    return sorted(path for path in Path(root).glob(PREFIX + "*") if path.is_dir())


def newest_checkpoints(root: str | Path) -> list[Path]:
    """The newest checkpoint of each run under the checkpoint root `root`, newest first."""
    root = Path(root)
    newest = [checkpoints[-1] for run in sorted(root.glob(RUN_PREFIX + "*"))
              if (checkpoints := list_checkpoints(run))]
    return sorted(newest, key=lambda path: path.stat().st_mtime_ns, reverse=True)
