"""Supervised data in and out: gold demonstrations, OpenAI chat JSONL and sharegpt files, and the tokens the
warm start trains on (equal whichever way the conversations arrive)."""

import asyncio
import json

import pytest

from ctu.domains import get_domain
from ctu.engines.base import SamplingParams
from ctu.episode.data.conversations import Conversation, DataError, gold_conversation, gold_conversations
from ctu.episode.data.sft import read_conversations, to_sharegpt, write_conversations
from ctu.episode.reward import score_transcript
from ctu.episode.transcripts import ending
from ctu.episode.users.base import STOP
from ctu.episode.users.scripted import ScriptedUser
from ctu.rollout.loop import EpisodeSpec, RolloutLimits, rollout
from ctu.train.demos import conversation_sample, file_samples, gold_samples
from tests.unit.rollout.test_rollout import ScriptedModel

MINI = get_domain("mini")


def mini_tasks():
    """One train task of each mini kind, allowed and refused."""
    picked = {}
    for task in MINI.split("train"):
        picked.setdefault((task.description["kind"], task.description["refusal"]), task)
    return list(picked.values())


def tau2(name, n=6):
    domain = get_domain(name)
    return domain, domain.split("train")[:n]


def as_ids(sample):
    return sample.ids, sample.mask


@pytest.mark.parametrize("name", ["mini", "retail", "airline"])
def test_gold_demonstrations_end_with_the_domains_own_closing_line_and_score_1(name):
    domain, tasks = (MINI, mini_tasks()) if name == "mini" else (get_domain(name), get_domain(name).split("train"))
    for task in tasks:
        conversation = gold_conversation(domain, task)
        messages = conversation.messages
        reward = score_transcript(domain, task, messages, ending(messages, conversation.termination))
        assert reward.reward == 1.0 and set(reward.components.values()) == {1.0}, (task.id, reward.reasons)
        if task.actions and task.actions[-1].name == domain.transfer_tool:  # the transfer ends the call
            assert conversation.termination == "agent_stop" and messages[-1]["role"] == "tool"
            continue
        last_agent = [m for m in messages if m["role"] == "assistant"][-1]
        assert last_agent["content"] == domain.closing_line(task)
        assert messages[-1]["role"] == "user" and STOP in messages[-1]["content"]  # a statement: the user ends it
        if name != "mini":
            assert "order status" not in last_agent["content"]


def test_mini_keeps_its_closing_lines():
    status = next(t for t in MINI.tasks if t.description["kind"] == "status")
    cancel = next(t for t in MINI.tasks if t.description["kind"] == "cancel" and not t.description["refusal"])
    assert MINI.closing_line(status) == f"The order status is {status.communicate_info[0]}."
    assert MINI.closing_line(cancel) == "Done, your request is complete."


@pytest.mark.parametrize("name", ["mini", "retail"])
def test_a_conversations_tokens_are_what_a_rollout_of_the_same_turns_gives(chat_format, name):
    """conversation_sample against the real agent loop: a stand-in model replays each gold turn's ids."""
    domain, tasks = (MINI, mini_tasks()) if name == "mini" else tau2(name, 3)
    for task in tasks:
        assert_a_rollout_gives_its_tokens(chat_format, domain, task, gold_conversation(domain, task))


def assert_a_rollout_gives_its_tokens(chat_format, domain, task, conversation):
    """A stand-in model replays each of ``conversation``'s trained turns: the episode scores 1, has the same messages,
    and its tokens are the conversation's sample."""
    turns = [chat_format.encode(chat_format.render_assistant_text(m)) for m in conversation.messages
             if m["role"] == "assistant" and m.get("weight", 1)]
    (t,) = asyncio.run(rollout([EpisodeSpec(domain, task)], chat_format, ScriptedModel(chat_format, turns),
                               ScriptedUser(), SamplingParams(max_tokens=512),
                               RolloutLimits(max_turns=len(turns) + 1, max_context_tokens=32_768)))
    assert t.reward == 1.0 and t.messages == [{k: v for k, v in m.items() if k != "weight"}
                                              for m in conversation.messages]
    sample = conversation_sample(chat_format, conversation.messages, conversation.tools)
    assert sample.ids == t.prompt_ids + t.response_ids
    assert sample.mask == [0] * (len(t.prompt_ids) - 1) + t.loss_mask


