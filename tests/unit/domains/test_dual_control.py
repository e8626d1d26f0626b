"""Dual control (telecom): users act on their phone in real episodes, and recorded dual-control transcripts score.

The scripted user goes through the real rollout loop with a scripted stand-in for the agent model; the LLM
user calls its phone tools through a respx-mocked chat API; ``ctu score`` reads tau2-shaped transcripts.
"""

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import respx

from ctu.app.cli import main
from ctu.domains import get_domain
from ctu.engines.base import SamplingParams
from ctu.episode.env import AgentTurn, Episode
from ctu.episode.reward import score_transcript
from ctu.episode.transcripts import ending
from ctu.episode.users.llm import LLMUser, LLMUserConfig
from ctu.episode.users.scripted import ScriptedUser
from ctu.rollout.chat import ChatFormat
from ctu.rollout.loop import EpisodeSpec, RolloutLimits, rollout
from tests.unit.rollout.test_rollout import ScriptedModel

TELECOM = get_domain("telecom")
AIRPLANE = TELECOM.task("[service_issue]airplane_mode_on[PERSONA:None]")
PERMISSION = TELECOM.task("[mms_issue]break_app_sms_permission[PERSONA:None]")
FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "telecom" / "dual_control.jsonl"
LIMITS = RolloutLimits(max_turns=6, max_context_tokens=16_000)  # the policy and manual are ~5k tokens


@pytest.fixture(scope="module")
def chat():
    from transformers import AutoTokenizer

    from ctu.engines.hf.models import smollm2_tokenizer_dir

    return ChatFormat(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))


def play(chat, task, turns):
    engine = ScriptedModel(chat, turns)
    (trajectory,) = asyncio.run(rollout([EpisodeSpec(TELECOM, task)], chat, engine, ScriptedUser(),
                                        SamplingParams(temperature=1.0, max_tokens=64), LIMITS))
    return trajectory, engine


def test_the_scripted_user_fixes_the_phone_when_the_agent_asks(chat):
    t, engine = play(chat, AIRPLANE, ["Please toggle_airplane_mode on your phone.", "Your service is back. Goodbye."])
    assert (t.stop_reason, t.termination, t.reward, t.components) == ("done", "user_stop", 1.0,
                                                                      {"ENV_ASSERTION": 1.0})
    calls = [m for m in t.messages if m["role"] == "user" and m.get("tool_calls")]
    assert [c["tool_calls"][0]["function"]["name"] for c in calls] == ["toggle_airplane_mode"]
    result = next(m for m in t.messages if m.get("requestor") == "user")
    assert result["role"] == "tool" and result["content"].startswith("Airplane Mode is now OFF.")
    # the agent saw the user's words about it, never the user's tool call itself
    seen = chat.tokenizer.decode(engine.seen_prompts[-1])
    assert "Airplane Mode is now OFF." in seen and "user_call_" not in seen and '"toggle_airplane_mode"' not in seen
    # the recorded transcript re-scores the same
    again = score_transcript(TELECOM, AIRPLANE, t.messages, ending(t.messages, t.termination))
    assert (again.reward, again.components) == (t.reward, t.components)


def test_the_scripted_user_uses_the_gold_arguments_and_nothing_is_done_unasked(chat):
    t, _ = play(chat, PERMISSION, ["Please open settings and grant app permission to messaging: grant_app_permission.",
                                   "All set. Goodbye."])
    args = [json.loads(m["tool_calls"][0]["function"]["arguments"]) for m in t.messages if m.get("tool_calls")]
    assert args == [{"app_name": "messaging", "permission": "sms"}] and t.reward == 1.0
    idle, _ = play(chat, AIRPLANE, ["Everything looks fine on our side. Goodbye."])
    assert idle.reward == 0.0 and not any(m.get("tool_calls") for m in idle.messages)
    assert any("assert_service_status" in r for r in idle.reasons)


def test_recorded_dual_control_transcripts_score_with_env_assertions(capsys):
    assert main(["score", "--domain", "telecom", "--json", str(FIXTURE)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert all(r["components"] == {"ENV_ASSERTION": 1.0 if r["reward"] else 0.0} for r in rows[:4])
    assert "assert_internet_speed" in rows[2]["reasons"][0]  # the user never disconnected the VPN
    assert "assert_mobile_data_status" in " ".join(rows[3]["reasons"])  # the agent cannot touch the phone
    assert rows[4]["termination"] == "incomplete" and rows[4]["components"] == {"ENV_ASSERTION": 1.0}


def test_user_tool_calls_are_valid_transcript_messages_but_system_ones_are_not(tmp_path, capsys):
    line = {"task_id": AIRPLANE.id, "messages": [{"role": "system", "content": "x", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "toggle_airplane_mode", "arguments": "{}"}}]}]}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(line) + "\n")
    assert main(["score", "--domain", "telecom", str(path)]) == 1
    assert "messages[0].tool_calls is only allowed on assistant and user messages" in capsys.readouterr().err


