"""The remote and served engines against replies a server should not give (respx; a silent socket server on
127.0.0.1): a 200 whose body cannot be read is retried like a 5xx, then one error naming the redacted URL and the
body's start; a base_url's query stays the query; a request nobody answers is announced and times out."""

import asyncio

import httpx
import pytest
import respx

from ctu.config.redact import forget
from ctu.config.schema import ConfigError, load_config
from ctu.engines.base import SamplingParams
from ctu.engines.vllm.remote import RemoteEngine, RemoteEngineError
from ctu.engines.vllm.served import ServedEngine, ServedEngineError
from ctu.rollout import components
from tests.fakes.chat_server import SilentServer

BASE = "http://vllm.test/v1"
URL = f"{BASE}/completions"
GOOD = {"choices": [{"index": 0, "finish_reason": "stop", "token_ids": [4],
                     "logprobs": {"tokens": ["token_id:4"], "token_logprobs": [-0.1]}}]}
MALFORMED = [
    ({"text": '{"choices": [{bad', "headers": {"content-type": "application/json"}}, "not JSON"),
    ({"text": "<html>proxy error</html>", "headers": {"content-type": "text/html"}}, "not JSON"),
    ({"json": ["x"]}, "not an object"),
    ({"json": {"choices": "x"}}, "'choices' is not a list"),
    ({"json": {"choices": [{"logprobs": {"tokens": "abc"}}]}}, "tokens is not a list"),
    ({"json": {"choices": [{"logprobs": {"tokens": ["hello"], "token_logprobs": [-1.0]}}]}}, "not a token id"),
]


async def no_sleep(seconds):
    pass


def remote(base=BASE, **kw):
    return RemoteEngine(base, "policy", api_key_env="ENGINE_REPLIES_KEY", sleep=no_sleep, **kw)


@pytest.mark.parametrize(("reply", "problem"), MALFORMED)
@respx.mock
def test_a_malformed_200_is_retried_like_a_5xx(reply, problem):
    route = respx.post(URL).mock(side_effect=[httpx.Response(200, **reply), httpx.Response(200, json=GOOD)])
    (out,) = asyncio.run(remote().generate([[1]], SamplingParams(max_tokens=1)))
    assert out[0].token_ids == (4,) and len(route.calls) == 2


@pytest.mark.parametrize(("reply", "problem"), MALFORMED)
@respx.mock
def test_a_server_that_keeps_replying_malformed_fails_naming_url_and_body(reply, problem):
    route = respx.post(URL).mock(return_value=httpx.Response(200, **reply))
    with pytest.raises(RemoteEngineError) as err:
        asyncio.run(remote(max_retries=2).generate([[1]], SamplingParams(max_tokens=1)))
    text = str(err.value)
    assert len(route.calls) == 3 and "failed after 3 attempts" in text and URL in text
    assert "malformed reply" in text and problem in text and "body: '" in text and "\n" not in text


@respx.mock
def test_a_base_url_with_a_query_keeps_it_as_the_query():
    route = respx.route().mock(return_value=httpx.Response(200, json=GOOD))
    engine = remote(BASE + "?api_key=qk-secret-3141")
    asyncio.run(engine.generate([[1]], SamplingParams(max_tokens=1)))
    sent = route.calls[0].request.url
    assert sent.path == "/v1/completions" and sent.params["api_key"] == "qk-secret-3141"
    assert "qk-secret-3141" not in repr(engine)
    forget()


def served(base, **kw):
    return ServedEngine(base, "policy", weights_dir="/nonexistent", api_key_env="ENGINE_REPLIES_KEY",
                        sleep=no_sleep, max_retries=1, **kw)


@respx.mock
def test_served_admin_routes_with_a_query_and_malformed_bodies():
    health = respx.get("http://vllm.test/health").mock(return_value=httpx.Response(200))
    info = respx.get("http://vllm.test/server_info").mock(return_value=httpx.Response(200, text="{oops"))
    engine = served(BASE + "?k=v")
    with pytest.raises(RemoteEngineError) as err:
        engine.connect("merged", lora=False)
    text = str(err.value)
    assert "http://vllm.test/server_info?k=v&config_format=json" in text and "not JSON" in text
    assert "'{oops'" in text and len(info.calls) == 2 and health.calls[0].request.url.params["k"] == "v"
    respx.get("http://vllm.test/v1/models").mock(return_value=httpx.Response(200, json={"data": "x"}))
    with pytest.raises(RemoteEngineError, match="/v1/models.*malformed reply"):
        engine.listed_versions()
    respx.post("http://vllm.test/v1/completions").mock(return_value=httpx.Response(
        200, json={"choices": [{"prompt_logprobs": [None, {"9": {"logprob": -1.0}}]}]}))
    with pytest.raises((RemoteEngineError, ServedEngineError), match="malformed reply|prompt logprobs"):
        engine.prompt_logprobs([1, 2])


def test_a_server_that_never_answers_is_announced_then_times_out():
    lines = []
    with SilentServer() as server:
        engine = remote(server.base_url, max_retries=0, timeout=0.6, notice_s=0.2)
        engine.notices.say = lines.append
        with pytest.raises(RemoteEngineError, match="ReadTimeout"):
            asyncio.run(engine.generate([[1]], SamplingParams(max_tokens=1)))
    assert lines and lines[0].startswith(f"ctu: waiting for {server.base_url}/completions (")


def test_engine_timeout_and_retries_come_from_the_config():
    config = load_config(None, ["engine.kind=remote", "engine.base_url=http://vllm.test/v1", "engine.timeout=7",
                                "engine.max_retries=2"])
    engine = components.build_engine(config)
    assert engine._timeout == 7.0 and engine.max_retries == 2
    default = load_config(None, [])
    assert default.engine.timeout > 0 and default.engine.max_retries >= 1
    for bad, key in (("engine.timeout=0", "engine.timeout"), ("engine.max_retries=-1", "engine.max_retries")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(None, [bad])

