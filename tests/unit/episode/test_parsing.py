"""Parser properties: every format round-trips, arbitrary text never raises, truncation is recovered."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ctu.episode.parsing import ParseResult, parse_model_output, repair_json
from tests.support.timing import thread_cpu_seconds

names = st.from_regex(r"[a-z_][a-z0-9_]{0,30}", fullmatch=True)
scalars = (st.text(max_size=20) | st.integers(-10**9, 10**9) | st.floats(allow_nan=False, allow_infinity=False, width=32)
           | st.booleans() | st.none())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
arguments = st.dictionaries(st.text(min_size=1, max_size=10), values, max_size=4)
calls = st.tuples(names, arguments)
python_ok = st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(
    lambda k: k not in {"if", "in", "is", "or", "and", "not", "for", "def", "del", "as", "try", "with", "from",
                        "class", "elif", "else", "pass", "None", "True", "False", "lambda", "while", "yield",
                        "break", "raise", "async", "await", "import", "return", "global", "assert", "except",
                        "finally", "continue", "nonlocal"}),
    st.text(max_size=10) | st.integers(-1000, 1000) | st.booleans() | st.lists(st.integers(0, 9), max_size=3),
    max_size=3)


def hermes(calls):
    return "\n".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls)


def bare(call):
    return json.dumps({"name": call[0], "arguments": call[1]})


def openai(calls):
    return json.dumps({"tool_calls": [{"id": f"call_{i}", "type": "function",
                                       "function": {"name": n, "arguments": json.dumps(a)}} for i, (n, a) in enumerate(calls)]})


def fenced(call):
    return f"```json\n{bare(call)}\n```"


def react(call):
    return f"Thought: I should call a tool.\nAction: {call[0]}\nAction Input: {json.dumps(call[1])}"


def python_call(name, args):
    return f"```python\n{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})\n```"


def same(result: ParseResult, expected):
    assert not result.failed, result
    assert [(c.name, c.arguments) for c in result.tool_calls] == [(n, a) for n, a in expected]


@settings(max_examples=200, deadline=None)
@given(calls, st.sampled_from(["hermes", "bare", "openai", "fenced", "react"]))
def test_any_valid_call_in_any_format_parses_back(call, fmt):
    text = {"hermes": lambda: hermes([call]), "bare": lambda: bare(call), "openai": lambda: openai([call]),
            "fenced": lambda: fenced(call), "react": lambda: react(call)}[fmt]()
    result = parse_model_output(text)
    same(result, [call])
    assert not result.recovered


@settings(max_examples=100, deadline=None)
@given(st.lists(calls, min_size=2, max_size=4), st.sampled_from(["hermes", "openai"]))
def test_several_calls_keep_their_order(many, fmt):
    same(parse_model_output(hermes(many) if fmt == "hermes" else openai(many)), many)


@settings(max_examples=100, deadline=None)
@given(names.filter(lambda n: n not in {"if", "in", "is", "or", "and", "not", "for", "def", "del", "as", "try"}), python_ok)
def test_python_style_calls(name, args):
    same(parse_model_output(python_call(name, args)), [(name, args)])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.lists(st.sampled_from(["{", "}", "[", "]", '"', "'", ":", ",", "<tool_call>", "</tool_call>",
                                                       "Action:", "Action Input:", "```", "name", "arguments", "\n", "<think>",
                                                       "</think>", "True", "x", "1"]), max_size=40).map("".join)))
def test_arbitrary_text_never_raises(text):
    result = parse_model_output(text)
    assert isinstance(result, ParseResult) and isinstance(result.content, str)
    assert isinstance(result.tool_calls, tuple) and isinstance(result.failed, bool)
    for call in result.tool_calls:
        assert isinstance(call.name, str) and isinstance(call.arguments, dict)
    repair_json(text)  # never raises either


@settings(max_examples=200, deadline=None)
@given(calls, st.sampled_from(["hermes", "bare"]))
def test_cutting_after_the_arguments_closing_brace_still_recovers(call, fmt):
    args_json = json.dumps(call[1])
    text = (f"<tool_call>\n{{\"name\": {json.dumps(call[0])}, \"arguments\": {args_json}" if fmt == "hermes"
            else f"{{\"name\": {json.dumps(call[0])}, \"arguments\": {args_json}")
    result = parse_model_output(text)
    same(result, [call])
    assert result.recovered


prose = st.text(alphabet=st.characters(blacklist_characters="{}<>`[]\"'", blacklist_categories=("Cs",)), max_size=200)


@settings(max_examples=200, deadline=None)
@given(prose.filter(lambda t: "Action" not in t and "tool_calls" not in t))
def test_plain_prose_stays_a_message(text):
    result = parse_model_output(text)
    assert result.tool_calls == () and result.format == "none" and not result.failed
    assert result.content == text.strip()


def test_recovery_kinds_and_failures():
    cases = {
        "<tool_call>{'name': 'f', 'arguments': {'a': 'x',}}</tool_call>": ("f", {"a": "x"}),
        '{name: "f", arguments: {n: 2, ok: True, nothing: None}}': ("f", {"n": 2, "ok": True, "nothing": None}),
        '{"name": "f", "arguments": {"s": "unclosed': ("f", {"s": "unclosed"}),
        '{"name": "f", "parameters": {"a": [1, 2,]}}': ("f", {"a": [1, 2]}),
        'Let me check.\n{"name": "f"}': ("f", {}),
    }
    for text, (name, args) in cases.items():
        result = parse_model_output(text)
        assert [(c.name, c.arguments) for c in result.tool_calls] == [(name, args)], text
    assert parse_model_output('Let me check.\n{"name": "f"}').content == "Let me check."
    for bad in ("<tool_call>{{{", "<tool_call>not json</tool_call>", "Action: f\nAction Input: {{{", '{"name": 3}'):
        result = parse_model_output(bad)
        assert result.failed and not result.tool_calls and result.error, bad


def test_thinking_is_dropped_and_empty_inputs_are_messages():
    result = parse_model_output('<think>maybe {"name": "x", "arguments": {}}</think>\nHello!')
    assert result.content == "Hello!" and not result.tool_calls and not result.failed
    assert parse_model_output("<think>still thinking ...").content == ""
    assert parse_model_output("</think>Answer").content == "Answer"
    for empty in (None, "", "   "):
        result = parse_model_output(empty)
        assert result.content == "" and result.tool_calls == () and not result.failed and result.format == "none"
    assert parse_model_output("Action: respond\nAction Input: Your order shipped.").content == "Your order shipped."


# ------------------------------------------------------------------------------------------------
# linear time: adversarial megabyte replies parse in well under a second (they took minutes when every
# bracket was decoded and repaired again to the end of the text)
# ------------------------------------------------------------------------------------------------
MEGABYTE = 1_000_000
ADVERSARIAL_UNITS = ["{", "{a: ", "{ hello ", "[", '"', "<tool_call>", "'", '{"a": "', "{name: ", '{"name": ',
                     '[{"name": "f", ', "```{", '```\n{"a":1}\n```', '{"a": 1} ', "[{\"a\": ", "\n", "Action: f\n",
                     "Action Input: x\n", "{'name': 'f', 'arguments': {'x': ", "<tool_call>{a: "]


def _megabyte(unit: str) -> str:
    return (unit * (MEGABYTE // len(unit) + 1))[:MEGABYTE]


def _timed_parse(text: str) -> tuple[ParseResult, float]:
    """The parse and the CPU seconds it took (quadratic parsing takes tens of seconds on these inputs, linear well
    under one)."""
    return thread_cpu_seconds(parse_model_output, text)


def test_adversarial_megabytes_parse_in_under_a_second():
    for unit in ADVERSARIAL_UNITS:
        result, seconds = _timed_parse(_megabyte(unit))
        assert isinstance(result, ParseResult)
        assert seconds < 2.0, (unit, seconds)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.sampled_from(["{", "}", "[", "]", '"', "'", ":", ",", " ", "\n", "<tool_call>", "</tool_call>",
                                 "Action:", "Action Input:", "```", "name", '"name"', "arguments", "a", "\\", "1",
                                 "True", "<think>", "</think>"]), min_size=1, max_size=12).map("".join))
def test_random_megabyte_mixes_parse_in_under_a_second(unit):
    result, seconds = _timed_parse(_megabyte(unit))
    assert isinstance(result, ParseResult)
    assert seconds < 2.0, (unit, seconds)


def test_a_call_after_a_megabyte_of_garbage_is_still_found():
    garbage = _megabyte("{a: ")
    result, seconds = _timed_parse(garbage + '\n{"name": "f", "arguments": {"x": 1}}')
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("f", {"x": 1})] and not result.recovered
    assert seconds < 2.0
    result, seconds = _timed_parse(_megabyte("hello {x} ") + '\n{"name": "f", "arguments": {"x": "cut')
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("f", {"x": "cut"})] and result.recovered
    assert seconds < 2.0


def test_python_literals_json_has_no_value_for_are_not_calls():
    for literal in ("{1, 2}", "b'x'", "1j", "...", "{1: 2}", "[frozenset()]", "{'a': {(1, 2): 3}}"):
        text = f"```python\nget_order(order_id={literal})\n```"
        result = parse_model_output(text)
        assert result.tool_calls == (), literal
        json.dumps([c.arguments for c in result.tool_calls])
    (call,) = parse_model_output("```python\nget_order(ids=('a', 'b'), n={'k': (1,)})\n```").tool_calls
    assert call.arguments == {"ids": ["a", "b"], "n": {"k": [1]}}
