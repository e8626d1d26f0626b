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

import torch
import torch.nn.functional as F

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _Shared:
    """A group's fused weight (and bias), the input its last full product was of, and that product."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, bounds: list[tuple[int, int]]):
        self.weight, self.bias, self.bounds = weight, bias, bounds
        self.input: torch.Tensor | None = None
        self.output: torch.Tensor | None = None


class FusedMember(torch.nn.Linear):
    """One projection of a fused group: a ``Linear`` whose weight is a view of the group's fused weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared: _Shared = self._shared  # type: ignore[assignment]
        index: int = self._index  # type: ignore[assignment]
        if index == 0:
            shared.input, shared.output = x, F.linear(x, shared.weight, shared.bias)
        elif shared.input is not x or shared.output is None:
            return F.linear(x, self.weight, self.bias)
        start, end = shared.bounds[index]
        out = shared.output[..., start:end]
        if index == len(shared.bounds) - 1:  # the group's last member: the product is not kept past it
            shared.input, shared.output = None, None
        return out


def _fusable(members: list[object]) -> bool:
    if not all(type(m) is torch.nn.Linear for m in members):
        return False
    first = members[0]
    assert isinstance(first, torch.nn.Linear)
    return all(m.in_features == first.in_features and m.weight.dtype == first.weight.dtype  # type: ignore[attr-defined]
               and m.weight.device == first.weight.device and (m.bias is None) == (first.bias is None)  # type: ignore[attr-defined]
               for m in members)


@torch.no_grad()
def fuse_projections(model: torch.nn.Module) -> int:
    """Fuse every group of :data:`GROUPS` found as plain ``Linear`` children of one module; returns how many."""
    fused = 0
    for parent in list(model.modules()):
        for names in GROUPS:
            members = [getattr(parent, n, None) for n in names]
            if not _fusable(members):
                continue
            linears: list[torch.nn.Linear] = members  # type: ignore[assignment]
            weight = torch.cat([m.weight for m in linears])
            bias = torch.cat([m.bias for m in linears]) if linears[0].bias is not None else None
            bounds, start = [], 0
            for m in linears:
                bounds.append((start, start + m.out_features))
                start += m.out_features
            shared = _Shared(weight, bias, bounds)
            for index, (name, m) in enumerate(zip(names, linears, strict=True)):
                lo, hi = bounds[index]
                member = FusedMember.__new__(FusedMember)
                torch.nn.Module.__init__(member)
                member.in_features, member.out_features = m.in_features, m.out_features
                member.weight = torch.nn.Parameter(weight[lo:hi], requires_grad=False)
                if bias is None:
                    member.register_parameter("bias", None)
                else:
                    member.bias = torch.nn.Parameter(bias[lo:hi], requires_grad=False)
                object.__setattr__(member, "_shared", shared)  # not a submodule: the group's members share it
                object.__setattr__(member, "_index", index)
                setattr(parent, name, member)
            fused += 1
    return fused
