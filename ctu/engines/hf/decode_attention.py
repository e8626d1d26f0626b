"""Attention of the bf16 decode copy's one-token steps, as grouped products (``engine.decode_dtype``).

torch's CPU flash-attention kernel is ~10x slower in bf16 than in fp32 for a single query token (a 2-core Zen 4,
torch 2.13: 2.6 ms against 0.3 ms a layer at batch 16 over ~300 cached positions, SmolLM2-135M's 9 query and 3
key/value heads), so bf16 decoding spent half its step there and was slower than fp32 decoding. A decode step's
attention is two small products per key/value head: the query heads that share a key/value head are grouped,
scored against its keys (bf16 product, as transformers' eager attention), the softmax taken in fp32 and cast
back, then summed over its values. Prefill (more than one query token) and training use transformers' sdpa as
before. The copy's masks are sdpa's (a boolean mask, True where a position is attended, or None: all of them).
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

NAME = "ctu_grouped_decode"


def grouped_decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0,
                             scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [B, H, q, D], key and value [B, KV, L, D]; returns
    [B, q, H, D]. One query token without dropout is computed here, anything else by sdpa."""
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    mask_ok = attention_mask is None or (attention_mask.dtype == torch.bool and attention_mask.shape[1] == 1)
    if q_len != 1 or (dropout and module.training) or heads % kv_heads or not mask_ok or kwargs.get("softcap"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scale = dim ** -0.5 if scaling is None else scaling
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # a head's queries beside its key/value head
    # keys @ queries^T, not queries @ keys^T: the cache's keys are rows of a buffer, which bmm reads in place
    scores = torch.matmul(key, grouped.transpose(-1, -2)) * scale  # [B, KV, L, group]
    if attention_mask is not None:  # [B, 1, 1, L]: the same positions for every head
        scores = scores.masked_fill(~attention_mask.transpose(-1, -2), torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-2, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(probs.transpose(-1, -2), value)  # [B, KV, group, D]
    return out.reshape(batch, 1, heads, dim), None


def register() -> str:
    """Make :data:`NAME` an attention implementation transformers knows (with sdpa's masks); returns it."""
    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, grouped_decode_attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def use_grouped_decode(model: torch.nn.Module) -> bool:
    """Switch ``model`` (the engine's own decode copy: its config is its own) to grouped decode attention where it
    used sdpa; False where it uses another implementation, left as it is."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    config._attn_implementation = register()
    return True
