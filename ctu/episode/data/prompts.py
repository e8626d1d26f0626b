"""Tasks as a parquet prompt dataset (the layout verl and SkyRL read), and back into tau2 tasks.

One row per task:

- ``data_source``: ``ctu/<domain>``; ``prompt``: the chat messages the agent starts from (system prompt, the
  agent's greeting, the scripted user's first message), as a list of ``{"role", "content"}``;
- ``env_class``: ``ctu_<domain>`` (SkyRL picks its environment by this name); ``ability``: ``tool_use`` (verl);
- ``reward_spec`` (SkyRL) and ``reward_model`` (verl): ``{"method"|"style": "rule", "ground_truth": TASK}`` where
  ``TASK`` is the task as one tau2 ``tasks.json`` entry, as a JSON string (arguments differ from task to task,
  which a parquet struct column cannot hold without adding null fields);
- ``extra_info``: ``{"domain", "task_id", "index", "split"}``.

Written with pyarrow (``pip install 'ctu[data]'``).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctu.config.atomic import atomic_open, atomic_write_text, check_target
from ctu.domains.base import Domain, Task
from ctu.domains.tau2_data import split_problem, task_id_problem
from ctu.episode.data.conversations import DataError
from ctu.episode.data.jsonfile import load
from ctu.episode.env import Episode
from ctu.episode.users.scripted import ScriptedUser

DOMAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
COLUMNS = ("data_source", "prompt", "env_class", "ability", "reward_spec", "reward_model", "extra_info")


def pyarrow_parquet():
    """``pyarrow.parquet``, or a one-line error naming the extra that installs it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError("parquet needs pyarrow: pip install 'ctu[data]'") from None
    return pq


def task_to_tau2(task: Task) -> dict[str, Any]:
    """The task as a tau2 ``tasks.json`` entry; ``Task.from_tau2`` reads it back to an equal task."""
    raw: dict[str, Any] = {"id": task.id, "description": task.description, "user_scenario": task.user_scenario}
    if task.initial_state:  # telecom: the phone's broken state the episode starts from
        raw["initial_state"] = task.initial_state
    if task.user_tools is not None:  # banking_knowledge: the user tools the user is given
        raw["user_tools"] = list(task.user_tools)
    if not task.has_criteria:
        raw["evaluation_criteria"] = None
        return raw
    actions = [{"action_id": a.action_id, "requestor": a.requestor, "name": a.name, "arguments": a.arguments,
                "compare_args": None if a.compare_args is None else list(a.compare_args)} for a in task.actions]
    assertions = [{"env_type": e.env_type, "func_name": e.func_name, "arguments": e.arguments,
                   "assert_value": e.assert_value, "message": e.message} for e in task.env_assertions]
    unchecked = not task.checks_db and not actions and not assertions  # tau2's None: the DB is not compared
    raw["evaluation_criteria"] = {
        "actions": None if unchecked else actions,
        "env_assertions": None if unchecked else assertions,
        "communicate_info": list(task.communicate_info), "nl_assertions": list(task.nl_assertions),
        "reward_basis": list(task.reward_basis)}
    return raw


def opening_messages(domain: Domain, task: Task) -> list[dict[str, str]]:
    """What the agent sees before its first turn, with the scripted user."""
    episode = Episode(domain, task, ScriptedUser().start(domain, task))
    return [{"role": m["role"], "content": m.get("content") or ""} for m in asyncio.run(episode.reset())]


def task_rows(domain: Domain, tasks: Sequence[Task]) -> list[dict[str, Any]]:
    split_of = {tid: name for name, ids in domain.splits.items() if name not in ("base", "all") for tid in ids}
    rows = []
    for index, task in enumerate(tasks):
        truth = json.dumps(task_to_tau2(task), ensure_ascii=False)
        rows.append({"data_source": f"ctu/{domain.name}", "prompt": opening_messages(domain, task),
                     "env_class": f"ctu_{domain.name}", "ability": "tool_use",
                     "reward_spec": {"method": "rule", "ground_truth": truth},
                     "reward_model": {"style": "rule", "ground_truth": truth},
                     "extra_info": {"domain": domain.name, "task_id": task.id, "index": index,
                                    "split": split_of.get(task.id, "")}})
    return rows


