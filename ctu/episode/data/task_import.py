"""``ctu data import``'s writing: every domain's ``OUT/<domain>/tasks.json`` (and ``split_tasks.json``), or none.

Every folder and file is checked before anything is written; then every file is written (and synced) to a
staging folder inside ``OUT``; only when all are there are they moved into place. A refusal or a failed write
(a full disk) leaves ``OUT`` as it was: no domain written, nothing staged, no folder made.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ctu.config.atomic import _alive, _host
from ctu.config.runlock import describe_non_directory, not_a_folder
from ctu.episode.data.conversations import DataError
from ctu.episode.data.prompts import task_to_tau2

TASKS, SPLITS = "tasks.json", "split_tasks.json"
STAGE = ".ctu-import-"
_STAGE = re.compile(r"\.ctu-import-(?:(?P<host>[A-Za-z0-9_-]*)\.(?P<pid>[0-9]+)\.)?[A-Za-z0-9_]+$")
STALE_AFTER_S = 3600  # a staging folder whose owner cannot be checked: an import takes seconds, not an hour


def task_folder(out: Path, domain: str) -> Path:
    """``out/domain``, checked: nothing but a folder (or nothing) there, directly inside ``out``, its files free."""
    folder = out / domain
    if os.path.lexists(folder) and not folder.is_dir():
        raise DataError(f"domain {domain!r}: {folder} is {describe_non_directory(folder)}")
    if folder.resolve().parent != out.resolve():  # read_prompts accepts only plain names; this guards symlinks too
        raise DataError(f"domain {domain!r}: its folder {folder.resolve()} is not directly inside --out {out.resolve()}")
    for name in (TASKS, SPLITS):
        if (folder / name).is_dir():
            raise DataError(f"domain {domain!r}: {folder / name} is a directory")
    return folder


def task_files(entry: dict[str, Any]) -> dict[str, str | None]:
    """{file name: its text, or None for a split file to remove} of one domain's tasks and splits."""
    tasks = json.dumps([task_to_tau2(t) for t in entry["tasks"]], indent=1, ensure_ascii=False) + "\n"
    splits = json.dumps(entry["splits"], indent=1) + "\n" if entry["splits"] else None
    return {TASKS: tasks, SPLITS: splits}


def write_task_folders(out: str | Path, entries: dict[str, dict[str, Any]]) -> dict[str, Path]:
    """{domain: its tasks.json} for ``entries`` ({domain: {"tasks", "splits"}}, as ``read_prompts`` gives)."""
    out = Path(out)
    why = not_a_folder(out)
    if why is not None:
        raise DataError(f"--out: {out} {why}")
    folders = {domain: task_folder(out, domain) for domain in entries}
    texts = {domain: task_files(entry) for domain, entry in entries.items()}
    made = _make_dirs(out)
    remove_stale_stages(out)
    try:
        stage = Path(tempfile.mkdtemp(prefix=stage_prefix(os.getpid()), dir=out))
    except BaseException:
        _remove_dirs(made)
        raise
    try:
        for domain, files in texts.items():
            (stage / domain).mkdir()
            for name, text in files.items():
                if text is not None:
                    _write_synced(stage / domain / name, text)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        _remove_dirs(made)
        raise
    try:
        for domain, files in texts.items():  # all staged: move each domain's files into place
            folder = folders[domain]
            folder.mkdir(exist_ok=True)
            (folder / SPLITS).unlink(missing_ok=True)  # first: a crash next leaves tasks without splits, never stale
            for name, text in files.items():
                if text is not None:
                    os.replace(stage / domain / name, folder / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return {domain: (folder / TASKS).resolve() for domain, folder in folders.items()}


def stage_prefix(pid: int) -> str:
    """The start of the staging folder's name of the import run by ``pid`` on this host."""
    return f"{STAGE}{_host()}.{pid}."


def remove_stale_stages(out: Path) -> list[Path]:
    """Remove the staging folders in ``out`` that imports killed before their cleanup left (kill -9 during the
    renames): those named by a pid on this host that is no longer running, and any older than an hour whose owner
    cannot be checked (another host, or a name without the pid). Only folders of ctu's names are touched."""
    removed: list[Path] = []
    try:
        names = os.listdir(out)
    except OSError:
        return removed
    for name in names:
        match = _STAGE.match(name)
        path = out / name
        if match is None or path.is_symlink() or not path.is_dir():
            continue
        if match["pid"] is not None and match["host"] == _host():
            stale = int(match["pid"]) != os.getpid() and not _alive(int(match["pid"]))
        else:
            try:
                stale = time.time() - path.stat().st_mtime > STALE_AFTER_S
            except OSError:
                continue
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _make_dirs(out: Path) -> list[Path]:
    """Create ``out`` and missing folders above it; the ones made, deepest first."""
    missing = [p for p in (out, *out.parents) if not os.path.lexists(p)]
    out.mkdir(parents=True, exist_ok=True)
    return missing


def _remove_dirs(made: list[Path]) -> None:
    for path in made:
        try:
            path.rmdir()
        except OSError:
            return
