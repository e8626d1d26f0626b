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
  ctu's sampler logprob is the sampled token's under the distribution it was drawn from:
  ``log_softmax(logits / T)`` renormalised over the top-k/top-p set (plain ``log_softmax`` when greedy), as
  the hf engine's sampler (:mod:`ctu.engines.hf.sampling`) returns it. That is ``processed_logprobs``, for
  every T and top_p (:func:`choose_logprobs_mode`); ``raw_logprobs`` is it only when nothing is cut and T == 1.
- **Prefix cache** (vllm/v1/core/kv_cache_utils.py): full 16-token blocks are hashed over their token ids
  chained on the parent block's hash (plus the LoRA name); the KV of a hit is reused as it was computed.
  Reloading weights does not invalidate it, so every update (weights or adapter) ends with
  ``LLM.reset_prefix_cache()`` (the shared system prompt would otherwise keep the old KV).
- **Sleep** (vllm/entrypoints/llm.py, vllm/v1/engine/core.py, vllm/v1/executor/abstract.py,
  vllm/v1/worker/gpu_worker.py, vllm/device_allocator/sleep_mode_backend.py): ``LLM.sleep(level)`` pauses the
  scheduler, clears the prefix cache and puts the tags ``weights`` and ``kv_cache`` to sleep. Level 1 copies the
  weights to pinned host RAM and back on wake; level 2 keeps nothing ("good for ... update the model"): what
  wakes is not the model until weights are reloaded. ``LLM.wake_up(tags)`` wakes ``["weights"]`` and
  ``["kv_cache"]`` separately; the scheduler runs again once both are awake. So ``sleep_level`` is 2 where every
  sync overwrites every weight (merged sync: :func:`sleep_level_for`) and 1 where the base is kept (adapter
  sync), and a sync wakes the weights, loads, and only then wakes the KV cache (its memory is not needed to
  load, and may be what the load needs). After a level-2 sleep the engine refuses to generate until weights
  are loaded, and has no weight version (:attr:`weights_version`). Where the platform has no sleep mode
  (``current_platform.is_sleep_mode_available()`` is False: vLLM's CPU backend, whose worker logs sleep/wake
  as no-ops and whose ``LLM(enable_sleep_mode=True)`` raises), the engine does not ask for it and
  :meth:`sleep`/:meth:`wake_up` do nothing.
- **Weight version**: every sync stamps the policy version it loaded, once the load returned
  (:attr:`weights_version`): an adapter sync's version is its ``LoRARequest`` (name ``ctu-v<version>``, id
  version + 1); a merged sync's is stored on the engine after ``reload_weights`` completed. The trainer checks
  it after every sync (:func:`ctu.engines.checks.parity.check_versions`).
- **Weights** (vllm/model_executor/model_loader/reload/inplace.py): ``collective_rpc("reload_weights",
  kwargs={"weights_iterator": it})`` runs the model's own ``load_weights`` on Hugging Face-named
  ``(name, tensor)`` pairs, layer by layer (a layer is processed into kernel format once all its tensors
  arrived; a layer that got none keeps its weights). The iterator crosses no process boundary only when the
  engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here before vLLM starts);
  otherwise the tensors are written to a temporary safetensors directory shard by shard and reloaded with
  ``weights_path=DIR``. ``apply_model(lambda m: m.load_weights(...))`` is not used: on the CPU backend the
  loaded parameters are already repacked (size 0) and ``load_weights`` fails outside ``reload_weights``.
  Either way ``named_tensors`` is consumed as a stream, never held whole.
- **LoRA** (vllm/lora/request.py; vllm/lora/worker_manager.py; vllm/config/lora.py): ``LoRARequest(lora_name,
  lora_int_id, lora_path)`` with a PEFT directory (``adapter_config.json`` + ``adapter_model.safetensors``),
  passed as ``generate(..., lora_request=...)``. Adapters are cached by ``lora_int_id``: a reused id serves
  the adapter loaded first, so every version gets a new id (and a new name, which the prefix-cache hash
  uses). The directory is read when the adapter is first used; once a newer version is serving, the older
  directory this engine wrote is deleted (one per version would otherwise pile up on disk).
  ``max_lora_rank`` must be one of :data:`VLLM_LORA_RANKS`.
vLLM is imported lazily: ctu imports without it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ctu.config.checks import VLLM_LORA_RANKS
from ctu.engines.base import Completion, Engine, SamplingParams

