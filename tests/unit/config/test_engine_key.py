"""No credential goes to an engine server unless the config names its variable (engine.api_key_env, empty by
default): the user's OPENAI_API_KEY, set for the user simulator or the judge, never reaches engine.base_url."""

import asyncio

import httpx
import respx

from ctu.config.schema import load_config
from ctu.engines.base import SamplingParams
from ctu.rollout.components import build_engine

CANARY = "sk-canary-0123456789abcdefghijklmnop"
STUB = "http://engine-stub.test/v1"


def reply():
    return httpx.Response(200, json={"id": "c", "object": "text_completion", "model": "m", "choices": [
        {"index": 0, "text": "", "finish_reason": "stop",
         "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.5], "top_logprobs": None, "text_offset": [0]}}]})


def sent_headers(monkeypatch, *overrides):
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    monkeypatch.setenv("MY_ENGINE_KEY", CANARY)
    config = load_config(None, ["engine.kind=remote", f"engine.base_url={STUB}", *overrides])
    with respx.mock:
        route = respx.post(f"{STUB}/completions").mock(return_value=reply())
        asyncio.run(build_engine(config).generate([[1, 2]], SamplingParams(max_tokens=1)))
        return route.calls[0].request.headers


def test_no_key_goes_to_the_engine_server_unless_the_config_names_its_variable(monkeypatch):
    headers = sent_headers(monkeypatch)
    assert CANARY not in str(headers.raw)
    assert load_config(None, []).engine.api_key_env == ""
    named = sent_headers(monkeypatch, "engine.api_key_env=MY_ENGINE_KEY")
    assert named["authorization"] == f"Bearer {CANARY}"
