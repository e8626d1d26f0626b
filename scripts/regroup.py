"""Regroup ``ctu/`` by its data flow (issue 28): move modules and tests to their new paths, rewrite references.

Idempotent: run it again at any time (after merging a branch written against the old layout) and it moves what
still sits at an old path and rewrites what still names an old module, leaving the rest as it is:

1. files: every module of ``MODULES`` (a module, or a package with everything under it), ``ctu/templates``, and
   every test of ``TESTS`` that is still at its old path moves (``git mv`` when tracked); a moved test's
   ``Path(__file__)...parents[N]`` gains the extra folder;
2. text: in the repository's .py, .md, .toml, .yaml, .yml, .cfg, .ini, .txt and .rst files, dotted names
   (``from ctu.chat import``, ``import ctu.x``, ``"ctu.rollout.foo"`` mock targets, ``pkg://ctu.integrations...``,
   ``tests.unit.test_x``) and paths (``ctu/shared_prefix.py``, ``tests/unit/test_fsdp.py::test_x``) of the old
   layout become the new ones; ``from ctu import cli`` becomes ``from ctu.app import cli``;
3. ``pyproject.toml``'s package-data glob follows the templates; ruff sorts the imports of the .py files changed.

``ctu.config`` and ``ctu.rollout`` were modules and are now packages: ``ctu.config.X`` is rewritten to
``ctu.config.schema.X`` unless ``ctu.config.X`` is a module of the new package (``ctu.config.checks``), and
``from ctu.config import names`` is left alone only when every name is such a module.

Usage: ``python scripts/regroup.py [--dry-run] [--no-ruff] [ROOT]`` (ROOT: the repository, default: this one).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# old module -> new module; a package key carries everything under it (a longer key wins)
MODULES = {
    "ctu.atomic": "ctu.config.atomic",
    "ctu.config": "ctu.config.schema",
    "ctu.config_checks": "ctu.config.checks",
    "ctu.redact": "ctu.config.redact",
    "ctu.runlock": "ctu.config.runlock",
    "ctu.env": "ctu.episode.env",
    "ctu.reward": "ctu.episode.reward",
    "ctu.judge": "ctu.episode.judge",
    "ctu.transcripts": "ctu.episode.transcripts",
    "ctu.parsing": "ctu.episode.parsing",
    "ctu.llm_api": "ctu.episode.llm_api",
    "ctu.users": "ctu.episode.users",
    "ctu.data": "ctu.episode.data",
    "ctu.data.commands": "ctu.app.data_commands",
    "ctu.models": "ctu.engines.models",
    "ctu.shared_prefix": "ctu.engines.shared_prefix",
    "ctu.chat": "ctu.rollout.chat",
    "ctu.rollout": "ctu.rollout.loop",
    "ctu.components": "ctu.rollout.components",
    "ctu.metrics": "ctu.observe.metrics",
    "ctu.stats": "ctu.observe.stats",
    "ctu.tracking": "ctu.observe.tracking",
    "ctu.report": "ctu.observe.report",
    "ctu.cli": "ctu.app.cli",
    "ctu.evaluate": "ctu.app.evaluate",
    "ctu.play": "ctu.app.play",
    "ctu.plan": "ctu.app.plan",
    "ctu.plan_terms": "ctu.app.plan_terms",
    "ctu.integrations": "ctu.app.integrations",
    "ctu.train.trainer": "ctu.app.trainer",
}
OLD_PACKAGES = {"ctu.users", "ctu.data", "ctu.integrations"}  # keys that were folders, not files
FOLDERS = {"ctu/templates": "ctu/rollout/templates"}  # data folders (no modules)

# the new packages' docstrings (written only where the package has no __init__.py yet)
PACKAGE_DOCS = {
    "ctu/config": "The run's typed configuration and its checks, and the small safe-I/O helpers every layer uses:\n"
                  "atomic files, the one-writer run lock, credentials redacted from URLs.",
    "ctu/episode": "One conversation with tools: the environment, simulated users, reward and judge, model text parsed\n"
                   "into tool calls, transcripts, and datasets of conversations.",
    "ctu/rollout": "Episodes played by a model, token-in-token-out: chat templates, the agent loop, and the running\n"
                   "parts (engine, chat format, users, judge) built from a config.",
    "ctu/observe": "What a run measures and shows: metrics, confidence intervals, the tracker, the report.",
    "ctu/app": "The commands on top of the flow: the CLI, the training loop, evaluation, play, memory plan,\n"
               "data commands, and the adapters for other trainers.",
}

# tests/unit/<package>/ mirrors ctu/<package>/; tests not named here stay where they are
TEST_GROUPS = {
    "domains": "airline base custom_domain retail tau2_key_order telecom mini dual_control",
    "config": "config config_counts redact weight_sync_default",
    "episode": "env reward judge llm_api llm_user parsing data_prompts data_sft export_atomic tool_alignment",
    "engines": "engine_hf engine_remote engine_vllm engine_vllm_sleep engine_vllm_sync kv_reuse top_p_fast parity "
               "parity_bf16 shared_prefix",
    "rollout": "chat chat_properties rollout prompt_fits interop_template",
    "rl": "rl_math filters",
    "train": "autocast checkpoint_policy kl_reward logprobs model_export precision precision_auto train_autocast "
             "train_mode update_semantics weight_version sft_exclude",
    "distributed": "fsdp fsdp_phases fsdp_rank0 merged_stream offload_device ray_setup",
    "observe": "metrics stats tracking eval_history outcome",
    "app": "cli_errors plan plan_args plan_export plan_review plan_sync presets integrations task_weights",
}
TESTS = {f"tests/unit/test_{name}.py": f"tests/unit/{group}/test_{name}.py"
         for group, names in TEST_GROUPS.items() for name in names.split()}

TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".txt", ".rst"}
SKIP_DIRS = {".git", ".venv", "venv", ".nox", "node_modules", "__pycache__", "build", "dist", "shared"}
SELF = "scripts/regroup.py"

DOTTED = re.compile(r"(?<![\w.])(?:ctu|tests)(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w.-])(?:ctu|tests)(?:/[\w.*-]+)+/?")
FROM_IMPORT = re.compile(r"^(?P<indent>[ \t]*)from[ \t]+(?P<base>ctu(?:\.\w+)*)[ \t]+import[ \t]+(?P<names>[^(\n#]+?)"
                         r"(?P<tail>[ \t]*#.*)?$", re.M)
IMPORTED = re.compile(r"\s+import\s+(\([^)]*\)|[^\n#]*)")
PARENTS = re.compile(r"(Path\(__file__\)(?:\.resolve\(\))?\.parents\[)(\d+)(\])")


# ---------------------------------------------------------------- names


def old_dotted() -> dict[str, str]:
    """Every old dotted name this script rewrites: ctu modules, and the moved tests as ``tests.unit.test_x``."""
    tests = {old[:-3].replace("/", "."): new[:-3].replace("/", ".") for old, new in TESTS.items()}
    return {**MODULES, **tests}


def new_modules(root: Path) -> set[str]:
    """Modules and packages of the new layout: the mapping's targets, their parents, and what the tree holds
    (a module still at an old path, as in a dry run, does not count)."""
    targets = set(MODULES.values()) | {new[:-3].replace("/", ".") for new in TESTS.values()}
    parents = {".".join(t.split(".")[:n]) for t in targets for n in range(1, t.count(".") + 1)}
    old = old_dotted()
    found = set()
    for base in ("ctu", "tests"):
        for p in (root / base).rglob("*.py") if (root / base).is_dir() else ():
            parts = p.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            n_old = _longest(name.split("."), old)
            if not n_old or ".".join(name.split(".")[:n_old]) in parents:
                found.add(name)
    return found | targets | parents


def _longest(parts: list[str], table) -> int:
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in table:
            return n
    return 0


def rewrite_name(name: str, old: dict[str, str], new: set[str], imported: list[str] | None = None) -> str:
    """``name`` in the new layout (unchanged when it already is, or names nothing that moved)."""
    parts = name.split(".")
    n_old, n_new = _longest(parts, old), _longest(parts, new)
    if not n_old or n_new > n_old:
        return name
    prefix = ".".join(parts[:n_old])
    if n_new == n_old and imported and all(f"{prefix}.{i}" in new for i in imported):
        return name  # `from ctu.rollout import loop`: the new package's modules
    return ".".join([old[prefix], *parts[n_old:]])


def _names(text: str) -> list[str]:
    """The names of an import list (``a, b as c`` or ``(a,\\n b)``), without their aliases."""
    text = text.strip().strip("()")
    return [item.split()[0] for item in re.split(r"[,\s]*,[,\s]*|\n", text) if item.strip() and item.split()]


def split_module_imports(text: str, old: dict[str, str], new: set[str]) -> str:
    """``from ctu import cli`` / ``from ctu.data import commands``: a moved module imported by its name gets the
    import of its new parent (one line per new parent)."""

    def fix(m: re.Match) -> str:
        base, items = m["base"], [i.strip() for i in m["names"].split(",") if i.strip()]
        lines: dict[str, list[str]] = {}
        changed = False
        for item in items:
            name, _, alias = item.partition(" as ")
            name, alias = name.strip(), alias.strip()
            full = f"{base}.{name}"
            moved = rewrite_name(full, old, new)
            if full in old and moved != full and moved.rpartition(".")[0] != rewrite_name(base, old, new):
                parent, _, leaf = moved.rpartition(".")
                alias = alias or (name if leaf != name else "")
                lines.setdefault(parent, []).append(f"{leaf} as {alias}" if alias else leaf)
                changed = True
            else:
                lines.setdefault(base, []).append(item)
        if not changed:
            return m[0]
        tail = m["tail"] or ""
        out = [f"{m['indent']}from {parent} import {', '.join(names)}" for parent, names in lines.items()]
        out[0] += tail
        return "\n".join(out)

    return FROM_IMPORT.sub(fix, text)


def rewrite_dotted(text: str, old: dict[str, str], new: set[str]) -> str:
    def fix(m: re.Match) -> str:
        follow = IMPORTED.match(text, m.end())
        imported = _names(follow[1]) if follow and text[m.start() - 5:m.start()].endswith("from ") else None
        return rewrite_name(m[0], old, new, imported)

    return DOTTED.sub(fix, text)


# ---------------------------------------------------------------- paths


def path_table() -> tuple[dict[str, str], dict[str, str]]:
    """(old file -> new file, old folder -> new folder), as repository paths."""
    files = dict(TESTS)
    folders = dict(FOLDERS)
    for old, new in MODULES.items():
        src, dst = old.replace(".", "/"), new.replace(".", "/")
        if old in OLD_PACKAGES:
            folders[src] = dst
        else:
            files[f"{src}.py"] = f"{dst}.py"
    return files, folders


def rewrite_path(path: str, files: dict[str, str], folders: dict[str, str]) -> str:
    bare = path.rstrip("/.")  # a path ending a sentence, or a folder
    trail = path[len(bare):]
    if bare in files:
        return files[bare] + trail
    parts = bare.split("/")
    for n in range(len(parts), 0, -1):
        head = "/".join(parts[:n])
        if head in files and n < len(parts):  # ctu/rollout.py/... is no path
            return path
        if head in folders:
            # a file under an old package that has its own key (ctu/data/commands.py)
            return "/".join([folders[head], *parts[n:]]) + trail
    return path


def rewrite_paths(text: str, files: dict[str, str], folders: dict[str, str]) -> str:
    return PATH.sub(lambda m: rewrite_path(m[0], files, folders), text)


# ---------------------------------------------------------------- moves


def planned_moves(root: Path) -> list[tuple[Path, Path]]:
    files, folders = path_table()
    moves = [(root / old, root / new) for old, new in files.items() if (root / old).is_file()]
    for old in folders:
        if (root / old).is_dir():
            for p in sorted((root / old).rglob("*")):
                if p.is_file() and "__pycache__" not in p.parts and p.relative_to(root).as_posix() not in files:
                    rel = p.relative_to(root).as_posix()
                    moves.append((p, root / rewrite_path(rel, {}, folders)))
    return moves


def _tracked(root: Path, path: Path) -> bool:
    if not (root / ".git").exists():
        return False
    done = subprocess.run(["git", "-C", str(root), "ls-files", "--error-unmatch", str(path.relative_to(root))],
                          capture_output=True)
    return done.returncode == 0


def move(root: Path, src: Path, dst: Path, dry_run: bool) -> None:
    rel_src, rel_dst = src.relative_to(root), dst.relative_to(root)
    if dst.exists():
        sys.exit(f"regroup: both {rel_src} and {rel_dst} exist: merge them by hand, then run again")
    print(f"move {rel_src} -> {rel_dst}")
    if dry_run:
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    if _tracked(root, src):
        subprocess.run(["git", "-C", str(root), "mv", str(rel_src), str(rel_dst)], check=True)
    else:
        os.replace(src, dst)
    if rel_src.as_posix().startswith("tests/") and dst.suffix == ".py":
        depth = len(rel_dst.parts) - len(rel_src.parts)
        text = dst.read_text()
        fixed = PARENTS.sub(lambda m: f"{m[1]}{int(m[2]) + depth}{m[3]}", text)
        if fixed != text:
            dst.write_text(fixed)


def remove_empty_folders(root: Path, dry_run: bool) -> None:
    _, folders = path_table()
    for old in folders:
        folder = root / old
        if folder.is_dir() and not dry_run:
            for cache in folder.rglob("__pycache__"):
                shutil.rmtree(cache, ignore_errors=True)
            for d in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
                if not any(d.iterdir()):
                    d.rmdir()
            if not any(folder.iterdir()):
                folder.rmdir()


def ensure_packages(root: Path, dry_run: bool) -> None:
    """An ``__init__.py`` for every new folder of modules: the package docstrings above, empty for tests."""
    wanted = {root / folder / "__init__.py": f'"""{doc}"""\n' for folder, doc in PACKAGE_DOCS.items()}
    for new in TESTS.values():
        wanted.setdefault(root / Path(new).parent / "__init__.py", "")
    for init, text in wanted.items():
        if init.parent.is_dir() and not init.exists():
            print(f"create {init.relative_to(root)}")
            if not dry_run:
                init.write_text(text)
                if (root / ".git").exists():
                    subprocess.run(["git", "-C", str(root), "add", str(init.relative_to(root))], check=True)


# ---------------------------------------------------------------- text


def text_files(root: Path) -> list[Path]:
    if (root / ".git").exists():
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                capture_output=True, check=True).stdout.decode().split("\0")
        paths = [root / p for p in listed if p]
    else:
        paths = [p for p in root.rglob("*") if not (set(p.relative_to(root).parts) & SKIP_DIRS)]
    return sorted(p for p in paths if p.is_file() and p.suffix in TEXT_SUFFIXES
                  and p.relative_to(root).as_posix() != SELF and not (set(p.relative_to(root).parts) & SKIP_DIRS))


def rewrite_text(text: str, is_python: bool, old: dict[str, str], new: set[str]) -> str:
    files, folders = path_table()
    if is_python:
        text = split_module_imports(text, old, new)
    return rewrite_paths(rewrite_dotted(text, old, new), files, folders)


def fix_package_data(root: Path, dry_run: bool) -> bool:
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return False
    text = pyproject.read_text()
    fixed = re.sub(r'(?<![\w/])"templates/\*\.jinja"', '"rollout/templates/*.jinja"', text)
    if fixed != text and not dry_run:
        pyproject.write_text(fixed)
    return fixed != text


def ruff_sort(root: Path, paths: list[Path]) -> None:
    if not paths:
        return
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        print("ruff not found: sort the imports of the changed files with `ruff check --select I --fix`")
        return
    subprocess.run([ruff, "check", "--select", "I", "--fix", "--quiet", *map(str, paths)], cwd=root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    parser.add_argument("--no-ruff", action="store_true", help="do not sort the changed files' imports")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()

    for src, dst in planned_moves(root):
        move(root, src, dst, args.dry_run)
    remove_empty_folders(root, args.dry_run)
    ensure_packages(root, args.dry_run)

    old, new = old_dotted(), new_modules(root)
    changed = []
    for path in text_files(root):
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        fixed = rewrite_text(text, path.suffix == ".py", old, new)
        if fixed != text:
            changed.append(path)
            print(f"rewrite {path.relative_to(root)}")
            if not args.dry_run:
                path.write_text(fixed)
    if fix_package_data(root, args.dry_run):
        print("rewrite pyproject.toml (package-data)")
    if not args.dry_run and not args.no_ruff:
        ruff_sort(root, [p for p in changed if p.suffix == ".py"])
    print(f"regroup: {len(changed)} files rewritten" + (" (dry run)" if args.dry_run else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
