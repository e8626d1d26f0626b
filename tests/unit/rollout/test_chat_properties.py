"""Property tests of the token-in-token-out path over random conversations, with the real SmolLM2 tokenizer.

The sequence a rollout builds (prompt ids, each assistant turn's text as the model generates
it, observation ids) is compared with the template's render of the whole conversation:
- ctu hermes and Qwen2.5 are prefix-preserving: same text always, same ids unless an assistant
  turn starts with whitespace (then BPE may merge it with the header's newline in the whole
  render: the rollout keeps the ids the model sampled, which decode to the same text);
- Qwen3 is prefix-preserving only within one user query with reasoning in every turn (thinking
  on) or for a single final turn; otherwise the whole render differs from the appended text by
  exactly the think blocks Qwen3 drops.
"""

import json
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ctu.engines.hf.models import smollm2_tokenizer_dir
from ctu.rollout.chat import ChatFormat, TokenSequence

TOOLS = [{"type": "function", "function": {"name": "get_order", "description": "Look up an order.", "parameters": {
    "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}},
         {"type": "function", "function": {"name": "note", "description": "Write \"notes\".\nTwo lines.",
                                           "parameters": {"type": "object", "properties": {}}}}]
TEMPLATES = {"hermes": None, "compact": "compact", "qwen2_5": "fixtures/templates/qwen2_5.jinja",
             "qwen3": "fixtures/templates/qwen3.jinja"}
HEADER = "<|im_start|>assistant\n"
THINK = re.compile(r"<think>\n.*?\n</think>\n\n", re.S)


@pytest.fixture(scope="module")
def formats():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    out = {(name, False): ChatFormat(tokenizer, path) for name, path in TEMPLATES.items()}
    out["qwen3", True] = ChatFormat(tokenizer, TEMPLATES["qwen3"], enable_thinking=True)
    return out


# -- strategies ------------------------------------------------------------------------------
# what a model could write: any assigned code point (newlines, tabs, quotes, unicode) but "|",
# so no special-token markup (a sampled special token ends generation instead)
# (control characters but newline and tab are left out: the SmolLM2 vocabulary lacks some of their
# bytes, which it then drops; unassigned code points do not round-trip either)
raw_text = st.text(alphabet=st.characters(exclude_categories=("Cs", "Cn", "Co", "Cc"), max_codepoint=0x2FFFF,
                                          include_characters="\n\t", exclude_characters="|"),
                   max_size=30)
text = st.one_of(st.just(""), raw_text.map(str.strip), raw_text, st.sampled_from([
    '{"a": "b\\n", "q": "\\"x\\""}', "Quote \"x\" and 'y'", "línea\nnueva ✓ 中文 🎉", "done.", "  indented",
    "\n\nafter blank lines", "Error: Order not found", "tab\there", "<tool_response>\nfake\n</tool_response>"]))
json_value = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), raw_text,
                                    st.sampled_from(['say "hi"\nbye', "\\", "\u00e9\u4e2d"])),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(raw_text, inner, max_size=3),
                          max_leaves=6)
arguments = st.dictionaries(st.sampled_from(["order_id", "note", "n", "with \"quote\"", "ключ"]), json_value, max_size=3)


@st.composite
def arguments_as_sent(draw):
    """OpenAI format: a JSON string (sometimes compact, sometimes broken as a model may write it), or an object."""
    args = draw(arguments)
    kind = draw(st.sampled_from(["json", "compact", "object", "broken"]))
    if kind == "json":
        return json.dumps(args, ensure_ascii=draw(st.booleans()))
    if kind == "compact":
        return json.dumps(args, separators=(",", ":"))
    return args if kind == "object" else '{"order_id": "W1'


def parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def reasoning(draw):
    body = draw(raw_text.map(lambda s: s.strip()).filter(bool) | st.just("step 1\nstep 2"))
    return f"<think>\n{body}\n</think>\n\n"


@st.composite
def conversations(draw, think=False, one_query=False, always_think=False, calls=True):
    """Legal conversations: system? user (assistant (tool+ user? | user))* assistant?"""
    msgs = [{"role": "system", "content": draw(text)}] if draw(st.booleans()) else []
    msgs.append({"role": "user", "content": draw(text)})
    n_turns = draw(st.integers(1, 4))
    for turn in range(n_turns):
        content = draw(text)
        if always_think or (think and draw(st.booleans())):
            content = reasoning(draw) + content.lstrip("\n")
        msg = {"role": "assistant", "content": content}
        n_calls = draw(st.integers(0, 3)) if calls else 0
        if one_query and turn < n_turns - 1:
            n_calls = max(n_calls, 1)  # the user only speaks once: every turn but the last calls tools
        if n_calls or draw(st.booleans()):
            msg["tool_calls"] = [{"id": f"c{turn}{i}", "type": "function", "function": {
                "name": draw(st.sampled_from(["get_order", "note"])), "arguments": draw(arguments_as_sent())}}
                for i in range(n_calls)]  # sometimes an empty list
        msgs.append(msg)
        if turn == n_turns - 1 and draw(st.booleans()):
            break  # the conversation ends with the assistant
        for i in range(n_calls):
            result = draw(st.one_of(text, st.just("Error: order W1 not found"), st.just("")))
            msgs.append({"role": "tool", "tool_call_id": f"c{turn}{i}", "name": "get_order", "content": result})
        if not one_query and (not n_calls or draw(st.booleans())):
            msgs.append({"role": "user", "content": draw(text)})
    return msgs, draw(st.sampled_from([TOOLS, None, []]))


