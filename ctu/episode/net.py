"""What every HTTP client of ctu shares (the LLM user, the judges, the remote and served engines).

- :func:`join_url`: a path joined onto a base URL's path, the base's query kept as the query
  (``http://h/v1?api_key=K`` + ``completions`` -> ``http://h/v1/completions?api_key=K``);
- :func:`malformed`: a reply that came back 200 but cannot be read (not JSON, the wrong shape), described in one
  redacted line with the first bytes of its body; callers retry it like a 5xx;
- :class:`WaitNotices`: a line on stderr while a request to a server is still unanswered
  (``ctu: waiting for URL (25 s)``), at most one per server and interval.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ctu.config.redact import redact

BODY_EXCERPT = 200  # characters of a malformed body quoted in its error
NOTICE_S = 25.0  # seconds a request may wait before the first "waiting for" line
T = TypeVar("T")


def join_url(base: str, path: str) -> str:
    """``path`` (which may carry its own ``?query``) joined onto ``base``'s path; both queries kept, base's first."""
    parts = urlsplit(base)
    sub, _, sub_query = path.partition("?")
    joined = parts.path.rstrip("/") + ("/" + sub.lstrip("/") if sub.strip("/") else "")
    query = "&".join(q for q in (parts.query, sub_query) if q)
    return urlunsplit((parts.scheme, parts.netloc, joined, query, parts.fragment))


def split_query(base: str | None) -> tuple[str | None, dict[str, str]]:
    """``base`` without its query, and the query as a dict (for clients that append paths to a base URL and take the
    query apart, as the OpenAI SDK's ``default_query``)."""
    if base is None:
        return None, {}
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", parts.fragment)), dict(
        parse_qsl(parts.query, keep_blank_values=True))


def excerpt(body: bytes | str, limit: int = BODY_EXCERPT) -> str:
    """The first ``limit`` characters of a body, quoted on one line (``...`` when cut)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def malformed(problem: str, body: bytes | str) -> str:
    """One redacted line for a 200 reply that cannot be read: what is wrong and how the body starts."""
    return redact(f"malformed reply ({problem}; body: {excerpt(body)})")


def chat_reply_problem(data: Any) -> str | None:
    """What keeps ``data`` from being an OpenAI chat completion whose first choice can be read; None if it is one."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        return "no 'choices' list" if not isinstance(choices, list) else "an empty 'choices' list"
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        return "choices[0] has no 'message' object"
    if not isinstance(message.get("content"), str | None):
        return "choices[0].message.content is not a string"
    calls = message.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(
            isinstance(c, dict) and isinstance(c.get("function"), dict)
            and isinstance(c["function"].get("name"), str) for c in calls)):
        return "choices[0].message.tool_calls is not a list of function calls"
    return None


def completions_reply_problem(data: Any) -> str | None:
    """What keeps ``data`` from being a ``/v1/completions`` reply (``choices``: objects with optional ``logprobs``
    of ``tokens`` and ``token_logprobs`` lists); None if it is one. Token values are checked by the engine."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    choices = data.get("choices", [])
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        return "'choices' is not a list of objects"
    for i, choice in enumerate(choices):
        logprobs = choice.get("logprobs")
        if logprobs is None:
            continue
        if not isinstance(logprobs, dict):
            return f"choices[{i}].logprobs is not an object"
        for key in ("tokens", "token_logprobs"):
            if not isinstance(logprobs.get(key), list | None):
                return f"choices[{i}].logprobs.{key} is not a list"
        if not isinstance(choice.get("token_ids"), list | None):
            return f"choices[{i}].token_ids is not a list"
        if not isinstance(choice.get("index", 0), int):
            return f"choices[{i}].index is not an integer"
    return None


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class WaitNotices:
    """Wraps requests to servers: while one is unanswered for ``every_s`` seconds, one line on stderr,
    ``ctu: waiting for URL (N s)`` (with how many requests wait when several do), at most one per URL and
    ``every_s``. ``say`` receives each line (already redacted)."""

    def __init__(self, every_s: float = NOTICE_S, say: Callable[[str], None] = _say):
        self.every_s = every_s
        self.say = say
        self._last: dict[str, float] = {}
        self._waiting: dict[str, int] = {}

    async def wait(self, url: str, awaitable: Awaitable[T]) -> T:
        task = asyncio.ensure_future(awaitable)
        started = time.monotonic()
        self._waiting[url] = self._waiting.get(url, 0) + 1
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.every_s)
                if done:
                    return task.result()
                now = time.monotonic()
                if now - self._last.get(url, float("-inf")) >= self.every_s * 0.9:
                    self._last[url] = now
                    n = self._waiting.get(url, 1)
                    self.say(redact(f"ctu: waiting for {url} ({now - started:.0f} s"
                                    + (f", {n} requests)" if n > 1 else ")")))
        finally:
            self._waiting[url] -= 1
            if not task.done():
                task.cancel()
