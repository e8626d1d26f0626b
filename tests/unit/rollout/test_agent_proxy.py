"""The bring-your-own-agent proxy over real HTTP, driven by the real openai SDK: response shape, episode tokens,
stitching (extension vs. rewritten history), the environment API and its errors."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from ctu.domains import get_domain
from ctu.engines.base import Completion, Engine, SamplingParams
from ctu.episode.users.scripted import ScriptedUser
from ctu.rollout.agent_proxy import AgentProxy
from ctu.rollout.external import ExternalEpisodes
from ctu.rollout.loop import EpisodeSpec, RolloutLimits

CALL = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "O1082"}}\n</tool_call>'


class ScriptEngine(Engine):
    """Answers each generate call with the next scripted text (encoded, end-of-turn appended), logprob -0.5 a token;
    keeps every prompt it was given. A text in a tuple is encoded a character at a time: ids a model may sample
    that re-tokenizing the text would not give back."""

    def __init__(self, chat, texts):
        self.chat, self.texts, self.prompts = chat, list(texts), []

    async def generate(self, prompts, params, seeds=None):
        out = []
        for prompt in prompts:
            self.prompts.append(list(prompt))
            text = self.texts.pop(0)
            ids = [i for c in text[0] for i in self.chat.encode(c)] if isinstance(text, tuple) else self.chat.encode(text)
            ids += [self.chat.stop_token_ids[0]]
            reason = "length" if len(ids) > params.max_tokens else "stop"
            ids = ids[: params.max_tokens]
            out.append([Completion(tuple(ids), tuple(-0.5 for _ in ids), reason, version=3)])
        return out

    def update_weights(self, named_tensors, version=None):
        raise NotImplementedError


@pytest.fixture
def served(chat_format):
    def make(texts, max_context_tokens=4096):
        engine = ScriptEngine(chat_format, texts)
        episodes = ExternalEpisodes(chat_format, engine, ScriptedUser(), RolloutLimits(4, 5, max_context_tokens))
        proxy = AgentProxy(episodes).start()
        proxy.call(lambda: episodes.begin(SamplingParams(max_tokens=256, seed=0)))
        domain = get_domain("mini")
        token = proxy.call(episodes.open("ep1", EpisodeSpec(domain, domain.task("mini-0000")), seed=0)).token
        TOKENS[proxy] = token
        made.append(proxy)
        client = openai.OpenAI(base_url=proxy.base_url, api_key=token, max_retries=0)  # as the agent gets it
        return proxy, engine, client

    made: list[AgentProxy] = []
    yield make
    for proxy in made:
        proxy.close()
        TOKENS.pop(proxy, None)


TOKENS: dict[AgentProxy, str] = {}  # each proxy's ep1's token (CTU_EPISODE_TOKEN)


def env(proxy, action, **kwargs):
    """A request to ep1's environment, with its token as the agent sends it."""
    return httpx.post(f"{proxy.env_url('ep1')}/{action}", headers={"Authorization": f"Bearer {TOKENS[proxy]}"},
                      **kwargs)


def start(proxy):
    return env(proxy, "start").json()


def test_the_openai_sdk_reads_tool_calls_text_and_usage_and_turns_stitch_into_one_sample(served, chat_format):
    proxy, engine, client = served([(CALL,), "Your order O1082 is pending."])
    opening = start(proxy)
    assert [m["role"] for m in opening["messages"]] == ["system", "assistant", "user"]
    messages = list(opening["messages"])
    first = client.chat.completions.create(model="ctu", messages=messages, tools=opening["tools"],
                                           extra_headers={"X-Episode-Id": "ep1"})  # the token's episode: served
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == ("function", "get_order",
                                                                                   {"order_id": "O1082"})
    assert first.usage.prompt_tokens == len(chat_format.prompt_ids(messages, opening["tools"]))
    sampled = [i for c in CALL for i in chat_format.encode(c)] + [chat_format.stop_token_ids[0]]
    assert sampled != chat_format.encode(CALL) + [chat_format.stop_token_ids[0]]
    assert first.usage.completion_tokens == len(sampled)
    messages.append(choice.message.model_dump(exclude_none=True))
    step = env(proxy, "step", json={"message": messages[-1]}).json()
    assert step["done"] is False and step["observations"][0]["role"] == "tool"
    assert json.loads(step["observations"][0]["content"])["order_id"] == "O1082"
    messages += step["observations"]
    second = client.chat.completions.create(model="ctu", messages=messages, tools=opening["tools"], user="ep1",
                                            logprobs=True)
    assert second.choices[0].message.content == "Your order O1082 is pending."
    assert second.choices[0].message.tool_calls is None and second.choices[0].finish_reason == "stop"
    assert [t.logprob for t in second.choices[0].logprobs.content] == [-0.5] * second.usage.completion_tokens
    observation = chat_format.observation_ids(step["observations"])
    assert engine.prompts[1] == engine.prompts[0] + sampled + observation  # extended, never re-tokenized
    trajectory = proxy.call(proxy.episodes.finish("ep1"))
    assert trajectory.extra_samples == []
    assert trajectory.prompt_ids == engine.prompts[0]
    assert trajectory.loss_mask == [1] * len(sampled) + [0] * len(observation) + [1] * second.usage.completion_tokens
    assert trajectory.token_versions == [3 if m else -1 for m in trajectory.loss_mask]
    assert trajectory.tool_calls == 1 and trajectory.stop_reason == "done"