log = logging.getLogger(__name__)
PEFT_NAME = re.compile(r"(^base_model\.model\.)|(\.base_layer\.)|(lora_[AB])|(lora_embedding_[AB])|(modules_to_save)")
SHARD_BYTES = 1 << 30  # safetensors shard size when weights go through a directory


def check_hf_names(names: Iterable[str]) -> list[str]:
    """Names that are PEFT/LoRA names rather than merged Hugging Face names."""
    return [n for n in names if PEFT_NAME.search(n)]


def choose_logprobs_mode(temperature: float | None, top_p: float | None) -> str:
    """The vLLM ``logprobs_mode`` whose sampled-token value is the logprob under the distribution it was sampled
    from (temperature, then renormalised over the top-k/top-p set): ``processed_logprobs``, whatever the
    settings (the arguments are kept for the callers that pass a run's sampling)."""
    return "processed_logprobs"


def logprobs_exact(mode: str, params: SamplingParams) -> bool:
    """Whether vLLM's value under ``mode`` is the sampled token's logprob under the distribution it was drawn
    from, for these sampling params."""
    if params.temperature < 1e-5 or mode == "processed_logprobs":
        return True
    return mode == "raw_logprobs" and params.temperature == 1.0 and params.top_p >= 1.0 and not params.top_k


def vllm_dtype(model_dtype: str, cuda: bool) -> str:
    """The engine's dtype: the trainer's compute dtype (``model.dtype``; ``auto`` is bf16 on CUDA, fp32 on CPU,
    as in ctu/train/policy.py), so the parity probe compares like with like."""
    if model_dtype != "auto":
        return model_dtype
    return "bfloat16" if cuda else "float32"


def sleep_level_for(weight_sync: str) -> int:
    """vLLM's sleep level for an engine synced by ``weight_sync`` (``ctu.config.schema.weight_sync_mode``): 2 (discard
    the weights) when every sync overwrites them all (merged), 1 (keep them on the host) when the base stays."""
    return 2 if weight_sync == "merged" else 1


def hf_named_stream(named_tensors: Iterable[tuple[str, object]], bad: list[str]) -> Iterator[tuple[str, object]]:
    """``named_tensors`` passed through one at a time; at the first PEFT/LoRA name it is put in ``bad`` and the
    stream ends (the caller raises once the receiver has finished with what came before)."""
    for name, tensor in named_tensors:
        if PEFT_NAME.search(name):
            bad.append(name)
            return
        yield name, tensor


def write_safetensors_shards(named_tensors: Iterable[tuple[str, Any]], directory: str,
                             shard_bytes: int = SHARD_BYTES) -> list[str]:
    """Write ``(name, tensor)`` pairs as ``model-NNNNN.safetensors`` files of about ``shard_bytes`` each, holding
    at most one shard in memory; returns the file names."""
    from safetensors.torch import save_file

    files: list[str] = []
    shard: dict[str, Any] = {}
    size = 0

    def flush():
        nonlocal shard, size
        if shard:
            files.append(f"model-{len(files):05d}.safetensors")
            save_file(shard, os.path.join(directory, files[-1]))
        shard, size = {}, 0

    for name, tensor in named_tensors:
        t = tensor.detach().to("cpu").contiguous()
        if any(t.data_ptr() == other.data_ptr() for other in shard.values()):  # tied: safetensors refuses shared storage
            t = t.clone()
        shard[name] = t
        size += t.numel() * t.element_size()
        if size >= shard_bytes:
            flush()
    flush()
    return files


