"""An optimizer step's gradient passes under autocast, each frozen weight cast once and equal activations saved once.

Autocast casts a ``Linear``'s fp32 weight to bf16 at every call and saves that cast for backward. An optimizer step
runs its shared prefix once (its graph kept until the step's backward) and then its micro-batches, so it held two
casts of every frozen weight (SmolLM2-135M: 2 x 0.27 GB), and each checkpointed logit chunk cast the head again.
Within :func:`cast_once` the frozen ``Linear``s of a model (LoRA's base layers, a tied head) compute with one cast
per weight, made at first use and dropped at the end: the bits autocast makes (round to nearest), held once.

Autocast also casts an input once per consumer (q, k, v and each LoRA A read the same normed hidden states, every
layer the same attention mask), each copy saved. A saved-tensor hook keeps one of equal saved tensors (same dtype,
shape, strides and values, against the last few saved of that shape). Backward reads the same values, so the
gradients are the same bits. Only this thread's passes use either (an engine generating in another thread is left
as it is), and a model sharded by FSDP2 is left as it is (a cache would hold every layer unsharded).
"""

from __future__ import annotations

import contextlib
import threading
import types
import weakref
from collections import defaultdict, deque

import torch
import torch.nn.functional as F

from ctu.engines.cpu.precision import COMPUTE_DTYPE_ATTR, TRAIN_DTYPE_ATTR

_state = threading.local()  # .casts: {id(weight): (version, weight, cast)} while this thread is in cast_once
PATCHED = "_ctu_cast_once"
WINDOW = 4  # earlier saved tensors of the same shape a saved tensor is compared with
SMALLEST = 4096  # elements: smaller saved tensors are kept as they are


def _frozen_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if type(m) is torch.nn.Linear and not m.weight.requires_grad
            and m.weight.dtype == torch.float32 and type(m.weight) in (torch.Tensor, torch.nn.Parameter)]


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``Linear.forward``, with this thread's cached cast of the weight inside :func:`cast_once` under autocast.
    Bound to its module as a method, so a copy of the model (the engine's decode copy) computes with its own."""
    casts = getattr(_state, "casts", None)
    weight = self.weight
    device = weight.device.type
    if casts is None or weight.requires_grad or weight.dtype != torch.float32 or not torch.is_autocast_enabled(device):
        return torch.nn.Linear.forward(self, x)
    dtype = torch.get_autocast_dtype(device)
    held = casts.get(id(weight))
    if held is None or held[0] != weight._version or held[1] is not weight:
        held = (weight._version, weight, weight.detach().to(dtype))
        casts[id(weight)] = held
    bias = None if self.bias is None else self.bias.to(dtype)
    return F.linear(x.to(dtype) if x.is_floating_point() else x, held[2], bias)


def _sharded(model: torch.nn.Module) -> bool:
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


class _SavedOnce:
    """Saved-tensor hooks that keep one of equal saved tensors (compared by value; weak references only)."""

    def __init__(self):
        self.recent: dict[tuple, deque] = defaultdict(lambda: deque(maxlen=WINDOW))

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        # detached: a saved tensor kept with its own grad_fn would hold the graph that holds it, a reference cycle
        # that nothing frees where backward does not pass (a leak of ~0.18 GiB an update, measured)
        if t.dtype not in (torch.bfloat16, torch.float16) or t.numel() < SMALLEST or t.layout != torch.strided:
            return t.detach()
        window = self.recent[(t.dtype, t.device, tuple(t.shape), t.stride())]
        for ref in window:
            seen = ref()
            if seen is not None and (seen.data_ptr() == t.data_ptr() or torch.equal(seen, t)):
                return seen
        kept = t.detach()
        window.append(weakref.ref(kept))
        return kept

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


@contextlib.contextmanager
def cast_once(model: torch.nn.Module):
    """This thread's passes over ``model`` inside: frozen ``Linear`` weights cast once, equal saved tensors saved
    once (see the module's doc). Nothing changes where autocast is off or the model is sharded."""
    dtypes = {getattr(model, TRAIN_DTYPE_ATTR, None), getattr(model, COMPUTE_DTYPE_ATTR, None)} - {None, torch.float32}
    if not dtypes or getattr(_state, "casts", None) is not None or _sharded(model):  # fp32, nested, FSDP2: as it is
        yield
        return
    for module in _frozen_linears(model):
        if not getattr(module, PATCHED, False):
            module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]
            setattr(module, PATCHED, True)
    saved = _SavedOnce()
    _state.casts = {}
    try:
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            yield
    finally:
        _state.casts = None
