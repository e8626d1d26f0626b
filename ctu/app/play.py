"""``ctu play``: one episode in the terminal, with a model or a human as the agent."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any

from ctu.domains.base import Domain, Task
from ctu.episode.env import AgentTurn, Episode, ToolCall
from ctu.episode.parsing import parse_model_output
from ctu.episode.users.base import UserSimulator

HUMAN_HELP = (
    "You are the agent. Type a message for the user, or a tool call in any format the parser reads, e.g.\n"
    '  {"name": "get_order", "arguments": {"order_id": "O1001"}}\n'
    "Type /tools to list the tools, /quit to stop."
)


def format_message(msg: dict[str, Any]) -> str:
    role = msg["role"]
    if role == "system":
        return f"[system prompt: {len(msg.get('content') or '')} characters]"
    if role == "tool":
        return f"  tool {msg.get('name', '')} -> {msg.get('content', '')}"
    text = msg.get("content") or ""
    calls = msg.get("tool_calls") or []
    parts = [f"{role}: {text}"] if text or not calls else []
    parts += [f"{role} calls {c['function']['name']}({c['function']['arguments']})" for c in calls]
    return "\n".join(parts)


async def play_human(domain: Domain, task: Task, user: UserSimulator, read: Callable[[str], str] | None = None,
                     write: Callable[[str], None] = print, max_turns: int = 30) -> Episode:
    import builtins

    read = read or builtins.input  # looked up at call time, so a patched input() is the one used
    episode = Episode(domain, task, user.start(domain, task), max_turns=max_turns)
    for msg in await episode.reset():
        write(format_message(msg))
    write(HUMAN_HELP)
    while not episode.done:
        try:
            text = read("agent> ")
        except EOFError:
            break
        if text.strip() == "/quit":
            break
        if text.strip() == "/tools":
            for tool in domain.tools:
                write(f"  {tool.name}: {json.dumps(tool.parameters['properties'])}")
            continue
        parsed = parse_model_output(text)
        turn = AgentTurn(content=parsed.content, tool_calls=tuple(ToolCall(c.name, c.arguments) for c in parsed.tool_calls))
        result = await episode.step(turn)
        for msg in result.observations:
            write(format_message(msg))
    reward = episode.reward()
    write(f"episode ended: {episode.termination or 'quit'}; reward {reward.reward:.1f} "
          f"{json.dumps(reward.components)}" + (f"; {'; '.join(reward.reasons)}" if reward.reasons else ""))
    return episode


def print_trajectory(trajectory, write: Callable[[str], None] = print) -> None:
    for msg in trajectory.messages:
        write(format_message(msg))
    write(f"episode ended: {trajectory.stop_reason} ({trajectory.termination}); reward {trajectory.reward:.1f} "
          f"{json.dumps(trajectory.components)}; turns {trajectory.turns}; parse failures {trajectory.parse_failures}")
    if trajectory.reasons:
        write("why: " + "; ".join(trajectory.reasons))


def run_human(domain: Domain, task: Task, user: UserSimulator, max_turns: int) -> int:
    asyncio.run(play_human(domain, task, user, max_turns=max_turns))
    sys.stdout.flush()
    return 0
