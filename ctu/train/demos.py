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
        episode = Episode(domain, task, ScriptedUser().start(domain, task), max_turns=len(task.actions) + 2)
        messages = asyncio.run(episode.reset())
        ids = chat.prompt_ids(messages, domain.openai_tools())
        response, mask = [], []
        final = (f"The order status is {', '.join(task.communicate_info)}." if task.communicate_info
                 else "Done, your request is complete.")
        turns = [AgentTurn(tool_calls=(ToolCall(a.name, dict(a.arguments)),)) for a in task.actions]
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
