"""Supervised warm-start data: gold demonstrations tokenized exactly as rollouts are."""

from __future__ import annotations

import asyncio

from ctu.env import AgentTurn, Episode, ToolCall
from ctu.train.update import Sample, to_sample
from ctu.users.scripted import ScriptedUser


def gold_samples(chat, domain, tasks) -> list[Sample]:
    """Token sequences of gold demonstrations (for the supervised warm start), built like rollouts."""
    samples = []
    for task in tasks:
        user = ScriptedUser(patience=len(task.actions) + 8)  # one reply per user-side action, and the opening
        episode = Episode(domain, task, user.start(domain, task), max_turns=len(task.actions) + 2)
        messages = asyncio.run(episode.reset())
        ids = chat.prompt_ids(messages, domain.openai_tools())
        response, mask = [], []
        final = (f"The order status is {', '.join(task.communicate_info)}." if task.communicate_info
                 else "Done, your request is complete.")
        turns = gold_turns(task)
        for turn in [*turns, AgentTurn(content=final)]:
            msg = {"role": "assistant", "content": turn.content,
                   "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                  for c in turn.tool_calls]}
            generated = chat.encode(chat.render_assistant_text(msg))
            response += generated
            mask += [1] * len(generated)
            result = asyncio.run(episode.step(turn))
            if episode.done:
                break
            observation = chat.observation_ids(result.observations)
            response += observation
            mask += [0] * len(observation)
        samples.append(to_sample(ids, response, mask, [0.0] * len(mask), 0.0))
    return samples


def gold_turns(task) -> list[AgentTurn]:
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
