"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP), committed atomically.

Layout, as :mod:`ctu.train.checkpoint`: ``ROOT/step_N/`` holds the DCP shards of the trainable weights and the
optimizer state (``get_state_dict``: fully-qualified names, so any world size — or a single unsharded process —
can load them), ``state.pt`` (scheduler, rank 0's RNG states, ``extra``) and the completion marker
``checkpoint.json``. Every rank writes into ``ROOT/.tmp-step_N``; after a barrier rank 0 writes the marker and
renames the directory into place. A run killed mid-write leaves only the ``.tmp-`` directory, which resuming
ignores (:func:`latest_sharded`) and the next save of that step replaces. Rank 0 writes ``manifest.json`` (every
file's size and sha256) last, after the marker; resuming checks it (:func:`ctu.train.checkpoint.resolve_resume`) and
reads ``state.pt`` as data only.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from ctu.train.checkpoint import COMPLETE, list_checkpoints, restore_state, rng_state
from ctu.train.manifest import MANIFEST, write_manifest

__all__ = ["latest_sharded", "load_sharded", "save_sharded"]

_OPTIONS = StateDictOptions(ignore_frozen_params=True)  # LoRA: the adapters only; full fine-tuning: all
# Loading: the frozen weights are not in the checkpoint (strict=False); every trainable one must be (dcp.load
# refuses a checkpoint that lacks a requested key).
_LOAD_OPTIONS = StateDictOptions(ignore_frozen_params=True, strict=False)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def save_sharded(root: str | Path, step: int, *, policy, optimizer, scheduler, extra: dict[str, Any],
                 keep: int = 2, files: dict[str, Any] | None = None) -> Path:
    """Write ``ROOT/step_{step}`` from every rank (a collective); returns its path on every rank. ``files``:
    more objects rank 0 saves (``torch.save``) into the checkpoint under those names (e.g. the KL reference)."""
    root = Path(root)
    final, tmp = root / f"step_{step}", root / f".tmp-step_{step}"
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed while writing this step
        tmp.mkdir()
    _barrier()
    model_state, optim_state = get_state_dict(policy.model, optimizer, options=_OPTIONS)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(tmp))
    if _rank() == 0:
        torch.save({"scheduler": scheduler.state_dict(), "rng": rng_state(), "extra": extra}, tmp / "state.pt")
        for name, value in (files or {}).items():
            torch.save(value, tmp / name)
    _barrier()  # every shard is on disk before the marker
    if _rank() == 0:
        (tmp / COMPLETE).write_text(json.dumps({"step": step, "format": "dcp", "manifest": MANIFEST,
                                                "world_size": dist.get_world_size() if _distributed() else 1}))
        write_manifest(tmp)  # last: every rank's shards and rank 0's files, checked on resume
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        others = [c for c in list_checkpoints(root) if c != final]
        for old in others[: max(0, len(others) - (keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def latest_sharded(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (partial ``.tmp-`` directories are ignored), or None."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def load_sharded(path: str | Path, *, policy, optimizer, scheduler) -> tuple[int, dict[str, Any]]:
    """Load a :func:`save_sharded` checkpoint into ``policy`` (sharded at any world size, or unsharded with
    no process group) and ``optimizer`` (built over ``policy.trainable_parameters()``); returns (step, extra)."""
    path = Path(path)
    if not (path / COMPLETE).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {COMPLETE})")
    model_state, optim_state = get_state_dict(policy.model, optimizer, options=_OPTIONS)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(policy.model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],  # type: ignore[arg-type]
                   options=_LOAD_OPTIONS)
    return restore_state(path, scheduler)  # the optimizer's state came with the shards
