"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for a :class:`ctu.train.policy.Policy`.

Layout: one FSDP unit per decoder layer and a root unit grouping the decoder body (embeddings, final norm)
with ``lm_head`` (``fully_shard([body, lm_head])``): :func:`ctu.train.logprobs.token_logprobs` calls the body
and the head separately (chunked logits), and a tied ``lm_head`` shares the embedding's parameter, so both must
be in one unit that either call unshards. With full fine-tuning the frozen reference is sharded the same way.

Precision: the parameters keep :func:`ctu.train.policy.build_policy`'s layout — trainable ones (all weights in
full fine-tuning, the LoRA adapters) are fp32 masters, frozen ones in the compute dtype — and FSDP2's
``MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=float32)`` casts them to the compute dtype for the
forward and reduce-scatters gradients in fp32 into the fp32 sharded masters (the optimizer state stays fp32).
ctu's own autocast (:func:`ctu.train.logprobs.compute_context`) to the compute dtype is switched off for sharded
models (the compute dtype attribute is set to float32): the cast is FSDP's, once per unit, not per op.
``trainer.autocast`` (bf16 matmuls in the trainer's passes over fp32 weights) is kept, as in one process.

Loss semantics: each rank holds a slice of the episodes of one update; ``policy_update(..., reduce=
make_reduce(group))`` makes the loss denominators and the stats global, and gradients are SUMMED across ranks
(the divide factor is 1), so an update over N ranks equals the single-process update on all episodes.

Weights leave through :func:`gathered_named_tensors` (merged, Hugging Face names, fp32 masters gathered one unit
at a time with ``DTensor.full_tensor()``) or :func:`gathered_lora_tensors` (adapters only).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from ctu.engines.cpu.precision import COMPUTE_DEVICE_ATTR, COMPUTE_DTYPE_ATTR, TRAIN_DTYPE_ATTR
from ctu.engines.hf.hf_api import checkpointing_enabled, enable_checkpointing
from ctu.train.policy import Policy, _reshard, reshard
from ctu.train.weights import hf_name, lora_modules

__all__ = ["gathered_lora_tensors", "gathered_named_tensors", "is_sharded", "make_reduce", "reshard", "shard_policy"]

SHARDED_ATTR = "ctu_fsdp_mesh"
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def make_reduce(group: dist.ProcessGroup | None = None, device: torch.device | str = "cpu") -> Callable:
    """``reduce(values, op)`` for :func:`ctu.train.update.policy_update`: an all-reduce (op "sum" | "max" |
    "min") of a list of floats over ``group`` (float64; ``device`` must suit the backend: cuda for NCCL)."""
    def reduce(values: list[float], op: str) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=_OPS[op], group=group)
        return t.tolist()
    return reduce


def _mesh(mesh_or_group, device_type: str) -> DeviceMesh:
    if isinstance(mesh_or_group, DeviceMesh):
        return mesh_or_group
    if mesh_or_group is None:
        return init_device_mesh(device_type, (dist.get_world_size(),))
    return DeviceMesh.from_group(mesh_or_group, device_type)


def _body_head_layers(model: Any) -> tuple[nn.Module, nn.Module, list[nn.Module]]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    body, head = base.get_decoder(), base.get_output_embeddings()
    layers = getattr(body, "layers", None)
    if body is None or head is None or layers is None:
        raise TypeError(f"shard_policy: {type(base).__name__} is not a decoder-only causal LM with .layers")
    return body, head, list(layers)


