"""Training through a running vLLM server (``engine.kind=served``): OpenAI completions for rollouts, new weights
pushed over HTTP while the server runs.

Facts from vLLM 0.33's server (vllm/entrypoints/openai/models/serving.py, vllm/entrypoints/serve/lora/api_router.py,
vllm/entrypoints/serve/dev/, vllm/entrypoints/rl/online/api_router.py, vllm/v1/core/kv_cache_utils.py):

- **Tokens**: prompts go as token ids; ``return_tokens_as_token_ids`` and ``return_token_ids`` bring back the sampled
  ids (checked to agree), ``logprobs=1`` their logprobs under the server's ``--logprobs-mode`` (see
  :mod:`ctu.engines.vllm.remote`); nothing is re-tokenized. ``prompt_logprobs=0`` scores a prompt's own tokens with
  ``log_softmax`` of the logits (no temperature): the parity probe uses it.
- **LoRA hot-load** (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, ``--enable-lora``): ``POST /v1/load_lora_adapter``
  ``{"lora_name", "lora_path"}`` reads a PEFT directory *on the server's file system*; 200 with a text body, 400 when
  the name is already loaded (unless ``load_inplace``), 404 when the path holds no adapter, 500 for other load
  failures. ``POST /v1/unload_lora_adapter`` ``{"lora_name"}``: 200, or 404 for an unknown name. Without the variable
  the routes do not exist (404 ``{"detail": "Not Found"}``). A request whose ``model`` is not loaded gets 404.
  Unloading only drops the name: requests already running keep their adapter, and an adapter evicted from the
  ``--max-loras`` slots is re-read from its path, so the newest ``keep`` directories stay on disk.
  Each version is a new name ``ctu-v<version>`` at a new path; the prefix-cache block hash includes both, so no
  request of a new version can hit KV computed by an older one.
- **Dev routes** (``VLLM_SERVER_DEV_MODE=1``): ``POST /reset_prefix_cache`` (``{"success": bool}``; false while
  requests hold blocks, ``?reset_running_requests=true`` preempts them), ``GET /server_info?config_format=json``
  (``lora_config.max_loras``, ``model_config.logprobs_mode``), ``POST /collective_rpc`` ``{"method":
  "reload_weights", "kwargs": {"weights_path": DIR}}`` (merged weights from safetensors on the server's disk),
  ``POST /update_weight_version`` ``{"new_version"}`` and ``GET /weight_info`` (the reload stamp). Merged sync
  needs them; without dev mode a merged sync is refused in one line that says to train LoRA.
- **Sleep** (vllm/entrypoints/serve/dev/sleep/api_router.py, vllm/v1/engine/core.py; dev mode and
  ``--enable-sleep-mode``, CUDA only): ``POST /sleep?level=1&mode=...`` pauses the scheduler (requests queue) and
  offloads the weights to host RAM, dropping the KV cache; ``POST /wake_up?tags=weights|kv_cache`` (repeatable;
  none: all) answers ``"sleeping"`` until every tag is awake, then scheduling resumes.
"""

from __future__ import annotations

import logging
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx

from ctu.config.redact import redact
from ctu.config.yaml_load import ConfigError
from ctu.engines.base import Completion, SamplingParams
from ctu.engines.vllm.remote import MalformedReply, RemoteEngine, RemoteEngineError
from ctu.engines.vllm.served_inflight import PauseGate, complete_with_pauses, paused
from ctu.engines.vllm.served_wire import (
    ADMIN_RETRY,
    ServedEngineError,
    adapter_name,
    json_object,
    model_ids,
    route_missing,
    run_sync,
    server_info,
    server_message,
    server_root,
    version_of,
)
from ctu.episode.net import join_url

log = logging.getLogger(__name__)