def write_prompts(path: str | Path, rows: Sequence[dict[str, Any]], allow_empty: bool = False) -> dict[str, Any]:
    pq = pyarrow_parquet()
    import pyarrow as pa

    out = check_target(path)
    if not rows and not allow_empty:
        raise DataError(f"{out}: no tasks to write; the file is left as it was")
    table = pa.Table.from_pylist(list(rows))
    with atomic_open(out, "wb") as handle:  # the previous file stays whole until this one is
        pq.write_table(table, handle)
    return {"path": str(out), "records": len(rows), "format": "parquet"}


def _ground_truth(row: dict[str, Any]) -> Any:
    for column, key in (("reward_spec", "ground_truth"), ("reward_model", "ground_truth")):
        spec = row.get(column)
        if isinstance(spec, dict) and spec.get(key) is not None:
            return spec[key]
    raise DataError("no reward_spec.ground_truth (SkyRL) or reward_model.ground_truth (verl)")


def row_task(row: dict[str, Any]) -> tuple[str, Task, str]:
    """(domain, task, split) of one prompt row whose ground truth is a tau2 task (a JSON string or an object)."""
    truth = _ground_truth(row)
    try:
        if isinstance(truth, str):
            try:
                truth = json.loads(truth)
            except json.JSONDecodeError as exc:
                raise DataError(f"ground_truth is not JSON ({exc.msg}); expected a tau2 task") from None
        if not isinstance(truth, dict) or "id" not in truth:
            raise DataError("ground_truth is not a tau2 task (an object with an 'id')")
        try:
            task = Task.from_tau2(truth)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DataError(f"ground_truth is not a tau2 task: {' '.join(repr(exc).split())[:300]}") from None
    except RecursionError:
        raise DataError("ground_truth is nested too deeply to be a tau2 task") from None
    extra: Any = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    source = row.get("data_source")
    domain = extra.get("domain")
    if domain is None or domain == "":
        if source is not None and not isinstance(source, str):
            raise DataError(f"data_source is {type(source).__name__}, not a string naming the task's domain")
        domain = (source or "").removeprefix("ctu/")
    if not isinstance(domain, str):
        raise DataError(f"extra_info.domain is {type(domain).__name__} ({str(domain)[:50]}), not a domain name")
    if not domain:
        raise DataError("no extra_info.domain or data_source to name the task's domain")
    if not DOMAIN_NAME.fullmatch(domain):  # it names a folder under --out: no paths, no '..'
        raise DataError(f"domain {domain[:100]!r} (extra_info.domain or data_source) is not a domain name: "
                        "letters, digits, '_', '-' and '.' only, not starting with '.'")
    split = extra.get("split")
    if split is not None and not isinstance(split, str):
        raise DataError(f"extra_info.split is {type(split).__name__} ({str(split)[:50]}), not a split name")
    return domain, task, split or ""


def read_prompts(path: str | Path) -> dict[str, dict[str, Any]]:
    """{domain: {"tasks": [Task], "splits": {split: [ids]}}} of a parquet prompt dataset of tau2 tasks.
    Errors name the file and the row (0-based, as pandas and pyarrow count)."""
    p = Path(path)
    out: dict[str, dict[str, Any]] = {}
    seen: set[tuple[str, str]] = set()
    for n, row in _rows(p):
        try:
            domain, task, split = row_task(row)
        except DataError as exc:
            raise DataError(f"{p}: row {n}: {exc}") from None
        entry = out.setdefault(domain, {"tasks": [], "splits": {}})
        if (domain, task.id) in seen:
            raise DataError(f"{p}: row {n}: task '{task.id}' of domain '{domain}' appears twice")
        seen.add((domain, task.id))
        entry["tasks"].append(task)
        if split:
            entry["splits"].setdefault(split, []).append(task.id)
    if not out:
        raise DataError(f"{p}: no rows")
    return out


BATCH_ROWS = 16  # rows decoded at a time
BATCH_BYTES = 256 << 20  # what those rows may take decoded: a small file can decode to much more (dictionaries)