def _shard(model: Any, mesh: DeviceMesh, mp: MixedPrecisionPolicy, offload: OffloadPolicy) -> None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    body, head, layers = _body_head_layers(model)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=offload)
    fully_shard(base, mesh=mesh, mp_policy=mp, offload_policy=offload)  # root: embeddings, final norm, lm_head
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # SUM across ranks: the loss weights are global already
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
    # FSDP casts to the compute dtype; no ctu autocast on top, except ``trainer.autocast``'s for the trainer's own
    # passes over fp32 masters, which the in-process trainer runs too (the same numbers on N ranks as in one process)
    train_dtype = getattr(model, TRAIN_DTYPE_ATTR, None)
    for target in {model, base}:
        setattr(target, COMPUTE_DTYPE_ATTR, torch.float32)
        setattr(target, TRAIN_DTYPE_ATTR, train_dtype)
        setattr(target, COMPUTE_DEVICE_ATTR, mesh.device_type)  # autocast there, wherever offloaded shards live
    setattr(model, SHARDED_ATTR, mesh)
    # token_logprobs calls the body and lm_head directly, never the root's forward: the root unit is unsharded
    # by these hooks (a no-op while unsharded, so chunked head calls add no collective) and resharded, its
    # gradients reduce-scattered, by FSDP's end-of-backward callback, once per backward on every rank. A pass
    # without backward (scoring, the frozen reference, the parity probe) must call :func:`reshard` after it.
    def unshard_root(*_):
        base.unshard()
    body.register_forward_pre_hook(unshard_root)
    head.register_forward_pre_hook(unshard_root)
    with torch.no_grad():  # one forward through the root fixes the root for FSDP's lazy init
        was_training = model.training
        model.eval()
        model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=mesh.device_type), use_cache=False)
        model.train(was_training)
    _reshard(model)  # the registered parameters are the sharded masters again (the optimizer must get these)


