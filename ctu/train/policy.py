"""The policy: a Hugging Face causal LM, fully fine-tuned or with LoRA adapters (peft).

With LoRA the reference model is the same model with adapters disabled (no second copy);
with full fine-tuning it is a frozen copy. Every parameter, trainable or frozen, has one dtype
(bf16 on CUDA, fp32 on CPU) — asserted, because mixed fp32/bf16 parameters break FSDP.
Weights leave the trainer with plain Hugging Face names (LoRA merged in), as vLLM loads them.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ctu.config import Config
from ctu.shared_prefix import needed_logits

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


def assert_uniform_dtype(model: torch.nn.Module) -> torch.dtype:
    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) != 1:
        detail = {str(d): [n for n, p in model.named_parameters() if p.dtype == d][:3] for d in dtypes}
        raise TypeError(f"policy parameters must share one dtype, found {detail}")
    return dtypes.pop()


@dataclass
class Policy:
    model: torch.nn.Module
    tokenizer: object
    lora: bool
    reference: torch.nn.Module | None = None  # full fine-tuning only

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def as_reference(self) -> Iterator[torch.nn.Module]:
        """The reference model: adapters disabled (LoRA) or the frozen copy."""
        if self.lora:
            with self.model.disable_adapter():
                yield self.model
        else:
            yield self.reference

    def merged_named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every weight with its Hugging Face name, LoRA deltas merged in (for engines and export)."""
        if not self.lora:
            yield from ((n, p.detach()) for n, p in self.model.named_parameters())
            return
        deltas = {}
        for name, module in self.model.named_modules():
            if hasattr(module, "lora_A") and hasattr(module, "get_delta_weight") and module.active_adapters:
                for adapter in module.active_adapters:
                    if adapter in module.lora_A:
                        delta = module.get_delta_weight(adapter).detach()
                        key = hf_name(f"{name}.base_layer.weight")
                        deltas[key] = deltas.get(key, 0) + delta
        for name, param in self.model.named_parameters():
            target = hf_name(name)
            if target is None:
                continue
            yield target, (param.detach() + deltas[target]) if target in deltas else param.detach()


def build_policy(config: Config, device: str | None = None) -> Policy:
    from ctu.models import load_model, load_tokenizer

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(config.model.dtype)
    model = load_model(config.model.path, dtype=dtype, device=device)
    tokenizer = load_tokenizer(config.model.path)
    if config.trainer.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if config.lora.enabled:
        from peft import LoraConfig, get_peft_model

        present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        targets = [t for t in config.lora.target_modules if t in present]
        if not targets:
            raise ValueError(f"lora.target_modules {config.lora.target_modules} match no module of {config.model.path}")
        model = get_peft_model(model, LoraConfig(r=config.lora.rank, lora_alpha=config.lora.alpha,
                                                 lora_dropout=config.lora.dropout, target_modules=targets,
                                                 task_type="CAUSAL_LM"))
        if config.trainer.gradient_checkpointing:
            model.enable_input_require_grads()
        dtype_now = next(p.dtype for p in model.parameters() if not p.requires_grad)
        for p in model.parameters():  # adapters start in fp32 under peft: one dtype for everything
            if p.dtype != dtype_now:
                p.data = p.data.to(dtype_now)
        policy = Policy(model, tokenizer, lora=True)
    else:
        reference = copy.deepcopy(model).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
        policy = Policy(model, tokenizer, lora=False, reference=reference)
    assert_uniform_dtype(policy.model)
    return policy


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False, needed: torch.Tensor | None = None):
    """Logprobs of each next token (positions 1..T-1) under ``logits / temperature``; optional entropy.

    ``needed`` [B, T-1] (e.g. the loss mask) limits the work to the positions some row scores; positions no
    row scores come back as 0. The batch's shared prefix is computed once (:mod:`ctu.shared_prefix`).
    """
    batch, width = input_ids.shape
    logits, positions = needed_logits(model, input_ids, attention_mask, needed)
    out = torch.zeros((batch, width - 1), device=input_ids.device)
    entropy_out = torch.zeros((batch, width - 1), device=input_ids.device) if with_entropy else None
    if positions.numel() == 0:
        return out, entropy_out
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logp.gather(-1, input_ids[:, positions + 1, None]).squeeze(-1)
    out = out.index_copy(1, positions, chosen)
    if not with_entropy:
        return out, None
    with torch.no_grad():
        entropy_out = entropy_out.index_copy(1, positions, -(logp.exp() * logp).sum(-1))
    return out, entropy_out


def export(policy: Policy, out_dir: str | Path, base_path: str) -> dict[str, str]:
    """Write the merged Hugging Face model (and, with LoRA, the PEFT adapter) under ``out_dir``."""
    from transformers import AutoModelForCausalLM

    from ctu.models import resolve_model

    out = Path(out_dir)
    paths = {}
    if policy.lora:
        policy.model.save_pretrained(out / "adapter")
        paths["adapter"] = str(out / "adapter")
    merged = AutoModelForCausalLM.from_pretrained(resolve_model(base_path), dtype=torch.float32)
    state = {name: tensor.to(torch.float32).cpu() for name, tensor in policy.merged_named_tensors()}
    missing, unexpected = merged.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise RuntimeError(f"export name mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")
    merged.tie_weights()
    merged.save_pretrained(out / "merged")
    policy.tokenizer.save_pretrained(out / "merged")
    paths["merged"] = str(out / "merged")
    return paths
