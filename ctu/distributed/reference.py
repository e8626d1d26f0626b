"""The KL reference and frozen weights of an FSDP2-sharded policy: rebase after the warm start, checkpoint, sync.

What :meth:`ctu.train.policy.Policy.rebase_reference` / ``reference_state`` / ``load_reference_state`` do for a
policy in one process, done shard by shard: each rank computes on gathered full tensors (``full_tensor()``, a
collective every rank makes in the same order) and writes back only its own shard (``distribute_tensor`` with
``src_data_rank=None``: every rank cuts its chunk locally, as FSDP2 cut it). Full tensors stay on rank 0 only: the
other ranks take part in each gather and drop its result at once (no host copies). Offloaded (CPU) shards of a
CUDA mesh are gathered on the mesh's device (:func:`ctu.distributed.fsdp._full`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from ctu.train.weights import hf_name, lora_modules


def _resharded(policy) -> None:
    """Registered parameters are the sharded masters again (the root unit may still be unsharded after a
    no-grad forward), so that reads see the shards and writes reach them."""
    from ctu.distributed.fsdp import _reshard

    _reshard(policy.model)
    if policy.reference is not None:
        _reshard(policy.reference)


def _full(t: torch.Tensor) -> torch.Tensor:
    from ctu.distributed.fsdp import _full as gather

    return gather(t)


def _rank0() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


@torch.no_grad()
def _write(param: torch.Tensor, full: torch.Tensor) -> None:
    """Set ``param`` (sharded or not) to the full tensor ``full`` (the same on every rank)."""
    if isinstance(param, DTensor):
        mine = distribute_tensor(full.to(param.dtype), param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(mine.to_local())
    else:
        param.copy_(full.to(device=param.device, dtype=param.dtype))


@torch.no_grad()
def rebase_sharded_reference(policy) -> dict[str, torch.Tensor]:
    """Make the current policy the KL reference. LoRA: merge each adapter delta into its frozen base weight
    (fp32 sum, one cast) and reset ``lora_B`` to 0; returns the rewritten base weights (PEFT names, full, on rank
    0; empty elsewhere). Full fine-tuning: copy every weight into the reference (same sharding); returns {}."""
    _resharded(policy)
    if not policy.lora:
        ref = dict(policy.reference.named_parameters())
        for name, p in policy.model.named_parameters():
            target = ref[name]
            local = p.to_local() if isinstance(p, DTensor) else p
            (target.to_local() if isinstance(target, DTensor) else target).copy_(local.detach().to(target.dtype))
        return {}
    changed: dict[str, torch.Tensor] = {}
    for name, module in lora_modules(policy.model):
        base = module.base_layer.weight
        merged = _full(base.detach()).to(torch.float32)
        for adapter in module.active_adapters:
            if adapter not in module.lora_A:
                continue
            a = _full(module.lora_A[adapter].weight.detach()).to(torch.float32)
            b = _full(module.lora_B[adapter].weight.detach()).to(torch.float32)
            delta = b @ a
            if getattr(module, "fan_in_fan_out", False):
                delta = delta.T
            merged = merged + delta * module.scaling[adapter]
            weight = module.lora_B[adapter].weight
            (weight.to_local() if isinstance(weight, DTensor) else weight).zero_()
        new = merged.to(base.dtype)
        _write(base, new)
        if _rank0():
            changed[f"{name}.base_layer.weight"] = new.cpu()
    return changed


@torch.no_grad()
def gathered_reference_state(policy, rebased: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """What a checkpoint stores of the reference (as ``Policy.reference_state``), on rank 0 (None elsewhere):
    LoRA: the rebased base weights; full fine-tuning: every reference weight, gathered (a collective)."""
    _resharded(policy)
    if policy.lora:
        return dict(rebased) if _rank0() else None
    return _host_copies((n, p) for n, p in policy.reference.named_parameters())


@torch.no_grad()
def load_sharded_reference(policy, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Restore :func:`gathered_reference_state` into a freshly sharded policy (every rank passes the whole
    state); returns what rank 0 keeps as its rebased weights (LoRA)."""
    _resharded(policy)
    target = policy.model if policy.lora else policy.reference
    params = dict(target.named_parameters())
    unknown = [n for n in state if n not in params]
    if unknown:
        raise KeyError(f"reference state names the model does not have: {unknown[:5]}")
    for name, tensor in state.items():
        _write(params[name], tensor.to(params[name].device))
    return {n: t.cpu() for n, t in state.items()} if policy.lora and _rank0() else {}


@torch.no_grad()
def gathered_base_tensors(policy) -> dict[str, torch.Tensor] | None:
    """The frozen base weights with Hugging Face names, full (a collective), on rank 0 (None elsewhere)."""
    _resharded(policy)
    return _host_copies((hf_name(n), p) for n, p in policy.model.named_parameters()
                        if hf_name(n) is not None and not p.requires_grad)


def _host_copies(named) -> dict[str, torch.Tensor] | None:
    """Every ``(name, parameter)`` gathered (a collective, one at a time), kept as a host copy on rank 0 only (None
    elsewhere: the other ranks drop each full tensor as soon as the gather returns)."""
    keep = _rank0()
    out: dict[str, torch.Tensor] = {}
    for name, p in named:
        full = _full(p.detach())
        if keep:
            out[name] = full.cpu()
        del full
    return out if keep else None
