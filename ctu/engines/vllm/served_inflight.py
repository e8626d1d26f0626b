"""Partial rollouts on a vLLM server (``trainer.inflight=abort|continue`` with ``engine.kind=served``).

Facts from vLLM 0.33 (vllm/entrypoints/rl/online/api_router.py, vllm/entrypoints/launchers/api_server/routers.py,
vllm/v1/engine/async_llm.py, vllm/v1/engine/core.py, vllm/v1/engine/output_processor.py):

- ``POST /pause?mode=abort`` (the default mode), ``POST /resume`` and ``GET /is_paused`` are registered only with
  ``VLLM_SERVER_DEV_MODE=1`` (``register_rl_api_routers``, beside the dev routes).
- ``mode=abort`` finishes every running and waiting request ``FINISHED_ABORTED`` and returns once their outputs
  are sent. A non-streaming ``/v1/completions`` request so stopped answers 200 with the tokens it sampled so far
  (``token_ids``, their logprobs; the output processor keeps every token in FINAL_ONLY mode) and
  ``finish_reason: "abort"``. Until ``/resume`` new requests are refused: 503, "Generation is paused. Please
  retry after it resumes." (``RetryableRequestError``). ``mode=keep`` would freeze requests and run them on under
  the new weights with the old weights' KV; ``mode=wait`` lets them finish (ctu's ``finish``): neither is used.

ctu pauses only around its own loads (:func:`paused`) and holds its own requests at a local gate meanwhile, so a
request is refused only when it was on its way as the pause began; it is sent again once the server resumed.

Measured with vLLM 0.33 on CPU: where the engine core samples faster than the API process turns tokens into JSON
(a tiny model), the API process's output handler never yields its event loop while a request runs (``await`` on
a non-empty queue), so it answers no route, ``/pause`` included, until the request is done: the pause then stops
nothing and the rows ran to their end on the weights they began with (stamped with that version, as ``finish``
would). ctu counts such rows (``unstopped_rows``) and says so once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from ctu.config.redact import redact
from ctu.engines.base import Completion, SamplingParams
from ctu.engines.vllm.remote import RemoteEngineError

if TYPE_CHECKING:
    import httpx

ServedEngine = Any  # ctu.engines.vllm.served.ServedEngine, which imports this module

log = logging.getLogger(__name__)
T = TypeVar("T")

RESEND_SEED_STEP = 1_000_003  # a row sent again samples from a seed of its own (not the stream it began with)


class PauseGate:
    """Closed from ctu's ``/pause`` until its ``/resume``; ``epoch`` counts the pauses (a request refused while
    one began is sent again)."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self.epoch = 0

    def close(self) -> None:
        self.epoch += 1
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def wait(self) -> None:
        while not self._open.is_set():
            await asyncio.sleep(0.005)


@contextmanager
def paused(engine: ServedEngine) -> Iterator[None]:
    """The server paused (``mode=abort``: its running requests stop and return what they sampled) while the
    ``with`` body loads weights, then resumed; ``trainer.inflight=finish``: nothing."""
    if engine.inflight == "finish":
        yield
        return
    engine.pause_gate.close()
    try:
        response = engine.call("POST", "/pause?mode=abort")
        if response.status_code != 200:
            raise engine.fail("POST /pause?mode=abort", response)
        yield
    finally:
        try:
            response = engine.call("POST", "/resume")
            if response.status_code != 200:
                raise engine.fail("POST /resume", response)
        finally:
            engine.pause_gate.open()


