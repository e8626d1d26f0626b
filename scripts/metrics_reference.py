"""The metric keys ctu can write to ``run.dir/metrics.jsonl`` (and W&B), read from the code, and those
docs/metrics.md documents; tests/unit/test_metrics_reference.py fails when the two differ.

A training step's record is the nested dict ``Trainer.train_step`` builds (``metrics = {...}``), plus
``metrics["async"]`` and ``metrics["eval"]`` set beside it, flattened with ``/`` (``ctu.observe.tracking.flatten``).
This reads that dict with ``ast``; a section whose value is a name or a call (``"train": stats``) is read where
SECTIONS says it is made. A section the trainer adds that SECTIONS does not know is an error, so a new producer cannot
slip past. Keys made at run time are written with a placeholder: ``per_domain/<domain>/reward``::

    python scripts/metrics_reference.py   # prints the keys the code logs, and the difference with docs/metrics.md
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "metrics.md"
TRAINER = "ctu/app/trainer.py"
# section of the step's record -> [(file, function, how its keys are made there)]:
# "assigned:NAME" a dict literal assigned to NAME; "returned" the dict literals it returns; "subscript:NAME" keys of
# NAME["key"] = ...; "tuple:NAME" a module-level tuple of names; "comprehension" a returned dict comprehension's key
SECTIONS: dict[str, list[tuple[str, str, str]]] = {
    "train": [("ctu/train/update.py", "", "tuple:STAT_KEYS"), ("ctu/train/update.py", "policy_update", "subscript:stats"),
              ("ctu/distributed/group.py", "LocalTrainer.update", "returned"),
              ("ctu/distributed/ray_trainer.py", "TrainerRank.update", "returned")],
    "sync": [("ctu/train/sync.py", "WeightSync.after_update", "returned")],
    "timing": [(TRAINER, "Trainer.train_step", "assigned:timing")],
    "async": [("ctu/app/async_loop.py", "AsyncRollouts.collect", "assigned:self.stats"),
              ("ctu/app/async_loop.py", "AsyncRollouts.step_metrics", "subscript:self.stats"),
              ("ctu/app/async_loop.py", "AsyncRollouts.step_metrics", "returned")],
    "eval": [(TRAINER, "Trainer.evaluate", "comprehension")],
}
# a value made by a call, one key per distinct value at run time
CALLS = {"distribution": "<stop_reason>"}
# keys the trainer takes out of a section before logging it (train_step: ``sync_s = sync.pop("seconds")``)
POPPED = {"sync": {"seconds"}}


def _tree(path: str) -> ast.Module:
    return ast.parse((ROOT / path).read_text(encoding="utf-8"))


def _function(path: str, qualname: str) -> ast.AST:
    node: ast.AST = _tree(path)
    for part in qualname.split("."):
        node = next(n for n in ast.iter_child_nodes(node)
                    if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == part)
    return node


def _text(node: ast.AST) -> str:
    """A key: a string, or an f-string with ``<name>`` for each of its fields."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else f"<{ast.unparse(v.value).split('.')[-1]}>"
                       for v in node.values)
    raise ValueError(f"not a key: {ast.unparse(node)}")


