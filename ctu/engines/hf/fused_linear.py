"""Sibling projections of the engine's decode copy as one product: q/k/v, and gate/up.

At a decode batch of 16 a CPU product's cost is mostly per call: on a 2-core Zen 4 in bf16, SmolLM2-135M's gate and
up projections (576 -> 1536 each) take ~205 us apiece and as one 576 -> 3072 product ~230 us; q, k and v
(576 -> 576, 192, 192) ~120 us and as one ~95 us. :func:`fuse_projections` stores each group's weights in one tensor
whose rows the modules' ``weight`` parameters are views of (so a copy into ``q_proj.weight`` writes the fused tensor:
``decode_copy.refresh`` is unchanged). The first module of a group computes the whole product and keeps it; the next
ones, called on the same input tensor, return their columns of it. A member called on another input (another order,
another caller) computes its own product: the result is the same, only slower.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _Shared:
    """A group's fused weight (and bias), the input its last full product was of, and that product."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, bounds: list[tuple[int, int]]):
        self.weight, self.bias, self.bounds = weight, bias, bounds
        self.input: torch.Tensor | None = None
        self.output: torch.Tensor | None = None
        self.packed: torch.Tensor | None = None  # the weight laid out for oneDNN (``packed_linear``), or None


class FusedMember(torch.nn.Linear):
    """One projection of a fused group: a ``Linear`` whose weight (and bias) are views of the group's fused ones."""

    def __init__(self, shared: _Shared, index: int):
        torch.nn.Module.__init__(self)  # not Linear's: the parameters are views, not new tensors
        start, end = shared.bounds[index]
        self.shared, self.index = shared, index  # a plain object and an int: not submodules or parameters
        self.in_features, self.out_features = shared.weight.shape[1], end - start
        self.weight = torch.nn.Parameter(shared.weight[start:end], requires_grad=False)
        bias = None if shared.bias is None else torch.nn.Parameter(shared.bias[start:end], requires_grad=False)
        self.register_parameter("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = self.shared
        start, end = shared.bounds[self.index]
        if self.index == 0:
            shared.input, shared.output = x, _product(x, shared)
        elif shared.input is not x or shared.output is None:  # packed: no plain rows of its own to multiply by
            return F.linear(x, self.weight, self.bias) if shared.packed is None else _product(x, shared)[..., start:end]
        out = shared.output[..., start:end]
        if self.index == len(shared.bounds) - 1:  # the group's last member: the product is not kept past it
            shared.input, shared.output = None, None
        return out


def product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            packed: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, by the weight laid out for oneDNN (``packed_linear``) when there is one."""
    if packed is None:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _product(x: torch.Tensor, shared: _Shared) -> torch.Tensor:
    return product(x, shared.weight, shared.bias, shared.packed)


def _fusable(members: list) -> bool:
    first = members[0]
    return all(type(m) is torch.nn.Linear for m in members) and all(
        m.in_features == first.in_features and m.weight.dtype == first.weight.dtype
        and m.weight.device == first.weight.device and (m.bias is None) == (first.bias is None) for m in members)


@torch.no_grad()
def fuse_projections(model: torch.nn.Module) -> int:
    """Fuse every group of :data:`GROUPS` found as plain ``Linear`` children of one module; returns how many."""
    fused = 0
    for parent in list(model.modules()):
        for names in GROUPS:
            members: list = [getattr(parent, n, None) for n in names]  # plain Linears once _fusable says so
            if not _fusable(members):
                continue
            ends = list(itertools.accumulate(m.out_features for m in members))
            bias = torch.cat([m.bias for m in members]) if members[0].bias is not None else None
            shared = _Shared(torch.cat([m.weight for m in members]), bias, list(zip([0, *ends[:-1]], ends, strict=True)))
            for index, name in enumerate(names):
                setattr(parent, name, FusedMember(shared, index))
            fused += 1
    return fused