async def complete_with_pauses(engine: ServedEngine, client: httpx.AsyncClient, prompt: Sequence[int],
                               params: SamplingParams) -> list[Completion]:
    """``params.n`` completions of ``prompt``; rows a pause stopped go on once the server resumed: sampled again
    from scratch (``abort``), or from prompt + their tokens with what is left of ``max_tokens`` (``continue``; each
    token stamped with the version that sampled it, the completion's ``version`` the oldest)."""
    sampled: dict[int, tuple[list[int], list[float], list[int]]] = {j: ([], [], []) for j in range(params.n)}
    done: dict[int, Completion] = {}
    pending, rounds = list(range(params.n)), 0
    while pending:
        await engine.pause_gate.wait()
        epoch = engine.pause_gate.epoch
        async with engine._gate():  # the target is read once through it (see RemoteEngine.generate)
            model, version = engine.target()
            if rounds == 0:
                sends = [(pending, engine.request_body(prompt, params, model))]
            else:
                sends = [([j], engine.request_body(list(prompt) + sampled[j][0], replace(
                    params, n=1, max_tokens=params.max_tokens - len(sampled[j][0]),
                    seed=None if params.seed is None else params.seed + j + RESEND_SEED_STEP * rounds), model))
                    for j in pending]
            try:
                replies = await gather_or_cancel([post_reading_aborts(engine, client, body, len(rows), version, epoch)
                                                  for rows, body in sends])
            except RemoteEngineError:
                if engine.pause_gate.epoch != epoch:  # refused (503) by a pause that began meanwhile: again
                    continue
                raise
        rounds += 1
        stamp = -1 if version is None else version
        paused_meanwhile = engine.pause_gate.epoch != epoch
        for (rows, _), (completions, aborted) in zip(sends, replies, strict=True):
            for j, c, stopped in zip(rows, completions, aborted, strict=True):
                if paused_meanwhile and not stopped:
                    unstopped(engine)
                ids, lps, vs = sampled[j]
                if stopped and engine.inflight == "abort":
                    engine.interrupted_rows += 1
                    sampled[j] = ([], [], [])
                    continue
                ids, lps = ids + list(c.token_ids), lps + list(c.logprobs)
                vs = vs + [stamp] * len(c.token_ids)
                if stopped and len(ids) < params.max_tokens:
                    engine.interrupted_rows += 1
                    sampled[j] = (ids, lps, vs)
                    continue
                mixed = len(set(vs)) > 1
                only = version if not vs else (None if vs[0] == -1 else vs[0])
                done[j] = Completion(tuple(ids), tuple(lps), "length" if stopped else c.finish_reason,
                                     min(vs) if mixed else only, tuple(vs) if mixed else None)
        pending = [j for j in pending if j not in done]
    return [done[j] for j in range(params.n)]


def unstopped(engine: ServedEngine) -> None:
    """A row that a pause began during and did not stop: counted, said once per engine."""
    engine.unstopped_rows += 1
    if engine.unstopped_rows == 1:
        log.warning("%s: a load's POST /pause?mode=abort did not stop the requests running: they ran to their end on "
                    "the weights they began with, stamped with that version, as trainer.inflight=finish would "
                    "(trainer.inflight=%s). A server answers /pause that late when its API process cannot keep up "
                    "with its engine core (seen with tiny models on CPU). Said once; the engine counts such rows "
                    "(unstopped_rows)", redact(engine.root), engine.inflight)


async def gather_or_cancel(calls: Sequence[Awaitable[T]]) -> list[T]:
    """Every call's result in order; the first to raise cancels the others (a failed row must not leave its
    siblings decoding on the server) and its error is raised once they are gone."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def post_reading_aborts(engine: ServedEngine, client: httpx.AsyncClient, body: dict[str, Any], n: int,
                              version: int | None, epoch: int) -> tuple[list[Completion], list[bool]]:
    """A completions request's ``n`` completions and, for each, whether a pause stopped it (``"abort"``). Sent
    while the pause gate's ``epoch`` was current: once a pause began, a refusal (the server's 503 while paused) is
    not retried with this body, whose target may be unloaded or overwritten by the load: the caller sends it again
    after the resume, reading the target anew."""
    def read(response: httpx.Response) -> tuple[list[Completion], list[bool]]:
        data = response.json()
        completions = engine.read_reply(data, body, n, version)
        choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
        aborted = [c.get("finish_reason") == "abort" for c in choices][:n]
        return completions, aborted + [False] * (n - len(aborted))

    def retry(status: int) -> bool:
        return (status == 429 or status >= 500) and engine.pause_gate.epoch == epoch

    response, out = await engine.request_read(client, "POST", engine.url, body, retry=retry, read=read)
    if response.status_code != 200:
        raise engine.post_refused(response)
    return out
