"""Recorded transcripts: OpenAI-format conversations, one JSON object per line.

``parse_line`` validates one line for ``ctu score`` (clear errors naming the field; tool results must line up with
their calls as tau2's replay requires: :func:`check_tool_results`);
``gold_transcript`` builds the conversation an ideal agent would have for a task
(its gold tool calls with their results, then a message with every fact to
communicate, then the user's stop) — what ``ctu env check`` scores.

Dual control (telecom): the user's own tool calls are ``user`` messages with ``tool_calls``
(OpenAI shape), answered by ``tool`` messages (optionally ``"requestor": "user"``), as tau2
records a simulation; the gold transcript has the user perform the task's user-side actions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctu.domains.base import Domain, Task
from ctu.episode.users.base import AGENT_GREETING, STOP, is_stop

ROLES = ("system", "user", "assistant", "tool")


class TranscriptError(ValueError):
    """A transcript line that cannot be scored; the message names the bad field."""


@dataclass(frozen=True)
class Transcript:
    task_id: str
    messages: list[dict[str, Any]]
    domain: str | None
    termination: str | None


def _check_message(i: int, msg: Any) -> None:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise TranscriptError(f"{where} must be an object, got {type(msg).__name__}")
    role = msg.get("role")
    if role not in ROLES:
        raise TranscriptError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
    content = msg.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise TranscriptError(f"{where}.content must be a string or null, got {type(content).__name__}")
    calls = msg.get("tool_calls")
    if calls is None:
        return
    if role not in ("assistant", "user"):
        raise TranscriptError(f"{where}.tool_calls is only allowed on assistant and user messages")
    if not isinstance(calls, list):
        raise TranscriptError(f"{where}.tool_calls must be a list")
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise TranscriptError(f"{where}.tool_calls[{j}].function.name is missing")
        args = fn.get("arguments", {})
        if not isinstance(args, (str, dict)):
            raise TranscriptError(f"{where}.tool_calls[{j}].function.arguments must be a JSON string or an object")


def check_messages(messages: Any) -> None:
    """Raise :class:`TranscriptError` naming the first bad message of an OpenAI-format conversation."""
    if not isinstance(messages, list):
        raise TranscriptError("field 'messages' is missing or not a list")
    for i, msg in enumerate(messages):
        _check_message(i, msg)


REQUESTORS = ("user", "assistant")


def _call_ids(msg: Mapping[str, Any]) -> list[Any]:
    return [c.get("id", "") for c in msg.get("tool_calls") or []]


def check_tool_results(messages: Sequence[Mapping[str, Any]]) -> None:
    """Raise :class:`TranscriptError` naming the first tool message out of line with its call, as tau2 replays.

    tau2 (``Environment.set_state``) pairs results with calls by position: the ``k`` calls of a message must be
    followed at once by ``k`` tool messages answering them in order (``tool_call_id`` equal to the call's ``id``);
    a tool message that answers no pending call, a call without its result, or another id raises there. A tool
    message's ``requestor`` must be ``user`` or ``assistant`` (tau2's field) and, when given, the side whose
    call it answers. Messages are checked by :func:`check_messages` first."""
    i = 0
    while i < len(messages):
        msg = messages[i]
        if msg.get("role") == "tool":
            tid = msg.get("tool_call_id")
            answered = [j for j in range(i) if tid in _call_ids(messages[j])]
            why = f"answers the call of messages[{answered[-1]}] again" if answered else "answers no call"
            raise TranscriptError(f"messages[{i}] is a tool message with tool_call_id {tid!r} that {why} (each tool "
                                  "message must follow its call, one result per call, in call order)")
        ids = _call_ids(msg)
        for k, call_id in enumerate(ids):
            at = i + 1 + k
            where = f"messages[{i}].tool_calls[{k}] (id {call_id!r})"
            if at >= len(messages) or messages[at].get("role") != "tool":
                role = messages[at].get("role") if at < len(messages) else None
                got = f"messages[{at}] is {'an' if role == 'assistant' else 'a'} {role} message" if role \
                    else "the transcript ends"
                raise TranscriptError(f"{where} has no result: {got} (each call's tool message must follow it, "
                                      "in call order)")
            answer = messages[at]
            if "tool_call_id" not in answer:
                raise TranscriptError(f"messages[{at}].tool_call_id is missing (expected {call_id!r}, the result "
                                      f"of {where})")
            if answer["tool_call_id"] != call_id:
                raise TranscriptError(f"messages[{at}].tool_call_id is {answer['tool_call_id']!r}, expected "
                                      f"{call_id!r}: the result of {where} (results follow their calls in order)")
            requestor = answer.get("requestor")
            if requestor is not None and requestor not in REQUESTORS:
                raise TranscriptError(f"messages[{at}].requestor must be user or assistant, got {requestor!r}")
            if requestor is not None and requestor != msg.get("role"):
                raise TranscriptError(f"messages[{at}].requestor is {requestor!r} but it answers {where}, "
                                      f"a call by the {msg.get('role')}")
        i += 1 + len(ids)


def parse_line(text: str) -> Transcript:
    """Validate one JSONL line of a transcript file."""
    from ctu.episode.data.jsonfile import TOO_DEEP, check_text, value_problem

    try:
        obj = check_text(text, json.loads(text))
    except json.JSONDecodeError as exc:
        raise TranscriptError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise TranscriptError(TOO_DEEP) from None
    except ValueError as exc:
        raise TranscriptError(value_problem(exc)) from None
    if not isinstance(obj, dict):
        raise TranscriptError(f"expected a JSON object, got {type(obj).__name__}")
    if "task_id" not in obj or not isinstance(obj["task_id"], (str, int)):
        raise TranscriptError("field 'task_id' is missing or not a string")
    messages: Any = obj.get("messages")
    check_messages(messages)
    check_tool_results(messages)
    domain = obj.get("domain")
    if domain is not None and not isinstance(domain, str):
        raise TranscriptError("field 'domain' must be a string")
    termination = obj.get("termination")
    if termination is not None and not isinstance(termination, str):
        raise TranscriptError("field 'termination' must be a string")
    return Transcript(str(obj["task_id"]), messages, domain, termination)


def ending(messages: Sequence[Mapping[str, Any]], termination: str | None) -> str:
    """How a recorded conversation ended, for the reward.

    Normal ('user_stop'/'agent_stop') only when the last message is a user message with a
    stop token, or the recorded ``termination`` says so; anything else scores 0, as tau2
    scores max-steps and too-many-errors endings.
    """
    if termination in ("user_stop", "agent_stop"):
        return termination
    if messages and messages[-1].get("role") == "user" and is_stop(messages[-1].get("content") or ""):
        return "user_stop"
    return termination or "incomplete"


def gold_transcript(domain: Domain, task: Task) -> list[dict[str, Any]]:
    """An ideal conversation for ``task``: gold calls with real results, facts, user stop."""
    db = domain.initial_db(task)
    messages: list[dict[str, Any]] = [{"role": "assistant", "content": AGENT_GREETING},
                                      {"role": "user", "content": "I need help."}]
    for n, action in enumerate(task.actions):
        call_id = f"gold_{n}"
        result = domain.call(action.requestor, action.name, dict(action.arguments), db)
        by_user = action.requestor == "user"
        messages.append({"role": "user" if by_user else "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": action.name, "arguments": json.dumps(action.arguments)}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result.content,
                         **({"requestor": "user"} if by_user else {})})
    facts = "; ".join(task.communicate_info)
    messages.append({"role": "assistant", "content": f"Done. {facts}".strip()})
    messages.append({"role": "user", "content": f"Thanks! {STOP}"})
    return messages