def test_openai_jsonl_round_trip_is_lossless_and_trains_the_same_tokens(tmp_path, chat_format):
    conversations = gold_conversations(MINI, mini_tasks()) + gold_conversations(*tau2("airline", 3))
    info = write_conversations(tmp_path / "gold.jsonl", conversations, "openai")
    assert info["records"] == len(conversations)
    back = read_conversations(tmp_path / "gold.jsonl")
    assert [(c.messages, c.tools, c.domain, c.task_id, c.termination) for c in back] == \
           [(c.messages, c.tools, c.domain, c.task_id, c.termination) for c in conversations]
    first = json.loads((tmp_path / "gold.jsonl").read_text().splitlines()[0])
    assert set(first) == {"messages", "tools", "domain", "task_id", "termination"}
    assert first["messages"][1] == {"role": "assistant", "content": "Hi! How can I help you today?", "weight": 0}
    expected = gold_samples(chat_format, MINI, mini_tasks()) + gold_samples(chat_format, *tau2("airline", 3))
    assert [as_ids(s) for s in file_samples(chat_format, str(tmp_path / "gold.jsonl"))] == [as_ids(s) for s in expected]


def two_calls_conversation():
    """One agent turn with text and two tool calls, and their two results (as the env writes them)."""
    base = gold_conversation(MINI, mini_tasks()[0])
    prefix = base.messages[:3]
    calls = [{"id": f"call_1_{k}", "type": "function",
              "function": {"name": "get_order", "arguments": json.dumps({"order_id": oid})}}
             for k, oid in ((1, "O1001"), (2, "O1002"))]
    rest = [{"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_1_1", "name": "get_order", "content": '{"a": 1}'},
            {"role": "tool", "tool_call_id": "call_1_2", "name": "get_order", "content": '{"b": 2}'},
            {"role": "assistant", "content": "Both are pending."}, {"role": "user", "content": "And O1003?"},
            {"role": "assistant", "content": "Shipped."}, {"role": "user", "content": STOP}]
    return Conversation(prefix + rest, base.tools, "mini", "two-calls")


def test_sharegpt_round_trip_gives_the_same_messages_and_tokens(tmp_path, chat_format):
    conversations = [*gold_conversations(MINI, mini_tasks()), *gold_conversations(*tau2("retail", 4)),
                     two_calls_conversation()]
    info = write_conversations(tmp_path / "sg.jsonl", conversations, "sharegpt", name="ctu_gold")
    assert info["dropped_texts"] == 0
    assert json.loads((tmp_path / "dataset_info.json").read_text()) == {"ctu_gold": {
        "file_name": "sg.jsonl", "formatting": "sharegpt",
        "columns": {"messages": "conversations", "system": "system", "tools": "tools"}}}
    for line in (tmp_path / "sg.jsonl").read_text().splitlines():  # LLaMA-Factory's rules
        turns = json.loads(line)["conversations"]
        assert [t["from"] in ("human", "observation") for t in turns] == [n % 2 == 0 for n in range(len(turns))]
        assert len(turns) % 2 == 0
    back = read_conversations(tmp_path / "sg.jsonl")
    for original, read in zip(conversations, back, strict=True):
        assert read.messages == original.messages[:-1]  # the user's closing stop is not a sharegpt turn
        assert read.tools == original.tools and read.task_id == original.task_id
        assert as_ids(conversation_sample(chat_format, read.messages, read.tools)) == \
               as_ids(conversation_sample(chat_format, original.messages, original.tools))


