"""Served partial rollouts (``trainer.inflight=abort|continue``) against a scripted transport: rows sent again after
a pause are cancelled together when one fails, and a request a pause refused (503) is sent again after the load
with the new target, not retried with its old body (whose version stamp names the weights it no longer meets)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from ctu.engines.base import SamplingParams
from ctu.engines.vllm.remote import RemoteEngineError
from ctu.engines.vllm.served import ServedEngine


def choice(index: int, ids: list[int], reason: str) -> dict:
    return {"index": index, "text": "", "token_ids": ids, "finish_reason": reason,
            "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids)}}


def engine_on(handler, tmp_path, mode="continue") -> ServedEngine:
    return ServedEngine("http://served.test/v1", "m", weights_dir=str(tmp_path), inflight=mode, max_retries=3,
                        backoff_initial=0.05, backoff_max=0.05, transport=httpx.MockTransport(handler))


def complete(engine: ServedEngine, params: SamplingParams):
    async def go():
        async with httpx.AsyncClient(transport=engine._transport) as client:
            return await engine.complete_prompt(client, [1, 2, 3], params)

    return asyncio.run(go())


def test_rows_sent_again_are_cancelled_together_when_one_fails(tmp_path):
    # the re-sends were gathered without cancelling: a failed row left its sibling's request running on the server
    # (and decoding) after the error reached the caller
    state = {"cancelled": False, "bodies": []}

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        state["bodies"].append(body)
        if len(state["bodies"]) == 1:  # both rows stopped by a pause after one token each
            return httpx.Response(200, json={"model": "m", "choices": [choice(0, [7], "abort"), choice(1, [8], "abort")]})
        if body["prompt"][-1] == 7:  # row 0 sent again: refused for good
            return httpx.Response(400, json={"error": {"message": "bad request"}})
        try:  # row 1 sent again: a long decode
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise
        return httpx.Response(200, json={"model": "m", "choices": [choice(0, [9], "length")]})

    engine = engine_on(handler, tmp_path)

    async def go():
        async with httpx.AsyncClient(transport=engine._transport) as client:
            with pytest.raises(RemoteEngineError, match="HTTP 400"):
                await engine.complete_prompt(client, [1, 2, 3], SamplingParams(n=2, max_tokens=4, seed=1))
            await asyncio.sleep(0.05)
            return state["cancelled"]  # before asyncio.run's own clean-up cancels what is left

    assert asyncio.run(go()) and len(state["bodies"]) == 3


def test_a_request_a_pause_refused_goes_again_after_the_load_with_the_new_version(tmp_path):
    # a 503 from a pause was retried inside request_read with the old body: it ran on the new weights once the
    # server resumed, stamped with the version read before the pause (merged weights: the same model name)
    bodies = []

    def finish_load():
        engine.weights_version = 1
        engine.pause_gate.open()

    async def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        if len(bodies) == 1:  # a load began as this request left: the server is paused
            engine.pause_gate.close()
            asyncio.get_running_loop().call_later(0.02, finish_load)
            return httpx.Response(503, json={"error": {"message": "Generation is paused. Please retry after it "
                                                                  "resumes."}})
        return httpx.Response(200, json={"model": "m", "choices": [choice(0, [5, 6], "length")]})

    engine = engine_on(handler, tmp_path, mode="abort")
    (c,) = complete(engine, SamplingParams(n=1, max_tokens=2, seed=1))
    assert len(bodies) == 2 and c.token_ids == (5, 6)
    assert c.version == 1
