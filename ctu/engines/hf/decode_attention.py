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

import math
import threading

import torch
import torch.nn.functional as F
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
    if (dropout and module.training) or heads % kv_heads or not mask_ok or kwargs.get("softcap"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if q_len != 1:
        if attention_mask is None:  # sdpa's causal case
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        # a prefill over a cache: sdpa with its key/value heads as they are (transformers repeats them 3x first for
        # a CPU mask: two new tensors per layer; the same output, ~20% faster at 32 x 67 over 600 positions)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                             enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    scale = dim ** -0.5 if scaling is None else scaling
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # a head's queries beside its key/value head
    if torch.is_grad_enabled():
        probs = _probs(key, grouped, attention_mask, scale, value.dtype)
    else:
        probs = _probs_in_place(key, grouped, attention_mask, scale, value.dtype)
    out = torch.matmul(probs.transpose(-1, -2), value)  # [B, KV, group, D]
    return out.reshape(batch, 1, heads, dim), None


def _probs(key: torch.Tensor, grouped: torch.Tensor, mask: torch.Tensor | None, scale: float,
           dtype: torch.dtype) -> torch.Tensor:
    """Attention probabilities [B, KV, L, group]: bf16 scores, an fp32 softmax over the positions, cast back."""
    # keys @ queries^T, not queries @ keys^T: the cache's keys are rows of a buffer, which bmm reads in place
    scores = torch.matmul(key, grouped.transpose(-1, -2)) * scale
    if mask is not None:  # [B, 1, 1, L]: the same positions for every head
        scores = scores.masked_fill(~mask.transpose(-1, -2), torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-2, dtype=torch.float32).to(dtype)


_SPACE = threading.local()


def _space(slot: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A contiguous tensor of ``shape`` at the start of this thread's workspace ``slot`` (grown when too small)."""
    numel = math.prod(shape)
    spaces = _SPACE.__dict__.setdefault("spaces", {})
    buf = spaces.get((slot, dtype, device))
    if buf is None or buf.numel() < numel:
        with torch.inference_mode(False):  # a plain tensor: usable in and out of inference mode
            buf = spaces[(slot, dtype, device)] = torch.empty(numel + numel // 2, dtype=dtype, device=device)
    return buf[:numel].view(shape)


def _probs_in_place(key: torch.Tensor, grouped: torch.Tensor, mask: torch.Tensor | None, scale: float,
                    dtype: torch.dtype) -> torch.Tensor:
    """:func:`_probs`, the same operations into a workspace kept per thread: a decode step's scores grow by one
    position, and tensors allocated anew each step of each layer (4 a layer, ~1.4 MB at batch 32 over ~500
    positions) leave glibc's heap holes too small for the next step's. Valid until this thread's next call."""
    shape = (key.shape[0], key.shape[1], key.shape[2], grouped.shape[2])
    scores = torch.matmul(key, grouped.transpose(-1, -2), out=_space(0, shape, key.dtype, key.device))
    scores.mul_(scale)
    if mask is not None:
        scores.masked_fill_(~mask.transpose(-1, -2), torch.finfo(scores.dtype).min)
    wide = _space(1, shape, torch.float32, key.device).copy_(scores)
    probs = torch.ops.aten._softmax.out(wide, -2, False, out=_space(2, shape, torch.float32, key.device))
    return _space(0, shape, dtype, key.device).copy_(probs) if dtype == key.dtype else probs.to(dtype)


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
