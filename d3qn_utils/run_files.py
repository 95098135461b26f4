"""The files a training run owns: its locks, its id, its checkpoints, what killed writers left.

A run holds the lock `models/<name>.lock` (`RunLock`) while it trains, and `plots/<name>.lock`
when its plots go to another directory: a second run of the same name into the same model or
plot directory is refused, naming the first. Before it takes them, each directory is checked
writable (`check_writable`); its first lines name what it replaces of earlier runs and of the
files that came with the repository (`earlier_runs`, `shipped_note`). Its id is its start time
(`run-20250101-120000`); its checkpoints, `models/<name>.checkpoints/<run id>/step-<N>`, the
last two kept, are written as `.tmp-<pid>-step-<N>` and renamed into place once on disk. A run
resumed from an older checkpoint branches off: its checkpoint of a step already on disk replaces
that one, and those of later steps (the branch it left) go once it is written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from d3qn_utils import atomic_files

PREFIX = "step-"
RUN_PREFIX = "run-"
LATEST = "latest"  # --resume without a path: the newest checkpoint of this run
ROOT = Path(__file__).resolve().parent.parent  # the repository's folder


class RunLock:
    """The lock of a run's files: `path`, locked with flock and naming its holder inside; the OS
    lets go of it when its process dies, so a killed run leaves nothing stuck. ValueError naming
    the holder and `flag`, the directory's flag, if another process holds it; `release` removes
    the file."""

    def __init__(self, path: Path, flag: str = "--model-dir") -> None:
        self.path = path
        while True:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                raise atomic_files.WriteError(path, error, "no run was started") from error
            try:
                fcntl.flock(self.descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(self.descriptor, 1000).decode(errors="replace").strip()
                os.close(self.descriptor)
                raise ValueError(
                    f"another run is writing {path.stem} to {path.parent}: "
                    f"{holder or 'a process that is starting'} (lock {path}); wait for it to end "
                    f"or stop it, or give this run another {flag}") from None
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(self.descriptor), os.stat(path)):
                    break
            os.close(self.descriptor)  # its holder removed the file as it let go: open it anew
        holder = (f"pid {os.getpid()} on {socket.gethostname()}, started "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
        try:
            os.ftruncate(self.descriptor, 0)
            os.pwrite(self.descriptor, holder.encode(), 0)
        except OSError as error:
            self.release()
            raise atomic_files.WriteError(path, error, "no run was started") from error

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self.descriptor)


class RunLocks:
    """The locks of a run's files, one in each directory they lie in (`take_lock`)."""

    def __init__(self, locks: Sequence[RunLock]) -> None:
        self.locks = list(locks)

    def release(self) -> None:
        for lock in self.locks:
            lock.release()

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
    lock: RunLocks | None = None  # held while it trains
    # SHA-256 of each network file the run saved, by file name (a resume may name another
    # --model-dir), for a resume to check that the file is still the run's; None: not recorded
    # (a checkpoint written before they were).
    networks: dict[str, str] | None = field(default_factory=dict)
    # The checkpoint steps this process wrote (`write_checkpoint` writes none of them again).
    steps_written: set[int] = field(default_factory=set)

    def wrote(self, path: str) -> None:
        """Record the digest of the network file `path` that the run has just saved."""
        if self.networks is not None:
            self.networks[os.path.basename(path)] = file_digest(path)

    def hold(self, lock: RunLocks) -> None:
        """Hold `lock`, the lock of the run's files, until the run ends (`__exit__`)."""
        self.lock = lock

    def __enter__(self) -> TrainingRun:
        return self

    def __exit__(self, *exception: object) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def file_digest(path: str | Path) -> str | None:
    """SHA-256 of the file at `path`; None if there is none."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def is_run_id(text: object) -> bool:
    """Whether `text` is a run id as `new_run` makes them: run-20250101-120000, run-...-2."""
    return isinstance(text, str) and bool(re.fullmatch(re.escape(RUN_PREFIX) + r"[0-9-]+", text))


def new_run(checkpoint_root: str | Path) -> TrainingRun:
    """A run starting now, with an id that no earlier run under `checkpoint_root` has."""
    now = time.localtime()
    first = run_id = time.strftime(RUN_PREFIX + "%Y%m%d-%H%M%S", now)
    count = 1
    while (Path(checkpoint_root) / run_id).exists():  # another run started in the same second
        count += 1
        run_id = f"{first}-{count}"
    return TrainingRun(run_id, time.strftime("%Y-%m-%d %H:%M:%S", now))


def take_lock(outputs: Sequence[str], checkpoint_root: str | None = None) -> RunLocks:
    """The locks of a run's files, `outputs`, and of its checkpoints under `checkpoint_root`:
    one in the directory of the first, its best network (--model-dir), named for it, and one in
    each other directory they lie in (--plot-dir), named for the first output there. ValueError
    naming the flag and the directory if one cannot be written, or naming a lock's holder; what
    killed writers left of the files is removed."""
    first_in_directory: dict[str, Path] = {}
    for output in map(Path, outputs):
        first_in_directory.setdefault(os.path.realpath(output.parent), output)
    flags = ["--model-dir"] + ["--plot-dir"] * (len(first_in_directory) - 1)
    for flag, output in zip(flags, first_in_directory.values(), strict=True):
        check_writable(flag, output.parent)
    locks = RunLocks([])
    with locks.released_on_error():
        for flag, output in zip(flags, first_in_directory.values(), strict=True):
            locks.locks.append(RunLock(output.with_suffix(".lock"), flag))
        remove_leftovers(outputs, checkpoint_root)
    return locks


def check_writable(flag: str, path: str | Path, directory: bool = True) -> None:
    """ValueError naming `flag` and `path` unless this process can write files in the directory
    `path` (or, `directory` False, write the file `path`), made if need be: the nearest folder
    of it that exists takes a new file. Nothing is left there."""
    path = Path(path)
    if not directory and path.is_dir():
        raise ValueError(f"{flag} {path} is a directory; give a file name")
    folder = path if directory else path.parent
    existing = next(parent for parent in (folder.absolute(), *folder.absolute().parents)
                    if parent.exists())
    if not existing.is_dir():
        raise ValueError(f"{flag} {path} cannot be written: {existing} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise ValueError(f"{flag} {path} cannot be written: {atomic_files.reason(error)}"
                         ) from None


def git_tracked(paths: Sequence[str]) -> list[str] | None:
    """Those of the files `paths` that git tracks (committed, so `git checkout` brings them
    back), or None if git cannot tell (not installed, or not in a repository)."""
    tracked = []
    by_directory: dict[str, list[str]] = {}
    for path in paths:
        by_directory.setdefault(os.path.dirname(path) or ".", []).append(path)
    for directory, files in by_directory.items():
        try:
            listed = subprocess.run(
                ["git", "-C", directory, "ls-files", "-z", "--",
                 *(os.path.basename(path) for path in files)],
                capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        if listed.returncode != 0:
            return None
        names = set(listed.stdout.split("\0"))
        tracked += [path for path in files if os.path.basename(path) in names]
    return tracked


def shipped(paths: Sequence[str]) -> tuple[list[str], bool]:
    """Those of `paths` that exist and came with the repository, and whether git said so: those
    git tracks, or, where git cannot tell, those inside this repository's folder."""
    existing = [path for path in paths if os.path.isfile(path)]
    if not existing:
        return [], True
    tracked = git_tracked(existing)
    if tracked is not None:
        return tracked, True
    return [path for path in existing if Path(path).resolve().is_relative_to(ROOT)], False


