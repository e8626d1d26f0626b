"""Supervised data files: OpenAI chat JSONL and LLaMA-Factory sharegpt, written and read back losslessly.

**OpenAI JSONL**: one object per line, ``{"messages": [...], "tools": [...], "domain": ..., "task_id": ...}``;
messages as the environment writes them (assistant ``tool_calls`` with JSON-string arguments, ``tool`` results
with ``tool_call_id``); the agent's greeting carries ``weight: 0`` (not trained). ``domain``, ``task_id`` and
``termination`` are ctu's (provenance; ``ctu score`` reads them).

**sharegpt** (LLaMA-Factory, ``formatting: sharegpt``): one object per line with ``conversations`` alternating
``human``/``observation`` (odd positions) and ``gpt``/``function_call`` (even positions), ``system``, and
``tools`` (a JSON string of the OpenAI tool schemas). A ``function_call`` value is ``{"name", "arguments"}`` (a
list of them for several calls in one turn); an ``observation`` holds the tool result (a JSON list of results
after several calls). Conversations start at the first user message and end at the last assistant turn, as
LLaMA-Factory requires; ctu keeps the agent's greeting in an ``opening`` column (LLaMA-Factory drops unknown
columns), so reading the file back gives the same tokens. Text written beside tool calls in the same turn has
no place in sharegpt and is dropped (counted by :func:`write_conversations`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctu.config.atomic import atomic_open, atomic_write_text, check_target
from ctu.episode.data.conversations import Conversation, DataError, untrained_prefix
from ctu.episode.data.jsonfile import TOO_DEEP, load, records
from ctu.episode.transcripts import TranscriptError, check_messages

FORMATS = ("openai", "sharegpt")
SHAREGPT_COLUMNS = {"messages": "conversations", "system": "system", "tools": "tools"}


# -- writing ---------------------------------------------------------------------------------------
def _call_value(message: dict[str, Any]) -> Any:
    calls = []
    for call in message["tool_calls"]:
        fn = call.get("function", call)
        arguments = fn.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                pass  # what the model wrote, kept as a string
        calls.append({"name": fn.get("name", ""), "arguments": arguments})
    return calls[0] if len(calls) == 1 else calls


def to_sharegpt(conversation: Conversation) -> tuple[dict[str, Any], int]:
    """(the sharegpt record, how many assistant texts beside tool calls were dropped)."""
    messages = conversation.messages
    system = messages[0]["content"] if messages and messages[0].get("role") == "system" else ""
    start = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    if start is None or last < start:
        raise DataError(f"task {conversation.task_id}: no user message followed by an assistant turn")
    opening = [m for m in messages[1 if system else 0: start] if m.get("role") != "system"]
    turns, dropped, i = [], 0, start
    while i <= last:
        m = messages[i]
        if m["role"] == "tool":
            j = i
            while j <= last and messages[j]["role"] == "tool":
                j += 1
            results = [messages[k].get("content") or "" for k in range(i, j)]
            turns.append({"from": "observation", "value": results[0] if len(results) == 1 else json.dumps(results)})
            i = j
            continue
        if m["role"] == "assistant" and m.get("tool_calls"):
            dropped += bool((m.get("content") or "").strip())
            turns.append({"from": "function_call", "value": json.dumps(_call_value(m), ensure_ascii=False)})
        elif m["role"] == "assistant":
            turns.append({"from": "gpt", "value": m.get("content") or ""})
        elif m["role"] == "user":
            turns.append({"from": "human", "value": m.get("content") or ""})
        else:
            raise DataError(f"task {conversation.task_id}: a {m['role']!r} message inside the conversation has no "
                            "sharegpt role")
        i += 1
    for n, turn in enumerate(turns):
        if (turn["from"] in ("human", "observation")) != (n % 2 == 0):
            raise DataError(f"task {conversation.task_id}: sharegpt needs human/observation and gpt/function_call "
                            f"turns to alternate; turn {n} is {turn['from']} (a user who acts on their own "
                            "device between turns, as telecom's does, has no sharegpt role); use --format openai, which holds "
                            "any conversation")
    record = {"conversations": turns, "system": system, "tools": json.dumps(conversation.tools, ensure_ascii=False),
              "opening": opening, "domain": conversation.domain, "task_id": conversation.task_id}
    return record, dropped


def to_openai(conversation: Conversation) -> dict[str, Any]:
    return {"messages": conversation.messages, "tools": conversation.tools, "domain": conversation.domain,
            "task_id": conversation.task_id, "termination": conversation.termination}


def dataset_info_entry(file_name: str) -> dict[str, Any]:
    """LLaMA-Factory's ``dataset_info.json`` entry for a sharegpt file written here."""
    return {"file_name": file_name, "formatting": "sharegpt", "columns": dict(SHAREGPT_COLUMNS)}


