"""A fake ``vllm`` module that behaves like vLLM's offline API, with its own generation loop.

It does not use ctu's HFEngine: it runs a tiny Hugging Face model step by step and reproduces the
vLLM behaviours ctu depends on, each taken from vLLM's source (github vllm-project/vllm):

- ``vllm/entrypoints/llm.py``: ``LLM(model, **engine_args)`` (unknown engine args raise);
  ``generate(prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None, ...)``;
  ``sleep(level=1, mode="abort")`` (resets the prefix cache, then sleeps the engine); ``wake_up(tags=None) -> bool``;
  ``reset_prefix_cache(...) -> bool``; ``apply_model(func) -> list`` (``func(model)`` per worker);
  ``collective_rpc(method, timeout=None, args=(), kwargs=None) -> list``.
- ``vllm/v1/sample/sampler.py`` and ``vllm/v1/sample/ops/topk_topp_sampler.py``: ``raw_logprobs`` /
  ``raw_logits`` are taken from the float32 logits *before* penalties and temperature; greedy rows
  (temperature < 1e-5) return ``processed_*`` from the unscaled logits; random rows divide by the
  temperature, apply top-k/top-p (``apply_top_k_top_p``: sort ascending, mask where the cumulative
  probability ``<= 1 - p``, always keep the largest) and *then* take ``processed_logprobs`` as
  ``log_softmax`` of the masked logits, i.e. renormalised over the kept tokens. Sampling is
  ``argmax(probs / q)`` with ``q ~ Exp(1)`` drawn from the request's seeded generator.
- ``vllm/v1/core/kv_cache_utils.py``: prefix caching hashes only *full* blocks (16 tokens), each
  block hash chained on its parent's hash and the block's token ids plus extra keys (the LoRA
  name). A hit reuses the stored KV, computed with whatever weights were loaded then: after
  ``load_weights`` the cache serves stale KV until ``reset_prefix_cache()``. As in vLLM, the last
  prompt token is always recomputed.
- ``vllm/lora/request.py``: ``LoRARequest(lora_name, lora_int_id, lora_path)``; adapters are cached
  by ``lora_int_id`` (vllm/lora/worker_manager.py), so re-using an id with new weights serves the old
  adapter.
- Sleep (vLLM 0.33: ``vllm/v1/engine/core.py``, ``vllm/v1/executor/abstract.py``, ``vllm/v1/worker/gpu_worker.py``,
  ``vllm/device_allocator/sleep_mode_backend.py``, ``cumem.py``): ``sleep(level)`` pauses the scheduler and clears
  the prefix cache, then the executor marks the tags ``{"weights", "kv_cache"}`` asleep (a second sleep while the
  weights sleep is a logged no-op). Level 1 offloads the weights to host RAM (restored on wake) and discards the
  KV cache; level 2 keeps nothing: waking gives back memory that is not the model ("empty memory", zeroed on
  ROCm; zeroed here) until weights are reloaded (only buffers are saved and restored). ``wake_up(tags)`` wakes
  the given tags (None: all); a tag that is not asleep makes the executor log a warning and wake nothing; it
  returns whether the engine is fully awake, and only then does the scheduler run again (a request made before
  would wait for ever; here it raises). Loading weights needs the weights awake (on a GPU their memory is
  unmapped), not the KV cache. ``platforms.current_platform.is_sleep_mode_available()``; with ``SLEEP_MODE = False``
  the fake is vLLM's CPU backend: ``LLM(enable_sleep_mode=True)`` raises (vllm/config/model.py) and
  sleep/wake are logged no-ops (vllm/v1/worker/cpu_worker.py).
- Weights (vllm/model_executor/model_loader/reload/inplace.py, vllm/v1/worker/gpu_worker.py):
  ``collective_rpc("reload_weights", kwargs={"weights_iterator": it} | {"weights_path": dir})`` loads
  Hugging Face-named tensors into the model (a name the model lacks raises KeyError); the iterator only
  in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: a generator cannot be pickled to a worker process).
  ``model.load_weights`` outside ``reload_weights`` (``apply_model``) fails as on the CPU backend, whose loaded
  parameters are repacked to size 0 (vllm/model_executor/model_loader/weight_utils.py: default_weight_loader).
- ``vllm/config/lora.py``: ``max_lora_rank`` is one of ``MaxLoRARanks`` (pydantic rejects other values).
"""

