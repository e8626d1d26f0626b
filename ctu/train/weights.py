"""Weights leaving (or re-entering) the trainer: names, LoRA merging, export, what a sync sends.

Weights leave the trainer with plain Hugging Face names, as vLLM and ``from_pretrained`` load them.
LoRA deltas are merged in fp32 (the base weight cast up, plus the fp32 delta of the fp32 adapters), one module
at a time (a stream, never every delta at once), and cast once, to the receiver's dtype: merging in bf16 would round away the small updates that the fp32
master adapters carry (a bf16 weight near 0.02 has a spacing of ~1e-4; a step at lr 3e-7 is far below it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

_PEFT_PREFIX = "base_model.model."


def hf_name(peft_name: str) -> str | None:
    """A PEFT parameter name as the plain Hugging Face name, or None for adapter-only tensors.

    ``base_model.model.model.layers.0.q_proj.base_layer.weight`` -> ``model.layers.0.q_proj.weight``;
    ``…lora_A.default.weight`` / ``lora_B`` / ``lora_embedding_*`` / ``lora_magnitude_vector`` -> None.
    """
    name = peft_name[len(_PEFT_PREFIX):] if peft_name.startswith(_PEFT_PREFIX) else peft_name
    if re.search(r"(^|\.)(lora_[AB]|lora_embedding_[AB]|lora_magnitude_vector)(\.|$)", name):
        return None
    name = name.replace(".base_layer.", ".")
    name = re.sub(r"\.modules_to_save\.[^.]+\.", ".", name)
    name = re.sub(r"\.original_module\.", ".", name)
    return name


def lora_modules(model: torch.nn.Module) -> Iterator[tuple[str, Any]]:
    """(module name, module) of every LoRA layer with an active adapter."""
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and hasattr(module, "get_delta_weight") and module.active_adapters:
            yield name, module


def module_delta(module: Any) -> torch.Tensor | None:
    """fp32 delta weight of one LoRA layer, summed over its active adapters (None: no active adapter)."""
    delta = None
    for adapter in module.active_adapters:
        if adapter in module.lora_A:
            d = module.get_delta_weight(adapter).detach().to(torch.float32)
            delta = d if delta is None else delta + d
    return delta


def lora_deltas(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """fp32 delta weight per base-layer parameter (PEFT name), summed over the active adapters (every delta at
    once: for rebasing and tests; a sync streams them, :func:`merged_named_tensors`)."""
    deltas: dict[str, torch.Tensor] = {}
    for name, module in lora_modules(model):
        delta = module_delta(module)
        if delta is not None:
            deltas[f"{name}.base_layer.weight"] = delta
    return deltas


def merged_named_tensors(model: torch.nn.Module, lora: bool,
                         dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight with its Hugging Face name, LoRA deltas merged in fp32, then cast once to ``dtype``.

    A stream: each LoRA layer's delta is computed when its weight comes up and merged in place into one fp32
    copy of the base, so at most one module's merge is alive beside the tensor handed out (a consumer that
    drops each tensor keeps the sync's extra memory at one layer). ``dtype=None`` sends fp32 for merged (and
    fp32 master) weights and frozen weights as stored: the receiver casts once to its own dtype
    (``HFEngine.update_weights`` / vLLM ``load_weights`` do); a sync passes the compute dtype (bf16 on CUDA).
    """
    if not lora:
        for name, p in model.named_parameters():
            yield name, p.detach() if dtype is None else p.detach().to(dtype)
        return
    modules = {f"{name}.base_layer.weight": module for name, module in lora_modules(model)}
    for name, param in model.named_parameters():
        target = hf_name(name)
        if target is None:
            continue
        with torch.no_grad():
            tensor = param.detach()
            delta = module_delta(modules[name]) if name in modules else None
            if delta is not None:
                merged = tensor.to(torch.float32, copy=True)
                merged += delta
                del delta
                tensor = merged if dtype is None else merged.to(dtype)
                del merged
            elif dtype is not None:
                tensor = tensor.to(dtype)
        yield target, tensor
        del tensor


def absorb_lora(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Merge every active LoRA delta into its frozen base weight (fp32 sum, one cast to the base's dtype)
    and reset the adapter to the identity (lora_B = 0). Returns the changed base weights by PEFT name: the model's
    own frozen tensors, not copies (a copy of every adapted weight is the size of the model)."""
    changed: dict[str, torch.Tensor] = {}
    params = dict(model.named_parameters())
    with torch.no_grad():
        for module_name, module in lora_modules(model):  # one module's fp32 delta at a time
            delta = module_delta(module)
            if delta is None:
                continue
            name = f"{module_name}.base_layer.weight"
            base = params[name]
            base.copy_((base.to(torch.float32) + delta).to(base.dtype))
            changed[name] = base.detach()
            del delta
        for _, module in lora_modules(model):
            for adapter in module.active_adapters:
                if adapter in module.lora_B:
                    module.lora_B[adapter].weight.zero_()
                    bias = getattr(module.lora_B[adapter], "bias", None)
                    if bias is not None:
                        bias.zero_()
    return changed


def export(policy, out_dir: str | Path, base_path: str) -> dict[str, str]:
    """Write the merged Hugging Face model in fp32 (and, with LoRA, the PEFT adapter) under ``out_dir``."""
    out = Path(out_dir)
    paths = {}
    if policy.lora:
        policy.model.save_pretrained(out / "adapter")
        paths["adapter"] = str(out / "adapter")
    # streamed: one merged tensor at a time goes into the model written (a dict of them all is a model's size more)
    merged = ((name, tensor.cpu()) for name, tensor in policy.merged_named_tensors(dtype=torch.float32))
    return {**paths, **export_tensors(merged, out, base_path, policy.tokenizer)}


def export_tensors(merged: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], out_dir: Path,
                   base_path: str, tokenizer, adapter: dict[str, torch.Tensor] | None = None,
                   peft_config=None) -> dict[str, str]:
    """Write ``out_dir/merged`` (a Hugging Face model dir, fp32) from merged HF-named tensors (a dict, or pairs
    copied in one at a time) and, given the adapter's PEFT-named tensors and its ``LoraConfig``,
    ``out_dir/adapter`` as PEFT saves it (adapter name dropped from the keys); for a sharded policy, whose tensors
    were gathered."""
    from transformers import AutoModelForCausalLM

    from ctu.engines.hf.models import resolve_model

    paths = {}
    if adapter is not None and peft_config is not None:
        from safetensors.torch import save_file

        (out_dir / "adapter").mkdir(parents=True, exist_ok=True)
        peft_config.save_pretrained(str(out_dir / "adapter"))
        state = {re.sub(r"\.(lora_[AB])\.[^.]+\.", r".\1.", n): t.contiguous() for n, t in adapter.items()}
        save_file(state, str(out_dir / "adapter" / "adapter_model.safetensors"))
        paths["adapter"] = str(out_dir / "adapter")
    model = AutoModelForCausalLM.from_pretrained(resolve_model(base_path), dtype=torch.float32)
    state = model.state_dict()
    seen, unexpected = set(), []
    with torch.no_grad():
        for name, tensor in (merged.items() if isinstance(merged, dict) else merged):
            if name in state:
                state[name].copy_(tensor)
                seen.add(name)
            else:
                unexpected.append(name)
            del tensor
    missing = [n for n in state if n not in seen and "lm_head" not in n]
    if unexpected or missing:
        raise RuntimeError(f"export name mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")
    model.tie_weights()
    model.save_pretrained(out_dir / "merged")
    tokenizer.save_pretrained(out_dir / "merged")
    paths["merged"] = str(out_dir / "merged")
    return paths
