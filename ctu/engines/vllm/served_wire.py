"""What the served engine reads from and says to a vLLM server: adapter names, replies, error messages, URLs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from ctu.engines.vllm.remote import MalformedReply

NAME = re.compile(r"^ctu-v(\d+)$")
ADMIN_RETRY = (429, 502, 503, 504)  # a load that failed with 500 fails again: not retried


class ServedEngineError(RuntimeError):
    """The server refused a weight load, unload or check (one line: URL, what, the server's message)."""


def adapter_name(version: int) -> str:
    return f"ctu-v{version}"


def version_of(name: str | None) -> int | None:
    match = NAME.match(name or "")
    return int(match.group(1)) if match else None


def run_sync(coro):
    """Run ``coro`` to completion from synchronous code, also from inside a running event loop (in a thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def server_info(response: httpx.Response) -> dict[str, Any]:
    """``/server_info``'s ``vllm_config`` with its ``model_config`` (objects; {} where absent)."""
    info = json_object(response).get("vllm_config") or {}
    if not isinstance(info, dict) or not isinstance(info.get("model_config") or {}, dict):
        raise MalformedReply("'vllm_config' (or its 'model_config') is not an object")
    return info


def server_message(response: httpx.Response) -> str:
    """vLLM's error message (``{"error": {"message"}}``, FastAPI's ``{"detail"}``), else the body's start."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:300]
        if isinstance(error, str):  # the API-key middleware's {"error": "Unauthorized"}
            return error[:300]
        if data.get("detail"):
            return str(data["detail"])[:300]
    return response.text[:200]


def route_missing(response: httpx.Response) -> bool:
    """A 404 from the router (no such route: FastAPI's ``{"detail": "Not Found"}``), not from a handler."""
    return response.status_code in (404, 405) and "error" not in response.text


def server_root(base_url: str) -> str:
    """The server's root URL from its OpenAI base URL: the path without a final ``/v1``, the query kept."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, path[: -len("/v1")] if path.endswith("/v1") else path,
                       parts.query, parts.fragment))


def json_object(response: httpx.Response) -> dict[str, Any]:
    """A reply's JSON object (:class:`MalformedReply` for another JSON value)."""
    data = response.json()
    if not isinstance(data, dict):
        raise MalformedReply(f"a JSON {type(data).__name__}, not an object")
    return data


def model_ids(response: httpx.Response) -> list[str]:
    """The ``id`` of every card of ``GET /v1/models`` (``{"data": [{"id": ...}]}``)."""
    cards = json_object(response).get("data") or []
    if not isinstance(cards, list) or not all(isinstance(c, dict) for c in cards):
        raise MalformedReply("'data' is not a list of model cards")
    return [str(c.get("id")) for c in cards]


__all__ = ["ADMIN_RETRY", "ServedEngineError", "adapter_name", "json_object", "model_ids", "route_missing",
           "run_sync", "server_info", "server_message", "server_root", "version_of"]
