"""Atomic checkpoints: written to a temporary directory, then renamed into place.

A checkpoint holds the trainable weights (the LoRA adapter or the full model), the optimizer,
the scheduler, every RNG state, the task sampler's cursor and the step. A run killed while
writing leaves only a ``.tmp-`` directory, which is ignored: resuming takes the newest
complete ``step_N`` directory.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctu.config.atomic import space_hint

COMPLETE = "checkpoint.json"


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
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
        _save(json.dumps({"step": step}), tmp / COMPLETE, final)
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
        if isinstance(obj, str):
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
    return torch.load(file, map_location="cpu", weights_only=True) if file.is_file() else None


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


def resolve_resume(root: str | Path, resume: str | None) -> Path | None:
    if resume is None:
        return None
    if resume == "latest":
        checkpoints = list_checkpoints(root)
        return checkpoints[-1] if checkpoints else None
    path = Path(resume)
    if not (path / COMPLETE).is_file():
        raise FileNotFoundError(f"trainer.resume: {path} is not a complete checkpoint (no {COMPLETE})")
    return path


def checkpoint_step(path: str | Path) -> int:
    """The step a complete checkpoint holds, from its marker (no weights are read)."""
    return int(json.loads((Path(path) / COMPLETE).read_text())["step"])


def checkpoint_format(path: str | Path) -> str:
    """"dcp" (``ctu.distributed.dcp``: shards from Ray trainer ranks) or "local" (this module's ``trainable.pt``)."""
    return json.loads((Path(path) / COMPLETE).read_text()).get("format", "local")


def load_checkpoint(path: str | Path, *, model, optimizer, scheduler) -> tuple[int, dict[str, Any]]:
    path = Path(path)
    weights = torch.load(path / "trainable.pt", map_location="cpu", weights_only=True)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    step = json.loads((path / COMPLETE).read_text())["step"]
    return step, state["extra"]
