"""In-process vLLM engine (GPU), written against vLLM's offline API (vllm/entrypoints/llm.py).

What ctu relies on, and where in vLLM's source (github vllm-project/vllm) it was read:

- ``LLM(model, dtype=..., seed=..., gpu_memory_utilization=..., enable_sleep_mode=True, max_model_len=...,
  logprobs_mode=..., enable_lora=..., max_lora_rank=...)``; ``LLM.generate(prompts, sampling_params, *,
  use_tqdm, lora_request)`` with ``TokensPrompt(prompt_token_ids=ids)`` and ``SamplingParams(logprobs=0)``:
  each ``RequestOutput.outputs[i]`` has ``token_ids``, ``logprobs`` (one ``{token_id: Logprob}`` per token)
  and ``finish_reason``.
- **Logprob modes** (vllm/v1/sample/sampler.py, vllm/v1/sample/ops/topk_topp_sampler.py):
  ``raw_logprobs``/``raw_logits`` are taken from the logits before penalties and temperature;
  ``processed_logprobs`` is ``log_softmax`` taken inside ``TopKTopPSampler.forward_native`` *after*
  temperature and after ``apply_top_k_top_p`` has set the dropped tokens to -inf, i.e. renormalised over
  the kept tokens; greedy rows (temperature < 1e-5) return ``log_softmax`` of the unscaled logits.
  ctu's sampler logprob is the trainer's: ``log_softmax(logits / T)`` of the sampled token *before*
  top-k/top-p (plain ``log_softmax`` when greedy). So (see :func:`choose_logprobs_mode`):
  ``processed_logprobs`` is exact when top_p == 1 (any T) and when greedy; ``raw_logprobs`` is exact when
  T == 1 (any top_p) and when greedy. No mode is exact for T not in {0, 1} with top_p < 1: there
  ``processed_logprobs`` is used, and it overstates the logprob by ``-log(kept mass) <= -log(top_p)``
  (a warning says so once). ``raw_logits`` cannot help: the sampled token's logit without the
  normaliser over the vocabulary is not a logprob.
- **Prefix cache** (vllm/v1/core/kv_cache_utils.py): full 16-token blocks are hashed over their token ids
  chained on the parent block's hash (plus the LoRA name); the KV of a hit is reused as it was computed.
  ``load_weights`` does not invalidate it, so :meth:`VLLMEngine.update_weights` calls
  ``LLM.reset_prefix_cache()`` after loading (the shared system prompt would otherwise keep the old KV).
- **Sleep** (``LLM.sleep(level=1)`` resets the prefix cache, offloads weights to CPU and discards the KV
  cache; ``LLM.wake_up(tags=None)`` restores): when colocated, call :meth:`sleep` before the trainer's
  update and :meth:`wake_up` before loading weights — weights cannot be written while offloaded —
  then sync, then roll out. ``update_weights``/``update_adapter`` wake the engine if it sleeps.
- **Weights**: ``LLM.apply_model(fn)`` runs ``fn(model)`` where the model lives; vLLM models load Hugging
  Face-named tensors with ``model.load_weights(weights=[(name, tensor), ...])``. With
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set here before vLLM starts) the engine core runs in this process.
- **LoRA** (vllm/lora/request.py; vllm/lora/worker_manager.py): ``LoRARequest(lora_name, lora_int_id,
  lora_path)`` with a PEFT directory (``adapter_config.json`` + ``adapter_model.safetensors``), passed as
  ``generate(..., lora_request=...)``. Adapters are cached by ``lora_int_id``: a reused id serves the
  adapter loaded first, so every version gets a new id (and a new name, which the prefix-cache hash uses).
vLLM is imported lazily: ctu imports without it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from functools import partial

from ctu.engines.base import Completion, Engine, SamplingParams

log = logging.getLogger(__name__)
PEFT_NAME = re.compile(r"(^base_model\.model\.)|(\.base_layer\.)|(lora_[AB])|(lora_embedding_[AB])|(modules_to_save)")


def _load(weights, model):
    return model.load_weights(weights=weights)


def check_hf_names(names: Iterable[str]) -> list[str]:
    """Names that are PEFT/LoRA names rather than merged Hugging Face names."""
    return [n for n in names if PEFT_NAME.search(n)]


def choose_logprobs_mode(temperature: float | None, top_p: float | None) -> str:
    """The vLLM ``logprobs_mode`` whose sampled-token value is closest to ``log_softmax(logits / T)``.

    ``raw_logprobs`` when T == 1 and top_p < 1 (exact: taken before top-p); otherwise
    ``processed_logprobs`` (exact when top_p == 1 or greedy; otherwise renormalised after top-p).
    """
    if temperature == 1.0 and top_p is not None and top_p < 1.0:
        return "raw_logprobs"
    return "processed_logprobs"


def logprobs_exact(mode: str, params: SamplingParams) -> bool:
    """Whether vLLM's value under ``mode`` is the trainer's logprob for these sampling params."""
    if params.temperature < 1e-5:
        return True
    if mode == "raw_logprobs":
        return params.temperature == 1.0
    return mode == "processed_logprobs" and params.top_p >= 1.0


class VLLMEngine(Engine):
    def __init__(self, model_path: str, gpu_memory_utilization: float = 0.5, enable_sleep_mode: bool = True,
                 dtype: str = "bfloat16", seed: int = 0, max_model_len: int | None = None, enable_lora: bool = False,
                 max_lora_rank: int = 16, lora_alpha: float | None = None, sampling_temperature: float | None = None,
                 sampling_top_p: float | None = None, **llm_kwargs):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import vllm

        self._vllm = vllm
        self.lora_alpha = lora_alpha
        self.logprobs_mode = choose_logprobs_mode(sampling_temperature, sampling_top_p)
        if max_model_len is not None:
            llm_kwargs["max_model_len"] = int(max_model_len)
        if enable_lora:
            llm_kwargs.update(enable_lora=True, max_lora_rank=int(max_lora_rank))
        self.llm = vllm.LLM(model=model_path, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                            enable_sleep_mode=enable_sleep_mode, logprobs_mode=self.logprobs_mode, **llm_kwargs)
        self.sleeping = False
        self.lora_request = None  # the adapter every generate uses after update_adapter
        self._lora_ids: set[int] = set()
        self._adapter_root: tempfile.TemporaryDirectory | None = None
        self._warned_inexact = False
        self._lock = threading.Lock()

    def _sampling_params(self, params: SamplingParams, seed: int | None = None):
        return self._vllm.SamplingParams(
            n=params.n, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens,
            seed=params.seed if seed is None else int(seed), stop=list(params.stop) or None, stop_token_ids=list(params.stop_token_ids) or None,
            logprobs=0, include_stop_str_in_output=True, skip_special_tokens=False, detokenize=bool(params.stop))

    @staticmethod
    def _completion(output) -> Completion:
        ids = tuple(int(t) for t in output.token_ids)
        steps = output.logprobs or []
        lps = tuple(float(step[t].logprob) for step, t in zip(steps, ids, strict=False))
        if len(lps) != len(ids):
            raise RuntimeError(f"vLLM returned {len(ids)} tokens but {len(lps)} logprobs (request logprobs=0)")
        return Completion(ids, lps, "length" if output.finish_reason == "length" else "stop")

    def generate_sync(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                      seeds: Sequence[int] | None = None) -> list[list[Completion]]:
        """``seeds``: one per prompt, each request seeded on its own (vLLM takes a list of SamplingParams).
        Without them every request gets ``params.seed``: vLLM then samples identical prompts identically."""
        if not prompts:
            return []
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        if self.sleeping:
            raise RuntimeError("the vLLM engine is asleep: call wake_up() before generating")
        if not self._warned_inexact and not logprobs_exact(self.logprobs_mode, params):
            self._warned_inexact = True
            log.warning("vLLM cannot return log_softmax(logits/T) before top-p for T=%s, top_p=%s (logprobs_mode=%s): "
                        "sampler logprobs are renormalised over the top-p set, off by at most %.3f nats",
                        params.temperature, params.top_p, self.logprobs_mode, -math.log(params.top_p))
        inputs = [self._vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        with self._lock:
            sampling = (self._sampling_params(params) if seeds is None
                        else [self._sampling_params(params, seed) for seed in seeds])
            outputs = self.llm.generate(inputs, sampling, use_tqdm=False, lora_request=self.lora_request)
        return [[self._completion(o) for o in sorted(r.outputs, key=lambda o: o.index)] for r in outputs]

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                       seeds: Sequence[int] | None = None) -> list[list[Completion]]:
        if not prompts:
            return []
        return await asyncio.to_thread(self.generate_sync, prompts, params, seeds)

    def _reset_prefix_cache(self) -> None:
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running): the engine would "
                               "reuse KV computed with the old weights")

    def update_weights(self, named_tensors: Iterable[tuple[str, object]]) -> None:
        """Merged Hugging Face weights: wake (if asleep), ``load_weights``, then reset the prefix cache."""
        weights = list(named_tensors)
        bad = check_hf_names(name for name, _ in weights)
        if bad:
            raise ValueError(f"vLLM needs merged Hugging Face names; got PEFT names such as {bad[:3]} "
                             "(merge the adapter and strip base_model.model. / base_layer first)")
        self.wake_up()
        with self._lock:
            self.llm.apply_model(partial(_load, weights))
            self._reset_prefix_cache()

    def update_adapter(self, adapter: str | os.PathLike | Mapping[str, object] | Iterable[tuple[str, object]],
                       version: int, peft_config: Mapping[str, object] | None = None) -> None:
        """Adapter-only sync: serve LoRA ``adapter`` as version ``version`` (a new LoRA id per version).

        ``adapter`` is a PEFT adapter directory, or PEFT-named tensors (a mapping or ``(name, tensor)`` pairs,
        ``base_model.model.<module>.lora_A[.default].weight``), written to a PEFT directory here with
        ``peft_config`` or, without it, ``r`` and ``target_modules`` read from the tensors and ``lora_alpha``
        from the constructor. Every later ``generate`` passes this adapter's ``LoRARequest``.
        """
        lora_id = int(version) + 1  # vLLM ids must be > 0
        if lora_id in self._lora_ids:
            raise ValueError(f"adapter version {version} was already loaded: vLLM caches adapters by id and would "
                             "serve the old one; give every update a new version")
        path = os.fspath(adapter) if isinstance(adapter, (str, os.PathLike)) else self._write_adapter(
            adapter, version, peft_config)
        self.wake_up()
        with self._lock:
            from vllm.lora.request import LoRARequest

            self.lora_request = LoRARequest(f"ctu-v{version}", lora_id, path)
            self._lora_ids.add(lora_id)
            self._reset_prefix_cache()

    def _write_adapter(self, adapter, version: int, peft_config) -> str:
        from safetensors.torch import save_file

        items = adapter.items() if isinstance(adapter, Mapping) else adapter
        tensors = {name.replace(".default.", "."): tensor for name, tensor in items}
        if not peft_config:
            a = [(n, t) for n, t in tensors.items() if ".lora_A." in n]
            if not a or self.lora_alpha is None:
                raise ValueError("update_adapter needs lora_A/lora_B tensors and lora_alpha (constructor) or peft_config")
            peft_config = {"r": int(a[0][1].shape[0]), "lora_alpha": self.lora_alpha,
                           "target_modules": sorted({n.split(".lora_A.")[0].rsplit(".", 1)[-1] for n, _ in a})}

        if self._adapter_root is None:
            self._adapter_root = tempfile.TemporaryDirectory(prefix="ctu-lora-")
        path = os.path.join(self._adapter_root.name, f"v{version}")
        os.makedirs(path, exist_ok=True)
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
                  os.path.join(path, "adapter_model.safetensors"))
        with open(os.path.join(path, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", **dict(peft_config)}, f)
        return path

    def sleep(self) -> None:
        """Offload weights and free the KV cache (level 1) while the trainer updates."""
        if not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake_up(self) -> None:
        """Bring weights and KV cache back; call before loading weights and before rollouts."""
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    def close(self) -> None:
        if self._adapter_root is not None:
            self._adapter_root.cleanup()
            self._adapter_root = None
