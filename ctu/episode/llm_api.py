"""One client for OpenAI-compatible chat APIs (user simulator, judges), with retries.

Retries with exponential backoff (and seeded jitter) on 429, 5xx, timeouts, connection errors and
200 replies that cannot be read (not JSON, not a chat completion), honouring ``Retry-After``; other 4xx fail at once with the server's own reason. After
the last attempt it raises :class:`LLMCallError` naming the model, URL, status, the server's
reason and attempts — never the API key, which is read from the environment variable named in
the config and kept out of every repr and message.

The default budget (8 retries, backoff 1 s doubling to 16 s, each delay scaled by a jitter in
[0.5, 1)) waits 40-80 s in all before giving up: longer than a local server takes to restart.

The underlying ``openai.AsyncOpenAI`` (an httpx connection pool) belongs to one event loop:
the trainer calls ``asyncio.run`` once per step, and a pooled connection from a closed loop
fails with "Event loop is closed". So the client keeps one pool per running loop and closes it
when that loop shuts down (``asyncio.run`` finalizes async generators before closing).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import openai
from openai.types.chat import ChatCompletionMessage

from ctu.config.redact import redact, remember, remember_in
from ctu.episode.net import NOTICE_S, WaitNotices, chat_reply_problem, join_url, malformed, split_query

log = logging.getLogger(__name__)

DEFAULT_MAX_RETRIES = 8
DEFAULT_BACKOFF_INITIAL = 1.0
DEFAULT_BACKOFF_MAX = 16.0
DEFAULT_TIMEOUT = 60.0


class LLMCallError(RuntimeError):
    """A chat completion that failed for good (after retries, or a non-retryable error)."""


@dataclass(frozen=True)
class ChatAPIConfig:
    model: str
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    max_retries: int = DEFAULT_MAX_RETRIES
    backoff_initial: float = DEFAULT_BACKOFF_INITIAL
    backoff_max: float = DEFAULT_BACKOFF_MAX
    timeout: float = DEFAULT_TIMEOUT
    notice_s: float = NOTICE_S  # a request unanswered this long prints "waiting for URL (N s)"


async def _lifetime(client: Any, owner: dict, loop: asyncio.AbstractEventLoop) -> AsyncIterator[None]:
    """Suspended for the loop's life; ``asyncio.run``'s shutdown_asyncgens closes it, closing the pool."""
    try:
        yield
    finally:
        owner.pop(loop, None)
        await client.close()


@dataclass
class ChatClient:
    """``await client.complete(messages)`` -> the reply text (non-empty) or LLMCallError.

    ``failures`` lists failed attempts' reasons (retried or not; the latest 1,000), for tests and diagnostics."""

    config: ChatAPIConfig
    seed: int = 0
    sleep: Callable[[float], Awaitable[Any]] = field(default=asyncio.sleep, repr=False)
    failures: list[str] = field(default_factory=list, init=False, repr=False)
    notices: WaitNotices = field(init=False, repr=False)
    _key: str = field(default="", init=False, repr=False)
    _pools: dict = field(default_factory=dict, init=False, repr=False)
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        key = os.environ.get(self.config.api_key_env)
        if not key:
            if self.config.base_url is None:
                raise LLMCallError(
                    f"environment variable {self.config.api_key_env} is not set (it holds the API key for "
                    f"model '{self.config.model}'); set it, or give a base_url for a local server")
            key = "EMPTY"
        self._key = key
        if key != "EMPTY":
            remember(key)  # a server that echoes the key back shows it nowhere
        remember_in(self.config.base_url)  # nor a piece of the URL's password (an unchecked URL: InvalidURL)
        self._rng = random.Random(self.seed)
        self.notices = WaitNotices(self.config.notice_s)

    async def _client(self) -> Any:
        """This event loop's client; built on first use in the loop, closed when the loop shuts down."""
        loop = asyncio.get_running_loop()
        entry = self._pools.get(loop)
        if entry is None:
            for old in [old for old in self._pools if old.is_closed()]:  # a loop closed without asyncio.run
                self._pools.pop(old, None)
            base, query = split_query(self.config.base_url)  # the SDK appends paths to the base URL's whole text
            client = openai.AsyncOpenAI(api_key=self._key, base_url=base, default_query=query or None, max_retries=0,
                                        timeout=self.config.timeout)
            keeper = _lifetime(client, self._pools, loop)
            await keeper.__anext__()
            entry = self._pools[loop] = (client, keeper)
        return entry[0]

    def _failed(self, reason: str) -> None:
        self.failures.append(reason)
        del self.failures[:-1000]

    def _url(self) -> str:
        return join_url(self.config.base_url or "https://api.openai.com/v1", "chat/completions")

    def _where(self) -> str:
        return f"model '{self.config.model}' at {redact(self.config.base_url or 'the OpenAI API')}"

    async def complete(self, messages: Sequence[dict[str, Any]], *, temperature: float = 0.0,
                       max_tokens: int = 512, seed: int | None = None, tools: list[dict] | None = None) -> Any:
        """The reply text; with ``tools``, a reply that calls tools is returned as the message object instead."""
        attempts = self.config.max_retries + 1
        last = "no attempt made"
        for attempt in range(1, attempts + 1):
            delay = None
            try:
                client = await self._client()
                raw = await self.notices.wait(self._url(), client.chat.completions.with_raw_response.create(
                    model=self.config.model, messages=list(messages), temperature=temperature,
                    max_tokens=max_tokens, **({"seed": seed} if seed is not None else {}),
                    **({"tools": tools} if tools else {})))
                reply, last = _read_reply(raw.content)
                if reply is not None:
                    if tools and reply.tool_calls:
                        return reply
                    if (reply.content or "").strip():
                        return reply.content
                    last = "empty reply"
            except openai.APIStatusError as exc:
                status, reason = exc.status_code, redact(server_reason(exc))
                last = f"HTTP {status}: {reason}" if reason else f"HTTP {status}"
                if status != 429 and status < 500:
                    self._failed(last)
                    raise LLMCallError(f"{self._where()} refused the request: {last} (not retried)") from None
                delay = _retry_after(exc)
            except (openai.APITimeoutError, openai.APIConnectionError) as exc:
                cause = exc.__cause__
                last = type(exc).__name__ + (f" ({type(cause).__name__}: {cause})" if cause is not None else "")
            self._failed(last)
            if attempt < attempts:
                backoff = min(self.config.backoff_max, self.config.backoff_initial * 2 ** (attempt - 1))
                backoff *= 0.5 + self._rng.random() / 2
                wait = min(self.config.backoff_max, delay) if delay is not None else backoff
                log.info("%s: attempt %d/%d failed (%s); retrying in %.1fs", self._where(), attempt, attempts,
                         last, wait)
                await self.sleep(wait)
        raise LLMCallError(f"{self._where()} failed after {attempts} attempts (last error: {last})")


