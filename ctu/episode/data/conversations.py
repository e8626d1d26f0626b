"""Conversations to train on: a domain's gold demonstrations and the successful episodes of an eval run.

A :class:`Conversation` is OpenAI chat messages (as ctu's environment writes them: the system prompt, the
agent's greeting, the user, assistant turns with ``tool_calls``, ``tool`` results) and the OpenAI tool schemas
the agent was given. The agent's greeting is part of the prompt, not a trained turn: it carries ``weight: 0``
(OpenAI's fine-tuning flag for an assistant message that is not trained).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctu.domains.base import Domain, Task
from ctu.episode.data.jsonfile import DataError, parse_line
from ctu.episode.env import AgentTurn, Episode, ToolCall
from ctu.episode.users.scripted import ScriptedUser


@dataclass(frozen=True)
class Conversation:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    domain: str | None = None
    task_id: str | None = None
    termination: str | None = None  # how the episode ended (ctu score reads it: a transfer is a normal end)
    extra: dict[str, Any] = field(default_factory=dict)


def untrained_prefix(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages before the first user message: assistant ones among them (the greeting) get ``weight: 0``."""
    out = []
    for message in messages:
        if message.get("role") == "user":
            break
        out.append({**message, "weight": 0} if message.get("role") == "assistant" else message)
    return out + messages[len(out):]


def gold_conversation(domain: Domain, task: Task, reasons: bool = False) -> Conversation:
    """The task's gold actions, one tool call per turn, then the domain's closing line (unless a transfer ended
    the call), played against the scripted user: what the supervised warm start trains on. With ``reasons``
    (``trainer.sft_reasons``), each call the domain gives a reason for (``Domain.reason``) states it first."""
    user = ScriptedUser(patience=len(task.actions) + 8)  # one reply per user-side action, and the opening
    episode = Episode(domain, task, user.start(domain, task), max_turns=len(task.actions) + 2)
    asyncio.run(episode.reset())
    turns = gold_turns(task)
    if reasons and domain.reason is not None:
        turns = [AgentTurn(domain.reason(task, t.tool_calls[0]), t.tool_calls) if t.tool_calls else t for t in turns]
    for turn in [*turns, AgentTurn(content=domain.closing_line(task))]:
        if episode.done:  # the user may end the call at any reply, its first included
            break
        asyncio.run(episode.step(turn))
    return Conversation(untrained_prefix(episode.messages), domain.openai_tools(), domain.name, task.id,
                        episode.termination)


def gold_turns(task: Task) -> list[AgentTurn]:
    """The agent's gold turns: its own gold calls, and a request for each of the user's (dual control)."""
    turns: list[AgentTurn] = []
    for action in task.actions:
        if action.requestor != "user":
            turns.append(AgentTurn(tool_calls=(ToolCall(action.name, dict(action.arguments)),)))
        elif not turns or turns[-1].content != _ask(action.name):  # one request covers repeated calls
            turns.append(AgentTurn(content=_ask(action.name)))
    return turns


def _ask(tool_name: str) -> str:
    return f"Please use {tool_name} on your phone and tell me what it shows."


def gold_conversations(domain: Domain, tasks: list[Task], reasons: bool = False) -> list[Conversation]:
    return [gold_conversation(domain, task, reasons) for task in tasks]


def trajectory_file(path: str | Path) -> Path:
    """An eval run's ``trajectories.jsonl``: the file itself, or the run directory holding it."""
    p = Path(path)
    if p.is_dir():
        p = p / "trajectories.jsonl"
    if not p.is_file():
        raise DataError(f"{p}: no such trajectory file (give an eval run's directory or its trajectories.jsonl)")
    return p


def _json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{path}:{line_no}: not valid UTF-8") from None
            if not text.strip():
                continue
            row = parse_line(path, line_no, text)
            if not isinstance(row, dict):
                raise DataError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
            yield line_no, row


def successful_conversations(path: str | Path, domain_of: Callable[[str], Domain],
                             min_reward: float = 1.0) -> tuple[list[Conversation], int]:
    """(conversations of the episodes that reached ``min_reward``, episodes read) from an eval run's
    trajectories: rejection sampling for RFT. Errored episodes never count, whatever their reward."""
    file = trajectory_file(path)
    kept, total = [], 0
    for line_no, row in _json_lines(file):
        total += 1
        for key in ("domain", "task_id", "messages", "reward"):
            if key not in row:
                raise DataError(f"{file}:{line_no}: field '{key}' is missing (not a ctu trajectory)")
        if row.get("stop_reason") == "error" or not isinstance(row["reward"], (int, float)) \
                or row["reward"] < min_reward:
            continue
        try:
            domain = domain_of(row["domain"])
        except KeyError as exc:
            raise DataError(f"{file}:{line_no}: {exc.args[0]}") from None
        kept.append(Conversation(untrained_prefix(row["messages"]), domain.openai_tools(), row["domain"],
                                 str(row["task_id"]), row.get("termination"),
                                 {"reward": row["reward"], "sample": row.get("sample", 0)}))
    return kept, total
