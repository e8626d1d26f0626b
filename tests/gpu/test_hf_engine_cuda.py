"""The hf engine in bf16 on CUDA."""

import asyncio

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_bf16_generation_on_cuda():
    from ctu.engines.base import SamplingParams
    from ctu.engines.hf import HFEngine
    from ctu.models import load_model, load_tokenizer

    model = load_model("tiny-random", device="cuda")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    engine = HFEngine(model, load_tokenizer("tiny-random"))
    out = asyncio.run(engine.generate([[1, 2, 3], [1, 9]], SamplingParams(temperature=0.7, max_tokens=6, n=2, seed=0)))
    assert all(len(c.token_ids) == len(c.logprobs) for group in out for c in group)
