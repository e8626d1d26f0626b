"""In-process vLLM engine (GPU), written against vLLM 0.33's offline API.

- ``vllm.LLM(model, dtype=..., seed=..., gpu_memory_utilization=..., enable_sleep_mode=True,
  logprobs_mode="processed_logprobs")``: processed logprobs are taken after temperature scaling,
  the same quantity the hf engine returns and the trainer recomputes.
- ``LLM.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(..., logprobs=0,
  detokenize=False, skip_special_tokens=False), use_tqdm=False)``; each
  ``RequestOutput.outputs[i]`` has ``token_ids``, ``logprobs`` (one ``{token_id: Logprob}``
  per token) and ``finish_reason``.
- ``LLM.sleep(level=1)`` / ``LLM.wake_up()`` to share the GPU with the trainer.
- Weights: ``LLM.apply_model(fn)`` runs ``fn(model)`` where the model lives; vLLM models load
  Hugging Face-named tensors with ``model.load_weights(weights=[(name, tensor), ...])``. With
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set here before vLLM starts) the engine core runs in
  this process, so tensors are not pickled across processes.
vLLM is imported lazily: ctu imports without it.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Iterable, Sequence
from functools import partial

from ctu.engines.base import Completion, Engine, SamplingParams

PEFT_NAME = re.compile(r"(^base_model\.model\.)|(\.base_layer\.)|(lora_[AB])|(lora_embedding_[AB])|(modules_to_save)")


def _load(weights, model):
    return model.load_weights(weights=weights)


def check_hf_names(names: Iterable[str]) -> list[str]:
    """Names that are PEFT/LoRA names rather than merged Hugging Face names."""
    return [n for n in names if PEFT_NAME.search(n)]


class VLLMEngine(Engine):
    def __init__(self, model_path: str, gpu_memory_utilization: float = 0.5, enable_sleep_mode: bool = True,
                 dtype: str = "bfloat16", seed: int = 0, **llm_kwargs):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import vllm

        self._vllm = vllm
        self.llm = vllm.LLM(model=model_path, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                            enable_sleep_mode=enable_sleep_mode, logprobs_mode="processed_logprobs", **llm_kwargs)
        self.sleeping = False
        self._lock = threading.Lock()

    def _sampling_params(self, params: SamplingParams):
        return self._vllm.SamplingParams(
            n=params.n, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens,
            seed=params.seed, stop=list(params.stop) or None, stop_token_ids=list(params.stop_token_ids) or None,
            logprobs=0, include_stop_str_in_output=True, skip_special_tokens=False, detokenize=bool(params.stop))

    @staticmethod
    def _completion(output) -> Completion:
        ids = tuple(int(t) for t in output.token_ids)
        steps = output.logprobs or []
        lps = tuple(float(step[t].logprob) for step, t in zip(steps, ids, strict=False))
        if len(lps) != len(ids):
            raise RuntimeError(f"vLLM returned {len(ids)} tokens but {len(lps)} logprobs (request logprobs=0)")
        return Completion(ids, lps, "length" if output.finish_reason == "length" else "stop")

    def generate_sync(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        if not prompts:
            return []
        if self.sleeping:
            raise RuntimeError("the vLLM engine is asleep: call wake_up() before generating")
        inputs = [self._vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        with self._lock:
            outputs = self.llm.generate(inputs, self._sampling_params(params), use_tqdm=False)
        return [[self._completion(o) for o in sorted(r.outputs, key=lambda o: o.index)] for r in outputs]

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        if not prompts:
            return []
        return await asyncio.to_thread(self.generate_sync, prompts, params)

    def update_weights(self, named_tensors: Iterable[tuple[str, object]]) -> None:
        weights = list(named_tensors)
        bad = check_hf_names(name for name, _ in weights)
        if bad:
            raise ValueError(f"vLLM needs merged Hugging Face names; got PEFT names such as {bad[:3]} "
                             "(merge the adapter and strip base_model.model. / base_layer first)")
        with self._lock:
            self.llm.apply_model(partial(_load, weights))

    def sleep(self) -> None:
        if not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake_up(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False
