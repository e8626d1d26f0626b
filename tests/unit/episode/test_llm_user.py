"""The LLM user simulator against a respx-mocked OpenAI-compatible API (no network)."""

import asyncio
import json
import random

import httpx
import pytest
import respx

from ctu.domains.base import Task
from ctu.episode.users.base import UserSimulatorError
from ctu.episode.users.llm import LLMUser, LLMUserConfig

BASE = "http://user-sim.test/v1"
URL = f"{BASE}/chat/completions"
SECRET = "sk-test-secret-value-123"
TASK = Task(id="t1", user_scenario={"persona": "Calm.", "instructions": {
    "domain": "retail", "reason_for_call": "You want to cancel order #W1.", "known_info": "You are Ana, zip 12345.",
    "unknown_info": "Your email.", "task_instructions": "Be brief."}})


def reply(text, status=200, headers=None):
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]}
    return httpx.Response(status, json=body if status == 200 else {"error": {"message": "nope"}}, headers=headers)


def make_user(strategy="llm", monkeypatch=None, **kw):
    if monkeypatch is not None:
        monkeypatch.setenv("SIM_KEY", SECRET)
    slept = []

    async def fake_sleep(seconds):
        slept.append(seconds)

    user = LLMUser(LLMUserConfig(model="sim-model", base_url=BASE, api_key_env="SIM_KEY", strategy=strategy, **kw),
                   sleep=fake_sleep)
    return user, slept


def sent(route, i):
    return json.loads(route.calls[i].request.content)


@respx.mock
def test_prompt_is_built_from_the_scenario_and_the_roles_are_flipped(monkeypatch):
    route = respx.post(URL).mock(side_effect=[reply("Hi, I want to cancel an order."), reply("Thanks ###STOP###")])
    user, _ = make_user(monkeypatch=monkeypatch)
    session = user.start(None, TASK, seed=7)
    assert asyncio.run(session.reply("Hi! How can I help you today?")) == "Hi, I want to cancel an order."
    assert asyncio.run(session.reply("Done.")).endswith("###STOP###")
    first = sent(route, 0)
    system = first["messages"][0]["content"]
    for needle in ("cancel order #W1", "You are Ana, zip 12345", "Your email", "###STOP###", "###TRANSFER###",
                   "###OUT-OF-SCOPE###", "Persona:"):
        assert needle in system
    assert first["messages"][1] == {"role": "user", "content": "Hi! How can I help you today?"}
    assert first["seed"] == 7 and first["model"] == "sim-model"
    assert [m["role"] for m in sent(route, 1)["messages"]] == ["system", "user", "assistant", "user"]
    assert route.calls[0].request.headers["authorization"] == f"Bearer {SECRET}"


@respx.mock
def test_react_sends_only_the_user_response(monkeypatch):
    respx.post(URL).mock(return_value=reply("Thought:\nI should ask.\n\nUser Response:\nCan you cancel #W1?"))
    user, _ = make_user("react", monkeypatch)
    session = user.start(None, TASK)
    assert asyncio.run(session.reply("Hello")) == "Can you cancel #W1?"
    assert "User Response:" in session.history[0]["content"]


@respx.mock
def test_verify_regenerates_a_rejected_reply(monkeypatch):
    route = respx.post(URL).mock(side_effect=[reply("My email is a@b.c"), reply("false"), reply("I forgot my email."),
                                              reply("true")])
    user, _ = make_user("verify", monkeypatch)
    assert asyncio.run(user.start(None, TASK).reply("What is your email?")) == "I forgot my email."
    assert len(route.calls) == 4
    assert "Latest customer reply: My email is a@b.c" in sent(route, 1)["messages"][0]["content"]


@respx.mock
def test_reflection_uses_the_reflected_response(monkeypatch):
    route = respx.post(URL).mock(side_effect=[reply("My email is a@b.c"), reply("false"),
                                              reply("Reflection:\nInvented email.\n\nResponse:\nI don't remember it."),
                                              reply("true")])
    user, _ = make_user("reflection", monkeypatch)
    assert asyncio.run(user.start(None, TASK).reply("Email?")) == "I don't remember it."
    assert "Reflection:" in sent(route, 2)["messages"][0]["content"] and len(route.calls) == 4


