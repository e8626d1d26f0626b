"""ChatClient's connection lifecycle, error reasons and retry budget: over real sockets (a stdlib stub on
127.0.0.1) where the connection pool matters, respx where only the response does."""

import asyncio
import socket

import httpx
import pytest
import respx

from ctu.config.schema import ConfigError, load_config
from ctu.episode.llm_api import ChatAPIConfig, ChatClient, LLMCallError
from ctu.rollout import components
from tests.fakes.chat_server import StubChatServer, completion

SECRET = "sk-test-secret-value-456"
HI = [{"role": "user", "content": "hi"}]


def client(base_url, slept=None, **kw):
    async def fake_sleep(seconds):
        if slept is not None:
            slept.append(seconds)

    return ChatClient(ChatAPIConfig(model="m", base_url=base_url, api_key_env="LLM_API_TEST_KEY", **kw),
                      sleep=fake_sleep)


def test_one_client_serves_every_per_step_event_loop_without_a_failed_attempt():
    # the trainer calls asyncio.run once per step with the same user client: a connection pooled in step 1's
    # (closed) loop made every first attempt of step 2 on fail with "Event loop is closed", hidden by a retry
    slept = []
    with StubChatServer() as server:
        c = client(server.base_url, slept)
        for _ in range(3):
            assert asyncio.run(c.complete(HI)) == "hello"
    assert slept == [] and c.failures == [] and len(server.requests) == 3
    assert c._pools == {}  # each loop's pool was closed when asyncio.run shut the loop down


def test_concurrent_requests_in_one_loop_share_one_pool():
    with StubChatServer() as server:
        c = client(server.base_url)

        async def many():
            return await asyncio.gather(*(c.complete(HI) for _ in range(8)))

        assert asyncio.run(many()) == ["hello"] * 8
    assert c.failures == [] and server.connections <= 8


def test_5xx_and_429_honour_retry_after_over_real_sockets():
    slept = []
    script = [(503, {"error": {"message": "loading model"}}, {"retry-after": "2"}),
              (429, {"error": {"message": "slow down"}}, {"retry-after": "1.5"}),
              (500, "boom", {"retry-after": "120"}),  # capped at backoff_max
              (200, completion("ok"), {})]
    with StubChatServer(script) as server:
        c = client(server.base_url, slept, backoff_max=16.0)
        assert asyncio.run(c.complete(HI)) == "ok"
    assert slept == [2.0, 1.5, 16.0]
    assert c.failures == ["HTTP 503: loading model", "HTTP 429: slow down", "HTTP 500: boom"]


OPENAI_400 = {"error": {"message": "This model's maximum context length is 4096 tokens. However, your messages "
                                   "resulted in 5000 tokens.", "type": "invalid_request_error", "param": "messages",
                        "code": "context_length_exceeded"}}
LLAMA_CPP_400 = {"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                           "type": "exceed_context_size_error"}}
FASTAPI_400 = {"detail": "Server is pinned to 'smollm2'; requested 'gpt-4.1-mini'."}


@pytest.mark.parametrize(("body", "needles"), [
    (OPENAI_400, ["context_length_exceeded", "maximum context length is 4096 tokens"]),
    (LLAMA_CPP_400, ["exceed_context_size_error", "exceeds the available context size"]),
    (FASTAPI_400, ["Server is pinned to 'smollm2'"]),
    ("model not found", ["model not found"]),
])
@respx.mock
def test_a_4xx_names_the_servers_own_reason_and_is_not_retried(body, needles):
    kw = {"json": body} if isinstance(body, dict) else {"text": body}
    route = respx.post("http://api.test/v1/chat/completions").mock(return_value=httpx.Response(400, **kw))
    c = client("http://api.test/v1")
    with pytest.raises(LLMCallError) as err:
        asyncio.run(c.complete(HI))
    text = str(err.value)
    assert "HTTP 400" in text and "not retried" in text and len(route.calls) == 1
    for needle in needles:
        assert needle in text, text
    assert "\n" not in text


@respx.mock
def test_the_servers_reason_never_carries_the_key(monkeypatch):
    monkeypatch.setenv("LLM_API_TEST_KEY", SECRET)
    respx.post("http://api.test/v1/chat/completions").mock(return_value=httpx.Response(
        401, json={"error": {"message": f"Incorrect API key provided: {SECRET}.", "code": "invalid_api_key"}}))
    with pytest.raises(LLMCallError) as err:
        asyncio.run(client("http://api.test/v1").complete(HI))
    assert SECRET not in str(err.value) and "invalid_api_key" in str(err.value) and "<redacted>" in str(err.value)


def test_a_server_that_is_not_there_fails_after_the_budget_with_the_cause():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    slept = []
    c = client(f"http://127.0.0.1:{port}/v1", slept, max_retries=2, backoff_initial=0.01, backoff_max=0.02)
    with pytest.raises(LLMCallError) as err:
        asyncio.run(c.complete(HI))
    assert "failed after 3 attempts" in str(err.value) and "APIConnectionError (ConnectError" in str(err.value)
    assert len(slept) == 2


def min_total_wait(max_retries, initial, cap):
    return sum(min(cap, initial * 2 ** k) * 0.5 for k in range(max_retries))  # jitter is at least 0.5


def test_the_budget_comes_from_yaml_and_its_default_outlasts_a_server_restart(tmp_path):
    config = load_config(None, ["user.kind=llm", "user.base_url=http://u.test/v1", "user.max_retries=2",
                                "user.backoff_initial=0.25", "user.backoff_max=4", "user.timeout=7",
                                "user.max_tokens=64", "judge.enabled=true", "judge.base_url=http://j.test/v1",
                                "judge.max_retries=1", "judge.timeout=3", "judge.max_tokens=99"])
    user = components.build_user(config)
    assert (user.client.config.max_retries, user.client.config.backoff_initial, user.client.config.backoff_max,
            user.client.config.timeout, user.config.max_tokens) == (2, 0.25, 4.0, 7.0, 64)
    judge = components.build_judge(config)
    assert (judge.client.config.max_retries, judge.client.config.timeout, judge.max_tokens) == (1, 3.0, 99)
    # a local server restarts in 15-25 s here (transformers serve); the default waits at least 39 s in all
    default = load_config(None, [])
    for section in (default.user, default.judge, default.shaping):
        assert min_total_wait(section.max_retries, section.backoff_initial, section.backoff_max) >= 30
    api = ChatAPIConfig(model="m")
    assert (api.max_retries, api.backoff_initial, api.backoff_max, api.timeout) == (
        default.user.max_retries, default.user.backoff_initial, default.user.backoff_max, default.user.timeout)


@pytest.mark.parametrize(("override", "key"), [
    ("user.max_retries=-1", "user.max_retries"), ("judge.timeout=0", "judge.timeout"),
    ("shaping.backoff_max=0.1", "shaping.backoff_max"), ("user.max_tokens=0", "user.max_tokens"),
])
def test_a_bad_budget_names_its_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])
