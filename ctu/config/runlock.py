"""One writer per ``run.dir``: an exclusive ``flock`` on the ``run.dir`` directory itself, held for the whole command.

The lock is on the directory, which the holder keeps open: deleting or replacing ``run.dir/.ctu.lock`` frees
nothing. That file only names the holder (``pid N on HOST``) for the refusal message, and is emptied on a clean
release. The kernel drops a ``flock`` when its holder exits or crashes, so a lock left by a dead process is taken
over without any clean-up, with a note (text left in the file means its holder died). Where a directory cannot
be flocked (NFS emulates ``flock`` with ``fcntl`` locks, which need a descriptor open for writing), the lock file
itself is locked instead, as before.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

LOCK_NAME = ".ctu.lock"


class RunDirLocked(RuntimeError):
    """Another live process holds the run directory."""


class RunDirError(RuntimeError):
    """``run.dir`` (or a folder above it) is in the way: a file or a dangling symlink."""


class RunDirLock:
    """``with RunDirLock(run_dir):`` or ``acquire()`` / ``release()``; a second holder is refused at once."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._dir_fd: int | None = None  # the locked directory (None where only the lock file could be locked)
        self._fd: int | None = None  # the lock file, naming the holder
        self.took_over: str | None = None  # the holder recorded by a process that died holding the lock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunDirLock:
        if self._fd is not None:
            return self
        make_run_dir(self.run_dir)
        dir_fd = _lock_directory(self.run_dir, self._refusal)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            _close(dir_fd)
            if exc.errno != errno.ELOOP:
                raise
            raise RunDirError(f"run.dir: {self.path} is a symlink; ctu writes the lock holder there and follows "
                              "no symlink: remove it") from None
        except BaseException:
            _close(dir_fd)
            raise
        if dir_fd is None:
            _lock_file(fd, self._refusal)
        self.took_over = _read(fd) or None  # a clean release empties the file: text left means its holder died
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._dir_fd, self._fd = dir_fd, fd
        if self.took_over:
            print(f"ctu: note: run.dir: {self.run_dir} was locked by a process that died ({self.took_over}); "
                  "taken over", file=sys.stderr, flush=True)
        return self

    def _refusal(self, holder: str | None = None) -> RunDirLocked:
        if holder is None:
            holder = _holder(self.path)
        return RunDirLocked(f"run.dir: {self.run_dir} is in use by another ctu process ({holder}); wait for it to "
                            "finish or stop it, or choose another run.dir")

    def release(self) -> None:
        fd, dir_fd, self._fd, self._dir_fd = self._fd, self._dir_fd, None, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)
            _close(dir_fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:  # a holder dropped without release (a test's trainer never run): free the directory
        try:
            self.release()
        except OSError:
            pass


def make_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` and the folders above it; a one-line :class:`RunDirError` naming what is in the way."""
    why = not_a_folder(run_dir)
    if why is not None:
        raise RunDirError(f"run.dir: {run_dir} {why}; choose another run.dir")
    run_dir.mkdir(parents=True, exist_ok=True)


def not_a_folder(path: Path) -> str | None:
    """Why ``path`` is not, and cannot be made, a folder (it, or a folder above it, is a file or a dangling
    symlink), in a few words after its name; None when it is one or can be made."""
    blocker = next((p for p in (path, *path.parents) if os.path.lexists(p) and not p.is_dir()), None)
    if blocker is None:
        return None
    what = describe_non_directory(blocker)
    return f"is {what}" if blocker == path else f"cannot be created: {blocker} is {what}"


def describe_non_directory(path: Path) -> str:
    """What ``path`` (which exists, or is a symlink, and is not a directory) is, in a few words."""
    if path.is_symlink():
        target = os.readlink(path)
        if not path.exists():
            return f"a dangling symlink to {target}"
        return f"a symlink to {'a file' if path.is_file() else 'something'} ({target}), not a directory"
    return "a file, not a directory" if path.is_file() else "not a directory"


def _lock_directory(run_dir: Path, refusal: Callable[..., Exception]) -> int | None:
    """The directory's descriptor, flocked; None where this filesystem cannot flock a directory."""
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise refusal() from None
    except OSError:  # EBADF, ENOLCK, EOPNOTSUPP: fall back to locking the lock file
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_file(fd: int, refusal: Callable[..., Exception]) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd) or "pid unknown"
        os.close(fd)
        raise refusal(holder) from None
    except BaseException:
        os.close(fd)
        raise


def _holder(path: Path) -> str:
    """Who holds the lock, as its lock file says, without creating or changing that file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return f"holder unknown: its {LOCK_NAME} was removed"
    except OSError as exc:
        return f"holder unknown: {LOCK_NAME}: {exc.strerror}"
    try:
        return _read(fd) or f"holder unknown: its {LOCK_NAME} names no one"
    finally:
        os.close(fd)


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _read(fd: int) -> str:
    return os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
