import asyncio

import pytest

from ctu.episode.env import AgentTurn, Episode, ToolCall, system_prompt
from ctu.episode.users.base import UserSession, UserSimulatorError
from ctu.episode.users.scripted import ScriptedUser
from tests.support.toy_domain import make_toy_domain


def run(coro):
    return asyncio.run(coro)


def episode(task_id="paint", **kw):
    domain = make_toy_domain()
    task = domain.task(task_id)
    return Episode(domain, task, ScriptedUser().start(domain, task), **kw)


def test_reset_gives_system_greeting_and_first_user_message():
    ep = episode()
    msgs = run(ep.reset())
    assert [m["role"] for m in msgs] == ["system", "assistant", "user"]
    assert "<policy>\nBe nice.\n</policy>" in msgs[0]["content"] == system_prompt(ep.domain)
    assert msgs[2]["content"] == "Paint b1 blue please."


def test_full_episode_reaches_user_stop_with_reward_one():
    ep = episode()

    async def play():
        await ep.reset()
        r1 = await ep.step(AgentTurn(tool_calls=(ToolCall("get_box", {"box_id": "b1"}),)))
        assert not r1.done and r1.observations[0]["role"] == "tool" and '"green"' in r1.observations[0]["content"]
        await ep.step(AgentTurn(tool_calls=(ToolCall("paint_box", {"box_id": "b1", "color": "blue"}),)))
        return await ep.step(AgentTurn(content="It is blue now."))

    last = run(play())
    assert last.done and last.termination == "user_stop"
    assert last.observations[-1]["content"].endswith("###STOP###")
    assert ep.reward().reward == 1.0
    # clean OpenAI messages: tool calls carry JSON-string arguments and matching tool messages
    call_msg = ep.messages[3]
    assert call_msg["tool_calls"][0]["function"]["arguments"] == '{"box_id": "b1"}'
    assert ep.messages[4]["tool_call_id"] == call_msg["tool_calls"][0]["id"]


def test_agent_stop_token_ends_the_episode():
    ep = episode()
    run(ep.reset())
    res = run(ep.step(AgentTurn(content="bye ###STOP###")))
    assert res.done and res.termination == "agent_stop"


def test_transfer_tool_ends_the_episode():
    ep = episode()
    run(ep.reset())
    res = run(ep.step(AgentTurn(tool_calls=(ToolCall("transfer_to_human_agents", {"summary": "x"}),))))
    assert res.done and res.termination == "agent_stop"


def test_max_turns_and_max_errors():
    ep = episode(max_turns=2)
    run(ep.reset())
    run(ep.step(AgentTurn(tool_calls=(ToolCall("get_box", {"box_id": "b1"}),))))
    res = run(ep.step(AgentTurn(tool_calls=(ToolCall("get_box", {"box_id": "b1"}),))))
    assert res.done and res.termination == "max_turns" and ep.reward().reward == 0.0

    ep = episode(max_errors=2)
    run(ep.reset())
    bad = AgentTurn(tool_calls=(ToolCall("get_box", {"box_id": "zz"}), ToolCall("nope", {})))
    res = run(ep.step(bad))
    assert res.done and res.termination == "too_many_errors"
    with pytest.raises(RuntimeError):
        run(ep.step(bad))


def test_empty_turn_and_garbage_arguments_do_not_crash():
    ep = episode()
    run(ep.reset())
    res = run(ep.step(AgentTurn(tool_calls=(ToolCall("paint_box", '{"box_id": "b1", "col'),))))
    assert res.observations[0]["content"].startswith("Error: arguments must be a JSON object")
    assert ep.messages[-2]["tool_calls"][0]["function"]["arguments"] == '{"box_id": "b1", "col'
    res = run(ep.step(AgentTurn()))  # says nothing: the user gets an empty message
    assert res.observations and res.observations[0]["role"] == "user"


class FailingSession(UserSession):
    async def reply(self, agent_message):
        raise UserSimulatorError("simulator down after 4 attempts")


def test_user_failure_marks_the_episode_errored_not_a_silent_zero():
    domain = make_toy_domain()
    ep = Episode(domain, domain.task("paint"), FailingSession())
    run(ep.reset())
    assert ep.done and ep.termination == "user_error" and "simulator down" in ep.error


def test_many_concurrent_episodes_do_not_share_state():
    domain = make_toy_domain()
    task = domain.task("paint")

    async def one(i):
        ep = Episode(domain, task, ScriptedUser().start(domain, task))
        await ep.reset()
        color = "blue" if i % 2 else "red"
        await asyncio.sleep(0)
        await ep.step(AgentTurn(tool_calls=(ToolCall("paint_box", {"box_id": "b1", "color": color}),)))
        await asyncio.sleep(0)
        await ep.step(AgentTurn(content=f"now {color}"))
        return i, ep.db.get("boxes", "b1")["color"], ep.reward().reward

    async def all_of_them():
        return await asyncio.gather(*(one(i) for i in range(200)))

    results = run(all_of_them())
    for i, color, reward in results:
        assert color == ("blue" if i % 2 else "red")
        assert reward == (1.0 if i % 2 else 0.0)
    assert domain.db["boxes"]["b1"]["color"] == "green"


def test_scripted_user_on_tau2_style_scenarios():
    from ctu.domains.base import Task

    task = Task(id="x", user_scenario={"instructions": {"reason_for_call": "You want to cancel order #1.",
                                                        "known_info": "Your name is Ana."}})
    session = ScriptedUser(patience=4).start(None, task)
    assert run(session.reply("Hi! How can I help you today?")) == "My name is Ana. I want to cancel order #1."
    assert run(session.reply("Shall I proceed with the cancellation?")) == "Yes, please go ahead."
    assert run(session.reply("What is your zip code?")) == "My name is Ana."
    assert run(session.reply("Your order is cancelled.")).endswith("###STOP###")
    patient = ScriptedUser(patience=2).start(None, task)
    run(patient.reply("hi"))
    run(patient.reply("Which order?"))
    assert run(patient.reply("And your email?")).endswith("###STOP###")


def test_arguments_json_has_no_value_for_are_a_tool_error_not_a_crash():
    ep = episode()
    run(ep.reset())
    result = run(ep.step(AgentTurn(tool_calls=(ToolCall("get_box", {"box_id": {1, 2}}),))))
    assert result.observations[0]["content"].startswith("Error: ") and not ep.done
    assert ep.messages[-2]["tool_calls"][0]["function"]["arguments"] == '{"box_id": "{1, 2}"}'
