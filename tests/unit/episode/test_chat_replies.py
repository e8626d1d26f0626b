"""Replies a chat server should not give: a 200 whose body is not JSON or not a chat completion is retried like a 5xx,
then fails as LLMCallError naming the (redacted) URL and the body's start; a base_url with a query keeps it as the
query; a server that never answers is announced while ctu waits."""

import asyncio
import json

import httpx
import pytest
import respx

from ctu.config.redact import forget
from ctu.episode.judge import JudgeError, LLMJudge
from ctu.episode.llm_api import ChatAPIConfig, ChatClient, LLMCallError
from ctu.episode.net import join_url, split_query
from ctu.train.shaping import JudgeShaper
from tests.fakes.chat_server import SilentServer, completion

HI = [{"role": "user", "content": "hi"}]
URL = "http://api.test/v1/chat/completions"
MALFORMED = [
    ({"text": '{"choices": [{bad json', "headers": {"content-type": "application/json"}}, "not JSON"),
    ({"text": "<html>" + "x" * 500 + "</html>", "headers": {"content-type": "text/html"}}, "not JSON"),
    ({"json": {"choices": "x"}}, "no 'choices' list"),
    ({"json": [1, 2]}, "not an object"),
    ({"json": {"choices": []}}, "empty 'choices'"),
    ({"json": {"choices": [{"message": {"content": 5}}]}}, "content is not a string"),
    ({"json": {"choices": [{"message": {"content": None, "tool_calls": "x"}}]}}, "tool_calls"),
]


def client(base_url="http://api.test/v1", slept=None, **kw):
    async def fake_sleep(seconds):
        if slept is not None:
            slept.append(seconds)

    return ChatClient(ChatAPIConfig(model="m", base_url=base_url, api_key_env="CHAT_REPLIES_TEST_KEY", **kw),
                      sleep=fake_sleep)


@pytest.mark.parametrize(("reply", "problem"), MALFORMED)
@respx.mock
def test_a_malformed_200_is_retried_like_a_5xx(reply, problem):
    route = respx.post(URL).mock(side_effect=[httpx.Response(200, **reply), httpx.Response(200, json=completion("ok"))])
    slept = []
    c = client(slept=slept)
    assert asyncio.run(c.complete(HI)) == "ok"
    assert len(route.calls) == 2 and len(slept) == 1
    assert "malformed reply" in c.failures[0] and problem in c.failures[0]


@pytest.mark.parametrize(("reply", "problem"), MALFORMED)
@respx.mock
def test_a_server_that_keeps_replying_malformed_fails_naming_url_and_body(reply, problem):
    route = respx.post(URL).mock(return_value=httpx.Response(200, **reply))
    with pytest.raises(LLMCallError) as err:
        asyncio.run(client(max_retries=2).complete(HI))
    text = str(err.value)
    assert len(route.calls) == 3 and "failed after 3 attempts" in text and "http://api.test/v1" in text
    assert problem in text and "body: '" in text and "\n" not in text
    assert len(text) < 600  # the body is quoted cut, not whole


@respx.mock
def test_a_malformed_body_never_shows_the_key(monkeypatch):
    secret = "sk-body-echo-secret-9876"
    monkeypatch.setenv("CHAT_REPLIES_TEST_KEY", secret)
    respx.post(URL).mock(return_value=httpx.Response(200, text=f"<p>bad key {secret}</p>"))
    with pytest.raises(LLMCallError) as err:
        asyncio.run(client(max_retries=0).complete(HI))
    assert secret not in str(err.value) and "<redacted>" in str(err.value)
    forget()


@respx.mock
def test_the_judge_and_shaping_survive_a_malformed_reply():
    respx.post(URL).mock(return_value=httpx.Response(200, text="{not json"))
    judge = LLMJudge(ChatAPIConfig("m", "http://api.test/v1", "CHAT_REPLIES_TEST_KEY", max_retries=1),
                     sleep=lambda s: asyncio.sleep(0))
    with pytest.raises(LLMCallError):  # the agent loop marks the episode errored
        asyncio.run(judge.judge(["did it"], HI))
    from ctu.config.schema import ShapingConfig

    shaper = JudgeShaper(ShapingConfig(enabled=True, base_url="http://api.test/v1", max_retries=1,
                                       api_key_env="CHAT_REPLIES_TEST_KEY"), sleep=lambda s: asyncio.sleep(0))
    assert asyncio.run(shaper.bonus(HI)) == 0.0
    assert JudgeError.__mro__[1] is LLMCallError


