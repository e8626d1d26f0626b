"""Attention of the bf16 decode copy (``engine.decode_dtype``): one-token steps by the kernel this CPU runs fastest.

torch's CPU flash-attention kernel is ~10x slower in bf16 than in fp32 for a single query token on a CPU without
AMX (a 2-core Zen 4, torch 2.13: 2.6 ms against 0.3 ms a layer at batch 16 over ~300 cached positions,
SmolLM2-135M's 9 query and 3 key/value heads), so there a decode step's attention is two small products per
key/value head (:data:`NAME`): the query heads that share a key/value head are grouped, scored against its keys
(bf16 product, as transformers' eager attention), the softmax taken in fp32 and cast back, then summed over its
values. With AMX (Sapphire Rapids and newer) the flash kernel over the key/value heads as they are (``enable_gqa``,
no 3x repeat) is ~2.5x faster than those products (:data:`FLASH_NAME`; 0.46 against 1.12 ms a layer at those shapes
on one Sapphire Rapids core) and closer to fp32: it keeps the scores and softmax in fp32. :func:`one_token_kernel`
picks; ``CTU_DECODE_ATTENTION=grouped|flash`` overrides. Prefill (more than one query token) and training use sdpa
as before. The copy's masks are sdpa's (a boolean mask, True where a position is attended, or None: all of them).
"""

from __future__ import annotations

import functools
import math
import os
import threading

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

NAME = "ctu_grouped_decode"
FLASH_NAME = "ctu_gqa_flash_decode"
KERNELS = {"grouped": NAME, "flash": FLASH_NAME}


def one_token_kernel(env=None) -> tuple[str, str]:
    """(``grouped`` or ``flash``, why): how the bf16 copy's one-token steps attend on this CPU, flash where it has
    AMX (or as ``CTU_DECODE_ATTENTION`` says)."""
    env = os.environ if env is None else env
    forced = env.get("CTU_DECODE_ATTENTION", "").strip()
    if forced:
        if forced not in KERNELS:
            raise ValueError(f"CTU_DECODE_ATTENTION must be one of {', '.join(KERNELS)}, got {forced!r}")
        return forced, f"CTU_DECODE_ATTENTION={forced}"
    if torch.cpu._is_amx_tile_supported():
        return "flash", "one-token attention by the flash kernel (this CPU has AMX)"
    return "grouped", "one-token attention by grouped products (no AMX: the bf16 flash kernel is slow here)"


def grouped_decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0,
                             scaling: float | None = None, flash: bool = False,
                             **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [B, H, q, D], key and value [B, KV, L, D]; returns
    [B, q, H, D]. One query token without dropout is computed here (``flash``: by sdpa's flash kernel over the
    key/value heads as they are), anything else by sdpa."""
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    mask_ok = attention_mask is None or (attention_mask.dtype == torch.bool and attention_mask.shape[1] == 1)
    if (dropout and module.training) or heads % kv_heads or not mask_ok or kwargs.get("softcap"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if q_len != 1 or flash:
        if attention_mask is None and q_len != 1:  # sdpa's causal case
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        # a prefill over a cache (or a flash step): sdpa with its key/value heads as they are (transformers repeats
        # them 3x first for a CPU mask: two new tensors per layer; the same output, ~20% faster at 32 x 67 over 600)
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


def register(kernel: str = "grouped") -> str:
    """Make ``kernel``'s implementation (:data:`NAME` or :data:`FLASH_NAME`) one transformers knows (with sdpa's
    masks); returns its name."""
    name = KERNELS[kernel]
    if name not in AttentionInterface._global_mapping:
        function = functools.partial(grouped_decode_attention, flash=kernel == "flash")
        AttentionInterface.register(name, functools.update_wrapper(function, grouped_decode_attention))
        AttentionMaskInterface.register(name, sdpa_mask)
    return name


def use_grouped_decode(model: torch.nn.Module, kernel: str | None = None) -> bool:
    """Switch ``model`` (the engine's own decode copy: its config is its own) to its one-token attention
    (``kernel``, or :func:`one_token_kernel`'s) where it used sdpa; False where it uses another implementation,
    left as it is."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    config._attn_implementation = register(kernel or one_token_kernel()[0])
    return True
