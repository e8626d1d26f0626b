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
_REACT_INPUT = re.compile(r"Action Input[ \t]*+:")
_REACT_ACTION = re.compile(r"Action[ \t]*+:")
_ATTEMPT = re.compile(r"<tool_call>|\"name\"\s*+:|'name'\s*+:|tool_calls|^[ \t]*+Action[ \t]*+:", re.M)
_RESPOND_ACTIONS = {"respond", "finish", "final answer", "final_answer", "answer"}
_NAME = re.compile(r"^[A-Za-z_][\w.\-]*$")


# -------------------------------------------------------------------------------------------
# JSON repair
# -------------------------------------------------------------------------------------------
_LITERALS = {"True": "true", "False": "false", "None": "null"}
# Work limits that keep parsing linear in the text. Strict decoding (C speed) may scan a few times the
# text, each attempt counting at least _ATTEMPT_COST; repair (a Python-level pass) is tried on at most
# _REPAIR_WORK characters per reply in all, so a call cut off at the end of a long reply is still
# repaired, but a megabyte of nested brackets is not repaired from every bracket.
_STRICT_WORK = 4
_ATTEMPT_COST = 256
_REPAIR_WORK = 1 << 17


class _Work:
    """What one parse may still spend on strict decoding and on repair (characters)."""

    def __init__(self, n: int) -> None:
        self.strict = _STRICT_WORK * n + 65536
        self.repair = _REPAIR_WORK

    def take_repair(self, size: int) -> bool:
        if size > self.repair:
            return False
        self.repair -= size + _ATTEMPT_COST
        return True


# One token per match, so the repair is one pass of C-speed matching (no per-character Python loop, no
# rescans): strings (maybe unclosed), structural characters, bare words, whitespace, anything else.
_TOKEN = re.compile(r"""("(?:[^"\\]|\\.)*+)("?)|('(?:[^'\\]|\\.)*+)('?)|([{}\[\],:])|([^\W\d][\w.\-]*+)|(\s++)"""
                    r"""|((?:(?![^\W\d])[^\s"'{}\[\],:])++|\\)""", re.S)
_SINGLE_QUOTED = re.compile(r"""\\(.)|(")|(\n)""", re.S)
_WS = re.compile(r"\s*+")


def _single_to_double(match: re.Match) -> str:
    escaped, quote, _newline = match.groups()
    if escaped is not None:
        return "'" if escaped == "'" else "\\" + escaped
    return '\\"' if quote else "\\n"


def _tokens_repaired(text: str) -> tuple[str, bool]:
    """Rewrite near-JSON into JSON: quote styles, bare keys, literals, trailing commas, closers. One linear pass."""
    out: list[str] = []
    stack: list[str] = []
    changed = False
    for m in _TOKEN.finditer(text):
        dq, dq_end, sq, sq_end, punct, word, space, other = m.groups()
        if dq is not None:
            body = dq[1:]
            if "\n" in body:
                body = body.replace("\n", "\\n")
                changed = True
            changed |= not dq_end
            out.append('"' + body + '"')
        elif sq is not None:
            changed = True
            out.append('"' + _SINGLE_QUOTED.sub(_single_to_double, sq[1:]) + '"')
        elif punct is not None:
            if punct in "{[":
                stack.append("}" if punct == "{" else "]")
                out.append(punct)
            elif punct in "}]":
                while out and out[-1].isspace():
                    out.pop()
                if out and out[-1] == ",":
                    out.pop()
                    changed = True
                if stack:
                    stack.pop()
                out.append(punct)
            else:
                out.append(punct)
        elif word is not None:
            k = _WS.match(text, m.end()).end()  # type: ignore[union-attr]  # matches the empty string
            if stack and stack[-1] == "}" and text.startswith(":", k):
                out.append(json.dumps(word))
                changed = True
            elif word in _LITERALS:
                out.append(_LITERALS[word])
                changed = True
            else:
                out.append(word)
        else:
            out.append(space if space is not None else other)
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


