"""The compute-dtype policy every forward of the policy's weights shares (trainer and in-process hf engine).

``build_policy`` marks the model with its compute dtype (:data:`COMPUTE_DTYPE_ATTR`); :func:`compute_context`
autocasts to it when it is below fp32. The autocast weight cache is off: one region over a whole forward (or a
whole generation) would otherwise keep a compute-dtype copy of every fp32 weight it touched until the region
ends (full fine-tuning at 7B: ~14 GiB). Each cast now lives as long as its use (frozen weights already in the
compute dtype are never cast).
"""

from __future__ import annotations

import contextlib

import torch

COMPUTE_DTYPE_ATTR = "ctu_compute_dtype"
# ``trainer.autocast``: the dtype the trainer's own passes (gradient passes and the update's scoring) autocast to
# over fp32 weights, while the engine sharing the model keeps decoding in the compute dtype
TRAIN_DTYPE_ATTR = "ctu_train_dtype"
# where forwards run when it is not where the parameters are stored (FSDP2 CPU offload computes on the mesh's device)
COMPUTE_DEVICE_ATTR = "ctu_compute_device"


def compute_context(model: torch.nn.Module, train: bool = False):
    """Autocast to the model's compute dtype when it has one below fp32 (set by ``build_policy``), no cast cache.
    ``train``: a trainer pass, which uses ``trainer.autocast``'s dtype when one is set."""
    dtype = getattr(model, COMPUTE_DTYPE_ATTR, None)
    if train and getattr(model, TRAIN_DTYPE_ATTR, None) is not None:
        dtype = getattr(model, TRAIN_DTYPE_ATTR)
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    device = getattr(model, COMPUTE_DEVICE_ATTR, None) or next(model.parameters()).device.type
    return torch.autocast(device_type=device, dtype=dtype, cache_enabled=False)
