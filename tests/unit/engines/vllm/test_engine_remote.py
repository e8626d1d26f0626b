"""The remote engine against a respx-mocked vLLM-style /v1/completions server (no network)."""

import asyncio
import json

import httpx
import pytest
import respx

from ctu.engines.base import SamplingParams
from ctu.engines.vllm.remote import RemoteEngine, RemoteEngineError

BASE = "http://vllm.test/v1"
URL = f"{BASE}/completions"


def choice(index, ids, lps, reason="stop"):
    return {"index": index, "text": "", "finish_reason": reason,
            "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": lps, "top_logprobs": None,
                         "text_offset": list(range(len(ids)))}}


def ok(*choices):
    return httpx.Response(200, json={"id": "c", "object": "text_completion", "model": "m", "choices": list(choices)})


def engine(monkeypatch, **kw):
    monkeypatch.setenv("VLLM_KEY", "secret-key-42")
    slept = []

    async def sleep(s):
        slept.append(s)

    return RemoteEngine(BASE, "policy", api_key_env="VLLM_KEY", sleep=sleep, **kw), slept


@respx.mock
def test_request_fields_and_parsing(monkeypatch):
    route = respx.post(URL).mock(return_value=ok(choice(1, [7, 8], [-0.5, -0.25], "length"), choice(0, [5, 2], [-1.0, -0.1])))
    eng, _ = engine(monkeypatch)
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16, n=2, seed=3, stop_token_ids=(2,), stop=("###",))
    (out,) = asyncio.run(eng.generate([[1, 2, 3]], params))
    body = json.loads(route.calls[0].request.content)
    assert body["prompt"] == [1, 2, 3] and body["n"] == 2 and body["logprobs"] == 1 and body["seed"] == 3
    assert body["return_tokens_as_token_ids"] is True and body["stop_token_ids"] == [2] and body["stop"] == ["###"]
    assert body["skip_special_tokens"] is False and body["temperature"] == 0.8 and body["max_tokens"] == 16
    assert route.calls[0].request.headers["authorization"] == "Bearer secret-key-42"
    assert [c.token_ids for c in out] == [(5, 2), (7, 8)]  # grouped by index
    assert out[0].finish_reason == "stop" and out[1].finish_reason == "length"
    assert out[1].logprobs == (-0.5, -0.25)


@respx.mock
def test_retry_on_429_then_success(monkeypatch):
    route = respx.post(URL).mock(side_effect=[httpx.Response(429, headers={"retry-after": "2"}), ok(choice(0, [4], [-0.1]))])
    eng, slept = engine(monkeypatch)
    (out,) = asyncio.run(eng.generate([[1]], SamplingParams(max_tokens=1)))
    assert out[0].token_ids == (4,) and len(route.calls) == 2 and slept == [2.0]


@respx.mock
def test_500s_exhaust_retries_with_a_clear_error(monkeypatch):
    route = respx.post(URL).mock(return_value=httpx.Response(500))
    eng, slept = engine(monkeypatch, max_retries=2)
    with pytest.raises(RemoteEngineError) as err:
        asyncio.run(eng.generate([[1]], SamplingParams()))
    assert "failed after 3 attempts" in str(err.value) and "HTTP 500" in str(err.value) and URL in str(err.value)
    assert "secret-key-42" not in str(err.value) + repr(eng) and len(route.calls) == 3 and len(slept) == 2
    respx.post(URL).mock(return_value=httpx.Response(400, text="bad prompt"))
    with pytest.raises(RemoteEngineError, match="HTTP 400"):
        asyncio.run(eng.generate([[1]], SamplingParams()))


@respx.mock
def test_empty_choices_and_empty_text_do_not_crash(monkeypatch):
    respx.post(URL).mock(side_effect=[ok(), ok({"index": 0, "text": "", "finish_reason": "stop", "logprobs": None})])
    eng, _ = engine(monkeypatch)
    (a,) = asyncio.run(eng.generate([[1]], SamplingParams()))
    (b,) = asyncio.run(eng.generate([[1]], SamplingParams()))
    assert a[0].token_ids == () and b[0].token_ids == () and b[0].finish_reason == "stop"
    assert asyncio.run(eng.generate([], SamplingParams())) == []


def test_update_weights_is_refused_clearly(monkeypatch):
    eng, _ = engine(monkeypatch)
    with pytest.raises(NotImplementedError, match="reload the server"):
        eng.update_weights([])


def test_remote_engine_takes_no_weights_so_it_cannot_train(monkeypatch):
    eng, _ = engine(monkeypatch)
    assert eng.accepts_weights is False and RemoteEngine.accepts_weights is False
    from ctu.engines.hf.engine import HFEngine
    from ctu.engines.vllm.engine import VLLMEngine

    assert HFEngine.accepts_weights and VLLMEngine.accepts_weights
    with pytest.raises(NotImplementedError, match="cannot take tensors"):
        eng.update_weights([("w", 0)])


@respx.mock
def test_a_request_held_at_the_gate_names_the_adapter_served_when_it_is_sent(monkeypatch):
    """With engine.concurrency=1 a second request waits for the first; if the served adapter changes meanwhile
    (and the old one is unloaded), it must name the new one when it goes, not the one of when it was queued."""
    eng, _ = engine(monkeypatch, concurrency=1)
    served = {"model": "ctu-v0", "version": 0}
    monkeypatch.setattr(eng, "target", lambda: (served["model"], served["version"]))
    sent = []

    async def reply(request):
        sent.append(json.loads(request.content)["model"])
        if len(sent) == 1:  # the first request is in flight: a weight sync swaps the adapter now
            served.update(model="ctu-v1", version=1)
            await asyncio.sleep(0.05)
        return ok(choice(0, [5], [-0.5]))

    respx.post(URL).mock(side_effect=reply)
    out = asyncio.run(eng.generate([[1, 2], [3, 4]], SamplingParams(max_tokens=1, seed=0)))
    assert sent == ["ctu-v0", "ctu-v1"]
    assert [c[0].version for c in out] == [0, 1]  # each stamped with the version its request named


@respx.mock
@pytest.mark.parametrize("named", [None, ""])
def test_no_key_is_sent_unless_the_config_names_its_variable(monkeypatch, named):
    # the engine sent $OPENAI_API_KEY (the user's OpenAI key) as a bearer token to any server it was pointed at
    monkeypatch.setenv("OPENAI_API_KEY", "sk-canary-7f3a")
    route = respx.post(URL).mock(return_value=ok(choice(0, [4], [-0.1])))
    eng = RemoteEngine(BASE, "policy") if named is None else RemoteEngine(BASE, "policy", api_key_env=named)
    asyncio.run(eng.generate([[1]], SamplingParams(max_tokens=1)))
    (call,) = route.calls
    assert "authorization" not in call.request.headers and b"sk-canary" not in call.request.content