def repair_json(text: str, work: _Work | None = None) -> tuple[Any, bool] | None:
    """(value, was_repaired), or None if the text cannot be made into JSON.

    Text that is not valid JSON is repaired only while ``work`` (by default: one text of up to
    ``_REPAIR_WORK`` characters) allows, so every call costs time linear in the text."""
    try:
        return json.loads(text), False
    except (json.JSONDecodeError, TypeError, RecursionError):
        pass
    if not (work or _Work(0)).take_repair(len(text)):
        return None
    try:
        fixed, _ = _tokens_repaired(text.strip())
        return json.loads(fixed, strict=False), True
    except (json.JSONDecodeError, RecursionError):
        return None


# Where a call could start: an object opening with a key (quoted or bare) and a colon, or a list opening
# with an object. Each lookahead scans only to its key's closing quote, so finding them all is linear.
_CANDIDATE = re.compile(r"""\{(?=\s*+(?:"(?:[^"\\]|\\.)*+"|'(?:[^'\\]|\\.)*+'|[^\W\d][\w.\-]*+)\s*+:)|\[(?=\s*+\{)""", re.S)
_STRICT_START = re.compile(r'\{\s*+"|\[\s*+\{\s*+"')
_WINDOW = 4096


def _strict_at(decoder: json.JSONDecoder, text: str, start: int) -> tuple[Any, int, int]:
    """(value or None, end, characters scanned) for strict JSON at ``start``. It decodes growing windows
    of the text: a decode error's line count runs from the start of the document, so decoding the whole
    text at every candidate would be quadratic."""
    n, width = len(text), _WINDOW
    while True:
        chunk = text[start:start + width]
        try:
            value, end = decoder.raw_decode(chunk)
            return value, start + end, end
        except json.JSONDecodeError as exc:
            cut = start + width < n and (exc.pos >= len(chunk) - 10 or exc.msg.startswith("Unterminated"))
            if not cut:
                return None, start, exc.pos + 1
        except RecursionError:
            return None, start, len(chunk)
        width *= 4


def _find_call(value: Any) -> Any:
    """``value`` or the first value nested in it (in text order) that holds calls, else None."""
    pending = [value]
    while pending:
        node = pending.pop()
        if _calls_from(node) is not None:
            return node
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        pending.extend(reversed([c for c in children if isinstance(c, (dict, list))]))
    return None


def _first_json(text: str, work: _Work) -> tuple[Any, int, int, bool] | None:
    """The first JSON object/list in ``text`` that looks like a call: (value, start, end, repaired).

    A valid JSON value that is not a call is searched for a nested call and then skipped as a whole; a
    candidate that is not valid JSON is repaired (it then runs to the end of the text)."""
    decoder = json.JSONDecoder()
    n = len(text)
    skip_to = 0
    for match in _CANDIDATE.finditer(text):
        start = match.start()
        if start < skip_to:
            continue
        if work.strict > 0 and _STRICT_START.match(text, start):
            value, end, scanned = _strict_at(decoder, text, start)
            work.strict -= scanned + _ATTEMPT_COST
            if end > start:
                found = _find_call(value)
                if found is not None:
                    return found, start, end, False
                skip_to = end
                continue
        fixed = repair_json(text[start:], work) if n - start <= work.repair else None
        if fixed is not None and _calls_from(fixed[0]) is not None:
            return fixed[0], start, n, True
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
        args = {kw.arg: _json_value(ast.literal_eval(kw.value)) for kw in node.keywords if kw.arg is not None}
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return None
    return ParsedToolCall(node.func.id, args)