# -- the rollout's way ------------------------------------------------------------------------
def appended(chat: ChatFormat, msgs, tools):
    """The sequence a rollout builds: the prompt, each assistant turn as generated, observations."""
    first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    seq = TokenSequence.start(chat.prompt_ids(msgs[:first], tools))
    turns = []
    i = first
    while i < len(msgs):
        turn = chat.render_assistant_text(msgs[i])
        ids = chat.encode(turn)
        seq.add_generated(ids, [-0.25] * len(ids))
        turns.append(turn)
        j = i + 1
        while j < len(msgs) and msgs[j]["role"] != "assistant":
            j += 1
        if j > i + 1:
            seq.add_observation(chat.observation_ids(msgs[i + 1:j]))
        i = j
    return seq, turns


def whole(chat: ChatFormat, msgs, tools) -> str:
    """The template's render of everything at once, cut where the rollout's sequence ends."""
    if msgs[-1]["role"] == "assistant":
        text = chat.render(msgs, tools, add_generation_prompt=False)
        # the template's newline after the last end-of-turn belongs to the next observation
        assert text.endswith(chat.end_of_turn + "\n")
        return text[:-1]
    return chat.render(msgs, tools, add_generation_prompt=True)


def check_mask(chat: ChatFormat, seq: TokenSequence, turns):
    assert len(seq.loss_mask) == len(seq.response_ids) == len(seq.logprobs)
    spans = seq.assistant_spans()
    assert len(spans) == len(turns)
    generated = {i for start, end in spans for i in range(start, end)}
    assert {i for i, m in enumerate(seq.loss_mask) if m} == generated  # no observation id is masked 1
    for (start, end), turn in zip(spans, turns, strict=True):
        assert chat.tokenizer.decode(seq.response_ids[start:end]) == turn  # the turn's raw text back
        assert seq.response_ids[end - 1] in chat.stop_token_ids  # the end-of-turn token is trained on
        assert chat.stop_token_ids[0] not in seq.response_ids[start:end - 1]
    for i, (lp, m) in enumerate(zip(seq.logprobs, seq.loss_mask, strict=True)):
        assert (lp == -0.25) if m else (lp == 0.0), i
    assert TokenSequence(seq.prompt_ids, seq.response_ids, seq.loss_mask, seq.logprobs).assistant_spans() == spans


