"""The vLLM engine against a faithful fake of vLLM's offline API (real-GPU tests: tests/gpu)."""

import asyncio
import sys

import pytest
import torch

from ctu.engines.base import SamplingParams
from tests.fakes import fake_vllm


@pytest.fixture
def engine(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    from ctu.engines.vllm import VLLMEngine

    return VLLMEngine("tiny-random", gpu_memory_utilization=0.3, seed=1)


def gen(engine, prompts, **kw):
    return asyncio.run(engine.generate(prompts, SamplingParams(**kw)))


def test_constructor_arguments_are_real_vllm_ones(engine):
    assert engine.llm.kwargs["logprobs_mode"] == "processed_logprobs"
    assert engine.llm.kwargs["enable_sleep_mode"] is True and engine.llm.kwargs["dtype"] == "bfloat16"
    with pytest.raises(TypeError, match="unexpected engine arguments"):
        fake_vllm.LLM("tiny-random", not_an_engine_arg=1)


def test_generate_n_logprobs_and_finish_reasons(engine):
    out = gen(engine, [[1, 2, 3], [1, 5]], temperature=1.0, max_tokens=4, n=2, seed=3)
    assert [len(x) for x in out] == [2, 2]
    for completions in out:
        for c in completions:
            assert len(c.token_ids) == len(c.logprobs) and all(lp <= 0 for lp in c.logprobs)
            assert c.finish_reason in ("stop", "length")
    assert gen(engine, [], max_tokens=2) == []
    (greedy,) = gen(engine, [[1, 2, 3]], temperature=0.0, max_tokens=3)
    assert greedy[0].finish_reason == "length" or greedy[0].token_ids[-1] in (2,)


def test_sleep_and_wake(engine):
    engine.sleep()
    assert engine.sleeping and engine.llm.sleep_level == 1
    with pytest.raises(RuntimeError, match="asleep"):
        gen(engine, [[1]], max_tokens=1)
    engine.wake_up()
    assert gen(engine, [[1]], max_tokens=1)


def test_update_weights_passes_hf_names_and_refuses_peft_names(engine):
    model = engine.llm._model.hf
    name = "model.embed_tokens.weight"
    before = gen(engine, [[1, 2, 3]], temperature=0.0, max_tokens=4)
    engine.update_weights([(name, torch.randn_like(dict(model.named_parameters())[name]))])
    assert engine.llm._model.loaded == [name]
    assert gen(engine, [[1, 2, 3]], temperature=0.0, max_tokens=4) != before
    for bad in ("base_model.model.model.layers.0.mlp.up_proj.lora_A.default.weight",
                "model.layers.0.self_attn.q_proj.base_layer.weight"):
        with pytest.raises(ValueError, match="PEFT names"):
            engine.update_weights([(bad, torch.zeros(1))])
