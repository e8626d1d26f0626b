"""Every ``ctu…`` name the repository's Python files import or quote resolves.

A module moved or a function renamed leaves stale references in places no test imports: benchmarks, scripts,
function-level imports in tests for other tiers (gpu, vllm_cpu), ``mock.patch("ctu.x.y")`` strings. This reads
every tracked ``.py`` file with ``ast`` and resolves each ``from ctu.x import name``, ``import ctu.x`` and dotted
``"ctu.x.y"`` string against the installed package."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP = {"tests/unit/test_references.py"}  # this file: its examples are stale on purpose
DOTTED = re.compile(r"(?<![\w./])ctu(?:\.[A-Za-z_]\w*)+")


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or an attribute reachable from the longest importable module prefix."""
    if dotted.startswith("ctu.__main__"):
        return True
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for i in range(k, len(parts)):
            if hasattr(obj, parts[i]):
                obj = getattr(obj, parts[i])
                continue
            try:
                obj = importlib.import_module(".".join(parts[: i + 1]))
            except Exception:
                return False
        return True
    return False


def references(source: str):
    """(line, dotted name) of every ctu reference in one file's source."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "ctu":
            yield from ((node.lineno, f"{node.module}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "ctu")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield from ((node.lineno, n) for n in DOTTED.findall(node.value))


def tracked_python_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [f for f in out.stdout.split() if f not in SKIP and (ROOT / f).exists()]


def test_every_ctu_reference_in_the_repository_resolves():
    stale = [f"{f}:{line}: {name}" for f in tracked_python_files()
             for line, name in references((ROOT / f).read_text()) if not resolves(name)]
    assert not stale, "references to ctu names that do not exist:\n" + "\n".join(stale)


def test_the_check_sees_a_stale_reference():
    source = 'from ctu.app.trainer import _schedule\nimport ctu.nowhere\nX = "ctu.config.schema.load_config"\n'
    found = {name: resolves(name) for _, name in references(source)}
    assert found == {"ctu.app.trainer._schedule": False, "ctu.nowhere": False,
                     "ctu.config.schema.load_config": True}
