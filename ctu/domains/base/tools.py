"""Tools: one annotated function gives the OpenAI schema, the argument validation and the effect.

A tool is defined once, as a plain function ``fn(db, **arguments)`` with annotated
parameters; :func:`tool` derives its OpenAI function schema and its argument validation
from that signature, so the two can never disagree.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ctu.domains.base.db import DBView
from ctu.domains.base.schema import json_schema, validate


class ToolError(Exception):
    """Raised by a tool's effect for a domain-level failure ("Order not found").

    The environment turns it into the tool message ``"Error: <message>"`` as tau2 does.
    Effects may have changed records before raising; like tau2, those changes stay.
    """


@dataclass(frozen=True)
class Tool:
    """A domain tool: name, description, parameter schema, and its effect on a DBView."""

    name: str
    description: str
    parameters: dict[str, Any]
    effect: Callable[..., Any] = field(repr=False)
    mutates: bool = False

    def openai_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def check_arguments(self, arguments: Any) -> str | None:
        """None if the arguments are valid, else the reason (naming the argument)."""
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {type(arguments).__name__}"
        for name in self.parameters["required"]:
            if name not in arguments:
                return f"missing required argument '{name}'"
        for name, value in arguments.items():
            schema = self.parameters["properties"].get(name)
            if schema is None:
                return f"unexpected argument '{name}'"
            problem = validate(value, schema, name)
            if problem:
                return problem
        return None


def tool(*, mutates: bool = False, name: str | None = None) -> Callable[[Callable], Tool]:
    """Make a :class:`Tool` from ``fn(db, **params)``; its docstring is the description.

    Parameters are annotated ``Annotated[type, "description"]``; those without a
    default are required.
    """

    def wrap(fn: Callable) -> Tool:
        hints = typing.get_type_hints(fn, include_extras=True)
        properties, required = {}, []
        for pname, param in list(inspect.signature(fn).parameters.items())[1:]:
            properties[pname] = json_schema(hints[pname])
            if param.default is inspect.Parameter.empty:
                required.append(pname)
        return Tool(
            name=name or fn.__name__,
            description=inspect.cleandoc(fn.__doc__ or ""),
            parameters={"type": "object", "properties": properties, "required": required},
            effect=fn,
            mutates=mutates,
        )

    return wrap


def to_json_text(value: Any) -> str:
    """A tool result as the text the agent sees (tau2: strings as-is, else JSON)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or isinstance(value, (int, float)):
        return json.dumps(str(value))
    return json.dumps(value, default=str)


@dataclass(frozen=True)
class ToolResult:
    content: str
    error: bool


def run_tool(tool: Tool | None, db: DBView, arguments: Any, name: str = "") -> ToolResult:
    """Validate then apply a tool, as tau2's ``Environment.get_response`` would.

    Invalid arguments (missing, wrong type, not in an enum) and unknown tools give an
    error result with the DB unchanged; a :class:`ToolError` from the effect gives
    ``"Error: <message>"`` (changes made before the raise are kept, as in tau2).
    """
    if tool is None:
        return ToolResult(f"Error: Tool '{name}' not found.", True)
    problem = tool.check_arguments(arguments)
    if problem:
        return ToolResult(f"Error: {problem}", True)
    try:
        value = tool.effect(db, **arguments)
    except ToolError as exc:
        return ToolResult(f"Error: {exc}", True)
    return ToolResult(to_json_text(value), False)
