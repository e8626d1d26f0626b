"""The OpenAI chat-completions wire format, for the bring-your-own-agent proxy (docs/agents.md).

Pure functions: read a request's ``messages``/``tools`` (one-line errors naming the bad field), decide whether a
request's messages continue the conversation the proxy last answered (then only the new tail is rendered, with
:meth:`ChatFormat.observation_ids`, exactly as ctu's loop appends observations), and write a sampled turn back as an
OpenAI response: the model's text parsed by :func:`ctu.episode.parsing.parse_model_output` (the loop's parser) into
``content`` and ``tool_calls``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ctu.episode.parsing import ParseResult
from ctu.rollout.chat import normalize_message

ROLES = ("system", "user", "assistant", "tool", "developer")


class WireError(ValueError):
    """A request the proxy refuses: an HTTP status and one line naming the field."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


def request_conversation(body: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(messages, tools)`` of a chat-completions request body."""
    if not isinstance(body, Mapping):
        raise WireError(400, "the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise WireError(400, "messages: must be a non-empty list of messages", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in ROLES:
            raise WireError(400, f"messages[{i}]: must be an object with a role ({', '.join(ROLES)})", f"messages[{i}]")
    tools = body.get("tools") or []
    if not isinstance(tools, list) or any(not isinstance(t, Mapping) or "function" not in t for t in tools):
        raise WireError(400, "tools: must be a list of {'type': 'function', 'function': {...}} objects", "tools")
    for key, allowed in (("n", (None, 1)), ("stream", (None, False))):
        if body.get(key) not in allowed:
            raise WireError(400, f"{key}: {body.get(key)!r} is not supported by the ctu proxy (one completion, "
                                 "not streamed)", key)
    return [dict(m) for m in messages], [dict(t) for t in tools]


def requested_max_tokens(body: Mapping[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WireError(400, f"max_tokens: must be a positive integer, got {value!r}", "max_tokens")
    return value


def _comparable(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as the template sees it (ids of tool calls left out: the template does not render them)."""
    out = normalize_message(message)
    out.pop("tool_call_id", None)
    if out["role"] == "developer":
        out["role"] = "system"
    return out


def continuation(history: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """The new tail of ``messages`` if they start with ``history`` (the last request's messages and the reply the
    proxy gave) and add only tool results and user turns; else None (the agent rewrote its history)."""
    if len(messages) <= len(history):
        return None
    if any(_comparable(a) != _comparable(b) for a, b in zip(history, messages, strict=False)):
        return None
    tail = [dict(m) for m in messages[len(history):]]
    if any(m.get("role") not in ("tool", "user") for m in tail):
        return None
    return tail


def tool_call_id(episode_id: str, turn: int, index: int) -> str:
    return f"call_{episode_id}_{turn}_{index}"


def assistant_message(parsed: ParseResult, episode_id: str, turn: int) -> dict[str, Any]:
    """The OpenAI assistant message of one parsed turn (arguments as JSON text, as the SDK expects)."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["content"] = parsed.content or None
        message["tool_calls"] = [
            {"id": tool_call_id(episode_id, turn, i), "type": "function",
             "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
            for i, call in enumerate(parsed.tool_calls)]
    return message


def finish_reason(parsed: ParseResult, engine_reason: str) -> str:
    if engine_reason == "length":
        return "length"
    return "tool_calls" if parsed.tool_calls else "stop"


def logprobs_block(tokens: Sequence[str], logprobs: Sequence[float]) -> dict[str, Any]:
    """OpenAI's ``choices[0].logprobs`` for the sampled tokens (no alternatives)."""
    return {"content": [{"token": t, "logprob": float(lp), "bytes": list(t.encode()), "top_logprobs": []}
                        for t, lp in zip(tokens, logprobs, strict=True)]}


def completion_body(*, episode_id: str, turn: int, model: str, message: Mapping[str, Any], reason: str,
                    prompt_tokens: int, completion_tokens: int, logprobs: dict[str, Any] | None = None,
                    extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A chat.completion object as the OpenAI API returns it (``extra``: ctu's own fields beside it)."""
    return {"id": f"chatcmpl-{episode_id}-{turn}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": dict(message), "finish_reason": reason,
                                         "logprobs": logprobs}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}, **(extra or {})}
