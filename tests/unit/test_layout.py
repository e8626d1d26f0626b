"""ctu's folders read as its data flow: a few packages at the top, each saying its role, no import cycles, and
every import pointing down the flow (read from the source with ``ast``; nothing is imported).

The flow, bottom to top (a package imports only itself and the packages before it):

    domains < config < episode < engines < rollout < rl < train < distributed < observe < app

Which imports count: every ``import``/``from ... import`` of a ctu module anywhere in a module, at its top or inside
a function (a lazy import still runs, so it still makes a cycle). Only those under ``if TYPE_CHECKING:`` never run:
they are left out of the cycle check but must still point down the flow. ``LAZY_CYCLE_ALLOWLIST`` names the lazy
imports allowed to close a cycle, each with its reason (none today).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "ctu"
FLOW = ("domains", "config", "episode", "engines", "rollout", "rl", "train", "distributed", "observe", "app")
TOP_FILES = {"__init__.py", "__main__.py"}
MAX_PACKAGES = 10
# (importer, imported) -> why this function-level import may close a cycle
LAZY_CYCLE_ALLOWLIST: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    where: str  # path:line
    runs: bool  # False: under `if TYPE_CHECKING:` (never executed)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, under_type_checking: bool = False):
    """(node, runs) for every import statement in ``tree``, at any depth."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, not under_type_checking
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), True)
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), under_type_checking)
        else:
            yield from _imports(node, under_type_checking)


def edges() -> list[Edge]:
    known = modules()
    out = []
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, runs in _imports(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT.parent)}:{node.lineno}"
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                # `from P import n`: the module P.n when there is one, else P itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for target in targets:
                if target == "ctu" or target.startswith("ctu."):
                    while target not in known and "." in target:  # import ctu.a.b where b is a name
                        target = target.rpartition(".")[0]
                    out.append(Edge(name, target, where, runs))
    return sorted(set(out), key=lambda e: (e.where, e.dst))


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (ROOT / parts[1]).is_dir() else None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_top_level_holds_only_the_flows_packages():
    entries = [p for p in ROOT.iterdir() if p.name != "__pycache__"]
    stray = sorted(p.name for p in entries if p.is_file() and p.name not in TOP_FILES)
    packages = sorted(p.name for p in entries if p.is_dir())
    assert not stray, f"modules at ctu/'s top level (put each in a package of the flow): {', '.join(stray)}"
    assert len(packages) <= MAX_PACKAGES, f"{len(packages)} packages at ctu/'s top level (at most {MAX_PACKAGES})"
    assert set(packages) == set(FLOW), (f"ctu/'s packages {packages} are not the flow's {list(FLOW)}: add a new "
                                        "package to FLOW (and the README's layout) or fold it into one")


def test_every_package_says_its_role():
    missing, long = [], []
    for init in sorted(ROOT.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        rel = init.relative_to(ROOT.parent)
        if not doc:
            missing.append(str(rel))
        elif init.parent.parent == ROOT and len(doc.split("\n\n")[0].splitlines()) > 2:
            long.append(str(rel))
    assert not missing, f"packages without a docstring: {', '.join(missing)}"
    assert not long, f"top-level packages whose role takes more than two lines: {', '.join(long)}"


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    for e in edges():
        if e.runs and (e.src, e.dst) not in LAZY_CYCLE_ALLOWLIST and e.src != e.dst:
            graph.setdefault(e.src, set()).add(e.dst)
    found = cycles(graph)
    lines = []
    for component in found:
        inside = sorted(f"{e.where}: {e.src} -> {e.dst}" for e in edges()
                        if e.runs and e.src in component and e.dst in component)
        lines.append(" <-> ".join(component) + "\n    " + "\n    ".join(inside))
    assert not found, "import cycles:\n" + "\n".join(lines)


def inner_package(module: str, path: Path) -> str:
    """The package a module sits in (a package's ``__init__`` sits in itself)."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def test_no_import_cycle_among_the_modules_of_one_package():
    """Inside a package, imports point one way, annotations included: a module that names another's types under
    ``if TYPE_CHECKING:`` still depends on it, so two modules of one package never import each other in any form
    (e.g. ``ctu.config``: fields <- derived <- checks <- schema)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for e in edges():
        if e.src != e.dst and e.src in known and e.dst in known and \
                inner_package(e.src, known[e.src]) == inner_package(e.dst, known[e.dst]):
            graph.setdefault(e.src, set()).add(e.dst)
    found = cycles(graph)
    lines = [" <-> ".join(c) + "\n    " + "\n    ".join(sorted(f"{e.where}: {e.src} -> {e.dst}" for e in edges()
                                                               if e.src in c and e.dst in c)) for c in found]
    assert not found, "modules of one package that import each other:\n" + "\n".join(lines)


def test_imports_point_down_the_flow():
    bad = []
    for e in edges():
        if e.src in ("ctu", "ctu.__main__") or e.dst == "ctu":
            continue  # the root package and `python -m ctu` sit above the flow
        src, dst = package_of(e.src), package_of(e.dst)
        if src not in FLOW or dst not in FLOW:
            outside = e.src if src not in FLOW else e.dst
            bad.append(f"{e.where}: {e.src} -> {e.dst} ({outside} is in no package of the flow)")
        elif FLOW.index(dst) > FLOW.index(src):
            bad.append(f"{e.where}: {e.src} -> {e.dst} ({dst} is above {src} in the flow)")
    assert not bad, f"{len(bad)} imports point up the flow or out of it:\n" + "\n".join(bad)


# ctu/engines/: its parts, bottom to top; base (the interface) below them all, registry (which makes them) above
ENGINE_PARTS = ("base", "cpu", "checks", "hf", "vllm", "registry")


def engine_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["ctu", "engines"] else None


def engine_part_violations(found: list[Edge]) -> list[str]:
    bad = []
    for e in found:
        src, dst = engine_part(e.src), engine_part(e.dst)
        if src is None or dst is None or src == dst:
            continue
        if src not in ENGINE_PARTS or dst not in ENGINE_PARTS:
            bad.append(f"{e.where}: {e.src} -> {e.dst} (not a part of ENGINE_PARTS: add it, or move the module)")
        elif ENGINE_PARTS.index(dst) > ENGINE_PARTS.index(src):
            bad.append(f"{e.where}: {e.src} -> {e.dst} ({dst} is above {src} in ctu/engines/)")
    return bad


def test_engines_parts_import_down_their_order():
    """What may change without touching the others: cpu/ and checks/ know no engine, hf/ no vLLM engine."""
    bad = engine_part_violations(edges())
    assert not bad, f"{len(bad)} imports point up ctu/engines/'s parts:\n" + "\n".join(bad)


def test_the_engine_parts_check_sees_an_upward_import():
    up = Edge("ctu.engines.cpu.cpu_threads", "ctu.engines.hf.engine", "x.py:1", True)
    down = Edge("ctu.engines.vllm.served", "ctu.engines.hf.models", "x.py:2", True)
    assert engine_part_violations([up, down]) == ["x.py:1: ctu.engines.cpu.cpu_threads -> ctu.engines.hf.engine "
                                                  "(hf is above cpu in ctu/engines/)"]


def test_the_checks_see_cycles_and_upward_imports():
    """The checker itself: a two-module cycle and a self-import are found; acyclic chains are not."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": {"c"}}) == []
    assert module_name(ROOT / "rl" / "__init__.py") == "ctu.rl"
    assert package_of("ctu.rl.losses") == "rl"
