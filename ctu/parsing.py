"""Raw model text -> tool calls and/or a message to the user. Never raises.

Formats, tried in this order: hermes ``<tool_call>{json}</tool_call>`` (one or several,
the last may be unclosed); fenced code blocks holding JSON or a python-style call
``tool(a="x", n=2)``; ReAct ``Action:`` / ``Action Input:``; OpenAI
``{"tool_calls": [...]}``, a bare ``{"name": ..., "arguments": ...}`` object, or a list
of them. Arguments may be an object or a JSON string. Truncated or malformed JSON
(unclosed braces and strings, trailing commas, single quotes, unquoted keys, Python
literals) is repaired; the result says whether repair was needed or failed.
``<think>…</think>`` blocks are dropped. A ReAct ``Action: respond`` (or ``finish`` /
``final answer``) is a message whose text is the action input.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class ParseResult:
    content: str
    tool_calls: tuple[ParsedToolCall, ...] = ()
    format: str = "none"
    recovered: bool = False
    failed: bool = False
    error: str | None = None


_THINK = re.compile(r"\s*<think>.*?</think>", re.S)
_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_FENCE = re.compile(r"```([A-Za-z_]*)[ \t]*\n?(.*?)(?:```|\Z)", re.S)
_REACT = re.compile(r"Action\s*:\s*([^\n]*)\n+\s*Action Input\s*:\s*(.*)", re.S)
_ATTEMPT = re.compile(r"<tool_call>|\"name\"\s*:|'name'\s*:|tool_calls|^\s*Action\s*:", re.M)
_RESPOND_ACTIONS = {"respond", "finish", "final answer", "final_answer", "answer"}
_NAME = re.compile(r"^[A-Za-z_][\w.\-]*$")


# -------------------------------------------------------------------------------------------
# JSON repair
# -------------------------------------------------------------------------------------------
_LITERALS = {"True": "true", "False": "false", "None": "null"}


def _tokens_repaired(text: str) -> tuple[str, bool]:
    """Rewrite near-JSON into JSON: quote styles, bare keys, literals, trailing commas, closers."""
    out: list[str] = []
    stack: list[str] = []
    i, n = 0, len(text)
    changed = False
    while i < n:
        ch = text[i]
        if ch in "\"'":
            quote, j, buf = ch, i + 1, []
            while j < n and text[j] != quote:
                if text[j] == "\\" and j + 1 < n:
                    if quote == "'" and text[j + 1] == "'":
                        buf.append("'")
                    else:
                        buf.append(text[j:j + 2])
                    j += 2
                    continue
                buf.append('\\"' if text[j] == '"' else ("\\n" if text[j] == "\n" else text[j]))
                j += 1
            changed |= quote == "'" or j >= n or "\n" in text[i:j]
            out.append('"' + "".join(buf) + '"')
            i = j + 1
            continue
        if ch in "{[":
            stack.append("}" if ch == "{" else "]")
            out.append(ch)
        elif ch in "}]":
            while out and out[-1].strip() == "":
                out.pop()
            if out and out[-1] == ",":
                out.pop()
                changed = True
            if stack:
                stack.pop()
            out.append(ch)
        elif ch.isalpha() or ch == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] in "_-."):
                j += 1
            word = text[i:j]
            k = j
            while k < n and text[k] in " \t\r\n":
                k += 1
            if k < n and text[k] == ":" and stack and stack[-1] == "}":
                out.append(json.dumps(word))
                changed = True
            elif word in _LITERALS:
                out.append(_LITERALS[word])
                changed = True
            else:
                out.append(word)
            i = j
            continue
        else:
            out.append(ch)
        i += 1
    # close what is open: drop a dangling comma, a key without value, a trailing colon
    tail = "".join(out).rstrip()
    if stack:
        changed = True
        tail = re.sub(r",\s*$", "", tail)
        if stack[-1] == "}":  # a key without a value: drop it
            tail = re.sub(r'(?:,\s*)?"(?:[^"\\]|\\.)*"\s*:\s*$', "", tail)
            tail = re.sub(r'(,|\{)\s*"(?:[^"\\]|\\.)*"$', lambda m: "" if m.group(1) == "," else "{", tail)
        tail = re.sub(r",\s*$", "", tail)
        tail += "".join(reversed(stack))
    return tail, changed


def repair_json(text: str) -> tuple[Any, bool] | None:
    """(value, was_repaired), or None if the text cannot be made into JSON."""
    try:
        return json.loads(text), False
    except (json.JSONDecodeError, TypeError, RecursionError):
        pass
    try:
        fixed, _ = _tokens_repaired(text.strip())
        return json.loads(fixed, strict=False), True
    except (json.JSONDecodeError, RecursionError):
        return None


def _first_json(text: str) -> tuple[Any, int, int, bool] | None:
    """The first JSON object/list in ``text`` that looks like a call: (value, start, end, repaired)."""
    decoder = json.JSONDecoder()
    for start, ch in enumerate(text):
        if ch not in "{[":
            continue
        try:
            value, end = decoder.raw_decode(text, start)
            if _calls_from(value) is not None:
                return value, start, end, False
            continue
        except (json.JSONDecodeError, RecursionError):
            pass
        fixed = repair_json(text[start:])
        if fixed is not None and _calls_from(fixed[0]) is not None:
            return fixed[0], start, len(text), True
    return None


# -------------------------------------------------------------------------------------------
# call shapes
# -------------------------------------------------------------------------------------------
def _arguments(raw: Any) -> dict | None:
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        fixed = repair_json(raw)
        if fixed is not None and isinstance(fixed[0], dict):
            return fixed[0]
    return None


def _call_from(obj: Any) -> ParsedToolCall | None:
    if not isinstance(obj, dict):
        return None
    if "function" in obj and isinstance(obj["function"], dict):  # OpenAI tool_calls entry
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        return None
    args = _arguments(obj.get("arguments", obj.get("parameters", obj.get("args"))))
    return None if args is None else ParsedToolCall(name, args)


def _calls_from(value: Any) -> list[ParsedToolCall] | None:
    """Calls in an OpenAI ``{"tool_calls": [...]}``, a call object, or a list of call objects."""
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        items = value["tool_calls"]
    elif isinstance(value, list):
        items = value
    else:
        items = [value]
    calls = [_call_from(item) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


def _python_call(code: str) -> ParsedToolCall | None:
    try:
        node = ast.parse(code.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    try:
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
    except (ValueError, SyntaxError, RecursionError):
        return None
    return ParsedToolCall(node.func.id, args)


# -------------------------------------------------------------------------------------------
# formats
# -------------------------------------------------------------------------------------------
def _hermes(text: str) -> ParseResult | None:
    blocks = list(_HERMES.finditer(text))
    if not blocks:
        return None
    calls, repaired = [], False
    for block in blocks:
        fixed = repair_json(block.group(1).strip())
        found = _calls_from(fixed[0]) if fixed else None
        if not found:
            return ParseResult(_HERMES.sub("", text).strip(), (), "hermes", bool(fixed), True,
                               f"unparseable <tool_call> block: {block.group(1).strip()[:80]!r}")
        calls.extend(found)
        repaired |= fixed[1] or not block.group(0).endswith("</tool_call>")
    return ParseResult(_HERMES.sub("", text).strip(), tuple(calls), "hermes", repaired)


def _fenced(text: str) -> ParseResult | None:
    for block in _FENCE.finditer(text):
        body = block.group(2).strip()
        content = (text[: block.start()] + text[block.end():]).strip()
        fixed = repair_json(body) if body[:1] in "{[" else None
        found = _calls_from(fixed[0]) if fixed else None
        if found:
            return ParseResult(content, tuple(found), "fenced_json", fixed[1] or not block.group(0).endswith("```"))
        call = _python_call(body)
        if call is not None:
            return ParseResult(content, (call,), "fenced_python", not block.group(0).endswith("```"))
    return None


def _react(text: str) -> ParseResult | None:
    match = _REACT.search(text)
    if not match:
        return None
    name = match.group(1).strip().strip("`\"'")
    raw = match.group(2).strip()
    before = text[: match.start()].strip()
    before = re.sub(r"^\s*Thought\s*:\s*", "", before)
    if name.lower() in _RESPOND_ACTIONS:
        fixed = repair_json(raw) if raw[:1] in "{[\"" else None
        message = raw
        if fixed is not None:
            value = fixed[0]
            message = value if isinstance(value, str) else str(
                value.get("content", value.get("message", raw))) if isinstance(value, dict) else raw
        return ParseResult(str(message).strip(), (), "react")
    if not _NAME.match(name):
        return ParseResult(before, (), "react", False, True, f"bad action name {name!r}")
    fixed = repair_json(raw) if raw else ({}, False)
    if fixed is None or not isinstance(fixed[0], dict):
        return ParseResult(before, (), "react", True, True, f"unparseable Action Input: {raw[:80]!r}")
    return ParseResult(before, (ParsedToolCall(name, fixed[0]),), "react", fixed[1])


def _bare_json(text: str) -> ParseResult | None:
    found = _first_json(text)
    if found is None:
        return None
    value, start, end, repaired = found
    fmt = "openai" if isinstance(value, dict) and "tool_calls" in value else "json"
    content = (text[:start] + text[end:]).strip()
    return ParseResult(content, tuple(_calls_from(value) or ()), fmt, repaired)


def strip_thinking(text: str) -> str:
    """Drop a leading ``<think>…</think>`` block (or an unclosed one: all of it), or the reasoning before a
    lone ``</think>`` when the template opened the block in the prompt (Qwen3). Text inside tool calls is kept."""
    match = _THINK.match(text)
    if match:
        return text[match.end():]
    if text.lstrip().startswith("<think>"):
        return ""
    head, sep, tail = text.partition("</think>")
    if sep and "<tool_call>" not in head and "{" not in head:
        return tail
    return text


def parse_model_output(text: str | None) -> ParseResult:
    """Parse one assistant turn's raw text; never raises."""
    try:
        return _parse(text)
    except Exception as exc:  # a parser bug must not end an episode: report it as a parse failure
        return ParseResult((text or "").strip(), (), "none", False, True, f"parser error: {exc!r}")


def _parse(text: str | None) -> ParseResult:
    if not text:
        return ParseResult("")
    visible = strip_thinking(text)
    for attempt in (_hermes, _fenced, _react, _bare_json):
        result = attempt(visible)
        if result is not None:
            return result
    content = visible.strip()
    if _ATTEMPT.search(visible):
        return ParseResult(content, (), "none", False, True, "looks like a tool call but none could be parsed")
    return ParseResult(content)
