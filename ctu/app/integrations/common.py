"""What the trainer adapters share: a parquet row's task, a decoded response's turns, and running a coroutine
from synchronous code (verl and SkyRL call rewards and environments synchronously)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ctu.domains import registered_domain
from ctu.domains.base import Domain, Task
from ctu.episode.data.prompts import row_task
from ctu.episode.parsing import parse_model_output
from ctu.episode.users.base import is_stop

T = TypeVar("T")
# role headers: ChatML's <|im_start|>ROLE, or the bare "\nROLE\n" left when special tokens are skipped in decoding
_HEADER_SPECIAL = re.compile(r"<\|im_start\|>(\w+)\n")
_HEADER_BARE = re.compile(r"\n(user|assistant|tool)\n")
_END = ("<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>")
_TOOL_RESPONSE = re.compile(r"<tool_response>.*?(?:</tool_response>|\Z)", re.S)


def plain(value: Any) -> Any:
    """A value as plain Python: numpy arrays and OmegaConf containers, as trainers hand them over, to lists/dicts."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return plain(value.tolist())
    if isinstance(value, Mapping) or (hasattr(value, "items") and hasattr(value, "keys")):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def task_of(ground_truth: Any, extra_info: Mapping[str, Any] | None, data_source: str | None = None,
            data_dir: str | None = None) -> tuple[Domain, Task]:
    """(domain, task) of a row of ``ctu data export --format parquet``: the ground truth is the tau2 task (JSON),
    the domain is ``extra_info.domain`` or ``data_source`` minus ``ctu/``. Raises DataError / KeyError."""
    row = {"reward_model": {"ground_truth": ground_truth}, "extra_info": plain(extra_info or {}),
           "data_source": data_source}
    name, task, _ = row_task(row)
    return registered_domain(name, data_dir), task  # a row names a built-in domain: nothing it says is imported


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to its end from synchronous code, also when the caller's thread runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def strip_end(text: str) -> str:
    """A turn's text without the end-of-turn / EOS strings a decoder may leave at its end."""
    text = text.rstrip()
    changed = True
    while changed:
        changed = False
        for end in _END:
            if text.endswith(end):
                text, changed = text[: -len(end)].rstrip(), True
    return text


def assistant_message(text: str) -> tuple[dict[str, Any], bool]:
    """(an OpenAI assistant message, whether parsing failed) of one turn's raw text, parsed as ctu's rollouts do."""
    parsed = parse_model_output(strip_end(text))
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in parsed.tool_calls]
    return message, parsed.failed


def response_messages(text: str) -> tuple[list[dict[str, Any]], int]:
    """(messages, parse failures) of a decoded multi-turn response that starts inside the first assistant turn
    (verl's ``solution_str``): assistant turns parsed into text and tool calls, user text kept, tool results
    dropped (the scorer re-executes the calls). Role headers are ChatML's; with special tokens skipped, a
    header is a line holding only ``user`` / ``assistant``."""
    pattern = _HEADER_SPECIAL if "<|im_start|>" in text else _HEADER_BARE
    parts = pattern.split(text)
    roles, bodies = ["assistant", *parts[1::2]], parts[0::2]
    messages, failures = [], 0
    for role, body in zip(roles, bodies, strict=True):
        if role == "assistant":
            message, failed = assistant_message(body)
            failures += failed
            messages.append(message)
            continue
        user_text = strip_end(_TOOL_RESPONSE.sub("", body)).strip()
        if user_text:
            messages.append({"role": "user", "content": user_text})
    return messages, failures


def termination_of(messages: list[dict[str, Any]], transfer_tool: str | None) -> str:
    """How a response without a recorded ending ended: a user stop token; the agent's transfer or a closing turn
    of text (the agent ended the episode, as when verl's tool agent loop stops on a turn without tool calls);
    else it was cut off (``max_turns``: reward 0)."""
    if not messages:
        return "max_turns"
    last = messages[-1]
    if last["role"] == "user":
        return "user_stop" if is_stop(last.get("content")) else "max_turns"
    if any(c["function"]["name"] == transfer_tool for m in messages for c in m.get("tool_calls") or []):
        return "agent_stop"
    return "agent_stop" if not last.get("tool_calls") else "max_turns"