from __future__ import annotations

import glob
import json
import logging
import math
import os

import torch

from ctu.engines.hf.hf_api import cache_of, with_cache
from tests.fakes.fake_vllm_types import (  # noqa: F401 - re-exported: ``import vllm`` finds them here
    CompletionOutput,
    Logprob,
    LoRARequest,
    RequestOutput,
    SamplingParams,
    TokensPrompt,
)

BLOCK_SIZE = 16
LLM_KWARGS = {"dtype", "seed", "gpu_memory_utilization", "enable_sleep_mode", "logprobs_mode", "tensor_parallel_size",
              "max_model_len", "enforce_eager", "tokenizer", "trust_remote_code", "enable_lora", "max_lora_rank",
              "max_loras", "enable_prefix_caching", "worker_extension_cls"}
LOGPROBS_MODES = ("raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs")
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_SAMPLING_EPS = 1e-5
SLEEP_MODE = True  # False: behave like vLLM's CPU backend (no sleep mode)
log = logging.getLogger(__name__)


class _Platform:
    def is_sleep_mode_available(self) -> bool:
        return SLEEP_MODE


current_platform = _Platform()


def apply_top_k_top_p(logits: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """vLLM's ``apply_top_k_top_p`` for one row batch [B, V]."""
    if k <= 0 and p >= 1.0:
        return logits
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k > 0:
        kth = logits_sort[:, -min(k, logits_sort.shape[-1])][:, None]
        logits_sort = logits_sort.masked_fill(logits_sort < kth, -float("inf"))
    if p < 1.0:
        probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
        mask = probs_sum <= 1 - p
        mask[:, -1] = False
        logits_sort = logits_sort.masked_fill(mask, -float("inf"))
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)


class _Model(torch.nn.Module):
    """What ``apply_model`` hands over: the model, with vLLM's ``load_weights(weights)``."""

    def __init__(self, hf_model, llm: LLM):
        super().__init__()
        self.hf = hf_model
        self._llm = llm
        self.loaded: list[str] = []
        self.reloading = False

    def load_weights(self, weights):
        if not self.reloading:  # the CPU backend's parameters are repacked after loading (size 0)
            name, tensor = next(iter(weights))
            raise AssertionError(f"Attempted to load weight ({tuple(torch.as_tensor(tensor).shape)}) into parameter "
                                 "(torch.Size([0])): load_weights works inside collective_rpc('reload_weights') only")
        if "weights" in self._llm.sleeping_tags:
            raise RuntimeError("the weights sleep (their GPU memory is unmapped): call wake_up(tags=['weights']) "
                               "before load_weights")
        params = dict(self.hf.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name not in params:  # vLLM raises KeyError on names the model does not have
                raise KeyError(name)
            with torch.no_grad():
                params[name].copy_(torch.as_tensor(tensor).to(params[name].dtype))
            loaded.add(name)
        self.loaded.extend(sorted(loaded))
        return loaded


class _Worker:
    def __init__(self, model):
        self.model = model
        self.model_runner = type("ModelRunner", (), {"model": model})()

    def reload_weights(self, weights_iterator=None, weights_path: str | None = None, is_checkpoint_format: bool = True):
        if weights_iterator is not None and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0":
            raise TypeError("cannot pickle 'generator' object (weights_iterator needs VLLM_ENABLE_V1_MULTIPROCESSING=0)")
        if weights_iterator is None:
            from safetensors import safe_open

            def from_files(path):
                for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
                    with safe_open(file, "pt") as f:
                        for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                            yield name, f.get_tensor(name)

            weights_iterator = from_files(weights_path or self.model._llm.model_dir)
            if weights_path is not None:
                self.model._llm.model_dir = weights_path
        self.model.reloading = True
        try:
            self.model.load_weights(weights_iterator)
        finally:
            self.model.reloading = False


def _worker_class(extension: str | None) -> type:
    """The worker class with ``worker_extension_cls`` among its bases, as vLLM's ``WorkerWrapperBase`` adds it."""
    if not extension:
        return _Worker
    import importlib

    module, _, name = extension.rpartition(".")
    return type("_ExtendedWorker", (_Worker, getattr(importlib.import_module(module), name)), {})


def _kv_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))