def _rows(p: Path):
    """(row number, row) of a parquet file, read a few rows at a time (only the columns a task is read from), each
    batch's decoded size checked before it becomes Python objects. Errors name the file and the row."""
    pq = pyarrow_parquet()
    if not p.is_file():
        raise DataError(f"{p}: no such parquet file")
    try:
        handle = pq.ParquetFile(p)
        names = set(handle.schema_arrow.names)
    except Exception as exc:  # pyarrow raises its own ArrowInvalid / OSError kinds
        raise DataError(f"{p}: not a parquet file ({' '.join(str(exc).split())[:300]})") from None
    if not names & {"reward_spec", "reward_model"}:
        raise DataError(f"{p}: no reward_spec or reward_model column: not a prompt dataset of tau2 tasks")
    columns = [c for c in ("data_source", "reward_spec", "reward_model", "extra_info") if c in names]
    n = 0
    batches = handle.iter_batches(batch_size=BATCH_ROWS, columns=columns)
    while True:
        try:
            batch = next(batches, None)
        except Exception as exc:
            raise DataError(f"{p}: row {n}: cannot be read ({' '.join(str(exc).split())[:300]})") from None
        if batch is None:
            return
        if batch.nbytes > BATCH_BYTES:
            raise DataError(f"{p}: rows {n}-{n + batch.num_rows - 1}: {batch.nbytes >> 20} MiB decoded, more than "
                            f"{BATCH_BYTES >> 20} MiB for {BATCH_ROWS} rows: not a prompt dataset of tau2 tasks")
        for row in batch.to_pylist():
            yield n, row
            n += 1


def write_tasks(folder: str | Path, tasks: Sequence[Task], splits: dict[str, list[str]]) -> Path:
    """``folder/tasks.json`` (tau2 entries) and, with splits, ``folder/split_tasks.json``; returns tasks.json.
    Each file is replaced whole; a ``split_tasks.json`` left by an earlier import is removed when there are no
    splits (it would name tasks this file may not hold)."""
    out = Path(folder)
    split_file = out / "split_tasks.json"
    split_file.unlink(missing_ok=True)  # first: a crash in between leaves tasks without splits, never stale ones
    atomic_write_text(out / "tasks.json",
                      json.dumps([task_to_tau2(t) for t in tasks], indent=1, ensure_ascii=False) + "\n")
    if splits:
        atomic_write_text(split_file, json.dumps(splits, indent=1) + "\n")
    return out / "tasks.json"


def load_tasks(path: str | Path) -> tuple[tuple[Task, ...], dict[str, tuple[str, ...]] | None]:
    """(tasks, splits or None) from a tau2 ``tasks.json`` and the ``split_tasks.json`` beside it, if any."""
    p = Path(path)
    try:
        raw = load(p)
    except FileNotFoundError:
        raise DataError(f"{p}: no such tasks file") from None
    if not isinstance(raw, list):
        raise DataError(f"{p}: expected a JSON list of tau2 tasks")
    tasks = []
    for i, entry in enumerate(raw):
        try:
            tasks.append(Task.from_tau2(entry))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DataError(f"{p}: task #{i} is malformed: {exc!r}") from None
    problem = task_id_problem(p, [t.id for t in tasks])
    if problem:
        raise DataError(problem)
    split_file = p.with_name("split_tasks.json")
    return tuple(tasks), (read_splits(split_file) if split_file.is_file() else None)


def read_splits(path: Path) -> dict[str, tuple[str, ...]]:
    """``split_tasks.json``: {split name: [task id, ...]}; errors name the file."""
    raw = load(path)
    if not isinstance(raw, dict):
        raise DataError(f"{path}: expected a JSON object of split names to lists of task ids, got "
                        f"{type(raw).__name__}")
    for name, ids in raw.items():
        if not isinstance(ids, list) or not all(isinstance(i, (str, int)) for i in ids):
            raise DataError(f"{path}: split '{name}' is not a list of task ids")
    splits = {k: tuple(str(i) for i in v) for k, v in raw.items()}
    problem = split_problem(path, splits)
    if problem:
        raise DataError(problem)
    return splits