def test_sharegpt_drops_and_counts_text_beside_tool_calls():
    conversation = two_calls_conversation()
    conversation.messages[3]["content"] = "Let me look."
    record, dropped = to_sharegpt(conversation)
    assert dropped == 1 and json.loads(record["conversations"][1]["value"]) == [
        {"name": "get_order", "arguments": {"order_id": "O1001"}}, {"name": "get_order", "arguments": {"order_id": "O1002"}}]
    assert json.loads(record["conversations"][2]["value"]) == ['{"a": 1}', '{"b": 2}']


def test_sharegpt_from_elsewhere_reads_as_llama_factory_writes_it(tmp_path, chat_format):
    """A JSON array file as in LLaMA-Factory's glaive demo: bare function schemas, no opening, no domain."""
    tool = {"name": "search", "description": "Search.", "parameters": {"type": "object", "properties": {
        "q": {"type": "string"}}, "required": ["q"]}}
    record = {"conversations": [{"from": "human", "value": "find cats"},
                                {"from": "function_call", "value": '{"name": "search", "arguments": {"q": "cats"}}'},
                                {"from": "observation", "value": "3 cats"}, {"from": "gpt", "value": "Found 3."}],
              "system": "Be brief.", "tools": json.dumps([tool])}
    (tmp_path / "glaive.json").write_text(json.dumps([record, record], indent=2))
    first, second = read_conversations(tmp_path / "glaive.json")
    assert first.extra["line"] == 2 and second.extra["line"] > 2
    assert first.tools == [{"type": "function", "function": tool}]
    assert [m["role"] for m in first.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert first.messages[2]["tool_calls"][0]["function"] == {"name": "search", "arguments": '{"q": "cats"}'}
    sample = conversation_sample(chat_format, first.messages, first.tools)
    assert sum(sample.mask) > 0


GOOD = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})


@pytest.mark.parametrize("lines,where,message", [
    ([GOOD, GOOD, "{not json"], 3, "not valid JSON"),
    ([GOOD, json.dumps({"prompt": "x"})], 2, "neither 'messages'"),
    ([json.dumps({"messages": [{"role": "robot", "content": "x"}]})], 1, r"messages\[0\]\.role"),
    ([GOOD, json.dumps({"conversations": [{"from": "gpt", "value": "x"}]})], 2, r"conversations\[0\]"),
    ([json.dumps({"conversations": [{"from": "human", "value": "x"},
                                    {"from": "function_call", "value": "{oops"}]})], 1, "function_call value"),
    ([json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": "[{"})], 1, "'tools' is not valid JSON"),
])
def test_a_bad_file_is_one_line_naming_the_file_and_line(tmp_path, lines, where, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=message) as info:
        read_conversations(path)
    assert str(info.value).startswith(f"{path}:{where}: ") and "\n" not in str(info.value)


def test_bad_bytes_a_broken_array_and_a_conversation_with_nothing_to_train(tmp_path, chat_format):
    (tmp_path / "bytes.jsonl").write_bytes(GOOD.encode() + b"\n\xff\xfe\n")
    with pytest.raises(DataError, match=r"bytes\.jsonl:2: not valid UTF-8"):
        read_conversations(tmp_path / "bytes.jsonl")
    (tmp_path / "array.json").write_text('[\n {"messages": []},\n {"messages": [}\n]')
    with pytest.raises(DataError, match=r"array\.json:3: not valid JSON"):
        read_conversations(tmp_path / "array.json")
    (tmp_path / "empty.jsonl").write_text(GOOD + "\n" + json.dumps({"messages": [{"role": "user", "content": "x"}]}))
    with pytest.raises(DataError, match=r"empty\.jsonl:2: no assistant turn to train on"):
        file_samples(chat_format, str(tmp_path / "empty.jsonl"))
    with pytest.raises(DataError, match="no such file"):
        read_conversations(tmp_path / "missing.jsonl")