BASE = "http://user-sim.test/v1"
URL = f"{BASE}/chat/completions"


def answer(text=None, tool_calls=None):
    message = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                                 for i, (n, a) in enumerate(tool_calls)]
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls" if tool_calls else "stop", "message": message}]}
    return httpx.Response(200, json=body)


def llm_episode(monkeypatch, **config):
    monkeypatch.setenv("SIM_KEY", "sk-test")
    user = LLMUser(LLMUserConfig(model="sim", base_url=BASE, api_key_env="SIM_KEY", **config))
    return Episode(TELECOM, AIRPLANE, user.start(TELECOM, AIRPLANE, seed=1))


@respx.mock
def test_the_llm_user_calls_its_phone_tools_through_the_chat_api(monkeypatch):
    route = respx.post(URL).mock(side_effect=[
        answer("My phone has no service."),
        answer(tool_calls=[("check_status_bar", "{}"), ("toggle_airplane_mode", "")]),
        answer("I turned airplane mode off; I have signal now. ###STOP###")])
    episode = llm_episode(monkeypatch)
    asyncio.run(episode.reset())
    result = asyncio.run(episode.step(AgentTurn(content="Please turn airplane mode off.")))
    assert [m["content"] for m in result.observations] == ["I turned airplane mode off; I have signal now. ###STOP###"]
    assert episode.termination == "user_stop" and episode.reward().reward == 1.0
    sent = [json.loads(c.request.content) for c in route.calls]
    assert "tools" in sent[1] and {t["function"]["name"] for t in sent[1]["tools"]} == \
        {t.name for t in TELECOM.user_tools}
    assert "act on your own phone" in sent[0]["messages"][0]["content"]
    # the tool results went back to the user model as tool messages answering its calls
    history = sent[2]["messages"]
    assert [m["role"] for m in history[-3:]] == ["assistant", "tool", "tool"]
    assert history[-2] == {"role": "tool", "tool_call_id": "c0", "content": "Status Bar: ✈️ Airplane Mode | 🔋 80%"}
    assert history[-1]["content"].startswith("Airplane Mode is now OFF.")
    recorded = [m for m in episode.messages if m["role"] == "user" and m.get("tool_calls")]
    assert [c["function"]["name"] for c in recorded[0]["tool_calls"]] == ["check_status_bar", "toggle_airplane_mode"]


@respx.mock
def test_a_user_model_that_never_stops_calling_tools_errors_the_episode(monkeypatch):
    respx.post(URL).mock(side_effect=[answer("Hi, no service."), *[answer(tool_calls=[("check_sim_status", "{}")])] * 3])
    episode = llm_episode(monkeypatch, max_tool_rounds=2)
    asyncio.run(episode.reset())
    asyncio.run(episode.step(AgentTurn(content="Please check your SIM.")))
    assert episode.termination == "user_error" and "kept calling tools: more than 2 rounds" in episode.error


def test_gold_demonstrations_solve_every_train_and_test_task_with_the_scripted_user():
    # what the supervised warm start shows the agent: its own gold calls, and asking the user for theirs
    from ctu.train.demos import gold_turns

    solved = 0
    tasks = TELECOM.split("train") + TELECOM.split("test")
    for task in tasks:
        episode = Episode(TELECOM, task, ScriptedUser(patience=len(task.actions) + 8).start(TELECOM, task),
                          max_turns=len(task.actions) + 2)
        asyncio.run(episode.reset())
        for turn in [*gold_turns(task), AgentTurn(content="Done, your request is complete.")]:
            asyncio.run(episode.step(turn))
            if episode.done:
                break
        solved += episode.reward().reward == 1.0
    assert solved == len(tasks) == 114


def test_the_scripted_user_performs_the_longest_tool_name_it_reads():
    task = TELECOM.task("[mms_issue]bad_wifi_calling[PERSONA:Easy]")
    session = ScriptedUser().start(TELECOM, task)
    episode = Episode(TELECOM, task, session)
    asyncio.run(episode.reset())
    asyncio.run(episode.step(AgentTurn(content="Please toggle wifi calling, then check_status_bar.")))
    called = [c["function"]["name"] for m in episode.messages if m["role"] == "user" for c in m.get("tool_calls", [])]
    assert called == ["toggle_wifi_calling", "check_status_bar"]