def _json_value(value: Any) -> Any:
    """A Python literal as the JSON value a tool call carries (a tuple as a list); ``TypeError`` for what JSON has
    no value for (a set, bytes, a complex number, ``...``, a key that is not a string)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _json_value(v) for k, v in value.items()}
    raise TypeError(f"not a JSON value: {type(value).__name__}")


# -------------------------------------------------------------------------------------------
# formats
# -------------------------------------------------------------------------------------------
def _hermes(text: str, work: _Work) -> ParseResult | None:
    blocks = list(_HERMES.finditer(text))
    if not blocks:
        return None
    calls, repaired = [], False
    for block in blocks:
        fixed = repair_json(block.group(1).strip(), work)
        found = _calls_from(fixed[0]) if fixed else None
        if not found:
            return ParseResult(_HERMES.sub("", text).strip(), (), "hermes", bool(fixed), True,
                               f"unparseable <tool_call> block: {block.group(1).strip()[:80]!r}")
        calls.extend(found)
        repaired |= fixed[1] or not block.group(0).endswith("</tool_call>")  # type: ignore[index]  # found: fixed
    return ParseResult(_HERMES.sub("", text).strip(), tuple(calls), "hermes", repaired)


_MAX_FENCES = 64  # code blocks looked at per reply
_PY_CALL = re.compile(r"[^\W\d][\w.]*+\s*+\(")


def _without(text: str, block: re.Match) -> str:
    return (text[: block.start()] + text[block.end():]).strip()


def _fenced(text: str, work: _Work) -> ParseResult | None:
    for count, block in enumerate(_FENCE.finditer(text)):
        if count == _MAX_FENCES:
            break
        body = block.group(2).strip()
        fixed = repair_json(body, work) if body[:1] in "{[" else None
        found = _calls_from(fixed[0]) if fixed else None
        if found:
            return ParseResult(_without(text, block), tuple(found), "fenced_json",
                               fixed[1] or not block.group(0).endswith("```"))  # type: ignore[index]  # found: fixed
        call = _python_call(body) if _PY_CALL.match(body) else None
        if call is not None:
            return ParseResult(_without(text, block), (call,), "fenced_python", not block.group(0).endswith("```"))
    return None


def _react_match(text: str) -> tuple[int, str, str] | None:
    """The first ``Action: NAME`` line followed (after blank lines) by ``Action Input: ...``:
    (where ``Action`` starts, NAME, the rest of the text). Linear: each ``Action Input`` looks back over
    its own blank lines and the one line before them."""
    for found in _REACT_INPUT.finditer(text):
        k = found.start()
        first_newline = -1
        while k > 0 and text[k - 1].isspace():
            k -= 1
            if text[k] == "\n":
                first_newline = k
        if first_newline < 0:
            continue
        line_start = text.rfind("\n", 0, first_newline) + 1
        action = _REACT_ACTION.search(text, line_start, first_newline)
        if action is not None:
            return action.start(), text[action.end():first_newline], text[found.end():]
    return None


def _react(text: str, work: _Work) -> ParseResult | None:
    found = _react_match(text)
    if found is None:
        return None
    action_at, name, raw = found
    name = name.strip().strip("`\"'")
    raw = raw.strip()
    before = text[:action_at].strip()
    before = re.sub(r"^\s*Thought\s*:\s*", "", before)
    if name.lower() in _RESPOND_ACTIONS:
        fixed = repair_json(raw, work) if raw[:1] in "{[\"" else None
        message = raw
        if fixed is not None:
            value = fixed[0]
            message = value if isinstance(value, str) else str(
                value.get("content", value.get("message", raw))) if isinstance(value, dict) else raw
        return ParseResult(str(message).strip(), (), "react")
    if not _NAME.match(name):
        return ParseResult(before, (), "react", False, True, f"bad action name {name!r}")
    fixed = repair_json(raw, work) if raw else ({}, False)
    if fixed is None or not isinstance(fixed[0], dict):
        return ParseResult(before, (), "react", True, True, f"unparseable Action Input: {raw[:80]!r}")
    return ParseResult(before, (ParsedToolCall(name, fixed[0]),), "react", fixed[1])


def _bare_json(text: str, work: _Work) -> ParseResult | None:
    found = _first_json(text, work)
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
    work = _Work(len(visible))
    for attempt in (_hermes, _fenced, _react, _bare_json):
        result = attempt(visible, work)
        if result is not None:
            return result
    content = visible.strip()
    if _ATTEMPT.search(visible):
        return ParseResult(content, (), "none", False, True, "looks like a tool call but none could be parsed")
    return ParseResult(content)
