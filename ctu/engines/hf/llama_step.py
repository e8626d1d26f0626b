"""One decode step of the engine's Llama decode copy without transformers' module calls: the same operators on the
same tensors, so the same logits bit for bit, in fewer calls.

A step of SmolLM2-135M at batch 16 made ~6,000 operator calls, and what was not products, attention or sampling
(norms, rotary embedding, copies, and the Python around them: module calls, keyword plumbing, the mask, the cache's
bookkeeping) took about a third of it on one CPU core. :func:`step` runs the decoder layers as a loop over their
weights: RMSNorm, projections (a fused group's one product, by its packed weight where it has one), rotary embedding
of the queries and keys as one tensor (they sit side by side in the fused q/k/v product), the cache layer's
``update``, the attention function the copy's config names, the MLP, the residual adds; the rotary cos/sin and the
attention mask come from the model's own modules, once a step. Elementwise operators compute each element alone,
so the queries and keys rotated together are the ones rotated apart. :func:`plan` reads each layer's weights and
functions once a batch (attribute lookups through ``nn.Module`` were ~3 ms of a 56 ms step at batch 16 on one
Sapphire Rapids core).

:func:`supports` says which models take it: a ``LlamaForCausalLM`` whose layers are transformers' Llama layers
(SmolLM2 is one) and whose cache is made of plain dynamic layers; any other decodes by its own forward.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from transformers.activations import SiLUActivation
from transformers.masking_utils import create_causal_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaRMSNorm,
    eager_attention_forward,
)

from ctu.engines.hf.fused_linear import FusedMember, product
from ctu.engines.hf.kv_buffer import plain_layers
from ctu.engines.hf.packed_linear import PackedLinear

# the mask's arguments as LlamaModel.forward passes them in this transformers (older ones take others: not supported)
_MASK_ARGS = {"config", "inputs_embeds", "attention_mask", "cache", "position_ids"} <= set(
    inspect.signature(create_causal_mask).parameters)


def supports(model: torch.nn.Module, cache) -> bool:
    """Whether :func:`step` decodes ``model`` with ``cache`` (else its own forward does): a Llama of transformers'
    own layers, no module hooked or given a forward of its own (neither would run), a cache of plain dynamic layers,
    one a layer."""
    if not _MASK_ARGS or type(model) is not LlamaForCausalLM or plain_layers(cache) is None or model.training:
        return False
    hooked = torch.nn.modules.module  # hooks on every module, or on one of this model's; a forward of a module's own
    if hooked._global_forward_hooks or hooked._global_forward_pre_hooks or any(  # (the trainer's cast_once binds some)
            m._forward_hooks or m._forward_pre_hooks or "forward" in vars(m) for m in model.modules()):
        return False
    inner = model.model
    layers = inner.layers[: model.config.num_hidden_layers]
    return (len(cache.layers) == len(layers) and type(inner.norm) is LlamaRMSNorm
            and all(type(layer) is LlamaDecoderLayer and type(layer.self_attn) is LlamaAttention
                    and type(layer.mlp) is LlamaMLP and type(layer.input_layernorm) is LlamaRMSNorm
                    and type(layer.post_attention_layernorm) is LlamaRMSNorm for layer in layers))


def rms_norm(norm: LlamaRMSNorm, x: torch.Tensor) -> torch.Tensor:
    """``LlamaRMSNorm.forward``'s operators."""
    return _norm(norm.weight, norm.variance_epsilon, x)


def _norm(weight: torch.Tensor, eps: float, x: torch.Tensor) -> torch.Tensor:
    wide = x.to(torch.float32)
    variance = wide.pow(2).mean(-1, keepdim=True)
    wide = wide * torch.rsqrt(variance + eps)
    return weight * wide.to(x.dtype)