def read_dataset_info(path: Path) -> dict[str, Any]:
    """LLaMA-Factory's ``dataset_info.json`` (empty if absent); anything but a JSON object is an error naming it."""
    if not check_target(path).exists():
        return {}
    entries = load(path)
    if not isinstance(entries, dict):
        raise DataError(f"{path}: expected a JSON object of LLaMA-Factory datasets, got {type(entries).__name__}; "
                        "fix or move it")
    return entries


def write_conversations(path: str | Path, conversations: Sequence[Conversation], fmt: str,
                        name: str | None = None, allow_empty: bool = False) -> dict[str, Any]:
    """Write ``conversations`` as ``fmt`` (one JSON object per line). sharegpt also adds its entry, named
    ``name`` (default: the file's stem), to ``dataset_info.json`` beside the file (other entries kept).
    Every check (the records, ``dataset_info.json``, the targets) comes before any file is touched; no
    conversations is an error unless ``allow_empty``."""
    if fmt not in FORMATS:
        raise DataError(f"unknown format '{fmt}' (known: {', '.join(FORMATS)}, parquet for tasks)")
    out = check_target(path)
    if not conversations and not allow_empty:
        raise DataError(f"{out}: no conversations to write; the file is left as it was")
    info_path = out.parent / "dataset_info.json"
    entries = read_dataset_info(info_path) if fmt == "sharegpt" else {}
    records, dropped = [], 0
    for conversation in conversations:  # every record first: a refused conversation touches no file
        if fmt == "sharegpt":
            record, n = to_sharegpt(conversation)
            dropped += n
        else:
            record = to_openai(conversation)
        records.append(record)
    with atomic_open(out) as f:  # the previous file stays whole until this one is
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    info: dict[str, Any] = {"path": str(out), "records": len(conversations), "format": fmt}
    if fmt == "sharegpt":
        entries[name or out.stem] = dataset_info_entry(out.name)
        atomic_write_text(info_path, json.dumps(entries, indent=2) + "\n")
        info.update(dataset_info=str(info_path), name=name or out.stem, dropped_texts=dropped)
    return info


# -- reading ---------------------------------------------------------------------------------------
def _tools(value: Any) -> list[dict[str, Any]]:
    """OpenAI tool schemas from a list or a JSON string; bare function schemas (glaive style) are wrapped."""
    if value in (None, ""):
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DataError(f"'tools' is not valid JSON ({exc.msg})") from None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise DataError("'tools' must be a list of tool schemas")
    return [t if t.get("type") == "function" and "function" in t else {"type": "function", "function": t}
            for t in value]


def _from_openai(record: dict[str, Any]) -> Conversation:
    try:
        check_messages(record.get("messages"))
    except TranscriptError as exc:
        raise DataError(str(exc)) from None
    task_id = record.get("task_id")
    return Conversation(list(record["messages"]), _tools(record.get("tools")), record.get("domain"),
                        None if task_id is None else str(task_id), record.get("termination"))


