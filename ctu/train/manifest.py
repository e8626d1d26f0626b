"""What ctu reads back of what it wrote (checkpoints, exports): a manifest of each file's size and sha256, written
last, checked before the folder is trusted; and tensors loaded by a reader that cannot run code.

``manifest.json`` lists every file of the folder but itself (paths relative to the folder). A folder whose files
differ from its manifest (cut, zeroed, dropped, replaced) is damaged: :func:`manifest_problem` says which file and
how, in one line.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctu.config.atomic import space_hint

MANIFEST = "manifest.json"
# what torch's, safetensors' and tokenizers' writers say when a write fails (they name no file)
_WRITE_FAILED = re.compile(r"inline_container|iostream|enforce fail|No space|[Ww]rite|I/O error|quota", re.S)
_CHUNK = 1 << 20


class DamagedError(ValueError):
    """A checkpoint or export that is not what was written; the message names the folder and the file."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p != folder / MANIFEST)


def write_manifest(folder: str | Path) -> Path:
    """``folder/manifest.json``: each file's size and sha256 (call it last, once every other file is written)."""
    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": sha256(p)} for p in _files(folder)}
    out = folder / MANIFEST
    with open(out, "w") as handle:
        json.dump({"files": files}, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    return out


def read_manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """The manifest's {relative path: {"size", "sha256"}}; :class:`DamagedError` naming it if unreadable."""
    path = folder / MANIFEST
    try:
        files = json.loads(path.read_bytes())["files"]
        if not isinstance(files, dict) or not all(
                isinstance(k, str) and isinstance(v, dict) and type(v.get("size")) is int
                and isinstance(v.get("sha256"), str) for k, v in files.items()):
            raise TypeError
    except FileNotFoundError:
        raise DamagedError(f"{path} is missing (written last: the checkpoint was cut short or altered)") from None
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        raise DamagedError(f"{path} is not a manifest (JSON with each file's size and sha256)") from None
    return files


def manifest_problem(folder: str | Path, hashes: bool = True) -> str | None:
    """None if every file the manifest lists is there with its size (and, with ``hashes``, its sha256); else one
    line naming the file and what differs."""
    folder = Path(folder)
    try:
        files = read_manifest(folder)
    except DamagedError as exc:
        return str(exc)
    for name, want in files.items():
        path = folder / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            return f"{folder / MANIFEST} names {name!r}, outside the folder"
        try:
            size = path.stat().st_size
        except OSError:
            return f"{path} is missing"
        if size != want["size"]:
            return f"{path} is {size} bytes, the manifest says {want['size']} (cut short or altered)"
        if hashes and sha256(path) != want["sha256"]:
            return f"{path} differs from what was written (its sha256 is not the manifest's)"
    return None


def export_problem(model_path: str | Path) -> str | None:
    """For a model directory that is (part of) a ctu export (``export/merged`` or ``export/adapter``, or the export
    itself), what differs from the export's manifest; None when it is whole or not a ctu export (a hub id, a model
    directory of its own). An export written before manifests is not checked."""
    path = Path(model_path)
    if not path.is_dir():
        return None
    for folder in (path, path.parent) if path.name in ("merged", "adapter") else (path,):
        manifest = folder / MANIFEST
        if manifest.is_file() and manifest.stat().st_size < (64 << 20):
            try:
                ours = isinstance(json.loads(manifest.read_bytes()).get("files"), dict)
            except (OSError, ValueError, AttributeError, RecursionError):
                ours = False
            if ours:
                return manifest_problem(folder)
    return None


def write_folder(folder: str | Path, write: Callable[[Path], dict[str, str] | None]) -> dict[str, str]:
    """``write(tmp)`` fills a temporary folder beside ``folder``; then its manifest is written and it is renamed to
    ``folder`` (one there before is replaced): ``folder`` is complete or as it was, never cut. ``write``'s paths
    (under ``tmp``) come back under ``folder``. A failed write is one OSError naming ``folder`` and the likely cause."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    for stale in folder.parent.glob(f".tmp-{folder.name}-*"):  # left by a run killed while writing
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{folder.name}-", dir=folder.parent))
    try:
        try:
            paths = write(tmp) or {}
            write_manifest(tmp)
        except (OSError, RuntimeError) as exc:  # a full disk: torch / safetensors / tokenizers name no file
            if isinstance(exc, RuntimeError) and not _WRITE_FAILED.search(str(exc)):
                raise  # not a failed write (a name mismatch, say): its own message
            why = space_hint(folder.parent) or "the disk is full, or a quota or file-size limit was reached"
            where = f" ({Path(exc.filename).name} failed)" if isinstance(exc, OSError) and exc.filename else ""
            raise OSError(getattr(exc, "errno", None) or errno.EIO, f"{folder} not written{where}: {why}; "
                          f"any earlier one is kept ({' '.join(str(exc).split())[:200]})", str(folder)) from exc
        old = folder.with_name(f".old-{folder.name}-{tmp.name}")
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {k: str(folder / Path(v).relative_to(tmp)) if Path(v).is_relative_to(tmp) else v for k, v in paths.items()}


def load_tensors(path: str | Path) -> Any:
    """``torch.load`` of a file ctu wrote, as data only (``weights_only``: tensors, numbers, strings, lists, dicts;
    a pickle that would build anything else, and so could run code, is refused). Errors name the file."""
    import numpy as np
    import torch

    # a numpy array (the numpy RNG state of checkpoints written before it was saved as a list) is data too
    core = np._core if hasattr(np, "_core") else np.core
    reconstruct = core.multiarray._reconstruct
    allowed = [reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = " ".join(str(exc).split())[:300]
        raise DamagedError(f"{path}: refused: it holds objects other than tensors and plain data, which loading "
                           f"could run as code ({first})") from None
    except FileNotFoundError:
        raise DamagedError(f"{path} is missing") from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise DamagedError(f"{path}: cannot be read ({' '.join(str(exc).split())[:300]})") from None
