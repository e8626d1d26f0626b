"""ctu's templates carry ``{% generation %}`` markers: Hugging Face's assistant-token mask (what TRL's
``assistant_only_loss`` trains on) equals ctu's own loss mask, and the markers add no text."""

from __future__ import annotations

import re

import pytest

from ctu.domains import get_domain
from ctu.episode.data.conversations import gold_conversation
from ctu.episode.data.sft import to_openai
from ctu.episode.env import agent_view
from ctu.rollout.chat import BUILTIN_TEMPLATES, ChatFormat
from ctu.train.demos import conversation_sample


def conversations(name: str, n: int = 4):
    domain = get_domain(name)
    return [gold_conversation(domain, task) for task in domain.split("train")[:n]]


def hf_render(tokenizer, template: str, record: dict):
    """The exported record as TRL renders it: every message as written (``weight`` included), the tools."""
    return tokenizer.apply_chat_template(record["messages"], tools=record["tools"], chat_template=template,
                                         tokenize=True, return_dict=True, return_assistant_tokens_mask=True)


@pytest.mark.parametrize("template", sorted(BUILTIN_TEMPLATES))
def test_builtin_templates_mark_assistant_turns_for_assistant_only_training(template):
    text = BUILTIN_TEMPLATES[template].read_text()
    assert "{%- generation %}" in text and "{%- endgeneration %}" in text


@pytest.mark.parametrize("template", sorted(BUILTIN_TEMPLATES))
@pytest.mark.parametrize("name", ["mini", "retail", "airline", "telecom"])  # telecom: the user's own device actions
def test_assistant_tokens_mask_is_ctus_loss_mask_and_markers_render_no_text(chat_format, template, name):
    chat = ChatFormat(chat_format.tokenizer, template)
    for conversation in conversations(name):
        record = to_openai(conversation)
        assert any(m.get("weight") == 0 for m in record["messages"])  # the greeting: not trained
        out = hf_render(chat.tokenizer, chat.template, record)
        ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
        # tracked (markers active) and plain rendering give the same text, and it is ctu's own render
        plain = chat.tokenizer.apply_chat_template(record["messages"], tools=record["tools"],
                                                   chat_template=chat.template, tokenize=False)
        assert plain == chat.render(agent_view(record["messages"]), record["tools"])  # what the agent sees
        unmarked = ChatFormat(chat.tokenizer, None)
        unmarked.template = re.sub(r"\{%-? *(end)?generation *-?%\}", "", chat.template)  # the markers taken out
        assert "generation %}" not in unmarked.template
        assert unmarked.render(agent_view(record["messages"]), record["tools"]) == plain
        assert ids == chat.encode(plain)
        sample = conversation_sample(chat, record["messages"], record["tools"])
        ctu_mask = [0, *sample.mask]  # the sample's mask is over next-token positions
        n = len(sample.ids)
        assert ids[:n] == sample.ids, conversation.task_id
        assert mask[:n] == ctu_mask, conversation.task_id
        assert not any(mask[n:])  # what follows the last assistant turn (the user's goodbye) is not trained
        assert sum(mask) == sum(ctu_mask) > 0


def test_a_weight_0_assistant_turn_is_left_out_of_the_mask_wherever_it_stands(chat_format):
    chat = ChatFormat(chat_format.tokenizer, "hermes")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "first answer"}, {"role": "user", "content": "again"},
                {"role": "assistant", "content": "second answer"}]
    weighted = [*messages[:2], {**messages[2], "weight": 0}, *messages[3:]]
    full = hf_render(chat.tokenizer, chat.template, {"messages": messages, "tools": None})
    skipped = hf_render(chat.tokenizer, chat.template, {"messages": weighted, "tools": None})
    assert skipped["input_ids"] == full["input_ids"]
    first = chat.encode(chat.render_assistant_text(messages[2]))
    assert sum(full["assistant_masks"]) - sum(skipped["assistant_masks"]) == len(first)
    ctu = conversation_sample(chat, weighted, [])
    n = len(ctu.ids)
    assert skipped["input_ids"][:n] == ctu.ids and skipped["assistant_masks"][:n] == [0, *ctu.mask]
