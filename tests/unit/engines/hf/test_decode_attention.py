"""The bf16 decode copy's one-token steps (``ctu/engines/hf/decode_attention.py``): by grouped products without AMX,
the same attention as transformers' eager implementation without torch's CPU flash kernel (slow there in bf16 for one
query); by the flash kernel over the key/value heads as they are with AMX."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from transformers.models.llama.modeling_llama import eager_attention_forward

from ctu.engines.base import SamplingParams
from ctu.engines.hf import decode_attention
from ctu.engines.hf.decode_attention import NAME, grouped_decode_attention, use_grouped_decode
from ctu.engines.hf.engine import HFEngine
from ctu.engines.hf.hf_api import cache_of, with_cache
from ctu.engines.hf.models import load_model, load_tokenizer


class Heads(torch.nn.Module):
    def __init__(self, heads: int, kv_heads: int):
        super().__init__()
        self.num_key_value_groups = heads // kv_heads
        self.is_causal = True


def inputs(dtype, heads=9, kv_heads=3, batch=4, length=23, q_len=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, 16, generator=g).to(dtype)
    k, v = (torch.randn(batch, kv_heads, length, 16, generator=g).to(dtype) for _ in range(2))
    mask = torch.ones(batch, 1, q_len, length, dtype=torch.bool)
    mask[1, ..., :5] = False  # left padding of rows 1 and 3
    mask[3, ..., :11] = False
    return q, k, v, mask


@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (4, 4), (8, 1)])
@pytest.mark.parametrize("masked", [True, False])
def test_one_query_token_attends_as_transformers_eager_attention(heads, kv_heads, masked):
    module = Heads(heads, kv_heads)
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        q, k, v, mask = inputs(dtype, heads, kv_heads)
        additive = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
        ours, _ = grouped_decode_attention(module, q, k, v, mask if masked else None, scaling=0.25)
        theirs, _ = eager_attention_forward(module, q, k, v, additive if masked else None, scaling=0.25)
        assert ours.shape == theirs.shape == (4, 1, heads, 16) and ours.dtype == dtype
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=tol, atol=tol)



def test_decode_steps_without_gradients_reuse_one_workspace_and_give_the_allocating_paths_numbers():
    """Without gradients (a decode) the scores and probabilities go into a workspace kept per thread: the same
    numbers as the path that allocates them, and no new memory as a decode's positions grow one a step (tensors
    allocated anew each step of each layer leave glibc's heap holes too small for the next step's)."""
    module = Heads(9, 3)
    q, k, v, mask = inputs(torch.bfloat16, length=40)
    with torch.no_grad():
        big, _ = grouped_decode_attention(module, q, k, v, mask, scaling=0.25)  # the workspace's size is set here
    spaces = {key: buf.data_ptr() for key, buf in decode_attention._SPACE.spaces.items()}
    for length in range(20, 40):  # a decode's steps, over the first positions of the same cache
        with torch.inference_mode():
            ours, _ = grouped_decode_attention(module, q, k[:, :, :length], v[:, :, :length], mask[..., :length],
                                               scaling=0.25)
        allocated, _ = grouped_decode_attention(module, q, k[:, :, :length], v[:, :, :length], mask[..., :length],
                                                scaling=0.25)  # gradients on: the allocating path
        assert torch.equal(ours, allocated), length
    assert {key: buf.data_ptr() for key, buf in decode_attention._SPACE.spaces.items()} == spaces


def test_more_query_tokens_are_sdpa_s():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = Heads(9, 3)
    q, k, v, mask = inputs(torch.bfloat16, q_len=23)
    ours, _ = grouped_decode_attention(module, q, k, v, mask, scaling=0.25)
    assert torch.equal(ours, sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)[0])


def prefill_then_step(model, ids, step_sdpa=None):
    """(prefill logits, one decode step's logits) of a batch whose row 1 is left-padded by 4; ``step_sdpa`` stands in
    for torch's sdpa during the step only."""
    mask = torch.ones(ids.shape, dtype=torch.long)
    mask[1, :4] = 0
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention",
                               step_sdpa or torch.nn.functional.scaled_dot_product_attention):
            step = model(input_ids=out.logits[:, -1].argmax(-1, keepdim=True), use_cache=True,
                         attention_mask=torch.cat([mask, torch.ones(len(ids), 1, dtype=torch.long)], 1),
                         **with_cache(cache_of(out)))
    return out.logits, step.logits


