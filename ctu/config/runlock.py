"""One writer per ``run.dir``: an exclusive ``flock`` on ``run.dir/.ctu.lock`` held for the whole command.

The kernel drops a ``flock`` when its holder exits or crashes, so a lock left by a dead process is taken over
without any clean-up; the file itself only records who holds it (``pid host``) for the refusal message.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

LOCK_NAME = ".ctu.lock"


class RunDirLocked(RuntimeError):
    """Another live process holds the run directory."""


class RunDirLock:
    """``with RunDirLock(run_dir):`` or ``acquire()`` / ``release()``; a second holder is refused at once."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None
        self.took_over: str | None = None  # the holder recorded by a process that died holding the lock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunDirLock:
        if self._fd is not None:
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd) or "unknown pid"
            os.close(fd)
            raise RunDirLocked(f"run.dir: {self.run_dir} is in use by another ctu process ({holder}); wait for it to "
                               "finish or stop it, or choose another run.dir") from None
        except BaseException:
            os.close(fd)
            raise
        self.took_over = _read(fd) or None  # a clean release empties the file: text left means its holder died
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):  # a holder dropped without release (a test's trainer never run): free the directory
        try:
            self.release()
        except OSError:
            pass


def _read(fd: int) -> str:
    return os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