def shipped_note(found: Sequence[str], by_git: bool) -> str | None:
    """The note of a run on the files it replaces that came with the repository, `found` by
    `shipped` (`by_git`: git said so); None if there is none."""
    if not found:
        return None
    if by_git:
        them = "it" if len(found) == 1 else "them"
        return (f"replaces {' and '.join(found)} (committed in git; `git checkout "
                f"{' '.join(found)}` brings {them} back)")
    return (f"replaces {' and '.join(found)} in the repository's folder, which may have come "
            "with it (git is not here to tell; a copy elsewhere keeps it)")


def earlier_runs(model_path: str, checkpoint_root: str | None = None,
                 outputs: Sequence[str] = ()) -> list[str]:
    """What a new run finds of earlier ones: the best network it will replace, with the run's
    other `outputs` (its last network, plots) found beside it; their checkpoints, which it leaves
    alone; another run's outputs it will replace (when this directory holds no best network,
    they are another's); and those that came with the repository."""
    notes = []
    found, by_git = shipped(outputs)
    others = [path for path in outputs if os.path.isfile(path) and path not in found]
    if os.path.exists(model_path):
        saved = time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(model_path)))
        beside = f" (with {' and '.join(others)}, replaced too)" if others else ""
        notes.append(f"{model_path} holds the best network of an earlier run (saved "
                     f"{saved}){beside}; this new run replaces it at its first evaluation "
                     "(another --model-dir keeps it)")
    if checkpoint_root is not None and (earlier := newest_checkpoints(checkpoint_root)):
        runs = "1 earlier run" if len(earlier) == 1 else f"{len(earlier)} earlier runs"
        notes.append(f"{checkpoint_root} holds the checkpoints of {runs}, which this run "
                     "leaves alone (--resume continues one)")
    if others and not os.path.exists(model_path):
        saved = time.strftime("%Y-%m-%d %H:%M",
                              time.localtime(max(map(os.path.getmtime, others))))
        holds, them = (("holds a file", "it") if len(others) == 1
                       else ("hold the files", "them"))
        notes.append(f"{' and '.join(others)} {holds} of another run (saved {saved}); this new "
                     f"run replaces {them} (another --model-dir or --plot-dir keeps {them})")
    if note := shipped_note(found, by_git):
        notes.append(note)
    return notes


