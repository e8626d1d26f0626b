"""How tau2 calls banking_knowledge's tools, kept exact: outputs, errors and the error flag.

tau2 calls a tool's Python method with the arguments as given (no schema validation): a missing or unexpected
argument is Python's own ``TypeError`` ("KnowledgeTools.log_verification() missing 1 required positional
argument: 'email'"), any exception becomes the tool message ``"Error: <exception>"`` flagged as an error, and
everything a tool *returns* (its many ``"Error: ..."`` strings included) is a normal result. ctu's tools are
plain functions ``fn(self, **arguments)`` (``self`` is the episode's :class:`~.store.Bank`); :class:`Method`
calls one the same way and words Python's argument errors with the tau2 class the method lives on, and answers
with the text of a :class:`~.checks.Refusal` a tool's check raised (what tau2's tool returns there).

Each function's docstring is tau2's tool documentation: the description and parameters of the OpenAI schema
(:func:`schema`), and for discoverable tools what ``unlock_discoverable_agent_tool`` shows (:func:`tool_info`).
"""

from __future__ import annotations

import functools
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from ctu.domains.banking_knowledge.checks import Refusal, ensure
from ctu.domains.banking_knowledge.store import Bank
from ctu.domains.base import DBView, Tool, ToolError

TAU2_TOOLS_MODULE = "tau2.domains.banking_knowledge.tools"
TAU2_ENVIRONMENT = "tau2.environment.environment.Environment"
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


@dataclass(frozen=True)
class Method:
    """A tool as tau2 defines it: the function, the class it is a method of, its kind and whether it mutates."""

    name: str
    fn: Callable[..., Any]
    owner: str  # tau2's class (KnowledgeTools, KnowledgeUserTools, KBSearchMixin, GrepMixin)
    kind: str  # tau2's ToolType: read, write, generic
    mutates: bool
    discoverable: bool
    module: str = TAU2_TOOLS_MODULE  # tau2's module (Python names it in some argument errors)

    def __call__(self, bank: Bank, arguments: Any) -> Any:
        """``fn(bank, **arguments)``, as tau2 calls the bound method (a refusal is the tool's answer)."""
        try:
            return self.fn(bank, **arguments)
        except TypeError as exc:
            raise TypeError(self.retitle(str(exc))) from None
        except Refusal as refusal:
            return refusal.text

    def retitle(self, text: str) -> str:
        """Python's argument error about ``fn`` worded about tau2's ``owner.name`` instead."""
        qualified = f"{self.fn.__module__}.{self.fn.__qualname__}() "
        if text.startswith(qualified):
            return f"{self.module}.{self.owner}.{self.name}() {text[len(qualified):]}"
        bare = f"{self.fn.__qualname__}() "
        if text.startswith(bare):
            return f"{self.owner}.{self.name}() {text[len(bare):]}"
        return text


def register(registry: dict[str, Method], owner: str, kind: str, *, mutates: bool | None = None,
             discoverable: bool = False, module: str = TAU2_TOOLS_MODULE) -> Callable[[Callable], Callable]:
    """Decorator adding ``fn`` to ``registry`` (tau2's default: only write tools mutate)."""

    def wrap(fn: Callable) -> Callable:
        registry[fn.__name__] = Method(fn.__name__, fn, owner, kind, kind == "write" if mutates is None else mutates,
                                       discoverable, module)
        return fn

    return wrap


AGENT: dict[str, Method] = {}  # the agent's tools by name: the 14 base tools, then the discoverable ones
USER: dict[str, Method] = {}  # the user's: 6 tools and 4 discoverable ones


def discoverable(kind: str, **options: Any) -> Callable[[Callable], Callable]:
    """Decorator for one of the agent's discoverable tools (tau2's ``@is_discoverable_tool`` on KnowledgeTools)."""
    return register(AGENT, "KnowledgeTools", kind, discoverable=True, **options)


def user_discoverable(name: Any) -> Method:
    """The user's discoverable tool ``name``, refused as unknown otherwise (a dict lookup, as tau2's: an unhashable
    name raises)."""
    method: Any = USER.get(name)
    ensure(method is not None and method.discoverable, f"Error: Unknown discoverable tool '{name}'.")
    return method


# -- families of tools written as data -----------------------------------------------------------
def docstring(description: str, args: tuple[str, ...] = (), returns: str | None = None) -> str:
    """A tool's docstring laid out as in tau2's source (4-space indents), from its description, its ``Args:``
    lines (``"user_id: The ID of the user"``, or ``"user_id (string): ..."`` for a discoverable tool) and the
    ``Returns:`` line."""
    doc = textwrap.indent(description, "    ")[4:] + "\n"
    if args:
        doc += "\n    Args:\n" + "".join(f"        {line}\n" for line in args)
    if returns is not None:
        doc += f"\n    Returns:\n        {returns}\n"
    return doc + "    "


def _no_parameter(run: Callable[[Bank], str]) -> Callable:
    def tool(self):
        return run(self)

    return tool


def _one_parameter(run: Callable[[Bank, Any], str]) -> Callable:
    def tool(self, value):
        return run(self, value)

    return tool


def tool_function(name: str, parameters: tuple[str, ...], run: Callable[..., str], doc: str, module: str) -> Callable:
    """The function ``name(self, *parameters) -> run(self, *values)`` (zero or one string parameter): a real one,
    with its own name, parameter names and docstring, so its schema, and Python's wording of a call with missing or
    unexpected arguments, are those of the same tool written out with ``def``."""
    template = (_no_parameter, _one_parameter)[len(parameters)](run)
    code = template.__code__.replace(co_name=name, co_qualname=name, co_varnames=("self", *parameters))
    fn = types.FunctionType(code, template.__globals__, name, None, template.__closure__)
    fn.__qualname__, fn.__module__, fn.__doc__ = name, module, doc
    fn.__annotations__ = {"self": "Bank", **dict.fromkeys(parameters, "str"), "return": "str"}
    return fn


