"""A fake ``vllm`` module mirroring the parts of vLLM 0.33's offline API that ctu uses.

Same names and keyword arguments as the real ones (``LLM``, ``SamplingParams``, ``TokensPrompt``,
``RequestOutput``, ``CompletionOutput``, ``Logprob``); unknown keywords are rejected like the
real constructors do. It is backed by a tiny Hugging Face model, so outputs are real tokens,
and its model exposes ``load_weights(weights=...)`` that, like vLLM's, accepts only the
model's own (Hugging Face) parameter names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

import torch

from ctu.engines.base import SamplingParams as CtuParams
from ctu.engines.hf import HFEngine

LLM_KWARGS = {"dtype", "seed", "gpu_memory_utilization", "enable_sleep_mode", "logprobs_mode", "tensor_parallel_size",
              "max_model_len", "enforce_eager", "tokenizer", "trust_remote_code"}
LOGPROBS_MODES = ("raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs")


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class TokensPrompt(TypedDict, total=False):
    prompt_token_ids: list[int]
    prompt: str


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: Any
    outputs: list[CompletionOutput]
    finished: bool = True


class _Model(torch.nn.Module):
    """What ``apply_model`` hands over: the model, with vLLM's ``load_weights`` method."""

    def __init__(self, hf_model):
        super().__init__()
        self.hf = hf_model
        self.loaded: list[str] = []

    def load_weights(self, weights):
        params = dict(self.hf.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name not in params:  # vLLM raises KeyError on names the model does not have
                raise KeyError(name)
            with torch.no_grad():
                params[name].copy_(tensor)
            loaded.add(name)
        self.loaded.extend(sorted(loaded))
        return loaded


@dataclass
class LLM:
    model: str
    _kwargs: dict = field(default_factory=dict)

    def __init__(self, model: str, **kwargs):
        unknown = set(kwargs) - LLM_KWARGS
        if unknown:
            raise TypeError(f"unexpected engine arguments: {sorted(unknown)}")
        if kwargs.get("logprobs_mode", "raw_logprobs") not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}")
        from ctu.models import load_model, load_tokenizer

        self.model = model
        self.kwargs = kwargs
        self._engine = HFEngine(load_model(model), load_tokenizer(model))
        self._model = _Model(self._engine.model)
        self.sleep_level = None
        self.calls = 0

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None, mm_processor_kwargs=None):
        if self.sleep_level is not None:
            raise RuntimeError("engine is sleeping")
        params = sampling_params or SamplingParams()
        prompts = prompts if isinstance(prompts, list) else [prompts]
        ids = [p["prompt_token_ids"] for p in prompts]
        stop = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
        ours = CtuParams(temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens or 16,
                         stop=tuple(stop), stop_token_ids=tuple(params.stop_token_ids or ()), n=params.n,
                         seed=params.seed)
        results = self._engine.generate_sync(ids, ours)
        self.calls += 1
        outputs = []
        for r, (prompt, completions) in enumerate(zip(ids, results, strict=True)):
            outs = [CompletionOutput(index=i, text="", token_ids=list(c.token_ids),
                                     cumulative_logprob=sum(c.logprobs) if params.logprobs is not None else None,
                                     logprobs=[{t: Logprob(lp, 1)} for t, lp in zip(c.token_ids, c.logprobs, strict=True)]
                                     if params.logprobs is not None else None,
                                     finish_reason=c.finish_reason)
                    for i, c in enumerate(completions)]
            outputs.append(RequestOutput(str(r), None, list(prompt), None, outs))
        return outputs

    def sleep(self, level: int = 1, mode: str = "abort"):
        if not self.kwargs.get("enable_sleep_mode"):
            raise RuntimeError("Sleep mode is not enabled in the model config")
        self.sleep_level = level

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.sleep_level = None
        return True

    def apply_model(self, func):
        return [func(self._model)]
