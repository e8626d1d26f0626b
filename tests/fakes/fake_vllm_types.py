"""vLLM's request and output types as the fake (tests/fakes/fake_vllm.py) serves them: vllm/sequence.py /
vllm/logprobs.py (``Logprob``), vllm/inputs (``TokensPrompt``), vllm/sampling_params.py, vllm/lora/request.py and
vllm/outputs.py, with the fields ctu uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict


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
    ignore_eos: bool = False
    max_tokens: int | None = 16
    logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self):
        if self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")


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