def shard_policy(policy: Policy, mesh_or_group=None, compute_dtype: torch.dtype | None = None,
                 cpu_offload: bool = False) -> Policy:
    """Shard ``policy`` in place with FSDP2 over ``mesh_or_group`` (a 1-D DeviceMesh, a ProcessGroup, or None
    for the default group) and return it; build the optimizer afterwards, over ``trainable_parameters()``.

    ``compute_dtype`` (default ``policy.compute_dtype``) is the forward dtype; gradients reduce in fp32 over
    fp32 masters. ``cpu_offload`` keeps sharded parameters, gradients and optimizer state in CPU memory.
    Gradient checkpointing, if the model has it, is switched to the non-reentrant form FSDP2 needs.
    """
    compute = compute_dtype or policy.compute_dtype
    if any(p.requires_grad and p.dtype != torch.float32 for p in policy.model.parameters()):
        raise TypeError("shard_policy: trainable parameters must be fp32 masters (build_policy's layout)")
    device = policy.device  # where the model was built: the compute device, also once shards are offloaded
    device_type = device.type
    mesh = _mesh(mesh_or_group, device_type)
    mp = MixedPrecisionPolicy(param_dtype=None if compute == torch.float32 else compute,
                              reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    base = policy.model.get_base_model() if policy.lora else policy.model
    if checkpointing_enabled(base):
        enable_checkpointing(base, use_reentrant=False)
    _shard(policy.model, mesh, mp, offload)
    if policy.reference is not None:
        _shard(policy.reference, mesh, mp, offload)
    policy.compute_dtype = compute
    policy.compute_device = device  # cpu_offload: parameters on the CPU, inputs still go to the mesh's device
    return policy


def is_sharded(policy_or_model) -> bool:
    model = getattr(policy_or_model, "model", policy_or_model)
    return getattr(model, SHARDED_ATTR, None) is not None


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a sharded parameter; an offloaded (CPU) shard of a mesh on another device is moved
    there first (NCCL gathers device tensors only)."""
    if not isinstance(t, DTensor):
        return t
    mesh_type = t.device_mesh.device_type
    if t.device.type != mesh_type:
        t = DTensor.from_local(t.to_local().to(mesh_type), t.device_mesh, t.placements, shape=t.shape,
                               stride=t.stride())
    return t.full_tensor()


@contextlib.contextmanager
def _unsharded(model: nn.Module, names: list[str]) -> Iterator[None]:
    """The parameters ``names`` (and any module sharing them) registered as gathered full tensors for the
    duration; the sharded parameters are put back afterwards."""
    wanted = dict(model.named_parameters(remove_duplicate=False))
    targets = {id(wanted[n]) for n in names}
    full: dict[int, nn.Parameter] = {}
    swapped = []
    for module in model.modules():
        for pname, p in list(module._parameters.items()):
            if p is not None and id(p) in targets:
                if id(p) not in full:
                    full[id(p)] = nn.Parameter(_full(p.detach()), requires_grad=p.requires_grad)
                module._parameters[pname] = full[id(p)]
                swapped.append((module, pname, p))
    try:
        yield
    finally:
        for module, pname, p in swapped:
            module._parameters[pname] = p


def _units(model: nn.Module) -> list[tuple[str, list[str]]]:
    """(decoder-layer prefix or "", parameter names) per FSDP unit, in order (the root unit last)."""
    body, _, layers = _body_head_layers(model)
    prefixes = {id(m): n for n, m in model.named_modules()}
    names = [n for n, _ in model.named_parameters()]
    out, seen = [], set()
    for layer in layers:
        prefix = prefixes[id(layer)] + "."
        group = [n for n in names if n.startswith(prefix)]
        out.append((prefix, group))
        seen.update(group)
    out.append(("", [n for n in names if n not in seen]))
    return out


def _unit_of(name: str, layer_prefixes: list[str]) -> str:
    return next((p for p in layer_prefixes if name.startswith(p)), "")


@torch.no_grad()
def gathered_named_tensors(policy: Policy, dtype: torch.dtype | None = None,
                           to_rank: int | None = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """As :meth:`Policy.merged_named_tensors` (Hugging Face names, LoRA merged in fp32, cast once to ``dtype``)
    for a sharded policy. A collective: every rank must iterate it to the end. One unit (decoder layer) at a
    time is gathered; only rank ``to_rank`` yields (``None``: every rank does). Unsharded policies fall back
    to :meth:`Policy.merged_named_tensors`."""
    if not is_sharded(policy):
        yield from policy.merged_named_tensors(dtype)
        return
    model = policy.model
    mine = to_rank is None or dist.get_rank() == to_rank
    _reshard(model)
    units = _units(model)
    layer_prefixes = [p for p, _ in units if p]
    for prefix, names in units:
        with _unsharded(model, names):  # the gather is a collective: every rank takes part
            if not mine:
                continue  # and drops the full tensors at once
            params = dict(model.named_parameters())
            deltas: dict[str, torch.Tensor] = {}
            if policy.lora:
                for name, module in lora_modules(model):
                    if _unit_of(name + ".", layer_prefixes) == prefix:
                        for adapter in module.active_adapters:
                            if adapter in module.lora_A:
                                delta = module.get_delta_weight(adapter).detach().to(torch.float32)
                                key = f"{name}.base_layer.weight"
                                deltas[key] = deltas[key] + delta if key in deltas else delta
            out = []
            for name in names:
                target = hf_name(name) if policy.lora else name
                if target is None:
                    continue
                tensor = params[name].detach()
                if name in deltas:
                    tensor = tensor.to(torch.float32) + deltas[name]
                tensor = tensor if dtype is None else tensor.to(dtype)  # a cast or a merge is already a copy
                out.append((target, tensor.clone() if tensor.data_ptr() == params[name].data_ptr() else tensor))
        out.reverse()
        while out:  # handed on one at a time: the list keeps none the consumer has already taken
            yield out.pop()


@torch.no_grad()
def gathered_lora_tensors(policy: Policy, to_rank: int | None = 0) -> dict[str, torch.Tensor]:
    """The LoRA adapter weights (PEFT names, fp32, full tensors) for engines that take adapters; a
    collective, returned on rank ``to_rank`` (``None``: every rank), empty elsewhere."""
    if not policy.lora:
        raise ValueError("gathered_lora_tensors: the policy has no LoRA adapters")
    _reshard(policy.model)
    keep = not is_sharded(policy) or to_rank is None or dist.get_rank() == to_rank
    out = {}
    for name, p in policy.model.named_parameters():
        if p.requires_grad:
            full = _full(p.detach())  # a collective on every rank; kept only where it is returned
            if keep:
                out[name] = full.clone()
    return out