def test_a_decode_step_of_a_model_matches_sdpa_s():
    """A left-padded batch's prefill, then one step from its cache: the grouped model's logits are sdpa's."""
    torch.manual_seed(0)
    sdpa, grouped = load_model("tiny-random").eval(), load_model("tiny-random").eval()
    assert use_grouped_decode(grouped, "grouped") and grouped.config._attn_implementation == NAME
    ids = torch.randint(5, 1000, (3, 9))
    logits = [prefill_then_step(model, ids) for model in (sdpa, grouped)]
    assert torch.equal(logits[0][0], logits[1][0])  # the prefill is sdpa's own
    torch.testing.assert_close(logits[1][1], logits[0][1], rtol=1e-5, atol=1e-5)


def test_the_bf16_decode_copy_never_runs_flash_attention_for_one_token_without_amx(monkeypatch):
    """Fails on a copy that decodes with sdpa (2.6 ms against 0.2 ms a layer at SmolLM2's shapes on a Zen 4); the
    policy's own model, which the trainer runs, keeps sdpa."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    seen: list[int] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counting(query, *args, **kwargs):
        seen.append(query.shape[0])
        return real(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    model = load_model("tiny-random").eval()
    engine = HFEngine(model, load_tokenizer("tiny-random"), decode_dtype="bfloat16")
    out = engine.generate_sync([[1, 520, 33, 88], [1, 77, 4000]], SamplingParams(max_tokens=6, temperature=0.0))
    assert all(len(c.token_ids) == 6 for [c] in out)
    assert len(seen) == model.config.num_hidden_layers  # the prefill's, once a layer; none for the 5 steps
    assert model.config._attn_implementation == "sdpa"
    model(input_ids=torch.tensor([[1, 2, 3]]))  # the trainer's forward, on the policy: sdpa
    assert len(seen) == 2 * model.config.num_hidden_layers


def test_the_one_token_kernel_is_flash_with_amx_and_grouped_without(monkeypatch):
    monkeypatch.delenv("CTU_DECODE_ATTENTION", raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert decode_attention.one_token_kernel()[0] == "flash"
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert decode_attention.one_token_kernel()[0] == "grouped"
    assert decode_attention.one_token_kernel({"CTU_DECODE_ATTENTION": "flash"}) == ("flash", "CTU_DECODE_ATTENTION=flash")
    with pytest.raises(ValueError, match="CTU_DECODE_ATTENTION must be one of grouped, flash, got 'fast'"):
        decode_attention.one_token_kernel({"CTU_DECODE_ATTENTION": "fast"})


def test_with_amx_every_one_token_step_runs_the_flash_kernel_and_matches_sdpa(monkeypatch):
    """Fails on a copy that keeps grouped products where the CPU has AMX (1.12 against 0.46 ms a layer on one
    Sapphire Rapids core): each decode step of each layer runs sdpa over the 3 key/value heads as they are, and a
    step's logits are transformers' sdpa's."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.delenv("CTU_DECODE_ATTENTION", raising=False)
    torch.manual_seed(0)
    sdpa, flash = load_model("tiny-random").eval(), load_model("tiny-random").eval()
    assert use_grouped_decode(flash) and flash.config._attn_implementation == decode_attention.FLASH_NAME
    seen: list[tuple[int, int]] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counting(query, key, *args, **kwargs):
        seen.append((query.shape[2], key.shape[1]))
        return real(query, key, *args, **kwargs)

    ids = torch.randint(5, 1000, (3, 9))
    logits = [prefill_then_step(model, ids, step_sdpa=counting)[1] for model in (sdpa, flash)]
    layers, kv_heads = flash.config.num_hidden_layers, flash.config.num_key_value_heads
    assert seen[layers:] == [(1, kv_heads)] * layers  # the flash copy: one query, key/value heads not repeated
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)