@respx.mock
def test_429_is_retried_honouring_retry_after(monkeypatch):
    route = respx.post(URL).mock(side_effect=[reply("", 429, {"retry-after": "3"}), reply("ok")])
    user, slept = make_user(monkeypatch=monkeypatch)
    assert asyncio.run(user.start(None, TASK).reply("hi")) == "ok"
    assert len(route.calls) == 2 and slept == [3.0]


@respx.mock
def test_5xx_until_exhausted_raises_a_clear_error_without_the_key(monkeypatch):
    route = respx.post(URL).mock(return_value=reply("", 503))
    user, slept = make_user(monkeypatch=monkeypatch, max_retries=3, backoff_initial=0.5, backoff_max=8.0)
    with pytest.raises(UserSimulatorError) as err:
        asyncio.run(user.start(None, TASK).reply("hi"))
    text = str(err.value)
    assert "failed after 4 attempts" in text and "HTTP 503" in text and "sim-model" in text and BASE in text
    assert SECRET not in text and len(route.calls) == 4 and len(slept) == 3
    # exponential backoff from backoff_initial=0.5 s, doubling per attempt, capped at backoff_max=8 s, each
    # delay scaled by a jitter in [0.5, 1) drawn from random.Random(0) (the client's seed)
    jitter = random.Random(0)
    expected = [min(8.0, 0.5 * 2 ** k) * (0.5 + jitter.random() / 2) for k in range(3)]
    assert slept == pytest.approx(expected, rel=1e-9)
    assert [0.25 <= slept[0] < 0.5, 0.5 <= slept[1] < 1.0, 1.0 <= slept[2] < 2.0] == [True] * 3


@respx.mock
def test_backoff_is_capped_at_backoff_max(monkeypatch):
    respx.post(URL).mock(return_value=reply("", 500))
    user, slept = make_user(monkeypatch=monkeypatch, max_retries=6, backoff_initial=0.5, backoff_max=2.0)
    with pytest.raises(UserSimulatorError):
        asyncio.run(user.start(None, TASK).reply("hi"))
    jitter = random.Random(0)
    bases = [0.5, 1.0, 2.0, 2.0, 2.0, 2.0]
    assert slept == pytest.approx([b * (0.5 + jitter.random() / 2) for b in bases], rel=1e-9)


@respx.mock
def test_400_fails_at_once(monkeypatch):
    route = respx.post(URL).mock(return_value=reply("", 400))
    user, _ = make_user(monkeypatch=monkeypatch)
    with pytest.raises(UserSimulatorError, match="HTTP 400"):
        asyncio.run(user.start(None, TASK).reply("hi"))
    assert len(route.calls) == 1


@respx.mock
def test_timeouts_and_empty_replies_are_retried(monkeypatch):
    route = respx.post(URL).mock(side_effect=[httpx.ReadTimeout("slow"), reply(""), reply("fine")])
    user, _ = make_user(monkeypatch=monkeypatch)
    assert asyncio.run(user.start(None, TASK).reply("hi")) == "fine"
    assert len(route.calls) == 3
    respx.post(URL).mock(return_value=reply("   "))
    with pytest.raises(UserSimulatorError, match="empty reply"):
        asyncio.run(user.start(None, TASK).reply("hi"))


def test_the_key_never_appears_in_reprs_and_a_missing_key_is_named(monkeypatch):
    user, _ = make_user(monkeypatch=monkeypatch)
    assert SECRET not in repr(user) and SECRET not in repr(user.client) and SECRET not in repr(user.config)
    monkeypatch.delenv("SIM_KEY")
    with pytest.raises(UserSimulatorError, match="SIM_KEY is not set"):
        LLMUser(LLMUserConfig(model="m", api_key_env="SIM_KEY"))


