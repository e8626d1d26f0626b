"""Chat templating: template choice, the Qwen2.5/Qwen3 fixtures' behaviour, observations, edge cases.

Random-conversation properties live in test_chat_properties.py.
"""

import json
from pathlib import Path

import pytest

from ctu.engines.hf.models import smollm2_tokenizer_dir
from ctu.rollout.chat import ChatFormat, TemplateError, TokenSequence

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "templates"
QWEN25, QWEN3 = str(FIXTURES / "qwen2_5.jinja"), str(FIXTURES / "qwen3.jinja")
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CONVERSATION = [
    {"role": "system", "content": "You are a bot."},
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp": 21}'},
    {"role": "user", "content": "thanks"},
]
# what Qwen2.5's own template gives for CONVERSATION (its documented hermes tool format)
QWEN_TOOL_PROMPT = (
    "<|im_start|>system\nYou are a bot.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
    "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", "parameters": '
    '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n</tools>\n\n'
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n"
    '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    "<|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n"
    "<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\n")
EMPTY_THINK = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())


@pytest.fixture(scope="module")
def formats(tokenizer):
    return {"hermes": ChatFormat(tokenizer), "qwen2_5": ChatFormat(tokenizer, QWEN25),
            "qwen3": ChatFormat(tokenizer, QWEN3), "qwen3_thinking": ChatFormat(tokenizer, QWEN3, enable_thinking=True)}


# -- template choice ----------------------------------------------------------------------------
def test_a_tokenizer_without_a_tool_template_gets_ctu_hermes(formats):
    chat = formats["hermes"]
    assert chat.template_name == "ctu hermes template"
    assert chat.stop_token_ids == (2,) and chat.end_of_turn == "<|im_end|>"


def test_a_tool_aware_tokenizer_template_is_used_and_a_path_wins(tokenizer):
    from transformers import AutoTokenizer

    own = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    own.chat_template = Path(QWEN25).read_text()
    assert ChatFormat(own).template_name == "the tokenizer's own template"
    assert ChatFormat(own).render(CONVERSATION, WEATHER, True) == QWEN_TOOL_PROMPT
    own.chat_template = {"default": tokenizer.chat_template, "tool_use": Path(QWEN25).read_text()}
    assert ChatFormat(own).render(CONVERSATION, WEATHER, True) == QWEN_TOOL_PROMPT
    assert ChatFormat(own, QWEN3).template_name == QWEN3
    with pytest.raises(TemplateError, match="does not exist"):
        ChatFormat(tokenizer, "no/such/template.jinja")


@pytest.mark.parametrize(("body", "why"), [
    ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ loop.index }}{{ m.content }}<|im_end|>\n{% endfor %}"
     "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", "depending on the earlier conversation"),
    ("{{ messages | length }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
     "{% endfor %}", "changes how the earlier conversation renders"),
    ("{{ messages[7].content }}", "failed to render"),
    ("{% for m in messages %}{{ m.content }}{% endfor %}", "no end-of-turn token"),
])
def test_templates_that_cannot_be_appended_to_are_refused_by_name(tokenizer, tmp_path, body, why):
    path = tmp_path / "custom.jinja"
    path.write_text(body)
    with pytest.raises(TemplateError, match=why) as info:
        ChatFormat(tokenizer, str(path))
    assert str(path) in str(info.value)


# -- the formats -------------------------------------------------------------------------------------
def test_qwen2_5_fixture_renders_qwen_tool_prompts(formats):
    assert formats["qwen2_5"].render(CONVERSATION, WEATHER, True) == QWEN_TOOL_PROMPT
    assert formats["qwen2_5"].render(CONVERSATION[1:2], None, True) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n<|im_start|>assistant\n")