@pytest.mark.parametrize(("base", "path", "want"), [
    ("http://h/v1?api_key=K", "completions", "http://h/v1/completions?api_key=K"),
    ("http://h/v1/?a=1&b=2", "/chat/completions", "http://h/v1/chat/completions?a=1&b=2"),
    ("http://h:8000", "/server_info?config_format=json", "http://h:8000/server_info?config_format=json"),
    ("http://h/x?k=v", "/reset_prefix_cache?r=true", "http://h/x/reset_prefix_cache?k=v&r=true"),
    ("http://h/v1", "", "http://h/v1"),
])
def test_join_url_keeps_the_query_as_query(base, path, want):
    assert join_url(base, path) == want


def test_split_query():
    assert split_query("http://h/v1?api_key=K&x=") == ("http://h/v1", {"api_key": "K", "x": ""})
    assert split_query(None) == (None, {})


@respx.mock
def test_a_base_url_with_a_query_posts_to_the_path_with_the_query_kept():
    route = respx.route().mock(return_value=httpx.Response(200, json=completion("ok")))
    assert asyncio.run(client("http://api.test/v1?api_key=abcd1234").complete(HI)) == "ok"
    sent = route.calls[0].request.url
    assert sent.path == "/v1/chat/completions" and sent.params["api_key"] == "abcd1234"
    assert json.loads(route.calls[0].request.content)["model"] == "m"
    forget()


def test_a_server_that_never_answers_is_announced_then_times_out():
    lines = []
    with SilentServer() as server:
        c = client(server.base_url + "?token=tok-secret-777", max_retries=0, timeout=0.6, notice_s=0.2)
        c.notices.say = lines.append
        with pytest.raises(LLMCallError, match="APITimeoutError"):
            asyncio.run(c.complete(HI))
    assert lines and lines[0].startswith("ctu: waiting for http://127.0.0.1:")
    assert "tok-secret-777" not in " ".join(lines) and " s)" in lines[0]
    forget()


@respx.mock
def test_shaping_without_a_verdict_says_so_in_one_line(caplog):
    from types import SimpleNamespace

    from ctu.config.schema import ShapingConfig

    respx.post(URL).mock(side_effect=[httpx.Response(200, text="<html>down</html>")] * 2
                         + [httpx.Response(200, json=completion('{"score": 0.5}'))])
    shaper = JudgeShaper(ShapingConfig(enabled=True, base_url="http://api.test/v1", max_retries=0,
                                       api_key_env="CHAT_REPLIES_TEST_KEY"), sleep=lambda s: asyncio.sleep(0))
    episodes = [SimpleNamespace(messages=HI)] * 3
    with caplog.at_level("WARNING", logger="ctu.train.shaping"):
        bonuses = asyncio.run(shaper.bonuses(episodes))
    assert sorted(bonuses) == [0.0, 0.0, 0.1]
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("shaping: no bonus for 2 of 3 episode(s) (first: model 'gpt-4.1-mini' at http://api.test")
    assert "malformed reply" in line and "<html>down</html>" in line


def test_every_client_announces_a_wait_within_30_s_by_default():
    from ctu.engines.vllm.remote import RemoteEngine
    from ctu.engines.vllm.served import ServedEngine

    assert 0 < ChatAPIConfig("m").notice_s <= 30 and 0 < client().notices.every_s <= 30
    assert 0 < RemoteEngine("http://h/v1", "m").notices.every_s <= 30
    assert 0 < ServedEngine("http://h/v1", "m", weights_dir="/nonexistent").notices.every_s <= 30


def test_a_base_url_query_is_accepted_and_a_fragment_refused_naming_the_key():
    from ctu.config.schema import ConfigError, load_config

    assert load_config(None, ["user.base_url=http://h/v1?api_key=fq-secret-1618"]).user.base_url.endswith("1618")
    with pytest.raises(ConfigError, match=r"^judge\.base_url: has a '#' fragment") as err:
        load_config(None, ["judge.base_url=http://h/v1#frag-secret-1618"])
    assert "frag-secret" not in str(err.value)
    forget()
