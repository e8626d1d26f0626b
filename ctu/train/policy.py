"""The policy: a Hugging Face causal LM, fully fine-tuned or with LoRA adapters (peft).

Precision policy (asserted by :func:`assert_precision_policy`): trainable parameters (LoRA adapters, or
every weight in full fine-tuning) are fp32 master copies, so their optimizer state is fp32 too; frozen
weights (the LoRA base, the full-fine-tuning reference) are in the compute dtype ``model.dtype`` (bf16 on
CUDA). Forwards run under autocast to the compute dtype (:meth:`Policy.compute`, applied by
:func:`token_logprobs` itself). This is what FSDP2's ``MixedPrecisionPolicy(param_dtype=compute,
reduce_dtype=float32)`` expresses over fp32 sharded parameters.

With LoRA the reference model is the same model with adapters disabled (no second copy); with full
fine-tuning it is a frozen copy. :meth:`Policy.rebase_reference` makes the current policy the reference.
Weights leave the trainer through :mod:`ctu.train.weights` (merged in fp32, cast once).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ctu.config.schema import Config
from ctu.engines.cpu.precision import cpu_bf16_support, resolve_autocast
from ctu.engines.hf.hf_api import enable_checkpointing, quiet_peft_wrap
from ctu.train.logprobs import (
    COMPUTE_DTYPE_ATTR,
    LOGIT_BUDGET_ATTR,
    TRAIN_DTYPE_ATTR,
    compute_context,
    token_logprobs,
)
from ctu.train.weights import absorb_lora, export, hf_name, merged_named_tensors

__all__ = ["Policy", "assert_precision_policy", "build_policy", "export", "hf_name", "token_logprobs"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _reshard(model: torch.nn.Module) -> None:
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def reshard(*models: torch.nn.Module | None) -> None:
    """Free every gathered FSDP unit of ``models`` (None and unsharded models: nothing to do); local, no
    collective. After passes without backward: FSDP2 reshards the root only at the end of a backward (sharding
    itself: :mod:`ctu.distributed.fsdp`)."""
    for model in models:
        if model is not None:
            _reshard(model)


def assert_precision_policy(model: torch.nn.Module, compute_dtype: torch.dtype,
                            reference: torch.nn.Module | None = None) -> torch.dtype:
    """Trainable parameters fp32, frozen parameters (and ``reference``'s) in ``compute_dtype``; returns it."""
    wrong = [f"{n} ({p.dtype}, trainable)" for n, p in model.named_parameters()
             if p.requires_grad and p.dtype != torch.float32]
    wrong += [f"{n} ({p.dtype}, frozen)" for n, p in model.named_parameters()
              if not p.requires_grad and p.dtype != compute_dtype]
    if reference is not None:
        wrong += [f"reference {n} ({p.dtype})" for n, p in reference.named_parameters()
                  if p.dtype != compute_dtype or p.requires_grad]
    if wrong:
        raise TypeError(f"precision policy violated (trainable must be float32, frozen {compute_dtype}): "
                        f"{wrong[:4]}{f' (+{len(wrong) - 4} more)' if len(wrong) > 4 else ''}")
    return compute_dtype


@dataclass
class Policy:
    model: Any  # a transformers model, or a PEFT model around one
    tokenizer: object
    lora: bool
    reference: Any = None  # full fine-tuning only: a frozen copy of the model
    compute_dtype: torch.dtype = torch.float32
    _rebased: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)  # LoRA: the base weights a rebase
    # changed, as the model's own frozen tensors (no copy: LoRA never writes a base weight after the rebase)
    compute_device: torch.device | None = None  # where forwards run, when parameters live elsewhere (offload)
    precision_note: str = ""  # trainer.autocast's resolution and why (printed once at start)

    @property
    def device(self) -> torch.device:
        """Where inputs go: the compute device (FSDP2 with CPU offload keeps the parameters on the CPU and
        computes on the mesh's device), else the parameters' device."""
        return self.compute_device or next(self.model.parameters()).device

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def compute(self):
        """Context for forwards: autocast to the compute dtype over the fp32 master weights (a no-op in fp32).
        :func:`token_logprobs` enters it itself; wrap any other forward of ``model`` or ``reference``."""
        return compute_context(self.model)

    @contextlib.contextmanager
    def as_reference(self) -> Iterator[torch.nn.Module]:
        """The reference model: adapters disabled (LoRA) or the frozen copy."""
        if self.lora:
            with self.model.disable_adapter():
                yield self.model
        else:
            yield self.reference

    def merged_named_tensors(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Every weight with its Hugging Face name, LoRA deltas merged in fp32, cast once to ``dtype``
        (None: fp32 where merged or trainable, for the receiver to cast once to its own dtype)."""
        return merged_named_tensors(self.model, self.lora, dtype)

    def rebase_reference(self) -> None:
        """Make the current policy the KL reference (after the supervised warm start).

        LoRA: every adapter delta is merged into its frozen base weight (fp32 sum, one cast to the compute
        dtype) and the adapter reset to the identity (lora_B = 0): outputs are unchanged up to that cast,
        and ``as_reference()`` now is the current policy. Optimizer state for the adapters is stale
        afterwards; start a fresh optimizer. Full fine-tuning: the weights are copied into the reference.
        """
        if self.lora:
            self._rebased.update(absorb_lora(self.model))
            return
        with torch.no_grad():
            ref = dict(self.reference.named_parameters())
            for name, p in self.model.named_parameters():
                ref[name].copy_(p.detach().to(ref[name].dtype))

    def reference_state(self) -> dict[str, torch.Tensor]:
        """What :meth:`rebase_reference` changed, for a checkpoint: the LoRA base weights it rewrote
        (PEFT names; empty if never rebased), or every reference weight (full fine-tuning). LoRA's are the frozen
        weights themselves on the CPU (a checkpoint writes them and nothing writes them after the rebase: no copy
        of the model's size at every checkpoint), copied to the CPU from an accelerator."""
        if self.lora:
            return {n: t.detach().cpu() for n, t in self._rebased.items()}
        return {n: p.detach().cpu().clone() for n, p in self.reference.named_parameters()}

    def load_reference_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`reference_state` into a freshly built policy (before loading the adapter)."""
        target = self.model if self.lora else self.reference
        params = dict(target.named_parameters())
        unknown = [n for n in state if n not in params]
        if unknown:
            raise KeyError(f"reference state names the model does not have: {unknown[:5]}")
        with torch.no_grad():
            for name, tensor in state.items():
                params[name].copy_(tensor.to(device=params[name].device, dtype=params[name].dtype))
        if self.lora:
            self._rebased.update({n: params[n].detach() for n in state})


def build_policy(config: Config, device: str | None = None) -> Policy:
    from ctu.engines.hf.models import load_model, load_tokenizer

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    compute = DTYPES.get(config.model.dtype) or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    # LoRA: the frozen base in the compute dtype. Full fine-tuning: fp32 master weights (loaded in fp32, so
    # an fp32 checkpoint loses nothing), the frozen reference cast to the compute dtype.
    model = load_model(config.model.path, dtype=compute if config.lora.enabled else torch.float32, device=device)
    setattr(model, COMPUTE_DTYPE_ATTR, compute)
    train_dtype, precision_note = resolve_autocast(config.trainer.autocast, device)
    setattr(model, TRAIN_DTYPE_ATTR, train_dtype)  # None: the trainer computes as the engine
    setattr(model, LOGIT_BUDGET_ATTR, config.trainer.logit_chunk_mib * 2**20 // 4)  # fp32 logits per lm_head chunk
    tokenizer = load_tokenizer(config.model.path)
    if config.trainer.gradient_checkpointing:
        enable_checkpointing(model)
        model.config.use_cache = False
    if config.lora.enabled:
        from peft import LoraConfig, get_peft_model

        present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        targets = [t for t in config.lora.target_modules if t in present]
        if not targets:
            raise ValueError(f"lora.target_modules {config.lora.target_modules} match no module of {config.model.path}")
        with quiet_peft_wrap():
            model = get_peft_model(model, LoraConfig(r=config.lora.rank, lora_alpha=config.lora.alpha,
                                                     lora_dropout=config.lora.dropout, target_modules=targets,
                                                     task_type="CAUSAL_LM"))
        if config.trainer.gradient_checkpointing:
            model.enable_input_require_grads()
        for p in model.parameters():  # fp32 master adapters (peft's default; made explicit)
            if p.requires_grad and p.dtype != torch.float32:
                p.data = p.data.float()
        policy = Policy(model, tokenizer, lora=True, compute_dtype=compute)
    else:
        reference = copy.deepcopy(model).to(compute).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
        policy = Policy(model, tokenizer, lora=False, reference=reference, compute_dtype=compute)
    assert_precision_policy(policy.model, compute, policy.reference)
    policy.precision_note = f"precision: weights {str(compute).removeprefix('torch.')}; {precision_note}"
    if compute != torch.float32 and device == "cpu" and not cpu_bf16_support()[0]:
        policy.precision_note += f" (model.dtype={config.model.dtype} is emulated on this CPU: use model.dtype=auto)"
    return policy
