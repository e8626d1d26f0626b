"""Remote engine: any OpenAI-compatible server (vLLM, SGLang) through ``POST /v1/completions``.

Prompts are sent as token ids; completions come back as token ids with per-token logprobs
(vLLM's ``return_tokens_as_token_ids`` gives tokens as ``"token_id:123"``). Retries with
exponential backoff on 429/5xx/timeouts/connection errors and on 200 replies that cannot be read (not JSON, the
wrong shape), honouring ``Retry-After``; the error after the last attempt names the URL, status (or the malformed
body's start) and attempts, never the API key. The key is sent (``Authorization: Bearer``) only when
``api_key_env`` names a variable that holds one: no key of this process reaches a server by default. A request
unanswered for ``notice_s`` prints ``waiting for URL``.

Logprobs: a vLLM server returns, for ``logprobs=1``, the sampled token's value under the server's
``--logprobs-mode`` (a server-wide setting, not a request field; vllm/v1/sample/sampler.py): the default
``raw_logprobs`` is ``log_softmax`` of the logits before temperature and top-p; ctu's sampler logprob (the
distribution the token was drawn from, renormalised over the top-k/top-p set) is ``processed_logprobs``. This engine cannot
take weights from the trainer (``accepts_weights = False``): it serves evaluation, and training with
``engine.kind=remote`` must be rejected at config time.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import httpx

from ctu.config.redact import redact
from ctu.engines.base import Completion, Engine, SamplingParams
from ctu.episode.net import NOTICE_S, WaitNotices, completions_reply_problem, join_url, malformed

# what reading a body that is not what was asked for raises (json's JSONDecodeError is a ValueError)
READ_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError)


class RemoteEngineError(RuntimeError):
    """The server could not produce a completion (after retries)."""


class MalformedReply(ValueError):
    """A 2xx body that is not what the request asks for (the words say what is wrong)."""


def _token_id(token: Any) -> int:
    if isinstance(token, int):
        return token
    if isinstance(token, str) and token.startswith("token_id:"):
        return int(token.split(":", 1)[1])
    raise RemoteEngineError(f"server returned token {token!r}, not a token id: start vLLM with "
                            "return_tokens_as_token_ids support (ctu sends it per request)")


def parse_choice(choice: dict[str, Any]) -> Completion:
    """One ``choices[i]`` of a completions response -> Completion."""
    logprobs = choice.get("logprobs") or {}
    tokens = logprobs.get("tokens") or []
    values = logprobs.get("token_logprobs") or []
    ids = tuple(_token_id(t) for t in tokens)
    returned = choice.get("token_ids")  # vLLM's return_token_ids: the sampled ids themselves
    if returned is not None and tuple(returned) != ids:
        raise RemoteEngineError(f"server returned token_ids {list(returned)[:8]}... that differ from its logprob "
                                f"tokens {list(ids)[:8]}...: cannot tell which ids were sampled")
    lps = tuple(float(v) if v is not None else 0.0 for v in values[: len(ids)])
    if len(lps) != len(ids):
        raise RemoteEngineError(f"server returned {len(ids)} tokens but {len(lps)} logprobs")
    reason = choice.get("finish_reason")
    return Completion(ids, lps, "length" if reason == "length" else "stop")


def read_completions(data: Any, n: int, version: int | None) -> list[Completion]:
    """A ``/v1/completions`` reply's ``n`` completions in index order (a server that returned fewer: empty ones, not
    a crash); :class:`MalformedReply` when it is not such a reply."""
    problem = completions_reply_problem(data)
    if problem is not None:
        raise MalformedReply(problem)
    choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
    completions = [replace(parse_choice(c), version=version) for c in choices]
    while len(completions) < n:
        completions.append(Completion((), (), "stop"))
    return completions[:n]


class RemoteEngine(Engine):
    """Generation on an OpenAI-compatible completions server (evaluation only: it takes no weights)."""

    accepts_weights = False

    def __init__(self, base_url: str, model: str, api_key_env: str = "", max_retries: int = 4,
                 timeout: float = 300.0, concurrency: int = 64, backoff_initial: float = 0.5, backoff_max: float = 8.0,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep, transport: httpx.AsyncBaseTransport | None = None,
                 notice_s: float = NOTICE_S):
        self.url = join_url(base_url, "completions")
        self.model = model
        self.max_retries = max_retries
        self.backoff = (backoff_initial, backoff_max)
        self._sleep = sleep
        self.concurrency = concurrency
        self._gates: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        key = os.environ.get(api_key_env) if api_key_env else None  # named by the config, or none is sent
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._timeout = timeout
        self._transport = transport
        self._rng = random.Random(0)
        self.notices = WaitNotices(notice_s)

    def __repr__(self) -> str:
        return f"RemoteEngine(url={redact(self.url)!r}, model={self.model!r})"

    def request_body(self, prompt: Sequence[int], params: SamplingParams, model: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model or self.model, "prompt": list(prompt), "max_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "n": params.n, "logprobs": 1,
            "return_tokens_as_token_ids": True, "return_token_ids": True, "skip_special_tokens": False,
            "include_stop_str_in_output": True,
        }
        if params.top_k:
            body["top_k"] = params.top_k
        if params.stop:
            body["stop"] = list(params.stop)
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            body["seed"] = params.seed
        return body

    async def request(self, client: httpx.AsyncClient, method: str, url: str, body: dict[str, Any] | None = None,
                      retry: Callable[[int], bool] = lambda status: status == 429 or status >= 500) -> httpx.Response:
        """``method url`` with the API key, retried with backoff while ``retry(status)`` (or on timeouts and
        connection errors, honouring ``Retry-After``); any other status is returned as it came."""
        return (await self.request_read(client, method, url, body, retry))[0]

    async def request_read(self, client: httpx.AsyncClient, method: str, url: str, body: dict[str, Any] | None = None,
                           retry: Callable[[int], bool] = lambda status: status == 429 or status >= 500,
                           read: Callable[[httpx.Response], Any] | None = None) -> tuple[httpx.Response, Any]:
        """:meth:`request`, and ``read(response)`` of a 2xx reply (else None): a body ``read`` cannot read (it raises
        one of ``READ_ERRORS``) is retried like a 5xx, then fails naming the URL and the body's start."""
        attempts = self.max_retries + 1
        last = "no attempt"
        for attempt in range(1, attempts + 1):
            delay = None
            try:
                response = await self.notices.wait(url, client.request(method, url, json=body, headers=self._headers))
                if response.status_code < 300 and read is not None:
                    try:
                        return response, read(response)
                    except READ_ERRORS + (RemoteEngineError,) as exc:
                        problem = str(exc) if isinstance(exc, MalformedReply | RemoteEngineError) else (
                            f"not JSON: {exc}" if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError)
                            else f"{type(exc).__name__}: {exc}")
                        last = malformed(problem, response.content)
                elif response.status_code < 400 or not retry(response.status_code):
                    return response, None
                else:
                    last = f"HTTP {response.status_code}"
                    retry_after = response.headers.get("retry-after")
                    delay = float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit() else None
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last = type(exc).__name__
            if attempt < attempts:
                backoff = min(self.backoff[1], self.backoff[0] * 2 ** (attempt - 1)) * (0.5 + self._rng.random() / 2)
                await self._sleep(min(self.backoff[1], delay) if delay is not None else backoff)
        raise RemoteEngineError(redact(f"{url} failed after {attempts} attempts (last error: {last})"))

    async def _post(self, client: httpx.AsyncClient, body: dict[str, Any], n: int,
                    version: int | None) -> list[Completion]:
        response, completions = await self.request_read(client, "POST", self.url, body,
                                                        read=lambda r: self.read_reply(r.json(), body, n, version))
        if response.status_code != 200:
            raise self.post_refused(response)
        return completions

    def post_refused(self, response: httpx.Response) -> RemoteEngineError:
        return RemoteEngineError(redact(f"{self.url} refused the request: HTTP {response.status_code}: "
                                        f"{response.text[:200]}"))

    def read_reply(self, data: Any, body: dict[str, Any], n: int, version: int | None) -> list[Completion]:
        """The completions of the reply ``data`` to the request ``body``."""
        return read_completions(data, n, version)

    def _gate(self) -> asyncio.Semaphore:
        """The request gate of the running event loop (a semaphore serves one loop; each ``asyncio.run`` is new)."""
        loop = asyncio.get_running_loop()
        gate = self._gates.get(loop)
        if gate is None:
            gate = self._gates[loop] = asyncio.Semaphore(self.concurrency)
        return gate

    def target(self) -> tuple[str, int | None]:
        """The ``model`` a request names now and the policy version it serves (None: unknown)."""
        return self.model, None

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                       seeds: Sequence[int] | None = None) -> list[list[Completion]]:
        """Each prompt is its own request; its seed is ``seeds[i]`` (or ``params.seed + i``: a server seeds every
        request on its own, so one shared seed would sample identical prompts identically)."""
        if not prompts:
            return []
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        async with httpx.AsyncClient(timeout=self._timeout, transport=self._transport) as client:

            async def one(i: int, prompt: Sequence[int]) -> list[Completion]:
                seed = seeds[i] if seeds is not None else (None if params.seed is None else params.seed + i * params.n)
                return await self.complete_prompt(client, prompt, replace(params, seed=seed))

            return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

    async def complete_prompt(self, client: httpx.AsyncClient, prompt: Sequence[int],
                              params: SamplingParams) -> list[Completion]:
        """One request: ``params.n`` completions of ``prompt``."""
        async with self._gate():  # the target is read once through it: a request held here must not
            model, version = self.target()  # name an adapter unloaded meanwhile (k + 1 are kept)
            return await self._post(client, self.request_body(prompt, params, model), params.n, version)

    def update_weights(self, named_tensors: Iterable[tuple[str, object]], version: int | None = None) -> None:
        raise NotImplementedError(
            "a remote server cannot take tensors from this process: save a checkpoint and restart or reload the "
            "server on it (vLLM: serve the exported merged model directory)")
