"""Atomic checkpoints: written to a temporary directory, then renamed into place.

A checkpoint holds the trainable weights (the LoRA adapter or the full model), the optimizer,
the scheduler, every RNG state, the task sampler's cursor and the step. A run killed while
writing leaves only a ``.tmp-`` directory, which is ignored: resuming takes the newest
complete ``step_N`` directory.

Resuming trusts nothing it reads: every file is loaded as data only (tensors, numbers, strings: never a pickle that
could run code), a ``manifest.json`` of each file's size and sha256 (written last) must match, and the marker's step
must be that of the folder's name and within ``trainer.max_steps``. ``trainer.resume=latest`` skips a damaged newest
checkpoint, says so in one line, and takes the newest intact one.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctu.config.atomic import space_hint
from ctu.config.schema import ConfigError
from ctu.train.manifest import MANIFEST, DamagedError, load_tensors, manifest_problem, write_manifest

COMPLETE = "checkpoint.json"


def rng_state() -> dict[str, Any]:
    """Every RNG's state as plain data (numpy's keys as a list: a checkpoint holds no numpy objects)."""
    name, keys, *rest = np.random.get_state()
    return {"python": random.getstate(), "numpy": (name, [int(k) for k in keys], *rest),
            "torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(root: str | Path, step: int, *, model, optimizer, scheduler, extra: dict[str, Any],
                    keep: int = 2, reference: dict[str, torch.Tensor] | None = None) -> Path:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step_{step}-", dir=root))
    try:
        _save(trainable_state(model), tmp / "trainable.pt", final)
        if reference is not None:  # what the warm start made the KL reference
            _save(reference, tmp / "reference.pt", final)
        _save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state(),
               "extra": extra}, tmp / "state.pt", final)
        _save(json.dumps({"step": step, "manifest": MANIFEST}), tmp / COMPLETE, final)
        _save(tmp, tmp / MANIFEST, final)  # last: each file's size and sha256, checked on resume
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    others = [c for c in list_checkpoints(root) if c != final]  # the one just written is always kept
    for old in others[: max(0, len(others) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _save(obj: Any, path: Path, final: Path) -> None:
    """``torch.save`` (a str: the text); a failed write (torch says only ``[enforce fail at inline_container.cc]``)
    is one error naming the checkpoint, the file and the likely cause."""
    try:
        if isinstance(obj, Path):  # the folder whose manifest this is
            write_manifest(obj)
        elif isinstance(obj, str):
            path.write_text(obj)
        else:
            torch.save(obj, path)
    except (OSError, RuntimeError) as exc:  # torch's writer: "iostream error", "[enforce fail at ...]"
        why = space_hint(path.parent) or "the disk is full, or a quota or file-size limit (ulimit -f) was reached"
        raise OSError(getattr(exc, "errno", None) or errno.EIO, f"checkpoint not written ({path.name} failed): {why}",
                      str(final)) from exc


def load_reference(path: str | Path) -> dict[str, torch.Tensor] | None:
    """The KL reference state a checkpoint stored (after a warm start), or None."""
    file = Path(path) / "reference.pt"
    return load_tensors(file) if file.is_file() else None


def clean_stale(root: str | Path) -> list[Path]:
    """Remove ``.tmp-step_*`` directories left by a run killed while writing a checkpoint."""
    root = Path(root)
    stale = sorted(root.glob(".tmp-step_*")) if root.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def previous_run(run_dir: str | Path) -> str | None:
    """What another run left in ``run_dir`` (checkpoints, metrics), described in a few words, or None."""
    run_dir = Path(run_dir)
    found = [p.name for p in list_checkpoints(run_dir / "checkpoints")]
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append("metrics.jsonl")
    return ", ".join(found) if found else None


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.glob("step_*"):
        if (path / COMPLETE).is_file():
            try:
                found.append((int(path.name.split("_", 1)[1]), path))
            except ValueError:
                continue
    return [p for _, p in sorted(found)]


def resolve_resume(root: str | Path, resume: str | None, max_steps: int | None = None) -> Path | None:
    """The checkpoint ``trainer.resume`` names, checked (:func:`checkpoint_problem`): "latest" is the newest intact
    one under ``root`` (damaged newer ones skipped, said in one line on stderr), a path must be intact. With
    ``max_steps``, a checkpoint past it is refused. None: nothing to resume."""
    if resume is None:
        return None
    if resume == "latest":
        chosen, damaged = None, []
        for path in reversed(list_checkpoints(root)):
            problem = _checked(path)
            if problem is None:
                chosen = path
                break
            damaged.append((path, problem))
        if damaged and chosen is None:
            raise DamagedError(f"trainer.resume=latest: no intact checkpoint in {root}: {damaged[0][1]}"
                               + (f" (and {len(damaged) - 1} older one(s) damaged)" if len(damaged) > 1 else ""))
        if damaged and chosen is not None:
            names = ", ".join(p.name for p, _ in damaged)
            _warn_once(f"ctu: warning: checkpoint {names} damaged, skipped ({damaged[0][1]}); resuming from "
                       f"{chosen.name}, the newest intact one")
    else:
        chosen = Path(resume)
        if not (chosen / COMPLETE).is_file():
            raise FileNotFoundError(f"trainer.resume: {chosen} is not a complete checkpoint (no {COMPLETE})")
        if problem := _checked(chosen):
            raise DamagedError(f"trainer.resume: checkpoint {chosen} is damaged: {problem}")
    if chosen is not None and max_steps is not None and checkpoint_step(chosen) > max_steps:
        raise ConfigError(f"trainer.resume: checkpoint {chosen} is at step {checkpoint_step(chosen)}, past "
                          f"trainer.max_steps={max_steps} (raise trainer.max_steps to at least that to go on from it)")
    return chosen


def checkpoint_problem(path: str | Path) -> str | None:
    """None if ``path`` is an intact checkpoint: its marker names a positive step, that of its folder's name
    (``step_N``), and every file is as its manifest says (one written before manifests: the marker only); else one
    line naming the file and what is wrong."""
    path = Path(path)
    try:
        info = _marker(path)
    except DamagedError as exc:
        return str(exc)
    named = re.fullmatch(r"step_(\d+)", path.name)
    if named and int(named[1]) != info["step"]:
        return f"{path / COMPLETE} says step {info['step']}, its folder is {path.name}"
    if "manifest" in info or (path / MANIFEST).exists():
        return manifest_problem(path)
    return None


_CHECKED: dict[tuple[str, int, int], str | None] = {}  # a checkpoint is hashed once per process (prepare, then load)
_WARNED: set[str] = set()


def _checked(path: Path) -> str | None:
    try:
        stat = (path / MANIFEST).stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    except OSError:
        return checkpoint_problem(path)
    if key not in _CHECKED:
        _CHECKED[key] = checkpoint_problem(path)
    return _CHECKED[key]


def _warn_once(line: str) -> None:
    if line not in _WARNED:
        _WARNED.add(line)
        print(line, file=sys.stderr, flush=True)


def _marker(path: Path) -> dict[str, Any]:
    """The checkpoint's ``checkpoint.json``: an object with a positive integer ``step``; errors name the file."""
    marker = path / COMPLETE
    try:
        info = json.loads(marker.read_bytes())
    except FileNotFoundError:
        raise DamagedError(f"{marker} is missing (not a complete checkpoint)") from None
    except (OSError, ValueError, RecursionError):
        raise DamagedError(f"{marker} is not JSON (cut short or altered)") from None
    if not isinstance(info, dict) or type(info.get("step")) is not int or info["step"] < 1:
        raise DamagedError(f"{marker} names no step (a positive integer 'step')")
    if info.get("format", "local") not in ("local", "dcp"):
        raise DamagedError(f"{marker}: unknown format {str(info['format'])[:50]!r}")
    return info


