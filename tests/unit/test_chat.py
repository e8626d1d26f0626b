"""Token-in-token-out: appended sequences vs whole-conversation renders, with the real SmolLM2 tokenizer."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctu.chat import ChatFormat, TemplateError, TokenSequence
from ctu.models import smollm2_tokenizer_dir

TOOLS = [{"type": "function", "function": {"name": "get_order", "description": "Look up an order.", "parameters": {
    "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}]
TEMPLATES = {"hermes": None, "qwen2_5": "fixtures/templates/qwen2_5.jinja", "qwen3": "fixtures/templates/qwen3.jinja"}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())


@pytest.fixture(scope="module")
def formats(tokenizer):
    return {name: ChatFormat(tokenizer, path) for name, path in TEMPLATES.items()}


# text that a model could write: unicode, JSON-ish, newlines; never special-token markup
safe_text = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Cn", "Co"), max_codepoint=0x2FFFF,
                                          blacklist_characters="<|>"), max_size=40)  # the GGUF tokenizer cannot round-trip unassigned code points
content_text = st.one_of(st.just(""), safe_text.map(lambda s: s.strip()),
                         st.sampled_from(['{"a": "b\\n"}', 'Quote "x" and \'y\'', "línea\nnueva", "done."]))
args = st.dictionaries(st.sampled_from(["order_id", "note", "n"]),
                       st.one_of(safe_text, st.integers(-99, 99), st.booleans()), max_size=3)


@st.composite
def conversations(draw, with_think=False):
    msgs = [{"role": "system", "content": draw(content_text) or "policy"},
            {"role": "user", "content": draw(content_text)}]
    for turn in range(draw(st.integers(1, 4))):
        n_calls = draw(st.integers(0, 3))
        text = draw(content_text)
        if with_think and draw(st.booleans()):
            text = f"<think>\n{draw(safe_text).strip() or 'hmm'}\n</think>\n\n{text}"
        msg = {"role": "assistant", "content": text}
        if n_calls:
            msg["tool_calls"] = [{"id": f"c{turn}{i}", "type": "function",
                                  "function": {"name": "get_order", "arguments": draw(args)}} for i in range(n_calls)]
        msgs.append(msg)
        if n_calls:
            for i in range(n_calls):
                result = draw(st.one_of(content_text, st.just("Error: Order not found")))
                msgs.append({"role": "tool", "tool_call_id": f"c{turn}{i}", "content": result})
        else:
            msgs.append({"role": "user", "content": draw(content_text)})
    return msgs


def appended(chat: ChatFormat, msgs):
    """Build the sequence the rollout builds: prompt, sampled turns verbatim, observations."""
    first_assistant = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    seq = TokenSequence.start(chat.prompt_ids(msgs[:first_assistant], TOOLS))
    turns = []
    i = first_assistant
    while i < len(msgs):
        text = chat.render_assistant_text(msgs[i])
        ids = chat.encode(text)
        seq.add_generated(ids, [-0.5] * len(ids))
        turns.append(text)
        j = i + 1
        while j < len(msgs) and msgs[j]["role"] != "assistant":
            j += 1
        if j > i + 1:
            seq.add_observation(chat.observation_ids(msgs[i + 1:j]))
        i = j
    return seq, turns


@pytest.mark.parametrize("name", ["hermes", "qwen2_5"])
@settings(max_examples=40, deadline=None)
@given(msgs=conversations())
def test_appended_sequence_equals_the_whole_render_for_prefix_preserving_templates(formats, name, msgs):
    chat = formats[name]
    seq, turns = appended(chat, msgs)
    whole = chat.encode(chat.render(msgs, TOOLS, add_generation_prompt=True))
    assert seq.all_ids() == whole
    check_mask(chat, seq, turns)


@pytest.mark.parametrize("thinking", [False, True])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_qwen3_differs_only_by_the_thinking_it_strips(tokenizer, thinking, data):
    """Thinking off: the model samples after an empty think block that later renders drop. Thinking on:
    it writes <think>…</think> itself, and the template strips it from turns before the last user query."""
    chat = ChatFormat(tokenizer, TEMPLATES["qwen3"], enable_thinking=thinking)
    msgs = data.draw(conversations(with_think=thinking))
    seq, turns = appended(chat, msgs)
    ours = chat.tokenizer.decode(seq.all_ids())
    whole = chat.render(msgs, TOOLS, add_generation_prompt=True)
    think = re.compile(r"<think>.*?</think>\n\n", re.S)
    assert think.sub("", ours) == think.sub("", whole)
    check_mask(chat, seq, turns)


def check_mask(chat, seq, turns):
    assert len(seq.loss_mask) == len(seq.response_ids) == len(seq.logprobs)
    spans = seq.assistant_spans()
    assert len(spans) == len(turns)
    generated = {i for start, end in spans for i in range(start, end)}
    assert {i for i, m in enumerate(seq.loss_mask) if m} == generated
    for (start, end), text in zip(spans, turns, strict=True):
        assert chat.tokenizer.decode(seq.response_ids[start:end]) == text
        assert seq.response_ids[end - 1] in chat.stop_token_ids  # the end-of-turn token is trained on
    assert all(lp == 0.0 for lp, m in zip(seq.logprobs, seq.loss_mask, strict=True) if not m)


def test_observations_start_right_after_the_end_of_turn_token(formats):
    for chat in formats.values():
        text = chat.observation_text([{"role": "user", "content": "next"}])
        assert text.startswith("\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n")


def test_qwen3_thinking_is_off_by_default_and_configurable(tokenizer):
    off = ChatFormat(tokenizer, TEMPLATES["qwen3"])
    on = ChatFormat(tokenizer, TEMPLATES["qwen3"], enable_thinking=True)
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert off.render(msgs, None, True).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.render(msgs, None, True).endswith("<|im_start|>assistant\n")
    # the flag reaches observation renders too
    assert off.observation_text([{"role": "user", "content": "x"}]).endswith("<think>\n\n</think>\n\n")
    assert on.observation_text([{"role": "user", "content": "x"}]).endswith("<|im_start|>assistant\n")


def test_edge_cases_do_not_crash(formats, tokenizer):
    for chat in formats.values():
        with pytest.raises(ValueError, match="empty conversation|at least one message"):
            chat.prompt_ids([], None)  # a clear error, not an IndexError inside a template
        assert chat.render_assistant_text({"role": "assistant", "content": ""}).endswith("<|im_end|>")
        assert chat.decode_generated([]) == ""
        assert chat.decode_generated(list(chat.stop_token_ids)) == ""
        assert chat.observation_ids([{"role": "tool", "content": ""}])
    seq = TokenSequence.start([])
    seq.add_generated([], [])
    assert seq.assistant_spans() == [] and seq.all_ids() == []
    with pytest.raises(ValueError):
        seq.add_generated([1], [])
    with pytest.raises(ValueError):
        formats["hermes"].observation_ids([{"role": "assistant", "content": "x"}])
    with pytest.raises(TemplateError, match="does not exist"):
        ChatFormat(tokenizer, "no/such/template.jinja")


def test_tokenizer_without_tool_template_gets_ctu_hermes(formats):
    assert formats["hermes"].template_name == "ctu hermes template"
    assert formats["hermes"].stop_token_ids == (2,)