def write_peft_adapter(adapter: Mapping[str, Any] | Iterable[tuple[str, Any]], path: str,
                       peft_config: Mapping[str, object] | None = None, lora_alpha: float | None = None) -> str:
    """Write PEFT-named LoRA tensors as a PEFT adapter directory (``adapter_model.safetensors`` and
    ``adapter_config.json``) at ``path``; without ``peft_config``, ``r`` and ``target_modules`` are read from the
    tensors and ``lora_alpha`` is the one given."""
    from safetensors.torch import save_file

    items = adapter.items() if isinstance(adapter, Mapping) else adapter
    tensors = {name.replace(".default.", "."): tensor for name, tensor in items}
    if not peft_config:
        a = [(n, t) for n, t in tensors.items() if ".lora_A." in n]
        if not a or lora_alpha is None:
            raise ValueError("update_adapter needs lora_A/lora_B tensors and lora_alpha (constructor) or peft_config")
        peft_config = {"r": int(a[0][1].shape[0]), "lora_alpha": lora_alpha,
                       "target_modules": sorted({n.split(".lora_A.")[0].rsplit(".", 1)[-1] for n, _ in a})}
    os.makedirs(path, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", **dict(peft_config)}, f)
    return path


class VLLMEngine(Engine):
    """``enable_sleep_mode``: None asks for it where vLLM's platform supports it (CUDA), not on CPU.
    ``sleep_level``: what :meth:`sleep` asks for; 2 only where every sync sends every weight (:func:`sleep_level_for`).
    ``weights_via``: ``"iterator"`` (in-process engine core) or ``"path"`` (a safetensors directory); None picks
    the iterator when ``VLLM_ENABLE_V1_MULTIPROCESSING=0``."""

    def __init__(self, model_path: str, gpu_memory_utilization: float = 0.5, enable_sleep_mode: bool | None = None,
                 dtype: str = "bfloat16", seed: int = 0, max_model_len: int | None = None, enable_lora: bool = False,
                 max_lora_rank: int = 16, lora_alpha: float | None = None, sampling_temperature: float | None = None,
                 sampling_top_p: float | None = None, weights_via: str | None = None,
                 shard_bytes: int = SHARD_BYTES, sleep_level: int = 1, **llm_kwargs):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 (keep the weights) or 2 (discard them), got {sleep_level}")
        if enable_lora and int(max_lora_rank) not in VLLM_LORA_RANKS:
            raise ValueError(f"max_lora_rank must be one of vLLM's {VLLM_LORA_RANKS}, got {max_lora_rank}")
        if weights_via is None:
            weights_via = "iterator" if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" else "path"
        if weights_via not in ("iterator", "path"):
            raise ValueError(f"weights_via must be 'iterator' or 'path', got {weights_via!r}")
        import vllm
        from vllm.platforms import current_platform

        from ctu.engines.hf.models import resolve_model

        self._vllm = vllm
        self.weights_via, self.shard_bytes = weights_via, int(shard_bytes)
        self.lora_alpha = lora_alpha
        self.logprobs_mode = choose_logprobs_mode(sampling_temperature, sampling_top_p)
        can_sleep = bool(current_platform.is_sleep_mode_available())
        if enable_sleep_mode and not can_sleep:
            raise ValueError("enable_sleep_mode: vLLM has no sleep mode on this platform (CPU); leave it unset")
        self.sleep_mode = can_sleep if enable_sleep_mode is None else bool(enable_sleep_mode)
        if self.sleep_mode:
            llm_kwargs["enable_sleep_mode"] = True
        if max_model_len is not None:
            llm_kwargs["max_model_len"] = int(max_model_len)
        if enable_lora:
            llm_kwargs.update(enable_lora=True, max_lora_rank=int(max_lora_rank))
        from ctu.engines.checks.fingerprint import EXTENSION

        self.llm = vllm.LLM(model=resolve_model(model_path), dtype=dtype, seed=seed,
                            gpu_memory_utilization=gpu_memory_utilization, logprobs_mode=self.logprobs_mode,
                            worker_extension_cls=EXTENSION, **llm_kwargs)
        self.sleep_level = int(sleep_level)
        self.asleep: set[str] = set()  # the vLLM tags this engine put to sleep and has not woken
        self.weights_discarded = False  # a level-2 sleep dropped the weights; a load brings them back
        self._merged_version: int | None = None  # the version the last completed update_weights loaded
        self.lora_request = None  # the adapter every generate uses after update_adapter
        self._lora_ids: set[int] = set()
        self._adapter_root: tempfile.TemporaryDirectory | None = None
        self._written_adapter: str | None = None  # the serving adapter's directory, when this engine wrote it
        self._warned_inexact = False
        self._lock = threading.Lock()

    def _sampling_params(self, params: SamplingParams, seed: int | None = None):
        return self._vllm.SamplingParams(
            n=params.n, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or -1,
            max_tokens=params.max_tokens,
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
        if self.weights_discarded:
            raise RuntimeError("the vLLM engine's weights were discarded (sleep level 2) and not reloaded: load "
                               "weights (update_weights) before generating")
        if not self._warned_inexact and not logprobs_exact(self.logprobs_mode, params):
            self._warned_inexact = True
            log.warning("vLLM's logprobs_mode=%s is not the sampling distribution's logprob for T=%s, top_p=%s: "
                        "sampler logprobs are inexact", self.logprobs_mode, params.temperature, params.top_p)
        inputs = [self._vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        with self._lock:
            sampling = (self._sampling_params(params) if seeds is None
                        else [self._sampling_params(params, seed) for seed in seeds])
            outputs = self.llm.generate(inputs, sampling, use_tqdm=False, lora_request=self.lora_request)
            version = self.weights_version  # under the lock: no load can come between the call and its stamp
        return [[replace(self._completion(o), version=version) for o in sorted(r.outputs, key=lambda o: o.index)]
                for r in outputs]

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                       seeds: Sequence[int] | None = None) -> list[list[Completion]]:
        if not prompts:
            return []
        return await asyncio.to_thread(self.generate_sync, prompts, params, seeds)

    def _reset_prefix_cache(self) -> None:
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running): the engine would "
                               "reuse KV computed with the old weights")

    def update_weights(self, named_tensors: Iterable[tuple[str, object]], version: int | None = None) -> None:
        """Merged Hugging Face weights, streamed: wake the weights (if asleep), ``reload_weights``, wake the KV
        cache, reset the prefix cache; then ``version`` is the engine's :attr:`weights_version`."""
        bad: list[str] = []
        stream = hf_named_stream(named_tensors, bad)
        self.wake_up(["weights"])
        with self._lock:
            if self.weights_via == "iterator":
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream})
            else:
                with tempfile.TemporaryDirectory(prefix="ctu-weights-") as directory:
                    write_safetensors_shards(stream, directory, self.shard_bytes)
                    if not bad:
                        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": directory})
        self.wake_up(["kv_cache"])
        with self._lock:
            self._reset_prefix_cache()
        if bad:
            raise ValueError(f"vLLM needs merged Hugging Face names, not PEFT names such as {bad[0]} (merge the adapter "
                             "and strip base_model.model. / base_layer first); the tensors before it were loaded")
        self.weights_discarded = False
        self._merged_version = version

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
        written = not isinstance(adapter, (str, os.PathLike))
        path = self._write_adapter(adapter, version, peft_config) if written else os.fspath(adapter)  # type: ignore[arg-type]
        self.wake_up(["weights"])
        self.wake_up(["kv_cache"])
        with self._lock:
            from vllm.lora.request import LoRARequest

            self.lora_request = LoRARequest(f"ctu-v{version}", lora_id, path)
            self._lora_ids.add(lora_id)
            self._reset_prefix_cache()
            # Nothing can ask for the previous version again (every generate takes the lock and the new request).
            previous, self._written_adapter = self._written_adapter, path if written else None
        if previous is not None and previous != path:
            shutil.rmtree(previous, ignore_errors=True)

    def _write_adapter(self, adapter, version: int, peft_config) -> str:
        if self._adapter_root is None:
            self._adapter_root = tempfile.TemporaryDirectory(prefix="ctu-lora-")
        path = os.path.join(self._adapter_root.name, f"v{version}")
        write_peft_adapter(adapter, path, peft_config, self.lora_alpha)
        return path

    def fingerprint(self):
        """From the worker's own tensors (:class:`~ctu.engines.checks.fingerprint.FingerprintExtension`); None asleep."""
        from ctu.engines.checks.fingerprint import Fingerprint

        if self.asleep or self.weights_discarded:
            return None
        with self._lock:
            return Fingerprint.of(self.llm.collective_rpc("ctu_fingerprint")[0])

    @property
    def sleeping(self) -> bool:
        return bool(self.asleep)

    @property
    def weights_version(self) -> int | None:  # type: ignore[override]  # read-only: it follows the loads
        """The policy version of the weights this engine serves: the adapter's (``LoRARequest`` id - 1) once an
        adapter is served, else the last completed merged load's; None before any sync and while the weights
        are discarded (level-2 sleep)."""
        if self.weights_discarded:
            return None
        if self.lora_request is not None:
            return self.lora_request.lora_int_id - 1
        return self._merged_version

    def sleep(self) -> None:
        """Free the KV cache and the weights' GPU memory (level 1: weights kept on the host; level 2: discarded)
        while the trainer updates; a no-op without sleep mode."""
        if self.sleep_mode and not self.sleeping:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = {"weights", "kv_cache"}
            self.weights_discarded = self.sleep_level == 2

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Wake ``tags`` (``"weights"``, ``"kv_cache"``; None: whatever sleeps). A sync wakes the weights, loads,
        then wakes the KV cache; rollouts need both."""
        wanted = self.asleep & set(tags if tags is not None else self.asleep)  # vLLM wakes nothing for a tag not asleep
        if self.sleep_mode and wanted:
            self.llm.wake_up(tags=sorted(wanted))
            self.asleep -= wanted

    def close(self) -> None:
        if self._adapter_root is not None:
            self._adapter_root.cleanup()
            self._adapter_root = None