class ServedEngine(RemoteEngine):
    """A vLLM server that takes the trainer's weights: LoRA adapters hot-loaded per version, or merged weights
    reloaded from disk (dev mode). ``weights_dir`` must be readable by the server at the same path (same machine,
    or a shared file system). ``keep``: adapter versions whose directories stay on disk (staleness + 1).
    ``inflight`` (``trainer.inflight``): ``finish`` lets requests run through a load; ``abort``/``continue`` pause the
    server around each load and send the stopped rows again (:mod:`ctu.engines.vllm.served_inflight`). ``sleep_mode``: the
    server was started with ``--enable-sleep-mode`` beside the trainer (:meth:`sleep`)."""

    accepts_weights = True

    def __init__(self, base_url: str, model: str, *, weights_dir: str, keep: int = 2, lora_alpha: float | None = None,
                 server=None, inflight: str = "finish", sleep_mode: bool = False, **remote_kwargs):
        super().__init__(base_url, model, **remote_kwargs)
        self.inflight = inflight
        self.pause_gate = PauseGate()
        self.interrupted_rows = 0  # rows a pause stopped (abort / continue)
        self.unstopped_rows = 0  # rows a pause began during and did not stop (a server that answered it late)
        self.sleep_mode = sleep_mode
        self.asleep: set[str] = set()  # the server's tags this engine put to sleep and has not woken
        self.root = server_root(base_url)
        self.weights_dir = Path(weights_dir)
        self.keep = max(1, int(keep))
        self.lora_alpha = lora_alpha
        self.server = server  # a LaunchedServer this engine stops on close
        self.served = model  # the ``model`` requests name: the base model, then the adapter of the newest version
        self.weights_version: int | None = 0  # the initial weights are policy version 0
        self.info: dict[str, Any] | None = None  # /server_info's vllm_config (dev mode), read by :meth:`connect`
        self.logprobs_mode: str | None = None
        self.loaded: list[str] = []  # adapter names this engine loaded and has not unloaded
        self.written: list[Path] = []  # directories this engine wrote, oldest first
        self.prefix_reset = True  # the server has /reset_prefix_cache (dev mode)
        self._warned_fingerprint = False
        self.tag = uuid.uuid4().hex[:8]
        self._lock = threading.Lock()
        self._warned_inexact = False

    def __repr__(self) -> str:
        return f"ServedEngine(url={redact(self.root)!r}, serving={self.served!r})"

    # -- HTTP ---------------------------------------------------------------------------------
    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             read: Callable[[httpx.Response], Any] | None = None) -> httpx.Response:
        """``method`` on the server's ``path`` (retried on ``ADMIN_RETRY``); with ``read``, :meth:`call_read`'s
        response alone."""
        return self.call_read(method, path, body, read)[0]

    def call_read(self, method: str, path: str, body: dict[str, Any] | None = None,
                  read: Callable[[httpx.Response], Any] | None = None) -> tuple[httpx.Response, Any]:
        """The response and ``read(response)`` of a 2xx (a body it cannot read is retried, then fails naming the
        URL and the body's start)."""
        async def go():
            async with httpx.AsyncClient(timeout=self._timeout, transport=self._transport) as client:
                return await self.request_read(client, method, join_url(self.root, path), body,
                                               retry=lambda s: s in ADMIN_RETRY, read=read)

        return run_sync(go())

    def fail(self, what: str, response: httpx.Response | None = None, hint: str = "") -> ServedEngineError:
        status = f": HTTP {response.status_code}: {server_message(response)}" if response is not None else ""
        return ServedEngineError(f"{redact(self.root)}: {what} failed{status}{hint}")

    # -- connecting ---------------------------------------------------------------------------
    def connect(self, weight_sync: str, lora: bool) -> None:
        """Check the server before training: healthy, and able to take this run's weights (``weight_sync``:
        ``adapter`` or ``merged``). Reads ``/server_info`` where dev mode serves it (max_loras, logprobs mode)."""
        health = self.call("GET", "/health")
        if health.status_code != 200:
            raise self.fail("GET /health", health)
        response, data = self.call_read("GET", "/server_info?config_format=json", read=server_info)
        self.info = self.logprobs_mode = None
        if response.status_code == 200:
            self.info = data
            self.logprobs_mode = (self.info.get("model_config") or {}).get("logprobs_mode")
        if weight_sync == "adapter":
            probe = self.call("POST", "/v1/unload_lora_adapter", {"lora_name": "ctu-route-check"})
            if probe.status_code == 401:
                raise self.fail("POST /v1/unload_lora_adapter", probe, hint=": the server wants an API key: put it "
                                "in the environment variable named by engine.api_key_env")
            if route_missing(probe):
                raise self.fail("LoRA hot-load", probe, hint=": no /v1/load_lora_adapter route: start the server with "
                                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora")
            lora_config = (self.info or {}).get("lora_config", "unknown")
            if lora_config is None:
                raise self.fail("LoRA hot-load", hint=": the server runs without --enable-lora")
            if isinstance(lora_config, dict) and int(lora_config.get("max_loras", 1)) < self.keep:
                raise self.fail("LoRA hot-load", hint=f": the server's --max-loras is {lora_config.get('max_loras')}, "
                                f"training needs >= {self.keep} (trainer.max_staleness + 1; engine.max_loras)")
            for leftover in self.listed_versions():  # a previous run's adapters (resume): its names are ours to reuse
                log.warning("%s: unloading adapter %s left by an earlier run", redact(self.root), adapter_name(leftover))
                self.loaded.append(adapter_name(leftover))
                self.unload(adapter_name(leftover))
        elif self.info is None:
            raise self.fail("merged weight sync", response, hint=": it reloads weights through the dev routes "
                            "(/collective_rpc reload_weights): start the server with VLLM_SERVER_DEV_MODE=1, or "
                            "train LoRA (lora.enabled=true), whose adapters hot-load through /v1/load_lora_adapter")
        if self.inflight != "finish" and route_missing(self.call("GET", "/is_paused")):
            raise ConfigError(f"trainer.inflight: {self.inflight} stops the requests running at a weight load "
                              f"through the server's /pause and /resume routes, and {redact(self.root)} has none: "
                              "start it with VLLM_SERVER_DEV_MODE=1, or trainer.inflight=finish")

    @property
    def reloads_base(self) -> bool:
        """Whether the server can reload merged weights (its dev routes): a LoRA run needs it once the warm start
        is merged into the base."""
        return self.info is not None

    # -- generation ---------------------------------------------------------------------------
    def target(self) -> tuple[str, int | None]:
        with self._lock:
            return self.served, self.weights_version

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                       seeds: Sequence[int] | None = None) -> list[list[Completion]]:
        from ctu.engines.vllm.engine import logprobs_exact

        if self.logprobs_mode and not self._warned_inexact and not logprobs_exact(self.logprobs_mode, params):
            self._warned_inexact = True
            log.warning("the server's --logprobs-mode %s is not the sampling distribution's logprob for T=%s, "
                        "top_p=%s: sampler logprobs are inexact (serve with --logprobs-mode processed_logprobs)",
                        self.logprobs_mode, params.temperature, params.top_p)
        return await super().generate(prompts, params, seeds)

    async def complete_prompt(self, client: httpx.AsyncClient, prompt: Sequence[int],
                              params: SamplingParams) -> list[Completion]:
        if self.inflight == "finish":
            return await super().complete_prompt(client, prompt, params)
        return await complete_with_pauses(self, client, prompt, params)

    def read_reply(self, data: Any, body: dict[str, Any], n: int, version: int | None) -> list[Completion]:
        completions = super().read_reply(data, body, n, version)
        self.check_model(body["model"], data.get("model"))
        return completions

    def check_model(self, sent: str, answered: Any) -> None:
        """A request for adapter ``ctu-v<v>`` answered under another name stops the run: something between ctu
        and the server (a proxy, another deployment) maps the name elsewhere. vLLM itself answers with the
        request's own adapter name (``OpenAIServingModels.model_name(lora_request)``), so this cannot see an
        adapter that holds old values under a new name (docs/engines.md: no outside check of adapter weights)."""
        if version_of(sent) is not None and answered != sent:
            raise ServedEngineError(f"{redact(self.root)}: asked for '{sent}', the reply is from '{answered}': the "
                                    "server serves something other than the adapter ctu loaded")

    def generate_sync(self, prompts, params, seeds=None) -> list[list[Completion]]:
        return run_sync(self.generate(prompts, params, seeds))

    def prompt_logprobs(self, ids: Sequence[int]) -> list[float]:
        """The server's ``log_softmax(logits)`` of ``ids[1:]`` given what precedes each (``prompt_logprobs=0``)."""
        model, _ = self.target()
        body = {"model": model, "prompt": list(ids), "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0,
                "return_token_ids": True}
        def rows_of(response: httpx.Response) -> list[float]:
            data = json_object(response)
            rows = ((data.get("choices") or [{}])[0] or {}).get("prompt_logprobs") or []
            self.check_model(model, data.get("model"))
            if len(rows) != len(ids):
                raise MalformedReply(f"{len(rows)} prompt logprob rows for {len(ids)} prompt tokens")
            return [float(row[str(t)]["logprob"]) for row, t in zip(rows[1:], ids[1:], strict=True)]

        response, values = self.call_read("POST", "/v1/completions", body, read=rows_of)
        if response.status_code != 200:
            raise self.fail(f"prompt logprobs of the parity probe with model '{model}'", response)
        return values

    # -- weights ------------------------------------------------------------------------------
    def update_adapter(self, named_tensors: Iterable[tuple[str, object]], version: int, peft_config=None) -> None:
        """Write the adapter of ``version`` under ``weights_dir``, load it as ``ctu-v<version>``, reset the prefix
        cache, check the server lists it, serve it, unload versions older than the newest ``keep``."""
        from ctu.engines.vllm.engine import write_peft_adapter

        name = adapter_name(version)
        again = name in self.loaded  # the same version with new weights (the initial weights, then the warm start)
        path = self.weights_dir / f"{name}-{self.tag}"  # a path of this engine's own: vLLM's block hash includes it
        shutil.rmtree(path, ignore_errors=True)  # a resumed run's leftover of the same version
        write_peft_adapter(named_tensors, str(path), peft_config, self.lora_alpha)
        self.written.append(path)
        self.wake_up(["weights"])
        self.wake_up(["kv_cache"])
        with paused(self):  # trainer.inflight=abort|continue: no request runs across the load
            self._load_adapter(name, path, again, version)
        for old in [n for n in self.loaded if n != name][: max(0, len(self.loaded) - self.keep)]:
            self.unload(old)  # the newest ``keep`` stay: requests in flight under max_staleness may still name them
        self._prune()

    def _load_adapter(self, name: str, path: Path, again: bool, version: int) -> None:
        """Load, reset the prefix cache, and serve ``name`` once the server lists it."""
        body = {"lora_name": name, "lora_path": str(path), **({"load_inplace": True} if again else {})}
        response = self.call("POST", "/v1/load_lora_adapter", body)
        if response.status_code != 200:
            raise self.fail(f"loading adapter '{name}' from {path}", response)
        if not again:
            self.loaded.append(name)
        self.reset_prefix_cache(running=False)
        listed = self.listed_versions()
        if version not in listed:  # accepted but not served: keep serving what is, its stamp stops the run
            with self._lock:
                self.weights_version = version_of(self.served) if self.served != self.model else 0
            return
        with self._lock:  # requests sent from now on name the new adapter
            self.served, self.weights_version = name, version

    def unload(self, name: str) -> None:
        response = self.call("POST", "/v1/unload_lora_adapter", {"lora_name": name})
        if response.status_code != 200:
            raise self.fail(f"unloading adapter '{name}'", response)
        self.loaded.remove(name)

    def listed_versions(self) -> list[int]:
        """The ``ctu-v<version>`` adapters the server lists in ``GET /v1/models``."""
        response, names = self.call_read("GET", "/v1/models", read=model_ids)
        if response.status_code != 200:
            raise self.fail("GET /v1/models", response)
        return sorted(v for v in map(version_of, names) if v is not None)

    def update_weights(self, named_tensors: Iterable[tuple[str, object]], version: int | None = None) -> None:
        """Merged Hugging Face weights: written as safetensors under ``weights_dir``, reloaded by the server
        (``/collective_rpc reload_weights``), prefix cache reset (running requests preempted and recomputed),
        stamped ``ctu-v<version>`` and read back from ``/weight_info``."""
        from ctu.engines.vllm.engine import hf_named_stream, write_safetensors_shards

        if self.info is None:
            self.connect("merged", lora=False)
        path = self.weights_dir / f"merged-v{version}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        bad: list[str] = []
        write_safetensors_shards(hf_named_stream(named_tensors, bad), str(path))
        if bad:
            shutil.rmtree(path, ignore_errors=True)
            raise ValueError(f"the server needs merged Hugging Face names, not PEFT names such as {bad[0]}")
        self.written.append(path)
        self.wake_up(["weights"])
        with paused(self):  # trainer.inflight=abort|continue: no request runs across the reload
            self._reload(path, version)
        self._prune(keep=1)

    def _reload(self, path: Path, version: int | None) -> None:
        """Reload merged weights from ``path``, reset the prefix cache, stamp and read back the version."""
        response = self.call("POST", "/collective_rpc", {"method": "reload_weights",
                                                         "kwargs": {"weights_path": str(path)}})
        if response.status_code != 200:
            hint = (": start the server with VLLM_SERVER_DEV_MODE=1 or train LoRA (lora.enabled=true)"
                    if route_missing(response) else "")
            raise self.fail(f"reloading merged weights of version {version} from {path}", response, hint)
        self.wake_up(["kv_cache"])
        self.reset_prefix_cache(running=True)
        stamp = self.call("POST", "/update_weight_version", {"new_version": adapter_name(version)})  # type: ignore[arg-type]
        if stamp.status_code != 200:
            raise self.fail(f"stamping weight version {version}", stamp)
        info, data = self.call_read("GET", "/weight_info", read=json_object)
        served = version_of(str(data.get("weight_version"))) if info.status_code == 200 else None
        with self._lock:
            self.weights_version = served

    def sleep(self) -> None:
        """``POST /sleep?level=1&mode=wait`` (a server ctu launched on CUDA beside the trainer; else nothing): its
        weights go to pinned host RAM and its KV cache is dropped while the trainer updates. Level 1, not 2: an
        adapter sync keeps the base, and the woken weights are the ones served (a merged reload overwrites them).
        ``mode=wait``: a request still running finishes first (ctu sleeps between rollouts)."""
        if self.sleep_mode and not self.asleep:
            response = self.call("POST", "/sleep?level=1&mode=wait")
            if response.status_code != 200:
                raise self.fail("POST /sleep?level=1", response)
            self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """``POST /wake_up?tags=...`` for ``tags`` still asleep (None: all): a load wakes the weights first, the KV
        cache after (its memory is not needed to load); the server schedules again once both are awake."""
        wanted = sorted(self.asleep & set(tags if tags is not None else self.asleep))
        if wanted:
            response = self.call("POST", "/wake_up?" + "&".join(f"tags={t}" for t in wanted))
            if response.status_code != 200:
                raise self.fail(f"POST /wake_up ({', '.join(wanted)})", response)
            self.asleep -= set(wanted)

    def fingerprint(self):
        """The server's own fingerprint of its weights (``/collective_rpc ctu_fingerprint``: a server started with
        ``--worker-extension-cls`` :data:`~ctu.engines.checks.fingerprint.EXTENSION` and dev mode); None without it
        (said once)."""
        from ctu.engines.checks.fingerprint import EXTENSION, Fingerprint

        response, data = self.call_read("POST", "/collective_rpc", {"method": "ctu_fingerprint"}, read=json_object)
        results = data.get("results") if response.status_code == 200 and isinstance(data, dict) else None
        if not results or not isinstance(results[0], list):
            if not self._warned_fingerprint:
                self._warned_fingerprint = True
                log.warning("%s cannot fingerprint its weights (start it with --worker-extension-cls %s and "
                            "VLLM_SERVER_DEV_MODE=1): merged loads are checked by version and parity only",
                            redact(self.root), EXTENSION)
            return None
        return Fingerprint.of(results[0])

    def reset_prefix_cache(self, running: bool) -> None:
        """``POST /reset_prefix_cache``; ``running``: preempt running requests so the reset cannot be refused.
        Without dev mode (404) an adapter sync goes on (its new name and path keep old KV out of reach)."""
        if not self.prefix_reset:
            return
        response, data = self.call_read("POST", "/reset_prefix_cache" + ("?reset_running_requests=true" if running
                                                                          else ""), read=json_object)
        if route_missing(response) and not running:
            self.prefix_reset = False
            log.warning("%s has no /reset_prefix_cache (VLLM_SERVER_DEV_MODE off): adapter versions keep their "
                        "KV apart by name and path", redact(self.root))
            return
        if response.status_code != 200:
            raise self.fail("POST /reset_prefix_cache", response)
        if not data.get("success", False) and running:
            raise self.fail("POST /reset_prefix_cache", hint=": the server did not reset its prefix cache")

    def _prune(self, keep: int | None = None) -> None:
        """Delete the directories this engine wrote beyond the newest ``keep`` (a running request may re-read an
        adapter evicted from the server's slots)."""
        keep = self.keep if keep is None else keep
        while len(self.written) > keep:
            shutil.rmtree(self.written.pop(0), ignore_errors=True)

    def close(self) -> None:
        for path in self.written:
            shutil.rmtree(path, ignore_errors=True)
        self.written = []
        if self.server is not None:
            self.server.stop()
            self.server = None


__all__ = ["RemoteEngineError", "ServedEngine", "ServedEngineError", "adapter_name", "version_of"]