def linear(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A projection's product, by its packed weight where it has one."""
    if type(module) is PackedLinear or type(module) is torch.nn.Linear:
        return product(x, module.weight, module.bias, getattr(module, "packed", None))
    return module(x)


Product = tuple  # (weight, bias, packed): one product; or a tuple of modules, their outputs side by side


def _product_of(modules: tuple[torch.nn.Module, ...]) -> Product:
    """How :func:`_run` computes ``modules``' outputs side by side: one product when they are a fused group in order
    or a single plain projection, else each module."""
    first = modules[0]
    if (isinstance(first, FusedMember) and first.index == 0 and len(modules) == len(first.shared.bounds)
            and all(isinstance(m, FusedMember) and m.shared is first.shared and m.index == i
                    for i, m in enumerate(modules))):
        shared = first.shared
        return (shared.weight, shared.bias, shared.packed)
    if len(modules) == 1 and type(first) in (PackedLinear, torch.nn.Linear):
        return (first.weight, first.bias, getattr(first, "packed", None))
    return modules


def _run(spec: Product, x: torch.Tensor) -> torch.Tensor:
    if isinstance(spec[0], torch.Tensor):
        return product(x, *spec)
    return torch.cat([linear(m, x) for m in spec], dim=-1)


class Layer(NamedTuple):
    """One decoder layer's weights and functions as :func:`step` reads them."""

    attn: LlamaAttention
    norm_in: tuple[torch.Tensor, float]
    qkv: Product
    o: Product
    norm_post: tuple[torch.Tensor, float]
    gate_up: Product
    down: Product
    act: Callable[[torch.Tensor], torch.Tensor]
    intermediate: int


def plan(model: LlamaForCausalLM) -> list[Layer]:
    """The layers of ``model`` for :func:`step`, read once: valid while its weights are not replaced (a batch's
    decode: the engine's lock keeps weight loads out)."""
    layers = []
    for layer in model.model.layers[: model.config.num_hidden_layers]:
        attn, mlp = layer.self_attn, layer.mlp
        act = F.silu if type(mlp.act_fn) in (SiLUActivation, torch.nn.SiLU) else mlp.act_fn
        layers.append(Layer(
            attn, (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
            _product_of((attn.q_proj, attn.k_proj, attn.v_proj)), _product_of((attn.o_proj,)),
            (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
            _product_of((mlp.gate_proj, mlp.up_proj)), _product_of((mlp.down_proj,)), act, mlp.intermediate_size))
    return layers


def signed(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with its first half negated, for :func:`rotate`."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """``apply_rotary_pos_emb`` on one tensor of heads [B, H, q, D]: ``x * cos + rotate_half(x) * sin``, where
    ``rotate_half(x) * sin`` is ``cat(x2, x1) * signed(sin)`` (a roll by half the last dimension): (-a) * b and
    a * (-b) round alike."""
    return (x * cos) + (x.roll(x.shape[-1] // 2, -1) * sin_signed)


def step(model: LlamaForCausalLM, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
         cache, layers: list[Layer] | None = None) -> torch.Tensor:
    """Logits [B, V] of one new token a row (``tokens`` [B]) at ``positions`` [B, 1], attending where ``mask``
    [B, L] (cache and this token) is 1; the token's keys and values are appended to ``cache``. ``model(...)
    .logits[:, -1]`` bit for bit. ``layers``: :func:`plan`'s for ``model`` (made here when None)."""
    inner, config = model.model, model.config
    x = inner.embed_tokens(tokens[:, None])
    attention_mask = create_causal_mask(config=config, inputs_embeds=x, attention_mask=mask, cache=cache,
                                        position_ids=positions)
    cos, sin = inner.rotary_emb(x, position_ids=positions)
    cos, sin = cos.unsqueeze(1), signed(sin.unsqueeze(1))
    name = config._attn_implementation
    attend = eager_attention_forward if name == "eager" else ALL_ATTENTION_FUNCTIONS[name]
    batch = x.shape[0]
    heads = int(config.num_attention_heads)
    kv_heads = int(config.num_key_value_heads or heads)
    for layer, kv in zip(plan(model) if layers is None else layers, cache.layers, strict=True):
        attn = layer.attn
        h = _norm(*layer.norm_in, x)
        qkv = _run(layer.qkv, h).view(batch, 1, heads + 2 * kv_heads, attn.head_dim)
        qkv = qkv.transpose(1, 2)  # [B, heads, 1, D], as the attention's view(...).transpose(1, 2)
        rotated = rotate(qkv[:, : heads + kv_heads], cos, sin)
        keys, values = kv.update(rotated[:, heads:], qkv[:, heads + kv_heads:])
        out, _ = attend(attn, rotated[:, :heads], keys, values, attention_mask, dropout=0.0, scaling=attn.scaling)
        x = _run(layer.o, out.reshape(batch, 1, -1).contiguous()).add_(x)  # x + o: a sum rounds alike either way
        h = _norm(*layer.norm_post, x)
        gate_up = _run(layer.gate_up, h)
        size = layer.intermediate
        x = _run(layer.down, layer.act(gate_up[..., :size]).mul_(gate_up[..., size:])).add_(x)
    return linear(model.lm_head, rms_norm(inner.norm, x))[:, -1, :]
