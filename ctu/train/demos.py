"""Supervised warm-start data: conversations tokenized exactly as rollouts are.

A conversation becomes one sample: the prompt is every message before the first trained assistant turn
(rendered with the tools and the generation prompt), each assistant turn is the template's text for it through
its end-of-turn token (loss mask 1; 0 for an assistant message with ``weight: 0``), and the messages between
turns are observation ids (mask 0) — what a rollout appends. Trailing messages after the last assistant turn
carry nothing to train on and are left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ctu.data.conversations import DataError, gold_conversations, gold_turns
from ctu.env import agent_view
from ctu.train.update import Sample, to_sample

__all__ = ["conversation_sample", "file_samples", "gold_samples", "gold_turns", "warm_start_samples"]


def conversation_sample(chat, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> Sample:
    messages = agent_view(list(messages))  # the agent never sees the user's own tool calls (dual control)
    trained = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and m.get("weight", 1) != 0]
    if not trained:
        raise ValueError("no assistant turn to train on")
    if trained[0] == 0:
        raise ValueError("the conversation starts with an assistant turn: no prompt before it")
    prompt = chat.prompt_ids(messages[: trained[0]], tools)
    response: list[int] = []
    mask: list[int] = []
    i = trained[0]
    while i <= trained[-1]:
        if messages[i].get("role") == "assistant":
            ids = chat.encode(chat.render_assistant_text(messages[i]))
            response += ids
            mask += [int(messages[i].get("weight", 1) != 0)] * len(ids)
            i += 1
            continue
        j = i
        while messages[j].get("role") != "assistant":
            j += 1
        ids = chat.observation_ids(messages[i:j])
        response += ids
        mask += [0] * len(ids)
        i = j
    return to_sample(prompt, response, mask, [0.0] * len(mask), 0.0)


def gold_samples(chat, domain, tasks) -> list[Sample]:
    """Token sequences of gold demonstrations (for the supervised warm start), built like rollouts."""
    return [conversation_sample(chat, c.messages, c.tools) for c in gold_conversations(domain, list(tasks))]


def file_samples(chat, path: str) -> list[Sample]:
    """Samples of every conversation in an OpenAI chat JSONL or sharegpt file; errors name the file and line."""
    from ctu.data.sft import read_conversations

    samples = []
    for conversation in read_conversations(path):
        try:
            samples.append(conversation_sample(chat, conversation.messages, conversation.tools))
        except ValueError as exc:
            raise DataError(f"{path}:{conversation.extra.get('line')}: {exc}") from None
    return samples


def warm_start_samples(chat, domains, sft_data: str | None = None) -> list[Sample]:
    """The warm start's data: the file ``sft_data`` when given, else every domain's gold demonstrations of its
    train split (all tasks if it has none)."""
    if sft_data:
        return file_samples(chat, sft_data)
    return [s for d in domains for s in gold_samples(chat, d, d.split("train") if "train" in d.splits else d.tasks)]
