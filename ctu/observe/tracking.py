"""Metrics tracking: exactly one record per global step, to metrics.jsonl, the console and W&B.

``finish()`` is called once, explicitly, at the end of a run or on error (``with Tracker(...)``);
never from a destructor. Secrets never reach W&B (``ctu.config.redact``): the config is redacted before upload, W&B records
the command line redacted and no git state or code, and what it captures of the console is redacted first.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ctu.config.redact import redact_data
from ctu.observe.records import Check, finite, number, read_records


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item"):
        return value.item()
    return value


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'rollout': {'reward': 1}} -> {'rollout/reward': 1}."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


class Tracker:
    """Writes ``run_dir/metrics.jsonl`` (one line per step) and mirrors it to W&B when enabled."""

    def __init__(self, run_dir: str | Path, *, config: Mapping[str, Any] | None = None, wandb_enabled: bool = False,
                 wandb_project: str = "ctu", wandb_mode: str = "offline", run_name: str = "ctu",
                 resume_step: int = 0):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self.last_step = resume_step
        self._truncate_after(resume_step)
        self._wandb = None
        self._finished = False
        self._undo_console: list = []
        if wandb_enabled:
            self._wandb = self._start_wandb(config or {}, wandb_project, wandb_mode, run_name, resume_step)

    def _truncate_after(self, step: int) -> None:
        """On resume, drop records of steps after the checkpoint (they will be redone), evaluations included."""
        for path in (self.path, eval_history_path(self.run_dir)):
            if not path.exists():
                continue
            kept = [line for line in path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= step]
            path.write_text("".join(line + "\n" for line in kept))

    def _start_wandb(self, config, project, mode, run_name, resume_step):
        import wandb

        id_file = self.run_dir / "wandb_id"
        run_id = id_file.read_text().strip() if id_file.exists() and resume_step > 0 else uuid.uuid4().hex[:8]
        id_file.write_text(run_id)
        os.environ.setdefault("WANDB_SILENT", "true")
        from ctu.config.redact_io import argv_redacted, redact_stream

        # no git state (a remote URL can hold a token, a diff a config file with a password) and no code
        settings = wandb.Settings(disable_git=True, save_code=False, disable_code=True)
        with argv_redacted():  # W&B's metadata records sys.argv
            run = wandb.init(project=project, name=run_name, id=run_id, resume="allow", mode=mode,
                             dir=str(self.run_dir), config=redact_data(dict(config)), settings=settings)
        # W&B captures the console by wrapping the streams' write: redaction goes on top of it
        self._undo_console = [redact_stream(sys.stdout), redact_stream(sys.stderr)]
        return run

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Record the metrics of one global step; steps must strictly increase."""
        if step <= self.last_step:
            raise ValueError(f"step {step} logged after step {self.last_step}: one record per step, in order")
        record = {"step": step, **redact_data(_clean(flatten(metrics)))}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if k != "step" and v is not None}, step=step)
        self.last_step = step
        return record

    def examples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> Path:
        """A few clean conversations for reading: ``run_dir/examples/step_N.jsonl``."""
        folder = self.run_dir / "examples"
        folder.mkdir(exist_ok=True)
        path = folder / f"step_{step}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(redact_data(_clean(dict(row))), ensure_ascii=False) + "\n")
        return path

    def finish(self, exit_code: int = 0) -> None:
        """End the W&B run, once."""
        if self._finished:
            return
        self._finished = True
        if self._wandb is not None:
            try:
                self._wandb.finish(exit_code=exit_code)
            finally:
                for undo in reversed(self._undo_console):
                    undo()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish(exit_code=0 if exc_type is None else 1)


def read_metrics(run_dir: str | Path, check: Check | None = None) -> list[dict[str, Any]]:
    return read_records(Path(run_dir) / "metrics.jsonl", check)


def eval_history_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "eval" / "history.jsonl"


def eval_phase(tag: str, step: int, max_steps: int) -> str:
    """Which evaluation of a run this is: before, after_warm_start, periodic or final."""
    if tag == "after_sft":
        return "after_warm_start"
    if step == 0:
        return "before"
    return "final" if step >= max_steps else "periodic"


def record_eval(run_dir: str | Path, *, tag: str, phase: str, step: int, success: Mapping[str, float],
                seconds: float, episodes: int) -> dict[str, Any]:
    """Append one evaluation to ``run_dir/eval/history.jsonl``: its phase, step, wall-clock start and end
    (``time.time()``), duration and held-out success per scope (what curves.png and the console table show)."""
    import time

    end = time.time()
    record = {"tag": tag, "phase": phase, "step": step, "started": end - seconds, "ended": end,
              "seconds": seconds, "episodes": episodes, "success": _clean(dict(success))}
    path = eval_history_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    return record


def read_evals(run_dir: str | Path) -> list[dict[str, Any]]:
    return read_records(eval_history_path(run_dir), eval_problem)


PHASES = ("before", "after_warm_start", "periodic", "final")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a folder under run.dir/eval: no paths, no '..'


def eval_problem(record: dict[str, Any]) -> str | None:
    """What an ``eval/history.jsonl`` record lacks of :func:`record_eval`'s (its readers draw and index by it)."""
    if not isinstance(record.get("tag"), str) or not TAG.fullmatch(record["tag"]):
        return "'tag' is not an evaluation's folder name"
    if record.get("phase") not in PHASES:
        return f"'phase' is not one of {', '.join(PHASES)}"
    if not finite(record.get("started")):
        return "'started' is not a finite number"
    success = record.get("success")
    if not isinstance(success, dict) or not all(v is None or number(v) for v in success.values()):
        return "'success' is not an object of numbers"
    return None
