"""A decode step without transformers' module calls (``ctu/engines/hf/llama_step.py``) gives the model's own forward's
logits and cache bit for bit: in fp32, and as the bf16 decode copy (fused projections, packed weights where the CPU
packs, either one-token attention kernel), over left-padded rows; models it cannot run decode by their forward."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ctu.engines.hf import llama_step
from ctu.engines.hf.decode_copy import DecodeCopy
from ctu.engines.hf.hf_api import cache_of, with_cache
from ctu.engines.hf.kv_buffer import preallocate


def tiny(seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=300, hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                         attn_implementation="sdpa")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


def prefill(model, steps: int = 3):
    """Left-padded prompts of 4 rows run through ``model``: (last logits, cache with room, mask, positions)."""
    ids = torch.randint(1, 300, (4, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[3, :6] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    cache = cache_of(out)
    preallocate(cache, steps)
    return out.logits[:, -1], cache, mask, positions[:, -1:]


def decode_both(model, steps: int = 3):
    """The same decode run by the direct step and by the model's forward: their logits and caches, step by step."""
    logits, cache, mask, positions = prefill(model, steps)
    ours, theirs = (logits, copy.deepcopy(cache)), (logits, cache)
    seen = []
    for _ in range(steps):
        tokens = ours[0].float().argmax(-1)
        mask = torch.cat([mask, torch.ones(4, 1, dtype=mask.dtype)], dim=-1)
        positions = positions + 1
        assert llama_step.supports(model, ours[1])
        direct = llama_step.step(model, tokens, mask, positions, ours[1])
        out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions,
                    **with_cache(theirs[1]), use_cache=True)
        ours, theirs = (direct, ours[1]), (out.logits[:, -1], cache_of(out))
        seen.append((ours, theirs))
    return seen


def assert_same(seen) -> None:
    for (logits, cache), (want, want_cache) in seen:
        assert torch.equal(logits, want)
        for layer, other in zip(cache.layers, want_cache.layers, strict=True):
            assert torch.equal(layer.keys, other.keys) and torch.equal(layer.values, other.values)


@torch.inference_mode()
def test_the_direct_step_is_the_forward_bit_for_bit_in_fp32():
    assert_same(decode_both(tiny()))


@pytest.mark.parametrize("kernel", ["grouped", "flash"])
def test_the_direct_step_is_the_bf16_decode_copys_forward_bit_for_bit(kernel, monkeypatch):
    monkeypatch.setenv("CTU_DECODE_ATTENTION", kernel)
    copy_ = DecodeCopy(torch.bfloat16).get(tiny(), version=0)
    assert copy_.config._attn_implementation.startswith("ctu_")
    with torch.inference_mode():
        assert_same(decode_both(copy_))


@torch.inference_mode()
def test_models_it_cannot_run_decode_by_their_forward():
    model = tiny()
    _, cache, _, _ = prefill(model)
    assert llama_step.supports(model, cache)
    handle = model.model.layers[1].mlp.register_forward_hook(lambda *args: None)  # a hook would not run
    assert not llama_step.supports(model, cache)
    handle.remove()
    for module in (model, model.model.layers[0].mlp.down_proj):  # a forward of its own (a spy, the trainer's cast)
        module.forward = module.forward
        assert not llama_step.supports(model, cache)
        del module.forward
    model.train()
    assert not llama_step.supports(model, cache)
    model.eval()
    cache.layers = cache.layers[:1]
    assert not llama_step.supports(model, cache)
    assert not llama_step.supports(torch.nn.Linear(2, 2), cache)