def install(monkeypatch) -> None:
    """Make ``import vllm`` and ``from vllm.lora.request import LoRARequest`` find this module."""
    import sys

    for name in ("vllm", "vllm.lora", "vllm.lora.request", "vllm.platforms"):
        monkeypatch.setitem(sys.modules, name, sys.modules[__name__])


class LLM:
    def __init__(self, model: str, **kwargs):
        unknown = set(kwargs) - LLM_KWARGS
        if unknown:
            raise TypeError(f"unexpected engine arguments: {sorted(unknown)}")
        if kwargs.get("logprobs_mode", "raw_logprobs") not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}")
        if kwargs.get("enable_sleep_mode") and not SLEEP_MODE:
            raise ValueError("Sleep mode is not supported on current platform.")
        if kwargs.get("enable_lora") and kwargs.get("max_lora_rank", 16) not in MAX_LORA_RANKS:
            raise ValueError(f"1 validation error for LoRAConfig\nmax_lora_rank\n  Input should be one of {MAX_LORA_RANKS}")
        from ctu.engines.hf.models import load_model, load_tokenizer, resolve_model

        self.model = model
        self.model_dir = resolve_model(model)  # what reload_weights() without a path reads
        self.kwargs = kwargs
        self.logprobs_mode = kwargs.get("logprobs_mode", "raw_logprobs")
        self.hf = load_model(model).eval()
        self.tokenizer = load_tokenizer(model)
        self.eos_id = self.tokenizer.eos_token_id
        self.max_model_len = kwargs.get("max_model_len") or self.hf.config.max_position_embeddings
        self._model = _Model(self.hf, self)
        self._generator = torch.Generator().manual_seed(int(kwargs.get("seed", 0)))
        self.prefix_cache: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.cache_hits = 0  # blocks served from the prefix cache
        self.loras: dict[int, dict[str, torch.Tensor]] = {}  # lora_int_id -> {module name: delta W}
        self.sleep_level: int | None = None  # the level of the current sleep, until fully awake
        self.sleeping_tags: set[str] = set()  # vllm/v1/executor/abstract.py: Executor.sleeping_tags
        self.calls = 0

    # -- control ------------------------------------------------------------------------------------------------

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        self.prefix_cache.clear()
        return True

    def sleep(self, level: int = 1, mode: str = "abort"):
        if not SLEEP_MODE:
            self.reset_prefix_cache()
            log.warning("sleep mode is not supported on CPU, ignore it.")
            return
        if not self.kwargs.get("enable_sleep_mode"):
            raise ValueError("Sleep mode is not enabled in the model config")
        if level not in (1, 2):
            raise NotImplementedError("the fake sleeps at level 1 or 2 (level 0 only pauses scheduling)")
        self.reset_prefix_cache()  # EngineCore.sleep: pause_scheduler(clear_cache=level >= 1)
        if "weights" in self.sleeping_tags:
            log.warning("Executor is already sleeping.")
            return
        if level == 2:
            with torch.no_grad():
                for p in self.hf.parameters():
                    p.zero_()  # discarded, not offloaded: wake_up gives back garbage until weights are reloaded
        self.sleep_level = level
        self.sleeping_tags = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> bool:
        if not SLEEP_MODE:
            log.warning("sleep mode is not supported on CPU, ignore it.")
            return True
        if tags is not None:
            tags = [t for t in tags if t != "scheduling"]
        if tags is None or tags:
            if not self.sleeping_tags:
                log.warning("Executor is not sleeping.")
            elif tags and any(t not in self.sleeping_tags for t in tags):
                log.warning("Tag %s is not in sleeping tags %s", tags, self.sleeping_tags)
            else:
                self.sleeping_tags -= set(tags) if tags else set(self.sleeping_tags)
        if not self.sleeping_tags:
            self.sleep_level = None
        return not self.sleeping_tags

    def apply_model(self, func):
        return [func(self._model)]

    def collective_rpc(self, method, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None):
        worker = _worker_class(self.kwargs.get("worker_extension_cls"))(self._model)
        fn = getattr(worker, method) if isinstance(method, str) else (lambda *a, **k: method(worker, *a, **k))
        return [fn(*args, **(kwargs or {}))]

    # -- LoRA -----------------------------------------------------------------------------------------------------

    def _lora_deltas(self, request: LoRARequest) -> dict[str, torch.Tensor]:
        if not self.kwargs.get("enable_lora"):
            raise ValueError(f"LoRA is not enabled, but a LoRA request was given: {request.lora_name}")
        if request.lora_int_id in self.loras:  # cached by id: a reused id is not reloaded
            return self.loras[request.lora_int_id]
        from safetensors.torch import load_file

        with open(os.path.join(request.lora_path, "adapter_config.json")) as f:
            config = json.load(f)
        rank, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
        if rank > int(self.kwargs.get("max_lora_rank", 16)):
            raise ValueError(f"LoRA rank {rank} is greater than max_lora_rank {self.kwargs.get('max_lora_rank', 16)}")
        tensors = load_file(os.path.join(request.lora_path, "adapter_model.safetensors"))
        deltas = {}
        for name, a in tensors.items():
            if ".lora_A." not in name:
                continue
            b = tensors[name.replace(".lora_A.", ".lora_B.")]
            module = name.split(".lora_A.")[0].removeprefix("base_model.model.")
            deltas[module + ".weight"] = (b.float() @ a.float()) * (alpha / rank)
        params = dict(self.hf.named_parameters())
        missing = [m for m in deltas if m not in params]
        if missing:
            raise ValueError(f"LoRA targets modules the model does not have: {missing[:3]}")
        self.loras[request.lora_int_id] = deltas
        return deltas

    # -- generation ----------------------------------------------------------------------------------------------

    def _block_hashes(self, ids: list[int], extra: tuple) -> list[int]:
        hashes, parent = [], None
        for start in range(0, len(ids) - len(ids) % BLOCK_SIZE, BLOCK_SIZE):
            parent = hash((parent, tuple(ids[start:start + BLOCK_SIZE]), extra or None))
            hashes.append(parent)
        return hashes

    def _prefill(self, prompt: list[int], extra: tuple):
        """KV for the prompt, its cached full blocks reused (never the last token, as vLLM)."""
        from transformers import DynamicCache

        cache = DynamicCache()
        hashes = self._block_hashes(prompt[:-1], extra)
        hit = 0
        for h in hashes:
            if h not in self.prefix_cache:
                break
            hit += 1
        if hit:
            for layer, _ in enumerate(self.prefix_cache[hashes[0]]):
                keys = torch.cat([self.prefix_cache[h][layer][0] for h in hashes[:hit]], dim=2)
                values = torch.cat([self.prefix_cache[h][layer][1] for h in hashes[:hit]], dim=2)
                cache.update(keys, values, layer)
            self.cache_hits += hit
        start = hit * BLOCK_SIZE
        out = self.hf(input_ids=torch.tensor([prompt[start:]]), position_ids=torch.arange(start, len(prompt))[None],
                      **with_cache(cache), use_cache=True)
        return out.logits[0, -1].float(), cache_of(out)

    def _store_blocks(self, ids: list[int], cache, extra: tuple) -> None:
        layers = _kv_layers(cache)
        for i, h in enumerate(self._block_hashes(ids, extra)):
            if h not in self.prefix_cache:
                sl = slice(i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE)
                self.prefix_cache[h] = [(k[:, :, sl].clone(), v[:, :, sl].clone()) for k, v in layers]

    def _step_logprobs(self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator):
        """(token, the value vLLM reports for it under ``logprobs_mode``, rank) — vLLM's v1 Sampler order."""
        mode = self.logprobs_mode
        raw = logits.float()[None]
        reported = {"raw_logprobs": raw.log_softmax(-1), "raw_logits": raw.clone()}.get(mode)
        if params.temperature < _SAMPLING_EPS:
            token = int(raw.argmax(-1))
            if mode == "processed_logprobs":
                reported = raw.log_softmax(-1)
            elif mode == "processed_logits":
                reported = raw
        else:
            scaled = apply_top_k_top_p(raw / params.temperature, params.top_k, params.top_p)
            if mode == "processed_logprobs":
                reported = scaled.log_softmax(-1)
            elif mode == "processed_logits":
                reported = scaled
            probs = scaled.softmax(-1)
            q = torch.empty_like(probs).exponential_(generator=generator)
            token = int((probs / q).argmax(-1))
        value = reported[0, token]
        return token, float(value), int((reported[0] > value).sum()) + 1

    def _generate_one(self, prompt: list[int], params: SamplingParams, generator, extra: tuple):
        logits, cache = self._prefill(prompt, extra)
        stops = set(params.stop_token_ids or ()) | (set() if params.ignore_eos else {self.eos_id})
        stop_strings = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
        ids, lps, reason = [], [], "length"
        limit = min(params.max_tokens or 16, self.max_model_len - len(prompt))
        for _ in range(limit):
            token, value, rank = self._step_logprobs(logits, params, generator)
            ids.append(token)
            lps.append((value, rank))
            if token in stops:
                reason = "stop"
                break
            if stop_strings and any(s in self.tokenizer.decode(ids) for s in stop_strings):
                reason = "stop"
                break
            if len(ids) == limit:
                break
            pos = len(prompt) + len(ids) - 1
            out = self.hf(input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[pos]]), **with_cache(cache),
                          use_cache=True)
            cache, logits = cache_of(out), out.logits[0, -1].float()
        self._store_blocks(prompt + ids[:-1], cache, extra)  # the last token's KV was never computed
        return ids, lps, reason

    @torch.inference_mode()
    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None):
        if self.sleeping_tags:  # the scheduler resumes only once fully awake: vLLM would wait for ever
            raise RuntimeError(f"the engine is sleeping ({sorted(self.sleeping_tags)} asleep): call wake_up() first")
        prompts = prompts if isinstance(prompts, list) else [prompts]
        # LLM.generate takes one SamplingParams for all prompts or a list with one per prompt (vllm/entrypoints/llm.py)
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(prompts):
                raise ValueError("The lengths of prompts and sampling_params must be the same.")
            per_prompt = list(sampling_params)
        else:
            per_prompt = [sampling_params or SamplingParams()] * len(prompts)
        requests = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        outputs = []
        for r, (prompt, lora, params) in enumerate(zip(prompts, requests, per_prompt, strict=True)):
            ids = list(prompt["prompt_token_ids"])
            if len(ids) > self.max_model_len:
                raise ValueError(f"The decoder prompt (length {len(ids)}) is longer than the maximum model length "
                                 f"of {self.max_model_len}.")
            extra = (lora.lora_name,) if lora is not None else ()
            deltas = self._lora_deltas(lora) if lora is not None else {}
            params_by_name = dict(self.hf.named_parameters())
            saved = {name: params_by_name[name].detach().clone() for name in deltas}
            for name, delta in deltas.items():
                params_by_name[name].add_(delta.to(params_by_name[name].dtype))
            try:
                outs = []
                for i in range(params.n):
                    if params.seed is not None:  # vLLM's parallel sampling: child i gets seed + i
                        generator = torch.Generator().manual_seed(params.seed + i)
                    else:
                        generator = self._generator
                    tokens, lps, reason = self._generate_one(ids, params, generator, extra)
                    logprobs = [{t: Logprob(v, rk)} for t, (v, rk) in zip(tokens, lps, strict=True)]
                    outs.append(CompletionOutput(
                        index=i, text="", token_ids=tokens,
                        cumulative_logprob=math.fsum(v for v, _ in lps) if params.logprobs is not None else None,
                        logprobs=logprobs if params.logprobs is not None else None, finish_reason=reason))
            finally:
                for name, value in saved.items():
                    params_by_name[name].copy_(value)
            outputs.append(RequestOutput(str(r), None, ids, None, outs))
        self.calls += 1
        return outputs