def test_ctu_hermes_is_qwen2_5_format_with_a_neutral_system_prompt(formats):
    assert formats["hermes"].render(CONVERSATION, WEATHER, True) == QWEN_TOOL_PROMPT
    assert formats["hermes"].render(CONVERSATION[1:], [], True).startswith(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")


def test_qwen3_thinking_is_off_by_default_and_reaches_every_render(formats):
    off, on = formats["qwen3"], formats["qwen3_thinking"]
    assert not off.enable_thinking
    assert off.render(CONVERSATION, WEATHER, True) == QWEN_TOOL_PROMPT + EMPTY_THINK  # Qwen3 system prompt = 2.5's
    assert on.render(CONVERSATION, WEATHER, True) == QWEN_TOOL_PROMPT
    user = [{"role": "user", "content": "x"}]
    assert off.observation_text(user).endswith("<|im_start|>assistant\n" + EMPTY_THINK)
    assert on.observation_text(user).endswith("<|im_start|>assistant\n")
    # thinking off: the empty think block is prompt (mask 0); on: the model writes it, so it is in the turn
    reply = {"role": "assistant", "content": "hi"}
    assert off.render_assistant_text(reply) == "hi<|im_end|>"
    assert on.render_assistant_text(reply) == EMPTY_THINK + "hi<|im_end|>"
    thought = {"role": "assistant", "content": "<think>\nplan\n</think>\n\nhi"}
    assert on.render_assistant_text(thought) == "<think>\nplan\n</think>\n\nhi<|im_end|>"
    assert on.render_assistant_text({"role": "assistant", "content": "hi", "reasoning_content": "plan"}) == (
        "<think>\nplan\n</think>\n\nhi<|im_end|>")
    with pytest.raises(TemplateError, match="enable_thinking=False"):
        off.render_assistant_text(thought)  # reasoning does not fit after the prompt's empty think block


def test_qwen3_keeps_reasoning_only_after_the_last_user_query(formats):
    chat = formats["qwen3_thinking"]
    msgs = [{"role": "user", "content": "q1"},
            {"role": "assistant", "content": "<think>\nold\n</think>\n\nanswer 1"},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "<think>\nnew\n</think>\n\n", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
            {"role": "tool", "content": "sunny"},
            {"role": "assistant", "content": "no reasoning", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
            {"role": "tool", "content": "rain"},
            {"role": "assistant", "content": "done"}]
    text = chat.render(msgs)
    assert "old" not in text and "<|im_start|>assistant\nanswer 1<|im_end|>" in text  # before the last query
    assert "<|im_start|>assistant\n<think>\nnew\n</think>\n\n<tool_call>" in text  # after it, with reasoning
    assert "<|im_start|>assistant\nno reasoning\n<tool_call>" in text  # after it, empty: no block
    assert text.endswith("<|im_start|>assistant\n" + EMPTY_THINK + "done<|im_end|>\n")  # the final turn always


# -- tool calls --------------------------------------------------------------------------------------
def test_tool_calls_render_canonically_whatever_the_arguments_look_like(formats):
    msg = {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "note", "arguments": '{"text":"línea\\n\\"dos\\""}'}},
        {"id": "b", "type": "function", "function": {"name": "note", "arguments": {"n": 1, "l": [True, None]}}},
        {"id": "c", "type": "function", "function": {"name": "note", "arguments": ""}}]}
    calls = ('<tool_call>\n{"name": "note", "arguments": {"text": "línea\\n\\"dos\\""}}\n</tool_call>\n'
             '<tool_call>\n{"name": "note", "arguments": {"n": 1, "l": [true, null]}}\n</tool_call>\n'
             '<tool_call>\n{"name": "note", "arguments": {}}\n</tool_call><|im_end|>')
    for name in ("hermes", "qwen2_5", "qwen3"):
        assert formats[name].render_assistant_text(msg) == "Checking.\n" + calls
    broken = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": '{"a": '}}]}
    assert formats["hermes"].render_assistant_text(broken) == '<tool_call>\n{"name": "f", "arguments": {"a": }\n</tool_call><|im_end|>'
    assert '"arguments": "{\\"a\\": "}' in formats["qwen2_5"].render_assistant_text(broken)  # Qwen2.5 quotes it


def test_rendered_calls_parse_back(formats):
    parsing = pytest.importorskip("ctu.episode.parsing")
    msg = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_order", "arguments": {"order_id": "#W1", "q": 'a "b"\nc'}}},
        {"type": "function", "function": {"name": "cancel_order", "arguments": {"reason": "ordered by mistake"}}}]}
    for chat in formats.values():
        ids = chat.encode(chat.render_assistant_text(msg))
        parsed = parsing.parse_model_output(chat.decode_generated(ids))
        got = [(c.name, c.arguments) for c in parsed.tool_calls]
        assert got == [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]]
        assert not parsed.failed