def environment_clash(arguments: dict[str, Any]) -> str | None:
    """tau2's ``Environment.make_tool_call(tool_name, requestor=..., **arguments)`` refuses these names first."""
    if "requestor" in arguments:
        return f"{TAU2_ENVIRONMENT}.make_tool_call() got multiple values for keyword argument 'requestor'"
    for name in arguments:
        if name in ("self", "tool_name"):
            return f"Environment.make_tool_call() got multiple values for argument '{name}'"
    return None


@dataclass(frozen=True)
class Tau2Tool(Tool):
    """A tool whose arguments go to its method unchecked, as tau2 passes them (a JSON object is all ctu asks)."""

    def check_arguments(self, arguments: Any) -> str | None:
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {type(arguments).__name__}"
        return None


def as_tool(method: Method) -> Tool:
    """The ctu tool: tau2's schema, and an effect that answers like tau2's ``Environment.get_response``."""

    def effect(db: DBView, /, **arguments: Any) -> Any:
        clash = environment_clash(arguments)
        if clash is not None:
            raise ToolError(clash)
        try:
            return method(Bank(db), arguments)
        except Exception as exc:  # tau2: any exception is the error message "Error: <exception>"
            raise ToolError(str(exc)) from exc

    description, parameters = schema(method.fn)
    return Tau2Tool(method.name, description, parameters, effect, method.mutates)


# -- tau2's tool documentation ------------------------------------------------------------------
_SECTION = re.compile(r"^\s*(Args|Returns|Raises|Examples?):\s*$", re.M)


def _doc_sections(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) of a Google-style docstring, as tau2's tool schemas read it."""
    head = _SECTION.split(doc, maxsplit=1)[0].strip()
    short, _, long = head.partition("\n\n")
    description = short.replace("\n", " ").strip()
    if long.strip():
        description += "\n\n" + long.strip()
    params: dict[str, str] = {}
    args = re.search(r"^\s*Args:\s*$(.*?)(?=^\s*(?:Returns|Raises|Examples?):\s*$|\Z)", doc, re.M | re.S)
    current = None
    for line in (args.group(1) if args else "").splitlines():
        found = re.match(r"^\s{0,8}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
        if found and (current is None or len(line) - len(line.lstrip()) <= _indent(args.group(1))):  # type: ignore[union-attr]
            current = found.group(1)
            params[current] = found.group(2).strip()
        elif current is not None and line.strip():
            params[current] += "\n" + line.strip()
    return description, params


def _indent(block: str) -> int:
    lines = [line for line in block.splitlines() if line.strip()]
    return min((len(line) - len(line.lstrip()) for line in lines), default=0)


def _json_type(annotation: Any) -> dict[str, Any]:
    optional = get_origin(annotation) in (typing.Union, types.UnionType)
    if optional:
        (annotation,) = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        out: dict[str, Any] = {"type": "string", "enum": list(get_args(annotation))}
    else:
        out = {"type": _JSON_TYPES[annotation]}
    return {"anyOf": [out, {"type": "null"}]} if optional else out


def schema(fn: Callable) -> tuple[str, dict[str, Any]]:
    """(description, JSON schema of the parameters) from the function's docstring and signature."""
    description, docs = _doc_sections(inspect.getdoc(fn) or "")
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required = []
    for name, param in list(inspect.signature(fn).parameters.items())[1:]:
        prop = _json_type(hints[name])
        if name in docs:
            prop["description"] = docs[name]
        if param.default is inspect.Parameter.empty:
            required.append(name)
        else:
            prop["default"] = param.default
        properties[name] = prop
    return description or fn.__name__, {"type": "object", "properties": properties, "required": required}


@functools.cache  # a docstring never changes: parse it once (callers only read the result)
def tool_info(fn: Callable) -> dict[str, Any]:
    """tau2's parse of a discoverable tool's docstring: description (the text before ``Args:``) and parameters."""
    doc = inspect.getdoc(fn) or ""
    head, *rest = re.split(r"\n\s*Args:\s*\n", doc, maxsplit=1)
    parameters: dict[str, dict[str, Any]] = {}
    if rest:
        args_text = re.split(r"\n\s*Returns:\s*\n", rest[0], maxsplit=1)[0]
        for found in re.finditer(r"^\s*(\w+)\s*(?:\(([^)]+)\))?\s*:\s*(.+?)$", args_text, re.M):
            type_info = found.group(2) or "string"
            kind = re.sub(r",?\s*optional", "", type_info, flags=re.I).strip() or "string"
            parameters[found.group(1)] = {"type": kind, "description": found.group(3).strip(),
                                          "required": "optional" not in type_info.lower()}
    return {"name": fn.__name__, "description": head.strip(), "parameters": parameters}


def describe_for_agent(info: dict[str, Any]) -> str:
    """A discoverable tool as ``unlock_discoverable_agent_tool`` shows it."""
    lines = [f"  - {name}: {p['type']}{' (required)' if p['required'] else ' (optional)'} - {p['description']}"
             for name, p in info["parameters"].items()]
    params = "\n".join(lines) if lines else "  (no parameters)"
    return f"Tool: {info['name']}\nDescription: {info['description']}\nParameters:\n{params}"
