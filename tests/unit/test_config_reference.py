"""docs/config.md is what scripts/config_reference.py makes of ctu/config/fields.py: every config key, its type,
default, where it applies and what it does. A field added, renamed, re-typed or re-commented without regenerating
the page fails here; so does a field with no description at all."""

from __future__ import annotations

import ast
import dataclasses

from scripts import config_reference as ref


def test_docs_config_md_is_the_generated_reference():
    table = ref.rows()
    assert not ref.problems(table)
    assert ref.PAGE.read_text(encoding="utf-8") == ref.render(table), \
        "docs/config.md is stale: run python scripts/config_reference.py"


def test_every_config_key_is_in_the_reference():
    from typing import get_type_hints

    from ctu.config.fields import Config

    keys = {f"{name}.{f.name}" for name, cls in get_type_hints(Config).items() for f in dataclasses.fields(cls)}
    page = ref.PAGE.read_text(encoding="utf-8")
    assert len(keys) > 100 and [k for k in keys if f"| `{k}` |" not in page] == []


def test_the_generator_reads_comments_and_sees_an_undescribed_key():
    source = ("class A:\n    # above one\n    # above two\n    x: int = 1  # trailing\n    y: str = 'a'\n"
              "    z: float = 2.0  # hf, served: only there\n")
    found = ref._comments(source, ast.parse(source))
    assert found == {("A", "x"): "above one above two trailing", ("A", "y"): "", ("A", "z"): "hf, served: only there"}
    assert ref.PREFIX.match("remote, served: seconds").group(1) == "remote, served"
    assert ref.PREFIX.match("hf on CPU: decode").group(1) == "hf"
    assert not ref.PREFIX.match("reinforce_pp: batch baseline")
    rows = [{"key": "a.x", "comment": "", "described": ""}, {"key": "a.y", "comment": "c", "described": "d"}]
    bad = ref.problems(rows)
    assert any(p.startswith("a.x: no comment") for p in bad) and any(p.startswith("a.y: described twice") for p in bad)