def test_the_episode_is_the_tokens_and_a_request_naming_another_is_refused(served):
    proxy, _, client = served(["hi"])
    messages = start(proxy)["messages"]
    stranger = openai.OpenAI(base_url=proxy.base_url, api_key="ctu-local", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as missing:
        stranger.chat.completions.create(model="ctu", messages=messages, user="ep1")
    body = missing.value.body
    assert missing.value.status_code == 401 and "\n" not in body["message"] and body["code"] == "invalid_token"
    with pytest.raises(openai.PermissionDeniedError, match="not episode 'nope'"):
        client.chat.completions.create(model="ctu", messages=messages, user="nope")
    auth = {"Authorization": f"Bearer {TOKENS[proxy]}"}
    bad = httpx.post(proxy.base_url + "/chat/completions", content=b"{not json",
                     headers={**auth, "content-type": "application/json"})
    assert bad.status_code == 400 and "not JSON" in bad.json()["error"]["message"]
    no_messages = httpx.post(proxy.base_url + "/chat/completions", json={"messages": []}, headers=auth)
    assert no_messages.status_code == 400 and no_messages.json()["error"]["param"] == "messages"


def test_a_prompt_that_does_not_extend_the_last_one_starts_a_new_sample(served, chat_format):
    proxy, engine, client = served(["Hello.", "Again."])
    opening = start(proxy)
    client.chat.completions.create(model="ctu", messages=opening["messages"], user="ep1")
    rewritten = [opening["messages"][0], {"role": "user", "content": "summary of the call so far"}]
    client.chat.completions.create(model="ctu", messages=rewritten, user="ep1")
    assert engine.prompts[1] == chat_format.prompt_ids(rewritten, None)  # rendered whole
    trajectory = proxy.call(proxy.episodes.finish("ep1"))
    (earlier,) = trajectory.extra_samples
    assert earlier.prompt_ids == engine.prompts[0] and trajectory.prompt_ids == engine.prompts[1]
    assert earlier.loss_mask == [1] * (len(chat_format.encode("Hello.")) + 1)
    assert trajectory.loss_mask == [1] * (len(chat_format.encode("Again.")) + 1)


def test_environment_api_user_turns_rewards_and_its_errors(served):
    proxy, _, _ = served([])
    reply = env(proxy, "user", json={"content": "Anything else?"}).json()
    assert reply["done"] is True and reply["termination"] == "user_stop"  # the mini script had one line
    over = env(proxy, "user", json={"content": "hello?"})
    assert over.status_code == 409 and "is over (user_stop)" in over.json()["error"]["message"]
    assert env(proxy, "reward", json={"reward": "high"}).status_code == 400
    assert env(proxy, "reward", json={"reward": 0.25}).json()["reward"] == 0.25
    assert env(proxy, "tool", json={}).json()["error"]["param"] == "name"
    trajectory = proxy.call(proxy.episodes.finish("ep1"))
    assert trajectory.reward == 0.25 and "posted by the agent" in trajectory.reasons[-1]
    assert env(proxy, "start").status_code == 401  # finished: closed, its token no longer opens anything


def test_a_prompt_over_the_context_budget_is_refused_and_the_episode_stops_for_context(served):
    proxy, _, client = served(["hi"], max_context_tokens=32)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="ctu", messages=start(proxy)["messages"], user="ep1")
    assert exc.value.body["code"] == "context_length_exceeded"
    trajectory = proxy.call(proxy.episodes.finish("ep1"))
    assert (trajectory.stop_reason, trajectory.termination, trajectory.reward) == ("context", "context", 0.0)


def test_a_turn_cut_by_max_tokens_ends_the_episode_as_ctus_loop_does(served):
    proxy, _, client = served(["Hello there, how can I help you today?"])
    reply = client.chat.completions.create(model="ctu", messages=start(proxy)["messages"], user="ep1", max_tokens=3)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 3
    step = env(proxy, "step", json={"message": reply.choices[0].message.model_dump()}).json()
    assert step == {"observations": [], "done": True, "termination": "length"}
    with pytest.raises(openai.ConflictError, match="is over"):
        client.chat.completions.create(model="ctu", messages=start(proxy)["messages"], user="ep1")
    trajectory = proxy.call(proxy.episodes.finish("ep1"))
    assert (trajectory.stop_reason, trajectory.termination, trajectory.turns) == ("length", "length", 0)
    assert trajectory.messages[-1] == {"role": "assistant", "content": reply.choices[0].message.content}
