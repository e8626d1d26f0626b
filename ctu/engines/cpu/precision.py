"""The compute-dtype policy every forward of the policy's weights shares (trainer and in-process hf engine).

``build_policy`` marks the model with its compute dtype (:data:`COMPUTE_DTYPE_ATTR`); :func:`compute_context`
autocasts to it when it is below fp32. The autocast weight cache is off: one region over a whole forward (or a
whole generation) would otherwise keep a compute-dtype copy of every fp32 weight it touched until the region
ends (full fine-tuning at 7B: ~14 GiB). Each cast now lives as long as its use (frozen weights already in the
compute dtype are never cast).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

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


# oneDNN ISAs (``ONEDNN_MAX_CPU_ISA``) with native bf16 dot products: AVX512-BF16 and AMX and what contains them
_NATIVE_BF16_ISA_WORDS = ("BF16", "AMX", "FP16", "AVX10", "ALL", "DEFAULT")


def cpu_bf16_support(env: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Whether this CPU computes bf16 matmuls natively, and why, as torch's CPU build will run them.

    Native means AVX512-BF16 or AMX instructions (Zen 4, Sapphire Rapids and newer) that oneDNN may use; without
    them (Zen 3, most laptops: AVX2) torch emulates bf16 and its matmuls run ~60-500x slower than fp32
    (``benchmarks/cpu_precision.py``). ``ONEDNN_MAX_CPU_ISA`` below a bf16 ISA counts as no native bf16, as oneDNN
    then runs without it; ``CTU_NATIVE_BF16=0/1`` overrides the detection (the default test run pins it to 0 so
    every CPU runs the same numbers)."""
    import os

    env = os.environ if env is None else env
    forced = env.get("CTU_NATIVE_BF16", "").strip()
    if forced in ("0", "1"):
        return forced == "1", f"CTU_NATIVE_BF16={forced}"
    isa = env.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if isa and not any(word in isa for word in _NATIVE_BF16_ISA_WORDS):
        return False, f"ONEDNN_MAX_CPU_ISA={isa} caps oneDNN below AVX512-BF16/AMX"
    has = [name for name, probe in (("AMX", torch.cpu._is_amx_tile_supported),
                                    ("AVX512-BF16", torch.cpu._is_avx512_bf16_supported)) if probe()]
    if not has or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        capability = torch.backends.cpu.get_cpu_capability()
        return False, f"this CPU has no native bf16 ({capability}, no AVX512-BF16 or AMX)"
    return True, f"this CPU computes bf16 natively ({' and '.join(has)})"


def resolve_autocast(setting: str, device: str) -> tuple[torch.dtype | None, str]:
    """``trainer.autocast`` on ``device``: the dtype the trainer's passes autocast to (None: they compute as the
    engine, in ``model.dtype``), and the reason, for the one line a run prints at start.

    ``auto``: bf16 where the device computes it natively (CUDA; a CPU with AVX512-BF16 or AMX), fp32 elsewhere.
    ``bfloat16``: bf16 everywhere (on a CPU without native bf16 the reason says how slow that is)."""
    if setting == "off":
        return None, "trainer.autocast=off: the trainer computes in model.dtype"
    if device.startswith("cuda"):
        return torch.bfloat16, f"trainer.autocast={setting}: bf16 on CUDA"
    native, why = cpu_bf16_support()
    if setting == "bfloat16":
        note = "" if native else " — emulated here: matmuls ~60x slower than fp32 (use trainer.autocast=auto)"
        return torch.bfloat16, f"trainer.autocast=bfloat16: bf16 over fp32 weights; {why}{note}"
    if native:
        return torch.bfloat16, f"trainer.autocast=auto: bf16 over fp32 weights; {why}"
    return None, f"trainer.autocast=auto: fp32; {why}"