def _read_reply(body: bytes) -> tuple[Any, str]:
    """The first choice's message of a chat completion body, or (None, why it cannot be read)."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        return None, malformed(f"not JSON: {exc}", body)
    problem = chat_reply_problem(data)
    if problem is not None:
        return None, malformed(problem, body)
    try:
        return ChatCompletionMessage.model_validate(data["choices"][0]["message"]), ""
    except ValueError as exc:  # pydantic's ValidationError
        return None, malformed(f"not a chat message: {str(exc).splitlines()[0]}", body)


def server_reason(exc: openai.APIStatusError, limit: int = 300) -> str:
    """The server's own words for a refused request: OpenAI's ``{"error": {"message", "code"}}``,
    FastAPI's ``{"detail": ...}``, a bare ``{"message": ...}``, or the response text."""
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("error"), dict):  # openai unwraps "error" only sometimes
        body = body["error"]
    parts: list[str] = []
    if isinstance(body, dict):
        for key in ("code", "type"):
            value = body.get(key)
            if isinstance(value, str) and value and value not in parts:
                parts.append(value)
        for key in ("message", "detail", "error"):
            value = body.get(key)
            if value:
                parts.append(value if isinstance(value, str) else str(value))
                break
    elif isinstance(body, str) and body.strip():
        parts.append(body.strip())
    if not parts:
        try:
            parts.append(exc.response.text.strip())
        except Exception:  # noqa: BLE001 - a streamed or unread body: no reason to give
            pass
    return " ".join(" ".join(p for p in parts if p).split())[:limit]


def _retry_after(exc: openai.APIStatusError) -> float | None:
    try:
        value = exc.response.headers.get("retry-after")
        return max(0.0, float(value)) if value is not None else None
    except (AttributeError, TypeError, ValueError):
        return None
