"""Files written whole or not at all: a temporary file in the same folder, then ``os.replace``.

- A failure (an exception, a full disk) leaves the previous file, if any, untouched and no partial one; the error
  names the target, never the temporary.
- A replaced file keeps its permission bits; a new one gets what ``open`` gives (0666 less the umask).
- Only a regular file is replaced: a symbolic link, a directory or a device at the target is refused, untouched.
- A temporary is named ``.NAME.ctu-tmp.HOST.PID.RANDOM``. One whose writer died without cleaning up (kill -9, power
  loss) is removed by the next atomic write into that folder on the same host.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NoReturn

TEMP_TAG = ".ctu-tmp."
_TEMP = re.compile(r"\.ctu-tmp\.(?P<host>[A-Za-z0-9_-]*)\.(?P<pid>[0-9]+)\.[0-9a-f]+$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:64]


def check_target(path: str | Path) -> Path:
    """``path`` if it is a regular file or does not exist; an OSError naming it otherwise (nothing touched)."""
    target = Path(path)
    try:
        mode = target.lstat().st_mode
    except FileNotFoundError:
        return target
    if stat.S_ISLNK(mode):
        raise FileExistsError(errno.EEXIST, "is a symbolic link; ctu replaces regular files only (remove the link, "
                                            "or write to the file it points to)", str(target))
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory; ctu replaces regular files only", str(target))
    if not stat.S_ISREG(mode):
        raise FileExistsError(errno.EEXIST, "is not a regular file; ctu replaces regular files only", str(target))
    return target


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Remove the temporaries in ``folder`` left by writers on this host that are no longer running."""
    host, removed = _host(), list[Path]()
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        match = _TEMP.search(name)
        if match is None or not name.startswith(".") or match["host"] != host:
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or _alive(pid):
            continue
        path = Path(folder) / name
        with contextlib.suppress(OSError):  # gone already (another writer removed it), or not ours to remove
            path.unlink()
            removed.append(path)
    return removed


def _reraise(exc: BaseException, target: Path, tmp: Path) -> NoReturn:
    """Raise ``exc``; an OSError that names the temporary or no file is raised naming the target instead."""
    if not isinstance(exc, OSError) or exc.errno is None or not exc.strerror:
        raise exc
    if exc.filename is not None and os.fspath(exc.filename) != str(tmp):
        raise exc
    raise type(exc)(exc.errno, exc.strerror, str(target)) from exc


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """``with atomic_open(p) as f: f.write(...)``: ``p`` appears (or is replaced) only when the block succeeds."""
    target = check_target(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target.parent)
    try:
        keep = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        keep = None
    tmp = target.parent / f".{target.name[:120]}{TEMP_TAG}{_host()}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)  # the umask applies
    except OSError as exc:
        _reraise(exc, target, tmp)
    try:
        if keep is not None:
            os.fchmod(fd, keep)
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        check_target(target)  # it may have become a link or a folder while this was written
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        _reraise(exc, target, tmp)


FULL_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)  # the disk, a file-size limit (ulimit -f), a quota


def space_hint(folder: str | Path) -> str:
    """Why a write into ``folder`` may have been cut short, in words: the file-size limit (``ulimit -f``) if one is
    set, the free space if it is low; '' when neither."""
    import resource
    import shutil

    reasons = []
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if soft != resource.RLIM_INFINITY:
        reasons.append(f"this process may write files of at most {soft} bytes (ulimit -f)")
    with contextlib.suppress(OSError):
        free = shutil.disk_usage(folder).free
        if free < 2**30:
            reasons.append(f"{free / 2**20:.1f} MiB free on its disk")
    return "; ".join(reasons)


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_open(path) as handle:
        handle.write(text)
