"""ctu.app.integrations without verl or SkyRL installed: the verl reward function and the SkyRL environment score
ctu's parquet rows (duck-typed inputs, as those trainers pass them)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from ctu.app.integrations.common import response_messages, termination_of
from ctu.app.integrations.skyrl_env import CtuTextEnv
from ctu.app.integrations.verl_reward import compute_score
from ctu.domains import get_domain
from ctu.episode.data.conversations import gold_conversation
from ctu.episode.data.prompts import task_rows
from ctu.episode.env import agent_view

DOMAINS = ["mini", "retail", "airline"]


def cases(name: str, n: int = 3):
    """(row, gold conversation) of the first train tasks of a domain that change the DB."""
    domain = get_domain(name)
    tasks = [t for t in domain.split("train") if any(domain.tool(a.name) and domain.tool(a.name).mutates
                                                     for a in t.actions if a.requestor == "assistant")][:n]
    assert tasks
    return [(row, gold_conversation(domain, task)) for row, task in zip(task_rows(domain, tasks), tasks, strict=True)]


def without_mutations(domain, messages):
    """The conversation with the agent's DB-changing calls (and their results) taken out: a wrong episode."""
    out, dropped = [], set()
    for m in messages:
        calls = m.get("tool_calls") or []
        if m["role"] == "assistant" and any(domain.tool(c["function"]["name"]).mutates for c in calls):
            dropped |= {c["id"] for c in calls}
            continue
        if m.get("tool_call_id") in dropped:
            continue
        out.append(m)
    return out


def solution_str(chat, row, conversation, messages=None, skip_special_tokens=True):
    """What verl's reward manager hands the reward function: the response after the prompt, decoded."""
    messages = agent_view(messages or conversation.messages)
    prompt = chat.render(row["prompt"], conversation.tools, add_generation_prompt=True)
    full = chat.render(messages, conversation.tools)
    assert full.startswith(prompt)
    ids = chat.encode(full[len(prompt):])
    return chat.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_ctu_imports_without_verl_or_skyrl():
    code = ("import sys, ctu.app.integrations.verl_reward, ctu.app.integrations.skyrl_env; "
            "print([m for m in sys.modules if m.split('.')[0] in ('verl', 'skyrl_gym')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("name", DOMAINS)
def test_verl_reward_gold_response_scores_1_and_one_without_its_db_changes_0(chat_format, name, skip):
    domain = get_domain(name)
    for row, conversation in cases(name):
        ground_truth = row["reward_model"]["ground_truth"]
        extra = {**row["extra_info"], "num_turns": 7, "rollout_reward_scores": {}}  # as verl's manager adds
        gold = compute_score(row["data_source"], solution_str(chat_format, row, conversation, None, skip),
                             ground_truth, extra)
        assert gold["score"] == 1.0 and gold["acc"] == 1.0 and gold["parse_failures"] == 0, row["extra_info"]
        assert gold["tool_calls"] == sum(len(m.get("tool_calls") or []) for m in agent_view(conversation.messages)
                                         if m["role"] == "assistant")
        wrong = solution_str(chat_format, row, conversation, without_mutations(domain, conversation.messages), skip)
        assert compute_score(row["data_source"], wrong, ground_truth, extra)["score"] == 0.0


def test_verl_reward_reads_numpy_extra_info_and_a_recorded_termination(chat_format):
    row, conversation = cases("retail", 1)[0]
    text = solution_str(chat_format, row, conversation)
    info = {k: np.array(v) if isinstance(v, int) else v for k, v in row["extra_info"].items()}
    truth = json.loads(row["reward_model"]["ground_truth"])  # an object instead of the JSON string
    assert compute_score(row["data_source"], text, truth, info)["score"] == 1.0
    assert compute_score(row["data_source"], text, truth, {**info, "termination": "max_turns"})["score"] == 0.0


def test_a_response_cut_off_in_a_tool_call_or_a_user_turn_is_not_a_normal_ending():
    cut = response_messages('<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n'
                            '</tool_call>\nuser\n<tool_response>\n{"x": 1}\n</tool_response>\nassistant\n'
                            '<tool_call>\n{"name": "cancel_pending_order", "arguments": {"order_id": "#W1"')[0]
    assert [m["role"] for m in cut] == ["assistant", "assistant"]  # tool results dropped: the scorer replays
    assert cut[1]["tool_calls"][0]["function"]["arguments"] == {"order_id": "#W1"}  # repaired, as rollouts do
    assert termination_of(cut, "transfer_to_human_agents") == "max_turns"
    done = response_messages("Your order is cancelled.<|im_end|>\n<|im_start|>user\nThanks ###STOP###<|im_end|>")[0]
    assert done == [{"role": "assistant", "content": "Your order is cancelled."},
                    {"role": "user", "content": "Thanks ###STOP###"}]
    assert termination_of(done, None) == "user_stop"
    assert termination_of(done[:1], None) == "agent_stop"  # verl's tool agent loop: a closing turn of text
    assert termination_of([{"role": "user", "content": "hello?"}], None) == "max_turns"


def test_verl_reward_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="^ctu/retail row 3: ground_truth is not JSON"):
        compute_score("ctu/retail", "", "not json", {"domain": "retail", "index": np.int64(3)})
    with pytest.raises(ValueError, match="^ctu/nowhere: unknown domain 'nowhere'"):
        compute_score("ctu/nowhere", "", json.dumps({"id": "1", "evaluation_criteria": None}), {})