def check_segments(chat: ChatFormat, seq: TokenSequence, expected: str):
    """Per segment (prompt, each sampled turn, each observation): its ids are its own text's ids,
    and the texts put together are the whole render."""
    cuts = sorted({0, len(seq.response_ids), *(i for span in seq.assistant_spans() for i in span)})
    segments = [seq.prompt_ids] + [seq.response_ids[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
    texts = [chat.tokenizer.decode(ids) for ids in segments]
    for ids, segment in zip(segments, texts, strict=True):
        assert chat.encode(segment) == ids
    assert "".join(texts) == expected


def starts_with_space(turns) -> bool:
    return any(t[:1].isspace() for t in turns)


# -- properties ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hermes", "qwen2_5"])
@settings(max_examples=60, deadline=None)
@given(case=conversations(think=True))
def test_prefix_preserving_templates_append_to_the_whole_render(formats, name, case):
    msgs, tools = case
    chat = formats[name, False]
    seq, turns = appended(chat, msgs, tools)
    expected = whole(chat, msgs, tools)
    check_segments(chat, seq, expected)
    if not starts_with_space(turns):  # else BPE may merge the turn's whitespace with the header's "\n"
        assert seq.all_ids() == chat.encode(expected)
    check_mask(chat, seq, turns)


@settings(max_examples=40, deadline=None)
@given(case=conversations(one_query=True, always_think=True))
def test_qwen3_thinking_is_prefix_preserving_within_one_query(formats, case):
    """One user query, reasoning in every turn: Qwen3 keeps every think block, so nothing is dropped."""
    msgs, tools = case
    assume(is_query(next(m for m in msgs if m["role"] == "user")))  # the one user message is a real query
    chat = formats["qwen3", True]
    seq, turns = appended(chat, msgs, tools)
    expected = whole(chat, msgs, tools)
    check_segments(chat, seq, expected)
    assert seq.all_ids() == chat.encode(expected)  # each turn opens with <think>: no whitespace boundary
    check_mask(chat, seq, turns)


@settings(max_examples=30, deadline=None)
@given(system=st.booleans(), user=text, content=text, tools=st.sampled_from([TOOLS, None]),
       args=st.lists(arguments, max_size=2))
def test_qwen3_without_thinking_is_prefix_preserving_for_a_single_final_turn(formats, system, user, content, tools,
                                                                            args):
    chat = formats["qwen3", False]
    msgs = [{"role": "system", "content": "s"}] * system + [{"role": "user", "content": user}]
    assume(is_query(msgs[-1]))  # a user message that is a wrapped tool response is no query to Qwen3
    msgs.append({"role": "assistant", "content": content, "tool_calls": [
        {"type": "function", "function": {"name": "note", "arguments": a}} for a in args]})
    seq, turns = appended(chat, msgs, tools)
    expected = whole(chat, msgs, tools)
    check_segments(chat, seq, expected)
    # no id equality here: the prompt ends with "</think>\n\n", which SmolLM2's GPT-2-style
    # pre-tokenizer encodes as one token at the end of a text but as two before a non-space
    # (Qwen's own pre-tokenizer keeps "\n\n" whole either way)
    check_mask(chat, seq, turns)


def is_query(message) -> bool:
    content = message["content"]
    return message["role"] == "user" and not (content.startswith("<tool_response>")
                                              and content.endswith("</tool_response>"))


def qwen3_keeps_think(msgs, index) -> bool:
    """Qwen3's rule: a turn keeps its think block if it follows the last user query (a user message
    that is not a wrapped tool response; none: the last message) and is the final message or has reasoning."""
    last_query = max((i for i, m in enumerate(msgs) if is_query(m)), default=len(msgs) - 1)
    content = msgs[index]["content"]
    thought = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n") if "</think>" in content else ""
    return index > last_query and (index == len(msgs) - 1 or bool(thought))


@pytest.mark.parametrize("thinking", [False, True])
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_qwen3_whole_render_is_the_appended_text_minus_the_think_blocks_it_drops(formats, thinking, data):
    """Thinking off: the model samples after an empty think block in the prompt. Thinking on: it writes
    <think>…</think> itself (or the template gives its final turn an empty one). Either way every
    appended assistant turn opens with a think block; the whole render drops exactly those Qwen3
    strips and is otherwise the same text, but for one more quirk: a dropped turn whose content has
    no think block of its own keeps the leading newlines the final-turn form strips."""
    chat = formats["qwen3", thinking]
    msgs, tools = data.draw(conversations(think=thinking))
    seq, turns = appended(chat, msgs, tools)
    expected = whole(chat, msgs, tools)
    pieces = chat.tokenizer.decode(seq.all_ids()).split(HEADER)
    assistant_indices = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    assert len(pieces) == 1 + len(assistant_indices) + (msgs[-1]["role"] != "assistant")
    for k, index in enumerate(assistant_indices, start=1):
        assert THINK.match(pieces[k]), pieces[k]
        if not qwen3_keeps_think(msgs, index):
            pieces[k] = THINK.sub("", pieces[k], count=1)
            content = msgs[index]["content"]
            if "</think>" not in content:  # the final-turn form lstrips newlines; this form keeps them
                pieces[k] = content[: len(content) - len(content.lstrip("\n"))] + pieces[k]
    assert HEADER.join(pieces) == expected
    check_mask(chat, seq, turns)
    if not thinking:  # the empty think blocks are prompt text (mask 0), never sampled
        assert all("<think>" not in t for t in turns)


@pytest.mark.parametrize("key", [("hermes", False), ("qwen2_5", False), ("qwen3", False), ("qwen3", True)])
@settings(max_examples=25, deadline=None)
@given(observation=st.lists(st.fixed_dictionaries({"role": st.sampled_from(["tool", "user"]), "content": text}),
                            max_size=4))
def test_observations_start_after_the_end_of_turn_and_end_with_the_generation_prompt(formats, key, observation):
    chat = formats[key]
    obs = chat.observation_text(observation)
    assert obs.startswith("\n")  # the template's newline after <|im_end|> (verl #3720)
    assert obs.endswith(chat.render([{"role": "user", "content": "x"}], None, True).split("x" + chat.end_of_turn)[-1])
    assert chat.observation_ids(observation) == chat.encode(obs)
    assert obs.count("<|im_start|>") == 1 + sum(1 for i, m in enumerate(observation) if m["role"] == "user"
                                                 or i == 0 or observation[i - 1]["role"] != "tool")


@settings(max_examples=30, deadline=None)
@given(case=conversations(think=True))
def test_ctu_hermes_renders_as_qwen2_5_does_given_a_system_prompt(formats, case):
    msgs, tools = case
    if msgs[0]["role"] != "system":
        msgs = [{"role": "system", "content": "policy"}, *msgs]
    calls = [c["function"]["arguments"] for m in msgs for c in m.get("tool_calls", [])]
    assume(all(not isinstance(a, str) or parses(a) for a in calls))  # broken JSON: Qwen2.5 quotes it, ctu does not
    for add in (False, True):
        assert formats["hermes", False].render(msgs, tools, add) == formats["qwen2_5", False].render(msgs, tools, add)
