"""JSON schemas from Python annotations, and validation of tool arguments against them."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union, get_args, get_origin

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _describe(annotation: Any) -> tuple[Any, str]:
    """Split ``Annotated[T, "description"]`` into (T, description)."""
    if get_origin(annotation) is Annotated:
        base, *extra = get_args(annotation)
        return base, next((e for e in extra if isinstance(e, str)), "")
    return annotation, ""


def _is_optional(tp: Any) -> tuple[bool, Any]:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return True, args[0]
    return False, tp


def json_schema(tp: Any) -> dict[str, Any]:
    """The JSON schema of a Python annotation (str/int/float/bool, Literal, list, dict, TypedDict)."""
    tp, description = _describe(tp)
    optional, tp = _is_optional(tp)
    origin = get_origin(tp)
    if tp in _JSON_TYPES:
        schema: dict[str, Any] = {"type": _JSON_TYPES[tp]}
    elif origin is Literal:
        values = list(get_args(tp))
        schema = {"type": _JSON_TYPES[type(values[0])], "enum": values}
    elif origin is list:
        (item,) = get_args(tp) or (Any,)
        schema = {"type": "array", "items": json_schema(item) if item is not Any else {}}
    elif tp is dict or origin is dict:
        schema = {"type": "object"}
    elif typing.is_typeddict(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        schema = {
            "type": "object",
            "properties": {name: json_schema(h) for name, h in hints.items()},
            "required": [n for n in hints if n in tp.__required_keys__],
        }
    elif tp is Any:
        schema = {}
    else:
        raise TypeError(f"unsupported tool parameter type: {tp!r}")
    if optional:
        schema = {"anyOf": [schema, {"type": "null"}]}
    if description:
        schema["description"] = description
    return schema


def validate(value: Any, schema: Mapping[str, Any], path: str) -> str | None:
    """First problem of ``value`` against a schema made by :func:`json_schema`, or None."""
    if "anyOf" in schema:
        problems = [validate(value, s, path) for s in schema["anyOf"]]
        return None if any(p is None for p in problems) else problems[0]
    kind = schema.get("type")
    ok = {
        None: True,
        "null": value is None,
        "string": isinstance(value, str),
        # integral floats pass as integers, as pydantic's lax mode accepts them (tools convert with int())
        "integer": (isinstance(value, int) and not isinstance(value, bool))
        or (isinstance(value, float) and value.is_integer()),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }[kind]
    if not ok:
        return f"'{path}' must be of type {kind}, got {type(value).__name__}"
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(repr(v) for v in schema["enum"])
        return f"'{path}' must be one of {allowed}, got {value!r}"
    if kind == "array":
        for i, item in enumerate(value):
            problem = validate(item, schema.get("items", {}), f"{path}[{i}]")
            if problem:
                return problem
    if kind == "object" and "properties" in schema:
        for name in schema.get("required", []):
            if name not in value:
                return f"missing required argument '{path}.{name}'"
        for name, item in value.items():
            if name not in schema["properties"]:
                continue  # nested objects ignore extra keys, as tau2's pydantic models do
            problem = validate(item, schema["properties"][name], f"{path}.{name}")
            if problem:
                return problem
    return None
