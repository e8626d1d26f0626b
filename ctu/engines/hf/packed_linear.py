"""The bf16 decode copy's products with their weights laid out once for oneDNN, not at every call.

``F.linear`` over a bf16 weight hands oneDNN a plain [out, in] matrix, which it reorders into its blocked layout
on every call: at a decode batch of 16 that reorder costs about as much as the product (one Sapphire Rapids core,
torch 2.13: 576 -> 3072 in 312 us, 192 us over a weight reordered once; the 49,152-row LM head in 8.5 ms against
3.2). :func:`pack` reorders each ``Linear`` weight of the copy once (``torch.ops.mkldnn._reorder_linear_weight``)
and frees the plain one; the module then computes with ``torch.ops.mkldnn._linear_pointwise``, the same oneDNN
product over the same numbers: its outputs are bit for bit ``F.linear``'s (``tests/unit/engines/hf/
test_packed_linear.py``), so a decode samples the same tokens. A weight another module also reads (the LM head
tied to the embedding) keeps its plain tensor beside the packed one.

The packed tensors are oneDNN's own (opaque: no storage to write into), so an update goes through the plain
weights: :func:`unpack` gives their storage back (the values are stale), ``decode_copy.refresh`` writes the new
weights, and :func:`pack` lays them out again. The copy packs where the CPU computes bf16 natively (AVX512-BF16,
AMX; oneDNN refuses bf16 packing without AVX-512) and keeps ``F.linear`` elsewhere; :func:`pack` itself works in
fp32 on any CPU.
"""

from __future__ import annotations

import torch

from ctu.engines.cpu.precision import cpu_bf16_support
from ctu.engines.hf.fused_linear import FusedMember, product


def available(dtype: torch.dtype) -> bool:
    """Whether this torch build can pack ``dtype`` weights for this CPU's native products (bf16 only)."""
    return (dtype == torch.bfloat16 and torch.backends.mkldnn.is_available() and cpu_bf16_support()[0]
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(torch.nn.Linear):
    """A ``Linear`` that computes with :attr:`packed` (its weight laid out for oneDNN) once :func:`pack` set it."""

    packed: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return product(x, self.weight, self.bias, self.packed)


def _owners(model: torch.nn.Module) -> list[tuple[object, torch.Tensor, torch.Tensor | None]]:
    """(what keeps the packed weight, its plain weight, bias) for each product of ``model``: a fused group's shared
    state once, each plain ``Linear`` (made a :class:`PackedLinear`)."""
    owners: list[tuple[object, torch.Tensor, torch.Tensor | None]] = []
    seen: set[int] = set()
    for module in model.modules():
        if isinstance(module, FusedMember):
            if id(module.shared) not in seen:
                seen.add(id(module.shared))
                owners.append((module.shared, module.shared.weight, module.shared.bias))
        elif isinstance(module, torch.nn.Linear) and type(module) in (torch.nn.Linear, PackedLinear):
            module.__class__ = PackedLinear
            # a forward of its own shadows the class's: the trainer's cast_once binds one to the policy's frozen
            # Linears, and a copy of the policy made after a training step carries it (it would read the freed weight)
            vars(module).pop("forward", None)
            owners.append((module, module.weight, module.bias))
    return owners


@torch.no_grad()
def pack(model: torch.nn.Module) -> list[tuple[torch.UntypedStorage, int]]:
    """Pack every product's weight of ``model`` (the decode copy), freeing each plain weight no other module reads;
    returns the freed storages and their sizes, for :func:`unpack`."""
    owners = _owners(model)
    kept = {p.untyped_storage().data_ptr() for m in model.modules() if not isinstance(m, (FusedMember, PackedLinear))
            for p in m.parameters(recurse=False)}  # read by another module too: the tied embedding
    freed: dict[int, tuple[torch.UntypedStorage, int]] = {}
    for owner, weight, _ in owners:
        owner.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)  # type: ignore[attr-defined]
        storage = weight.untyped_storage()
        if storage.data_ptr() not in kept and storage.resizable():  # (a file's memory map is not: kept)
            freed.setdefault(storage._cdata, (storage, storage.nbytes()))
    for storage, _ in freed.values():
        storage.resize_(0)
    return list(freed.values())


def unpack(model: torch.nn.Module, freed: list[tuple[torch.UntypedStorage, int]]) -> None:
    """Drop ``model``'s packed weights and give the plain ones their storage back (their values are stale until
    written again)."""
    drop_packed(model)
    for storage, size in freed:
        storage.resize_(size)


def drop_packed(model: torch.nn.Module) -> None:
    """Free ``model``'s packed weights (its products need :func:`pack` again, or their plain weights back)."""
    for module in model.modules():
        if isinstance(module, FusedMember):
            module.shared.packed = None
        elif isinstance(module, PackedLinear):
            module.packed = None
