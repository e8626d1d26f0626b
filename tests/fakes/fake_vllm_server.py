"""A real HTTP server on 127.0.0.1 (stdlib, in a thread) that answers as vLLM 0.33's OpenAI server does for what
``engine.kind=served`` uses, backed by ctu's hf engine so its tokens and logprobs are exact.

Read from vLLM's source (see ctu/engines/vllm/served.py): ``/v1/load_lora_adapter`` (400 name missing / base name /
already loaded without ``load_inplace``; 404 ``Loading lora X failed: No adapter found for P``; 500 other load
errors, e.g. a rank above ``--max-lora-rank``; 200 text), ``/v1/unload_lora_adapter`` (400 name missing; 404
``The lora adapter 'X' cannot be found.``; 200 text), both present only with runtime LoRA updating; completions
naming a model that is not served: 404; ``token_id:N`` tokens, ``token_ids``, ``prompt_logprobs`` (``{id:
{logprob, rank, decoded_token}}`` per prompt token, None first); dev routes only in dev mode (``/reset_prefix_cache``,
``/server_info``, ``/collective_rpc reload_weights``, ``/update_weight_version``, ``/weight_info``; the RL routes
``/pause``, ``/resume``, ``/is_paused``; ``/sleep``, ``/wake_up``, ``/is_sleeping`` as a CUDA server started with
``--enable-sleep-mode`` has them); any other route:
404 ``{"detail": "Not Found"}``; ``/v1`` routes need the API key when one is set (401).

Logprob modes: ``processed_logprobs`` returns the hf engine's ``log_softmax(logits / T)`` (vLLM's value at
top_p = 1); ``raw_logprobs`` rescored at T = 1 (vLLM's default: before temperature).
Faults for tests: ``keep_old_weights`` (a load answers 200 but the new name serves the previous weights; a merged
reload answers 200 and loads nothing), ``worker_extension`` False (no ``ctu_fingerprint`` rpc),
``forget_loads`` (a load answers 200 but the name is not registered), ``fail_loads`` (500), ``answer_as_previous``
(True, or a set of adapter names: a load answers 200 and the name is listed, but requests naming it are served by the previous adapter, or the base,
and the reply's ``model`` names that one: vLLM's reply names ``OpenAIServingModels.model_name(lora_request)``).
"""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import torch

from ctu.engines.base import SamplingParams
from ctu.engines.hf.engine import HFEngine
from ctu.engines.hf.models import load_model, load_tokenizer


def error(code: int, message: str, kind: str, param=None) -> tuple[int, dict]:
    return code, {"error": {"message": message, "type": kind, "param": param, "code": code}}


def apply_adapter(base, path: Path, max_rank: int):
    """A copy of ``base`` with the PEFT adapter at ``path`` merged in (W += alpha / r * B @ A)."""
    from safetensors.torch import load_file

    config = json.loads((path / "adapter_config.json").read_text())
    if int(config["r"]) > max_rank:
        raise ValueError(f"LoRA rank {config['r']} is greater than max_lora_rank {max_rank}.")
    tensors = load_file(str(path / "adapter_model.safetensors"))
    model = copy.deepcopy(base)
    modules = dict(model.named_modules())
    scale = float(config["lora_alpha"]) / float(config["r"])
    with torch.no_grad():
        for name, a in tensors.items():
            if ".lora_A." not in name:
                continue
            module = name.removeprefix("base_model.model.").split(".lora_A.")[0]
            b = tensors[name.replace(".lora_A.", ".lora_B.")]
            modules[module].weight += scale * (b.float() @ a.float()).to(modules[module].weight.dtype)
    return model


