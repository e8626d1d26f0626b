"""Where a run may write: ``run.dir`` is a folder of its own, never the current directory, a folder above it, a
home directory or a folder of someone else's files.

:func:`check_run_dir` is called by ``ctu train`` and ``ctu eval`` before they write anything: a folder holding files
ctu did not write is refused, unless an earlier ctu command left its lock file (:data:`~ctu.config.runlock.LOCK_NAME`)
or a run's records there (a run from before the marker). Once the run's lock is held, :func:`mark_run_dir` writes
:data:`MARKER` in a folder that is new or empty: the folder is ctu's. ``run.overwrite`` deletes only in a folder that holds the
marker, and only the entries a run writes (:data:`RUN_ENTRIES`): :func:`overwrite_problem` says why not.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import time
from pathlib import Path

from ctu.config.runlock import LOCK_NAME, RunDirError

MARKER = ".ctu-run"
# what a ctu run writes in run.dir and run.overwrite removes (config.yaml is rewritten; wandb/ is kept)
RUN_ENTRIES = ("checkpoints", "eval", "examples", "export", "agent", "metrics.jsonl", "curves.png")
# a run from before the marker: ctu's lock file or a run's records
EARLIER_RUN = (LOCK_NAME, "checkpoints", "metrics.jsonl", "report.json")


def home_directories() -> set[Path]:
    """This user's home (``$HOME`` and the password database's) and every account's home but ``/``."""
    homes = {Path.home()}
    try:
        homes |= {Path(entry.pw_dir) for entry in pwd.getpwall() if entry.pw_dir not in ("", "/")}
    except OSError:  # no password database: $HOME alone
        pass
    return {h.resolve() for h in homes}


def place_problem(raw: str, cwd: Path | None = None, homes: set[Path] | None = None) -> str | None:
    """Why ``raw`` (``run.dir`` as given) cannot be a run directory, in one line naming it; None when it can."""
    cwd = (cwd or Path.cwd()).resolve()
    if not raw.strip():
        return ("run.dir: is empty (an unset shell variable?): ctu would write into the current directory "
                f"{cwd}; give a folder of its own, e.g. run.dir=runs/NAME")
    path = (cwd / Path(raw).expanduser()).resolve()
    if path == cwd:
        return f"run.dir: {raw} is the current directory; give a folder of its own, e.g. run.dir=runs/NAME"
    if cwd.is_relative_to(path):
        return f"run.dir: {raw} is {path}, a folder above the current directory; give a folder of its own"
    if path in (home_directories() if homes is None else homes):
        return f"run.dir: {raw} is a home directory ({path}); give a folder of its own, e.g. run.dir=runs/NAME"
    return None


def foreign_entries(run_dir: Path) -> list[str]:
    """The entries of an existing ``run_dir`` that make it someone else's folder (empty: ctu may write there)."""
    if not run_dir.is_dir() or (run_dir / MARKER).is_file():
        return []
    names = sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_NAME)
    if not names or any((run_dir / name).exists() for name in EARLIER_RUN):
        return []
    return names


def check_run_dir(raw: str) -> Path:
    """Refuse a ``run.dir`` that is not a folder of its own (:func:`place_problem`, :func:`foreign_entries`) with
    a one-line :class:`~ctu.config.runlock.RunDirError`, writing nothing. Returns its path."""
    problem = place_problem(raw)
    if problem is not None:
        raise RunDirError(problem)
    run_dir = Path(raw)
    foreign = foreign_entries(run_dir)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f", … ({len(foreign)} entries)" if len(foreign) > 5 else "")
        raise RunDirError(f"run.dir: {run_dir} holds files ctu did not write ({shown}); give a new or empty folder")
    return run_dir


def mark_run_dir(run_dir: str | Path) -> None:
    """Write :data:`MARKER` in ``run_dir`` (just created, or empty but for the lock) once its lock is held: the
    folder is ctu's. A folder holding an earlier run but no marker stays unmarked."""
    run_dir = Path(run_dir)
    if (run_dir / MARKER).is_file() or any(p.name not in (LOCK_NAME, MARKER) for p in run_dir.iterdir()):
        return
    (run_dir / MARKER).write_text(json.dumps({
        "created_by": "ctu", "host": socket.gethostname(), "pid": os.getpid(), "time": time.time(),
        "note": "a ctu run directory: run.overwrite=true deletes only these entries of it", "entries": list(RUN_ENTRIES)})
        + "\n")


def owned(run_dir: str | Path) -> bool:
    """Whether ctu created ``run_dir`` (or took it empty): it holds :data:`MARKER`."""
    return (Path(run_dir) / MARKER).is_file()


def overwrite_problem(run_dir: str | Path) -> str | None:
    """Why ``run.overwrite`` may not delete a run in ``run_dir`` (one line), or None."""
    if owned(run_dir):
        return None
    return (f"run.dir: {run_dir} was not created by ctu (no {MARKER} in it), so run.overwrite deletes nothing there; "
            "remove the old run's files yourself, continue it with trainer.resume=latest, or choose another run.dir")


def remove_run(run_dir: str | Path) -> None:
    """Delete what a run wrote in ``run_dir`` (:data:`RUN_ENTRIES`), nothing else; refused where ctu did not create
    it (:func:`overwrite_problem`)."""
    problem = overwrite_problem(run_dir)
    if problem is not None:
        raise RunDirError(problem)
    for name in RUN_ENTRIES:
        path = Path(run_dir) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.is_file() or path.is_symlink():
            path.unlink()