# -- observations ------------------------------------------------------------------------------------
def test_observations_start_right_after_the_end_of_turn_token(formats):
    for name, chat in formats.items():
        think = EMPTY_THINK if name == "qwen3" else ""
        assert chat.observation_text([{"role": "user", "content": "next"}]) == (
            "\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n" + think)
        # consecutive tool results share one user turn
        assert chat.observation_text([{"role": "tool", "tool_call_id": "1", "content": "a"},
                                      {"role": "tool", "tool_call_id": "2", "content": "Error: b"}]) == (
            "\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nError: b\n</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\n" + think)
        assert chat.observation_ids([]) == chat.encode("\n<|im_start|>assistant\n" + think)
        ids = chat.observation_ids([{"role": "tool", "content": "x"}])
        ids.append(-1)  # callers own what they get: the cache is not shared
        assert chat.observation_ids([{"role": "tool", "content": "x"}])[-1] != -1


def test_a_rollout_sequence_only_grows(formats):
    chat = formats["hermes"]
    seq = TokenSequence.start(chat.prompt_ids(CONVERSATION[:2], WEATHER))
    seen = [seq.all_ids()]
    turn = chat.encode(chat.render_assistant_text(CONVERSATION[2]))
    seq.add_generated(turn, [-1.0] * len(turn))
    seq.add_observation(chat.observation_ids(CONVERSATION[3:]))
    seen.append(seq.all_ids())
    assert seen[1][: len(seen[0])] == seen[0]
    assert chat.tokenizer.decode(seq.all_ids()) == QWEN_TOOL_PROMPT
    assert seq.all_ids() == chat.encode(QWEN_TOOL_PROMPT)
    assert seq.assistant_spans() == [(0, len(turn))] and sum(seq.loss_mask) == len(turn)


def test_bpe_may_merge_a_turns_leading_whitespace_with_the_header(formats):
    """The documented tokenization caveat: the template's text is the same, the ids need not be."""
    chat = formats["hermes"]
    msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "\n\nindented"}]
    appended = chat.prompt_ids(msgs[:1], None) + chat.encode(chat.render_assistant_text(msgs[1]))
    whole = chat.render(msgs)[:-1]
    assert chat.tokenizer.decode(appended) == whole
    assert appended != chat.encode(whole)  # "\n" + "\n\n…" sampled apart vs "\n\n" + "\n…" in one text


# -- edge cases (seed bugs: IndexError in custom templates at eval-before-train, empty responses) -----
def test_empty_things_do_not_crash(formats):
    for chat in formats.values():
        with pytest.raises(ValueError, match="empty conversation"):
            chat.prompt_ids([], None)  # a clear error, never an IndexError inside a template
        assert chat.prompt_ids([{"role": "user", "content": ""}], []) == chat.prompt_ids(
            [{"role": "user", "content": None}], None)
        for empty in ({"role": "assistant", "content": ""}, {"role": "assistant", "content": None, "tool_calls": None},
                      {"role": "assistant", "content": [], "tool_calls": []}, {"content": ""}):
            assert chat.render_assistant_text(empty).endswith("<|im_end|>")
        assert chat.render_assistant_text({"role": "assistant", "content": [{"type": "text", "text": "hi"}]}) in (
            "hi<|im_end|>", EMPTY_THINK + "hi<|im_end|>")
        assert chat.decode_generated([]) == ""
        assert chat.decode_generated(list(chat.stop_token_ids)) == ""
        assert chat.observation_ids([{"role": "tool", "content": ""}])
        with pytest.raises(ValueError, match="tool/user messages only"):
            chat.observation_ids([{"role": "assistant", "content": "x"}])
        with pytest.raises(ValueError, match="assistant message"):
            chat.render_assistant_text({"role": "user", "content": "x"})


def test_token_sequence_edge_cases():
    seq = TokenSequence.start([])
    seq.add_generated([], [])  # an empty generation adds no span and no zero-size slices
    seq.add_observation([])
    assert seq.assistant_spans() == [] and seq.all_ids() == [] and seq.total_length() == 0
    with pytest.raises(ValueError, match="logprobs"):
        seq.add_generated([1], [])
    with pytest.raises(ValueError, match="mask entries"):
        TokenSequence([1], [5, 6], [1], [0.0])
    seq.add_generated([5, 2], [-0.1, -0.2])
    seq.add_observation([7])
    seq.add_generated([8, 2], [-0.3, -0.4])
    rebuilt = TokenSequence(seq.prompt_ids, list(seq.response_ids), list(seq.loss_mask), list(seq.logprobs))
    assert rebuilt.assistant_spans() == seq.assistant_spans() == [(0, 2), (3, 5)]
    assert seq.logprobs == [-0.1, -0.2, 0.0, -0.3, -0.4] and seq.loss_mask == [1, 1, 0, 1, 1]
    assert json.loads(json.dumps(seq.response_ids)) == [5, 2, 7, 8, 2]
