"""What a resumed run finds in ``run.dir``, checked before any model loads.

Its records (``metrics.jsonl``, ``eval/history.jsonl``, one JSON object per line) are read whole: a torn last
line (no newline, not JSON: a write cut short by a full disk or a crash) is dropped with a one-line warning and
the file rewritten atomically; any other damaged line is an error naming the file and the line. A run whose
latest checkpoint reached ``trainer.max_steps`` and whose final evaluation is recorded is complete: resuming it
does nothing. A run resumed to train further keeps its earlier final evaluation as a periodic one, so the run
has one final evaluation, at its end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from ctu.config.atomic import atomic_open
from ctu.config.schema import ConfigError
from ctu.observe.records import RecordError, Unreadable, parse_record, split_records  # noqa: F401 - re-exported
from ctu.observe.tracking import read_evals
from ctu.train.checkpoint import checkpoint_step, resolve_resume
from ctu.train.manifest import manifest_problem

RECORD_FILES = ("metrics.jsonl", "eval/history.jsonl")


def repair_records(path: Path) -> list[dict[str, Any]]:
    """The records of ``path`` (none if it does not exist), its torn last line dropped with a warning and the
    file rewritten whole; a damaged line anywhere else raises :class:`RecordError`."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    records, torn = split_records(path, data)
    if torn is not None:
        print(f"ctu: warning: {path}: dropped a torn last line ({len(torn)} bytes without a newline: a write cut "
              "short); the rest is kept", file=sys.stderr, flush=True)
    if torn is not None or (data and not data.endswith(b"\n")):
        write_records(path, records)
    return records


def write_records(path: Path, records: list[dict[str, Any]]) -> None:
    with atomic_open(path, "w") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)


def prepare_resume(config) -> str | None:
    """Before a resumed run loads its model: repair or refuse its records; return the one line that says it is
    complete (nothing to do), or None to go on."""
    t = config.trainer
    if t.resume is None:
        return None
    run_dir = Path(config.run.dir)
    records = {name: repair_records(run_dir / name) for name in RECORD_FILES}
    checkpoint = resolve_resume(run_dir / "checkpoints", t.resume, t.max_steps)  # intact, within max_steps
    if checkpoint is None:
        return None
    check_shapes(config, checkpoint)
    step = checkpoint_step(checkpoint)
    evals = records["eval/history.jsonl"]
    if step >= t.max_steps and any(e.get("phase") == "final" and e["step"] == step for e in evals):
        if not t.export or exported(run_dir / "export"):
            return (f"run.dir: {run_dir} is complete: checkpoint step {step} of trainer.max_steps={t.max_steps} and "
                    "its final evaluation are recorded; nothing to do (raise trainer.max_steps to train further)")
    earlier = [e for e in evals if e.get("phase") == "final" and step >= e["step"] and e["step"] < t.max_steps]
    if earlier:  # an earlier run's end is now a step on the way: its evaluation becomes a periodic one
        for e in earlier:
            e["phase"] = "periodic"
        write_records(run_dir / "eval/history.jsonl", evals)
    return None


SHAPE_KEYS = ("lora.enabled", "lora.rank", "lora.target_modules")  # what sizes the checkpoint's tensors


def check_shapes(config, checkpoint: Path) -> None:
    """Refuse to resume ``checkpoint`` with a setting that shapes its tensors changed, naming the key and both
    values (from the ``config.yaml`` of the checkpoint's run; nothing to compare without one)."""
    saved_path = checkpoint.parent.parent / "config.yaml"
    try:
        saved = yaml.safe_load(saved_path.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return
    for key in SHAPE_KEYS:
        section, name = key.split(".")
        before = (saved.get(section) or {}).get(name) if isinstance(saved, dict) else None
        now = getattr(getattr(config, section), name)
        if before is not None and before != now:
            raise ConfigError(f"trainer.resume: {key} is {json.dumps(now)}, the checkpoint's run had "
                              f"{json.dumps(before)} ({saved_path}); its weights have that shape: resume with the "
                              "checkpoint's value, or start a new run.dir")


def exported(folder: Path) -> bool:
    """Whether a finished export is there: the merged model's config and weights, every file as the export's
    manifest says (one cut short by a full disk, or written before manifests, is exported again)."""
    merged = folder / "merged"
    if not ((merged / "config.json").is_file() and any(merged.glob("*.safetensors"))):
        return False
    problem = manifest_problem(folder)
    if problem is not None:
        print(f"ctu: warning: the export is not complete ({problem}); it is written again", file=sys.stderr,
              flush=True)
    return problem is None


def recorded_final(run_dir: Path, step: int) -> dict[str, float] | None:
    """The held-out success of the final evaluation already recorded at ``step`` (as ``Trainer.evaluate``
    returns it), or None: a run resumed at its last step is not evaluated twice."""
    for e in reversed(read_evals(run_dir)):
        if e.get("phase") == "final" and e.get("step") == step:
            return {f"eval/{scope}/success": value for scope, value in e["success"].items()}
    return None