def _observations(value: str, calls: list[dict[str, Any]]) -> list[str]:
    if len(calls) > 1:
        try:
            results = json.loads(value)
        except json.JSONDecodeError:
            results = None
        if isinstance(results, list) and len(results) == len(calls) and all(isinstance(r, str) for r in results):
            return results
    return [value]


def _from_sharegpt(record: dict[str, Any]) -> Conversation:
    turns = record.get("conversations")
    if not isinstance(turns, list):
        raise DataError("field 'conversations' is missing or not a list")
    messages: list[dict[str, Any]] = []
    system = record.get("system") or ""
    if turns and isinstance(turns[0], dict) and turns[0].get("from") == "system":
        system, turns = turns[0].get("value") or "", turns[1:]
    if system:
        messages.append({"role": "system", "content": system})
    opening = record.get("opening") or []
    if not isinstance(opening, list) or not all(isinstance(m, dict) for m in opening):
        raise DataError("field 'opening' must be a list of messages")
    messages += untrained_prefix([*opening, {"role": "user"}])[:-1]
    agent_turns, call_count, calls = 0, 0, list[dict[str, Any]]()
    for n, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise DataError(f"conversations[{n}] must be an object with a string 'value'")
        role = turn.get("from")
        if (role in ("human", "observation")) != (n % 2 == 0) or role not in ("human", "observation", "gpt",
                                                                                "function_call"):
            raise DataError(f"conversations[{n}]: 'from' is {role!r}; sharegpt needs human/observation at even "
                            "indices and gpt/function_call at odd ones")
        if role == "human":
            messages.append({"role": "user", "content": turn["value"]})
        elif role == "gpt":
            agent_turns += 1
            messages.append({"role": "assistant", "content": turn["value"]})
        elif role == "function_call":
            agent_turns += 1
            try:
                value = json.loads(turn["value"])
            except json.JSONDecodeError as exc:
                raise DataError(f"conversations[{n}]: function_call value is not JSON ({exc.msg})") from None
            calls = []
            for call in value if isinstance(value, list) else [value]:
                if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                    raise DataError(f"conversations[{n}]: a function call needs a 'name'")
                call_count += 1
                arguments = call.get("arguments", {})
                text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
                calls.append({"id": f"call_{agent_turns}_{call_count}", "type": "function",
                              "function": {"name": call["name"], "arguments": text}})
            messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        else:
            for call, result in zip(calls, _observations(turn["value"], calls), strict=False):
                messages.append({"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                                 "content": result})
            if not calls:
                messages.append({"role": "tool", "content": turn["value"]})
    task_id = record.get("task_id")
    return Conversation(messages, _tools(record.get("tools")), record.get("domain"),
                        None if task_id is None else str(task_id))


def read_conversations(path: str | Path) -> list[Conversation]:
    """Every conversation of an OpenAI chat JSONL or a sharegpt file (JSON Lines or a JSON array), told apart
    per record by its ``messages`` or ``conversations`` field. Errors name the file and line."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file (expected OpenAI chat JSONL or sharegpt)")
    out = []
    for line, record in records(p):
        try:
            if not isinstance(record, dict):
                raise DataError(f"expected a JSON object, got {type(record).__name__}")
            if "messages" in record:
                conversation = _from_openai(record)
            elif "conversations" in record:
                conversation = _from_sharegpt(record)
            else:
                raise DataError("neither 'messages' (OpenAI chat) nor 'conversations' (sharegpt)")
        except DataError as exc:
            raise DataError(f"{p}:{line}: {exc}") from None
        except RecursionError:  # a value deep enough to parse, too deep to copy or re-encode
            raise DataError(f"{p}:{line}: {TOO_DEEP}") from None
        conversation.extra["line"] = line
        out.append(conversation)
    if not out:
        raise DataError(f"{p}: no conversations in the file")
    return out