def checkpoint_step(path: str | Path) -> int:
    """The step a complete checkpoint holds, from its marker (no weights are read)."""
    return int(_marker(Path(path))["step"])


def checkpoint_format(path: str | Path) -> str:
    """"dcp" (``ctu.distributed.dcp``: shards from Ray trainer ranks) or "local" (this module's ``trainable.pt``)."""
    return str(_marker(Path(path)).get("format", "local"))


def load_checkpoint(path: str | Path, *, model, optimizer, scheduler) -> tuple[int, dict[str, Any]]:
    path = Path(path)
    weights = load_tensors(path / "trainable.pt")
    params = dict(model.named_parameters())
    trainable = {n for n, p in params.items() if p.requires_grad}
    if not isinstance(weights, dict) or set(weights) != trainable:
        missing, unknown = sorted(trainable - set(weights or ())), sorted(set(weights or ()) - trainable)
        raise DamagedError(f"{path / 'trainable.pt'} does not hold this model's trainable tensors "
                           f"(missing {missing[:3]}, unknown {unknown[:3]})")
    with torch.no_grad():
        for name, tensor in weights.items():
            if not isinstance(tensor, torch.Tensor) or tensor.shape != params[name].shape:
                raise DamagedError(f"{path / 'trainable.pt'}: {name} is not a tensor of shape "
                                   f"{tuple(params[name].shape)}")
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))
    return restore_state(path, scheduler, optimizer)


def restore_state(path: Path, scheduler, optimizer=None) -> tuple[int, dict]:
    """``path/state.pt`` read as data (the optimizer's state where ``optimizer`` is given, the scheduler's, the RNGs)
    into them; (step, extra). A file that is not such a state is a :class:`DamagedError` naming it."""
    state = load_tensors(path / "state.pt")  # data only: a pickle that would run code is refused
    try:
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        extra = state["extra"]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise DamagedError(f"{path / 'state.pt'} is not a checkpoint's state ({type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:200]})") from None
    return checkpoint_step(path), extra