def remove_leftovers(outputs: Sequence[str], checkpoint_root: str | None) -> None:
    """Remove what writers killed mid-write left (`.tmp-*<name>`) of a run's `outputs` and its
    checkpoints (all under `checkpoint_root`, if it has any: only runs of this name write there);
    not those a live process is writing."""
    leftovers = [leftover for output in map(Path, outputs) for leftover in
                 output.parent.glob(f"{atomic_files.TEMPORARY_PREFIX}*{output.name}")]
    if checkpoint_root is not None:
        root = Path(checkpoint_root)
        leftovers += [*root.glob(atomic_files.TEMPORARY_PREFIX + "*"),
                      *root.glob(f"{RUN_PREFIX}*/{atomic_files.TEMPORARY_PREFIX}*")]
    for leftover in leftovers:
        if atomic_files.being_written(leftover):
            continue
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def write_checkpoint(checkpoint_root: str, run: TrainingRun, step: int,
                     write_files: Callable[[Path], None], size: int,
                     update_files: Callable[[Path], None]) -> Path:
    """Write checkpoint `step` of `run` under `checkpoint_root` atomically (`write_files` fills a
    temporary directory, renamed into place once on disk), replacing one of this step that this
    process did not write (`atomic_files.replace_directory`), then removing the run's checkpoints
    of later steps (a branch this run left) and all but its newest two. One this process wrote
    at this step holds the same state (a stop right after a checkpoint): `update_files` brings
    what may have changed since up to date in it. WriteError if the disk has under `size` bytes
    free or a write fails, nothing of it left."""
    root = Path(checkpoint_root) / run.run_id
    final = root / f"{PREFIX}{step:010d}"
    temporary = atomic_files.temporary_path(final)
    if step in run.steps_written and final.exists():
        update_files(final)
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(root).free
        if size > free:
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (it needs about "
                          f"{size / 2**20:.1f} MB, {free / 2**20:.1f} MB are free)")
        temporary.mkdir()
        write_files(temporary)
        for path in temporary.iterdir():
            atomic_files.fsync_file(path)
        atomic_files.replace_directory(temporary, final)
    except OSError as error:
        shutil.rmtree(temporary, ignore_errors=True)
        outcome = ("nothing of it was kept, and the checkpoints before it are intact (--resume "
                   "continues from the newest)")
        raise atomic_files.WriteError(final, error, outcome) from error
    atomic_files.fsync_directory(root)
    run.steps_written.add(step)
    kept = [path for path in list_checkpoints(root) if path.name <= final.name]
    for old in [*kept[:-2], *later_checkpoints(final)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def later_checkpoints(checkpoint: Path) -> list[Path]:
    """The checkpoints of `checkpoint`'s run at later steps than it, oldest first."""
    return [path for path in list_checkpoints(checkpoint.parent) if path.name > checkpoint.name]


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints right under `root`, oldest first (empty if there is none)."""
    return sorted(path for path in Path(root).glob(PREFIX + "*") if path.is_dir())


def newest_checkpoints(root: str | Path) -> list[Path]:
    """The newest checkpoint of each run under the checkpoint root `root`, newest first."""
    newest = [checkpoints[-1] for run in sorted(Path(root).glob(RUN_PREFIX + "*"))
              if (checkpoints := list_checkpoints(run))]
    return sorted(newest, key=lambda path: path.stat().st_mtime_ns, reverse=True)


def checkpoints_newest_first(root: str | Path) -> list[Path]:
    """Every checkpoint of every run under the checkpoint root `root`, the newest written first."""
    every = [path for run in Path(root).glob(RUN_PREFIX + "*") for path in list_checkpoints(run)]
    return sorted(every, key=lambda path: path.stat().st_mtime_ns, reverse=True)