def play(env, chat, messages):
    """Step the env with the raw text of each of the conversation's assistant turns (after the opening)."""
    turns = [m for m in agent_view(messages)[3:] if m["role"] == "assistant"]
    outputs = []
    for message in turns:
        outputs.append(env.step(chat.render_assistant_text(message)))
        if outputs[-1]["done"]:
            break
    return outputs


def test_a_parquet_row_keeps_the_tasks_initial_state():
    from ctu.episode.data.prompts import row_task

    domain = get_domain("telecom")
    tasks = [t for t in domain.tasks if t.initial_state][:5]
    assert tasks
    for row, task in zip(task_rows(domain, tasks), tasks, strict=True):
        assert row_task(row)[1] == task  # the phone's broken state included


@pytest.mark.parametrize("name", [*DOMAINS, "telecom"])
def test_skyrl_env_gold_turns_score_1_and_turns_without_db_changes_0(chat_format, name):
    domain = get_domain(name)
    for row, conversation in cases(name):
        extras = {k: row[k] for k in ("reward_spec", "extra_info", "data_source")}  # SkyRL's env_extras
        env = CtuTextEnv(env_config={"max_turns": 40, "patience": 30}, extras=extras)
        prompt, meta = env.init(row["prompt"])
        assert prompt == row["prompt"] == env.opening and meta["task_id"] == row["extra_info"]["task_id"]
        outputs = play(env, chat_format, conversation.messages)
        assert all(o["reward"] == 0.0 and not o["done"] for o in outputs[:-1])
        assert outputs[-1]["done"] and outputs[-1]["reward"] == 1.0, outputs[-1]["metadata"]["reasons"]
        calls = [o for o in outputs if o["metadata"]["tool_calls"]]
        assert calls and all(o["observations"][0]["role"] == "tool" for o in calls if not o["done"])
        assert env.get_metrics()["reward"] == 1.0 and env.get_metrics()["parse_failures"] == 0

        wrong = CtuTextEnv(env_config={"patience": 30}, extras=extras, domain=name)
        wrong.init(row["prompt"])
        outputs = play(wrong, chat_format, without_mutations(domain, conversation.messages))
        assert outputs[-1]["done"] and outputs[-1]["reward"] == 0.0


def test_skyrl_env_ends_at_max_turns_with_reward_0(chat_format):
    row, _ = cases("retail", 1)[0]
    env = CtuTextEnv(env_config={"max_turns": 2}, extras={"reward_spec": row["reward_spec"],
                                                           "extra_info": row["extra_info"]})
    env.init(None)  # no prompt: the episode's own opening
    first = env.step('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call><|im_end|>')
    assert first["done"] is False and first["observations"][0]["role"] == "tool"
    assert "nope" in first["observations"][0]["content"]  # the unknown tool's error, as the agent sees it
    last = env.step('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call><|im_end|>')
    assert last["done"] and last["reward"] == 0.0 and last["metadata"]["termination"] == "max_turns"


def test_parquet_export_names_the_adapters_that_score_it(tmp_path, capsys):
    import importlib
    import re

    from ctu.app.cli import main

    assert main(["data", "export", "--domain", "mini", "--split", "test", "--format", "parquet",
                 "--out", str(tmp_path / "mini.parquet")]) == 0
    out = capsys.readouterr().out
    module = re.search(r"path=pkg://([\w.]+) \(name=(\w+)\)", out)
    assert module and callable(getattr(importlib.import_module(module[1]), module[2]))
    assert "ctu.app.integrations.skyrl_env.register()" in out


def test_verl_reward_needs_the_transcript_for_dual_control_and_scores_it_when_given(chat_format):
    domain = get_domain("telecom")
    row, conversation = cases("telecom", 1)[0]
    text = solution_str(chat_format, row, conversation)
    truth = row["reward_model"]["ground_truth"]
    with pytest.raises(ValueError, match="ctu/telecom: .*user's own tool calls.*extra_info.messages"):
        compute_score(row["data_source"], text, truth, row["extra_info"])  # the user's actions are not in the text
    gold = compute_score(row["data_source"], text, truth, {**row["extra_info"], "messages": conversation.messages})
    assert gold["score"] == 1.0
    wrong = without_mutations(domain, conversation.messages)
    assert compute_score(row["data_source"], text, truth, {**row["extra_info"], "messages": wrong})["score"] == 0.0