class FakeVLLMServer:
    def __init__(self, model: str = "tiny-random", *, served_name: str | None = None, runtime_lora: bool = True,
                 dev_mode: bool = True, enable_lora: bool = True, max_loras: int = 2, max_lora_rank: int = 16,
                 logprobs_mode: str = "processed_logprobs", api_key: str | None = None):
        self.name = served_name or model
        self.tokenizer = load_tokenizer(model)
        self.base = load_model(model, dtype=torch.float32, device="cpu").eval()
        self.engines = {self.name: HFEngine(self.base, self.tokenizer, kv_reuse=False)}
        self.adapters: dict[str, tuple[str, object]] = {}  # name -> (path, its model)
        self.runtime_lora, self.dev_mode, self.enable_lora = runtime_lora, dev_mode, enable_lora
        self.max_loras, self.max_lora_rank, self.logprobs_mode = max_loras, max_lora_rank, logprobs_mode
        self.api_key = api_key
        self.weight_version = "default"
        self.keep_old_weights = self.forget_loads = self.fail_loads = False
        self.answer_as_previous: bool | set[str] = False
        self.paused = False  # /pause until /resume (vLLM's PAUSED_NEW with reject_new_requests)
        # vLLM's API process answering /pause only once its running requests ended, so they are not stopped: seen
        # where its engine core samples faster than the API process turns tokens into JSON (a tiny model on CPU):
        # its output handler then never yields the event loop (await on a non-empty queue) while a request runs
        self.pause_after_running = False
        self.sleeping: set[str] = set()  # /sleep's tags until /wake_up (a CUDA server with --enable-sleep-mode)
        self.aborted = 0  # choices a pause stopped (finish_reason "abort")
        self.in_flight = 0  # completions requests being generated
        self._flight = threading.Condition()
        self.aliases: dict[str, tuple[str, HFEngine]] = {}  # answer_as_previous: a name -> the name serving it, its engine
        self.worker_extension = True  # started with --worker-extension-cls ctu.engines.checks.fingerprint.FingerprintExtension
        self.events: list[str] = []  # "load NAME", "unload NAME", "reset", "reload PATH", "complete MODEL"
        self.requests: list[dict] = []  # completions bodies
        self.returned: list[list[int]] = []  # the token ids of every choice returned
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- routes ------------------------------------------------------------------------------
    def route(self, method: str, path: str, body: dict, auth: str | None) -> tuple[int, object]:
        path, _, query = path.partition("?")
        if self.api_key and path.startswith("/v1") and auth != f"Bearer {self.api_key}":
            return 401, {"error": "Unauthorized"}
        routes = {("GET", "/health"): lambda: (200, ""), ("GET", "/v1/models"): self.models,
                  ("POST", "/v1/completions"): lambda: self.complete(body)}
        if self.runtime_lora:
            routes[("POST", "/v1/load_lora_adapter")] = lambda: self.load(body)
            routes[("POST", "/v1/unload_lora_adapter")] = lambda: self.unload(body)
        if self.dev_mode:
            routes.update({("POST", "/reset_prefix_cache"): self.reset, ("GET", "/server_info"): self.server_info,
                           ("POST", "/collective_rpc"): lambda: self.rpc(body),
                           ("POST", "/update_weight_version"): lambda: self.stamp(body),
                           ("GET", "/weight_info"): lambda: (200, {"weight_version": self.weight_version}),
                           ("POST", "/pause"): lambda: self.pause(query), ("POST", "/resume"): self.resume,
                           ("GET", "/is_paused"): lambda: (200, {"is_paused": self.paused}),
                           ("POST", "/sleep"): lambda: self.sleep(query), ("POST", "/wake_up"): lambda: self.wake(query),
                           ("GET", "/is_sleeping"): lambda: (200, {"is_sleeping": bool(self.sleeping)})})
        handler = routes.get((method, path))
        return handler() if handler is not None else (404, {"detail": "Not Found"})

    def models(self):
        cards = [{"id": self.name, "object": "model", "root": self.name, "parent": None}]
        cards += [{"id": n, "object": "model", "root": p, "parent": self.name} for n, (p, _) in self.adapters.items()]
        return 200, {"object": "list", "data": cards}

    def load(self, body: dict):
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if name == self.name:
            return error(400, f"The lora adapter '{name}' conflicts with a served base model.", "InvalidUserInput")
        if name in self.adapters and not body.get("load_inplace"):
            return error(400, f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                         "in place, set 'load_inplace' to True.", "InvalidUserInput")
        if not (Path(path) / "adapter_config.json").exists():
            return error(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        if self.fail_loads:
            return error(500, "Call to add_lora method failed: simulated", "InternalServerError")
        try:
            model = apply_adapter(self.base, Path(path), self.max_lora_rank)
        except (ValueError, KeyError, OSError) as exc:
            return error(500, str(exc), "InternalServerError")
        self.events.append(f"load {name}")
        if self.forget_loads:
            return 200, f"Success: LoRA adapter '{name}' added successfully."
        with self._lock:
            if self.keep_old_weights:
                previous = [m for _, m in self.adapters.values()]
                model = previous[-1] if previous else self.base
            if self.answer_as_previous is True or name in (self.answer_as_previous or ()):
                previous = next((n for n in reversed(self.adapters) if n != name), self.name)
                self.aliases[name] = self.aliases.get(previous, (previous, self.engines[previous]))
            self.adapters[name] = (path, model)
            self.engines[name] = HFEngine(model, self.tokenizer, kv_reuse=False)
            self.engines[name].eos_ids = set(self.engines[self.name].eos_ids)  # the base's tokenizer (a test may clear)
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, body: dict):
        name = body.get("lora_name")
        if not name:
            return error(400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput")
        if name not in self.adapters:
            return error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        with self._lock:
            del self.adapters[name]
            del self.engines[name]
        self.events.append(f"unload {name}")
        return 200, f"Success: LoRA adapter '{name}' removed successfully."

    def reset(self):
        self.events.append("reset")
        return 200, {"success": True}

    def server_info(self):
        lora = {"max_loras": self.max_loras, "max_lora_rank": self.max_lora_rank} if self.enable_lora else None
        return 200, {"vllm_config": {"model_config": {"logprobs_mode": self.logprobs_mode}, "lora_config": lora}}

    def rpc(self, body: dict):
        if body.get("method") == "ctu_fingerprint" and self.worker_extension:  # vLLM runs the extension's method
            from ctu.engines.checks.fingerprint import of_module

            with self._lock:
                return 200, {"results": [of_module(self.base).as_list()]}
        if body.get("method") != "reload_weights":
            return error(500, f"Call to collective_rpc method failed: no method {body.get('method')}", "InternalServerError")
        from safetensors.torch import load_file

        path = Path((body.get("kwargs") or {}).get("weights_path", ""))
        files = sorted(path.glob("*.safetensors"))
        if not files:
            return error(500, f"Call to collective_rpc method failed: no weights in {path}", "InternalServerError")
        state = {k: v for f in files for k, v in load_file(str(f)).items()}
        if self.keep_old_weights:  # acknowledged, not loaded
            self.events.append(f"reload {path}")
            return 200, {"results": [None]}
        with self._lock, torch.no_grad():
            params = dict(self.base.named_parameters())
            for name, tensor in state.items():
                params[name].copy_(tensor)
        self.events.append(f"reload {path}")
        return 200, {"results": [None]}

    def stamp(self, body: dict):
        self.weight_version = str(body.get("new_version"))
        return 200, {"success": True, "new_version": self.weight_version}

    def complete(self, body: dict):
        self.requests.append(body)
        model = body.get("model") or self.name
        model, engine = self.aliases.get(model, (model, self.engines.get(model)))
        if engine is None:
            return error(404, f"The model `{model}` does not exist. Valid aliases: {self.name}.", "NotFoundError", "model")
        with self._flight:
            self._flight.wait_for(lambda: not self.sleeping)  # a sleeping engine queues requests until fully awake
            if self.paused:  # vllm/v1/engine/core.py _reject_add_while_paused -> RetryableRequestError (503)
                return error(503, "Generation is paused. Please retry after it resumes.", "ServiceUnavailableError")
            self.in_flight += 1
        try:
            self.events.append(f"complete {model}")
            prompt = [int(t) for t in body["prompt"]]
            params = SamplingParams(temperature=float(body.get("temperature", 1.0)),
                                    top_p=float(body.get("top_p", 1.0)), max_tokens=int(body.get("max_tokens") or 16),
                                    n=int(body.get("n", 1)), stop_token_ids=tuple(body.get("stop_token_ids") or ()))
            seed = body.get("seed")
            outs = self.sample(engine, prompt, params, None if seed is None else int(seed))
            choices = [self.choice(i, out, prompt, body, engine.model) for i, out in enumerate(outs)]
        finally:
            with self._flight:
                self.in_flight -= 1
                self._flight.notify_all()
        return 200, {"id": "cmpl-fake", "object": "text_completion", "model": model, "choices": choices}

    def sample(self, engine: HFEngine, prompt: list[int], params: SamplingParams, seed: int | None) -> list[tuple]:
        """``(ids, logprobs, finish_reason)`` per choice, as the hf engine samples them (completion j seeded
        ``seed + j``); a pause stops them at the next token with ``"abort"`` and what they sampled (a request
        still waiting: nothing), as vLLM's scheduler finishes its requests FINISHED_ABORTED."""
        gens = None if seed is None else [torch.Generator().manual_seed(seed + j) for j in range(params.n)]
        with engine._lock:
            if self.paused:
                self.aborted += params.n
                return [([], [], "abort")] * params.n
            engine.model.eval()
            outs, cut = engine._generate_batch([prompt] * params.n, params, gens, interruptible=True)
        self.aborted += len(cut)
        return [(list(c.token_ids), list(c.logprobs), "abort" if j in cut else c.finish_reason)
                for j, c in enumerate(outs)]

    def pause(self, query: str):
        """``POST /pause?mode=abort|wait|keep``: abort stops running requests and returns once they have answered;
        wait returns once they finished; both refuse new ones until ``/resume``. keep (requests frozen in the
        queue, run on after /resume with their KV) is not modelled: ctu does not use it."""
        mode = parse_qs(query).get("mode", ["abort"])[0]
        if mode not in ("abort", "wait"):
            return error(500, f"the fake server models pause modes abort and wait, not {mode}", "InternalServerError")
        self.events.append(f"pause {mode}")
        with self._flight:
            self.paused = True
            stopping = list(self.engines.values()) + [e for _, e in self.aliases.values()] \
                if mode == "abort" and not self.pause_after_running else []
            for engine in stopping:  # the hf engine's decode loop stops at its next token (interruptible)
                engine._pending_loads += 1
            self._flight.wait_for(lambda: self.in_flight == 0)
            for engine in stopping:
                engine._pending_loads -= 1
        return 200, {"status": "paused"}

    def sleep(self, query: str):
        """``POST /sleep?level=1`` (vllm/entrypoints/serve/dev/sleep/api_router.py, vllm/v1/engine/core.py): the
        scheduler paused (requests queue, none refused), level 1 offloads the weights to host RAM and drops the KV
        cache, level 2 drops both; the tags ``weights`` and ``kv_cache`` sleep."""
        level = int(parse_qs(query).get("level", ["1"])[0])
        self.events.append(f"sleep {level}")
        with self._flight:
            self._flight.wait_for(lambda: self.in_flight == 0)  # ctu sleeps only between rollouts
            self.sleeping = {"weights", "kv_cache"}
        return 200, {"status": "sleeping", "level": level}

    def wake(self, query: str):
        """``POST /wake_up[?tags=T...]``: wakes those tags (all without any); scheduling resumes once all are awake."""
        tags = parse_qs(query).get("tags") or None
        self.events.append("wake " + (" ".join(tags) if tags else "all"))
        with self._flight:
            self.sleeping -= set(tags) if tags else self.sleeping
            self._flight.notify_all()
            return 200, {"status": "sleeping" if self.sleeping else "awake", "tags": tags}

    def resume(self):
        self.events.append("resume")
        with self._flight:
            self.paused = False
        return 200, {"status": "resumed"}

    def choice(self, index: int, out: tuple, prompt: list[int], body: dict, model) -> dict:
        ids, lps, finish_reason = out
        self.returned.append(ids)
        if self.logprobs_mode == "raw_logprobs" and ids:
            lps = self.score(model, prompt + ids)[-len(ids):]
        tokens = [f"token_id:{t}" if body.get("return_tokens_as_token_ids") else self.tokenizer.decode([t]) for t in ids]
        choice = {"index": index, "text": self.tokenizer.decode(ids), "finish_reason": finish_reason,
                  "logprobs": {"tokens": tokens, "token_logprobs": lps, "top_logprobs": None, "text_offset": []}
                  if body.get("logprobs") is not None else None}
        if body.get("return_token_ids"):
            choice.update(token_ids=ids, prompt_token_ids=prompt)
        if body.get("prompt_logprobs") is not None:
            scored = self.score(model, prompt)
            choice["prompt_logprobs"] = [None] + [{str(t): {"logprob": lp, "rank": 1, "decoded_token": ""}}
                                                  for t, lp in zip(prompt[1:], scored, strict=True)]
        return choice

    def score(self, model, ids: list[int]) -> list[float]:
        """``log_softmax(logits)`` of ``ids[1:]`` (T = 1), teacher-forced."""
        with self._lock, torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].float()
        return logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1).tolist()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self, method: str):
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else {}
                status, payload = server.route(method, self.path, body, self.headers.get("authorization"))
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "text/plain" if isinstance(payload, str) else "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def log_message(self, *args):
                pass

        return Handler
