"""One client for OpenAI-compatible chat APIs (user simulator, judges), with retries.

Retries with exponential backoff (and seeded jitter) on 429, 5xx, timeouts and connection
errors, honouring ``Retry-After``; other 4xx fail at once. After the last attempt it raises
:class:`LLMCallError` naming the model, URL, status and attempts — never the API key, which
is read from the environment variable named in the config and kept out of every repr.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import openai


class LLMCallError(RuntimeError):
    """A chat completion that failed for good (after retries, or a non-retryable error)."""


@dataclass(frozen=True)
class ChatAPIConfig:
    model: str
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    max_retries: int = 4
    backoff_initial: float = 0.5
    backoff_max: float = 8.0
    timeout: float = 60.0


@dataclass
class ChatClient:
    """``await client.complete(messages)`` -> the reply text (non-empty) or LLMCallError."""

    config: ChatAPIConfig
    seed: int = 0
    sleep: Callable[[float], Awaitable[Any]] = field(default=asyncio.sleep, repr=False)
    _client: Any = field(default=None, init=False, repr=False)
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        key = os.environ.get(self.config.api_key_env)
        if not key:
            if self.config.base_url is None:
                raise LLMCallError(
                    f"environment variable {self.config.api_key_env} is not set (it holds the API key for "
                    f"model '{self.config.model}'); set it, or give a base_url for a local server")
            key = "EMPTY"
        self._client = openai.AsyncOpenAI(api_key=key, base_url=self.config.base_url, max_retries=0,
                                          timeout=self.config.timeout)
        self._rng = random.Random(self.seed)

    def _where(self) -> str:
        return f"model '{self.config.model}' at {self.config.base_url or 'the OpenAI API'}"

    async def complete(self, messages: Sequence[dict[str, Any]], *, temperature: float = 0.0,
                       max_tokens: int = 512, seed: int | None = None, tools: list[dict] | None = None) -> Any:
        """The reply text; with ``tools``, a reply that calls tools is returned as the message object instead."""
        attempts = self.config.max_retries + 1
        last = "no attempt made"
        for attempt in range(1, attempts + 1):
            delay = None
            try:
                response = await self._client.chat.completions.create(
                    model=self.config.model, messages=list(messages), temperature=temperature,
                    max_tokens=max_tokens, **({"seed": seed} if seed is not None else {}),
                    **({"tools": tools} if tools else {}))
                if tools and response.choices and response.choices[0].message.tool_calls:
                    return response.choices[0].message
                text = (response.choices[0].message.content or "") if response.choices else ""
                if text.strip():
                    return text
                last = "empty reply"
            except openai.APIStatusError as exc:
                status = exc.status_code
                if status != 429 and status < 500:
                    raise LLMCallError(f"{self._where()} refused the request: HTTP {status} "
                                       f"(not retried)") from None
                last = f"HTTP {status}"
                delay = _retry_after(exc)
            except (openai.APITimeoutError, openai.APIConnectionError) as exc:
                last = type(exc).__name__
            if attempt < attempts:
                backoff = min(self.config.backoff_max, self.config.backoff_initial * 2 ** (attempt - 1))
                backoff *= 0.5 + self._rng.random() / 2
                await self.sleep(min(self.config.backoff_max, delay) if delay is not None else backoff)
        raise LLMCallError(f"{self._where()} failed after {attempts} attempts (last error: {last})")


def _retry_after(exc: openai.APIStatusError) -> float | None:
    try:
        value = exc.response.headers.get("retry-after")
        return max(0.0, float(value)) if value is not None else None
    except (AttributeError, TypeError, ValueError):
        return None