def _dict_keys(node: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """(key, value) of a dict literal, with the keys of ``**{...}`` and ``**({...} if c else {...})`` spread in it."""
    if isinstance(node, ast.IfExp):
        yield from _dict_keys(node.body)
        yield from _dict_keys(node.orelse)
    elif isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:
                yield from _dict_keys(value)
            else:
                yield _text(key), value


def _target(node: ast.AST) -> str:
    return ast.unparse(node)


def _keys_in(path: str, function: str, how: str) -> set[str]:
    kind, _, name = how.partition(":")
    if kind == "tuple":
        for node in _tree(path).body:
            if isinstance(node, ast.Assign) and _target(node.targets[0]) == name:
                return {_text(e) for e in node.value.elts}  # type: ignore[attr-defined]
        raise ValueError(f"{path}: no tuple {name}")
    fn = _function(path, function)
    keys: set[str] = set()
    for node in ast.walk(fn):
        if kind == "assigned" and isinstance(node, ast.Assign) and _target(node.targets[0]) == name:
            keys |= {k for k, _ in _dict_keys(node.value)}
        elif kind == "subscript" and isinstance(node, ast.Assign):
            for t in node.targets:
                for sub in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(sub, ast.Subscript) and _target(sub.value) == name and \
                            isinstance(sub.slice, (ast.Constant, ast.JoinedStr)):  # stats[key] in a loop: keys made above
                        keys.add(_text(sub.slice))
        elif kind == "returned" and isinstance(node, ast.Return) and node.value is not None:
            keys |= {k for k, _ in _dict_keys(node.value)}
        elif kind == "comprehension" and isinstance(node, ast.Return) and isinstance(node.value, ast.Name):
            for a in ast.walk(fn):
                if isinstance(a, ast.Assign) and _target(a.targets[0]) == node.value.id and isinstance(a.value, ast.DictComp):
                    keys.add(_text(a.value.key))
    if not keys:
        raise ValueError(f"{path}: {function}: found no keys ({how})")
    return keys


def _section(name: str, value: ast.AST | None) -> set[str]:
    """The keys under ``name`` of the step's record, ``value`` the trainer's expression for it."""
    if isinstance(value, ast.Dict):
        out = set()
        for key, sub in _dict_keys(value):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in CALLS:
                out.add(f"{key}/{CALLS[sub.func.id]}")
            else:
                out.add(key)
        return {f"{name}/{k}" for k in out}
    if isinstance(value, ast.DictComp):  # per_domain: {d.name: {...} for d in ...}
        inner = {k for k, _ in _dict_keys(value.value)}
        return {f"{name}/<domain>/{k}" for k in inner}
    if name not in SECTIONS:
        raise ValueError(f"the trainer logs a section {name!r} that scripts/metrics_reference.py SECTIONS does not "
                         "know: say where its keys are made")
    keys = set().union(*(_keys_in(*where) for where in SECTIONS[name])) - POPPED.get(name, set())
    return {f"{name}/{k}" for k in keys}


def code_keys() -> set[str]:
    """Every key a training step can write to metrics.jsonl, besides ``step``."""
    step = _function(TRAINER, "Trainer.train_step")
    record = next(n.value for n in ast.walk(step) if isinstance(n, ast.Assign) and _target(n.targets[0]) == "metrics")
    keys: set[str] = set()
    for name, value in _dict_keys(record):
        keys |= _section(name, value)
    for fn in (step, _function(TRAINER, "Trainer._run")):  # metrics["async"] = ..., metrics["eval"] = ...
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign) and isinstance(t := n.targets[0], ast.Subscript) and _target(t.value) == "metrics":
                keys |= _section(_text(t.slice), None)
            elif isinstance(n, ast.Call) and ast.unparse(n.func) == "metrics.update" and n.args and \
                    isinstance(c := n.args[0], ast.Call) and ast.unparse(c.func) == "self.evaluate":  # eval/<scope>/success
                keys |= _keys_in(*SECTIONS["eval"][0])
    return keys


KEY = re.compile(r"`([a-z_]+/[^`\s]+)`")


def documented_keys(text: str | None = None) -> set[str]:
    """The keys in the first column of docs/metrics.md's tables."""
    text = PAGE.read_text(encoding="utf-8") if text is None else text
    return {k for line in text.splitlines() if line.startswith("| `")
            for k in KEY.findall(line.split(" | ")[0])}


def main() -> int:
    code, docs = code_keys(), documented_keys()
    print("\n".join(sorted(code)))
    for what, keys in (("logged but not in docs/metrics.md", code - docs), ("in docs/metrics.md, not logged", docs - code)):
        if keys:
            print(f"{what}: {', '.join(sorted(keys))}", file=sys.stderr)
    return int(code != docs)


if __name__ == "__main__":
    raise SystemExit(main())