@respx.mock
def test_concurrent_sessions_keep_their_own_history(monkeypatch):
    def answer(request):
        body = json.loads(request.content)
        return reply("echo " + body["messages"][-1]["content"])

    respx.post(URL).mock(side_effect=answer)
    user, _ = make_user(monkeypatch=monkeypatch)
    sessions = [user.start(None, TASK, seed=i) for i in range(20)]

    async def talk():
        return await asyncio.gather(*(s.reply(f"agent {i}") for i, s in enumerate(sessions)))

    replies = asyncio.run(talk())
    assert replies == [f"echo agent {i}" for i in range(20)]
    assert all(len(s.history) == 3 and s.history[1]["content"] == f"agent {i}" for i, s in enumerate(sessions))


@respx.mock
def test_reflection_without_a_response_label_never_sends_its_scaffolding(monkeypatch):
    route = respx.post(URL).mock(side_effect=[reply("My email is a@b.c"), reply("false"),
                                              reply("Reflection:\nI invented the email."),  # no Response: label
                                              reply("I don't know my email."), reply("true")])
    user, _ = make_user("reflection", monkeypatch)
    assert asyncio.run(user.start(None, TASK).reply("Email?")) == "I don't know my email."
    regenerated = sent(route, 3)["messages"]
    assert regenerated[-2] == {"role": "assistant", "content": "My email is a@b.c"}
    assert "rejected" in regenerated[-1]["content"] and len(route.calls) == 5


@respx.mock
def test_reflection_echoing_the_template_slot_is_not_a_reply(monkeypatch):
    respx.post(URL).mock(side_effect=[
        reply("My email is a@b.c"), reply("false"),
        reply("Reflection:\nInvented.\n\nResponse:\n<the corrected customer reply>"),
        reply("Sorry, I don't have it."), reply("true")])
    user, _ = make_user("reflection", monkeypatch)
    assert asyncio.run(user.start(None, TASK).reply("Email?")) == "Sorry, I don't have it."


@respx.mock
def test_verify_at_temperature_0_regenerates_something_different(monkeypatch):
    # a temperature-0 server answers the same messages with the same text: regenerating from the same
    # messages (as before) returned the rejected reply again, so verify never changed anything
    verdicts = iter(["false", "true"])

    def deterministic(request):
        messages = json.loads(request.content)["messages"]
        if messages[0]["content"].startswith("You supervise"):
            return reply(next(verdicts))
        return reply(f"reply #{len(json.dumps(messages))}")

    route = respx.post(URL).mock(side_effect=deterministic)
    user, _ = make_user("verify", monkeypatch, temperature=0.0)
    first = f"reply #{len(json.dumps([user.start(None, TASK).history[0], {'role': 'user', 'content': 'Email?'}]))}"
    final = asyncio.run(user.start(None, TASK).reply("Email?"))
    assert final != first and final.startswith("reply #") and len(route.calls) == 4
    assert sent(route, 2)["messages"] != sent(route, 0)["messages"] and sent(route, 2)["temperature"] == 0.0


@respx.mock
def test_react_without_user_response_is_regenerated_never_sent(monkeypatch):
    route = respx.post(URL).mock(side_effect=[reply("Thought:\nI should ask about the order."),
                                              reply("Thought: ok\n\nUser Response:\nWhere is my order?")])
    user, _ = make_user("react", monkeypatch)
    assert asyncio.run(user.start(None, TASK).reply("Hello")) == "Where is my order?"
    assert "User Response:" in sent(route, 1)["messages"][-1]["content"]


@respx.mock
def test_react_reply_without_any_label_is_the_message_and_one_that_never_answers_errors(monkeypatch):
    respx.post(URL).mock(return_value=reply("I want to cancel my order."))
    user, _ = make_user("react", monkeypatch)
    assert asyncio.run(user.start(None, TASK).reply("Hello")) == "I want to cancel my order."
    respx.post(URL).mock(return_value=reply("Thought: hmm"))
    with pytest.raises(UserSimulatorError, match="no usable reply after 3 tries"):
        asyncio.run(user.start(None, TASK).reply("Hello"))
