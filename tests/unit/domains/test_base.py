import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ctu.domains.base import DBView, canonical, run_tool, to_json_text
from tests.support.toy_domain import fill_box, get_box, make_toy_domain, paint_box


def test_schema_is_derived_from_the_signature():
    schema = paint_box.openai_schema()
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "paint_box" and fn["description"] == "Paint a box."
    props = fn["parameters"]["properties"]
    assert props["color"] == {"type": "string", "enum": ["red", "blue"], "description": "new color"}
    assert props["note"]["anyOf"][1] == {"type": "null"}
    assert fn["parameters"]["required"] == ["box_id", "color"]
    lines = fill_box.openai_schema()["function"]["parameters"]["properties"]["lines"]
    assert lines["type"] == "array" and lines["items"]["required"] == ["sku", "qty"]


def test_invalid_arguments_give_an_error_naming_the_field_and_leave_db_unchanged():
    domain = make_toy_domain()
    cases = [
        ({}, "missing required argument 'box_id'"),
        ({"box_id": 3, "color": "red"}, "'box_id' must be of type string"),
        ({"box_id": "b1", "color": "purple"}, "'color' must be one of"),
        ({"box_id": "b1", "color": "red", "shade": 1}, "unexpected argument 'shade'"),
        ("not a dict", "arguments must be a JSON object"),
    ]
    for args, message in cases:
        view = domain.new_db()
        result = run_tool(paint_box, view, args)
        assert result.error and message in result.content, (args, result.content)
        assert view.touched() == set()
    bad_line = run_tool(fill_box, domain.new_db(), {"box_id": "b1", "lines": [{"sku": "x"}]})
    assert bad_line.error and "lines[0].qty" in bad_line.content
    # like tau2's pydantic models: nested extra keys are ignored, integral floats are integers
    ok = run_tool(fill_box, domain.new_db(), {"box_id": "b1", "lines": [{"sku": "x", "qty": 2.0, "note": "x"}]})
    assert not ok.error
    half = run_tool(fill_box, domain.new_db(), {"box_id": "b1", "lines": [{"sku": "x", "qty": 2.5}]})
    assert half.error and "lines[0].qty' must be of type integer" in half.content


def test_unknown_tool_and_domain_errors():
    view = make_toy_domain().new_db()
    assert run_tool(None, view, {}, "nope").content == "Error: Tool 'nope' not found."
    assert run_tool(get_box, view, {"box_id": "zz"}).content == "Error: Box not found"


def test_partial_mutation_before_an_error_is_kept_like_tau2():
    view = make_toy_domain().new_db()
    result = run_tool(fill_box, view, {"box_id": "b1", "lines": [{"sku": "a", "qty": 0}]})
    assert result.error
    assert view.get("boxes", "b1")["attempts"] == 1 and "contents" not in view.get("boxes", "b1")


def test_views_are_isolated_and_the_base_is_never_mutated():
    domain = make_toy_domain()
    before = canonical(domain.db)
    a, b = domain.new_db(), domain.new_db()
    run_tool(paint_box, a, {"box_id": "b1", "color": "blue", "note": "x"})
    assert a.get("boxes", "b1")["color"] == "blue"
    assert b.get("boxes", "b1")["color"] == "green"
    assert canonical(domain.db) == before
    assert a.diff(b) == [("boxes", "b1")]
    # same content reached differently is no difference
    run_tool(paint_box, b, {"box_id": "b1", "color": "red"})
    run_tool(paint_box, b, {"box_id": "b1", "color": "blue", "note": "x"})
    assert a.diff(b) == []


def test_put_delete_and_iteration():
    view = DBView({"t": {"a": {"v": 1}, "b": {"v": 2}}})
    view.put("t", "c", {"v": 3})
    view.delete("t", "a")
    assert list(view.keys("t")) == ["b", "c"]
    assert ("t", "a") not in view and ("t", "c") in view
    assert view.materialize() == {"t": {"b": {"v": 2}, "c": {"v": 3}}}


def test_tool_result_text_matches_tau2_to_json_str():
    assert to_json_text("plain") == "plain"
    assert to_json_text(True) == '"True"'
    assert to_json_text(12.5) == '"12.5"'
    assert json.loads(to_json_text({"a": [1, 2]})) == {"a": [1, 2]}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "c"]), st.dictionaries(st.text(max_size=3), json_values), min_size=1),
       st.dictionaries(st.text(max_size=3), json_values))
def test_diff_is_empty_iff_the_materialized_documents_are_equal(base_table, new_value):
    """Records are JSON objects (None means absent)."""
    base = {"t": base_table}
    left, right = DBView(base), DBView(base)
    key = next(iter(base_table))
    left.edit("t", key)  # an edit that changes nothing is no difference
    right.put("t", key, new_value)
    same = canonical(left.materialize()) == canonical(right.materialize())
    assert (left.diff(right) == []) == same


def test_tables_named_with_an_underscore_are_episode_state_outside_the_comparison():
    """banking_knowledge keeps its unlocked tools in ``_session`` (tau2 keeps them on its toolkit, unhashed)."""
    base = {"t": {"a": {"v": 1}}}
    left, right = DBView(base), DBView(base)
    left.put("_session", "state", {"unlocked": {"x": 1}})
    assert left.diff(right) == [] and right.diff(left) == []
    left.edit("t", "a")["v"] = 2
    assert left.diff(right) == [("t", "a")]
