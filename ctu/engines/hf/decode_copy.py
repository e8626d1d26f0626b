"""``engine.decode_dtype``: the hf engine decodes with a bf16 copy of fp32 weights where the CPU computes bf16
natively.

A CPU with AVX512-BF16 or AMX runs bf16 matmuls ~4x faster than fp32 (``benchmarks/cpu_precision.py``), and a
decode step reads every weight once: bf16 weights halve that too. Autocast over the fp32 weights would cast every
weight at every step (more memory traffic than fp32 itself), so the engine keeps a copy: the policy with its LoRA
adapters merged (fp32 sum, one cast), in bf16, merged again in place when the policy's weights change (after each
update). The copy costs the model's size in bf16 (~270 MB for SmolLM2-135M; a transient fp32 copy when first made).
Its sibling projections run as one product each (``fused_linear``), every product over weights laid out once for
oneDNN (``packed_linear``: the same outputs bit for bit), its one-token steps attend by the kernel the CPU runs
fastest (``decode_attention``: grouped products, or flash with AMX), and a Llama copy's steps run without
transformers' module calls (``llama_step``: the same logits bit for bit).

Other tokens than fp32 decoding samples: the same tokens come only in the same precision. ``float32`` (the default)
decodes as the trainer's weights are stored; ``auto`` picks bf16 where the CPU computes it natively (never on an
AVX2 CPU or under ``ONEDNN_MAX_CPU_ISA=AVX2``, nor on CUDA, where the weights are in their compute dtype already).
"""

from __future__ import annotations

import copy

import torch

from ctu.engines.cpu.precision import cpu_bf16_support
from ctu.engines.hf.decode_attention import use_grouped_decode
from ctu.engines.hf.fused_linear import fuse_projections
from ctu.engines.hf.packed_linear import available as packing_available
from ctu.engines.hf.packed_linear import drop_packed, pack, unpack

SETTINGS = ("float32", "bfloat16", "auto")


def resolve_decode_dtype(setting: str, device: str) -> tuple[torch.dtype | None, str]:
    """The dtype the hf engine's decode copy is in (None: no copy, the policy's model decodes), and why."""
    if setting not in SETTINGS:
        raise ValueError(f"engine.decode_dtype must be one of {', '.join(SETTINGS)}, got {setting!r}")
    if setting == "float32" or not device.startswith("cpu"):
        return None, f"engine.decode_dtype={setting}: rollouts decode with the policy's weights"
    native, why = cpu_bf16_support()
    if setting == "auto" and not native:
        return None, f"engine.decode_dtype=auto: rollouts decode in the policy's dtype; {why}"
    note = "" if native else " (emulated here: slower than fp32)"
    return torch.bfloat16, f"engine.decode_dtype={setting}: rollouts decode with bf16 weights; {why}{note}"


class DecodeCopy:
    """A ``dtype`` copy of a model (LoRA merged), made again whenever :meth:`get` sees another weights version."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.model: torch.nn.Module | None = None
        self.version: object = None
        self.builds = 0  # copies made (once, unless dropped)
        self.refreshes = 0  # weights merged into it again
        self.released: list[tuple[torch.UntypedStorage, int]] = []  # (storage, bytes) while :meth:`release`d
        self.packs = packing_available(dtype)  # products by weights laid out once for oneDNN (``packed_linear``)
        self.unpacked: list[tuple[torch.UntypedStorage, int]] = []  # plain weights freed once packed

    def get(self, source: torch.nn.Module, version: object) -> torch.nn.Module:
        """The copy of ``source`` at ``version``; ``source`` itself when its weights are in ``dtype`` already."""
        if next(source.parameters()).dtype == self.dtype:
            return source
        if self.model is None:
            with torch.no_grad():
                made = copy.deepcopy(source)
                if hasattr(made, "merge_and_unload"):  # peft: adapters merged into the fp32 base, then one cast
                    made = made.merge_and_unload()  # type: ignore[operator]
                prepare(made, self.dtype)
                self.unpacked = pack(made) if self.packs else []
            self.model, self.version = made, version
            self.builds += 1
        elif self.version != version or self.released:  # changed weights (or none): merged again, a tensor at a time
            unpack(self.model, self.unpacked)  # the plain weights' storage back, to be written
            for storage, size in self.released:
                storage.resize_(size)
            self.released, self.unpacked = [], []
            written = refresh(self.model, source)
            if not {n for n, _ in self.model.named_parameters()} <= written:  # a tensor refresh cannot fill: made anew
                self.drop()
                return self.get(source, version)
            self.unpacked = pack(self.model) if self.packs else []  # (pack runs without grad itself)
            self.version = version
            self.refreshes += 1
        return self.model

    def release(self) -> None:
        """Free the copy's weights while the trainer updates (their storage, ~270 MB for SmolLM2-135M), keeping its
        modules: the next :meth:`get` allocates them again and merges the weights in, as after any update."""
        if self.model is None or self.released:
            return
        drop_packed(self.model)  # its packed weights freed too; the plain ones they replaced are freed already
        unpacked = {storage._cdata for storage, _ in self.unpacked}
        seen: dict[int, tuple[torch.UntypedStorage, int]] = {}
        for param in self.model.parameters():
            storage = param.untyped_storage()
            if storage._cdata not in unpacked:
                seen.setdefault(storage._cdata, (storage, storage.nbytes()))
        for storage, _ in seen.values():
            storage.resize_(0)
        self.released = list(seen.values())
        self.version = None

    def drop(self) -> None:
        self.model, self.version, self.released, self.unpacked = None, None, [], []


def prepare(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Make ``model`` (the engine's own copy) the decode copy: parameters in ``dtype``, sibling projections fused,
    one-token steps attending by :func:`decode_attention.one_token_kernel`'s kernel in bf16 (packing is
    :class:`DecodeCopy`'s, as it frees weights)."""
    cast_parameters(model, dtype)
    fuse_projections(model)
    if dtype == torch.bfloat16:  # CPU flash attention is slow for one bf16 query token without AMX
        use_grouped_decode(model)


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Parameters to ``dtype``, buffers as they are (rotary frequencies stay fp32, as a bf16 checkpoint loads them)."""
    for param in model.parameters():
        param.data = param.data.to(dtype)
    model.eval().requires_grad_(False)


def _plain_name(name: str) -> str | None:
    """A peft parameter's name in the merged model (None: an adapter's own tensor)."""
    if ".lora_" in name or name.startswith("lora_"):
        return None
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


@torch.no_grad()
def refresh(target: torch.nn.Module, source: torch.nn.Module) -> set[str]:
    """Copy ``source``'s weights into ``target`` (its merged copy), each LoRA delta added in fp32 before one cast;
    the names of ``target``'s parameters written."""
    modules = dict(source.named_modules())
    params = dict(target.named_parameters())
    written: set[str] = set()
    for name, param in source.named_parameters():
        plain = _plain_name(name)
        if plain is None or plain not in params:
            continue
        value = param.detach()
        owner = modules.get(name.removesuffix(".base_layer.weight")) if name.endswith(".base_layer.weight") else None
        if owner is not None and hasattr(owner, "get_delta_weight") and not getattr(owner, "merged", False):
            active = [a for a in owner.active_adapters if a in getattr(owner, "lora_A", {})]
            if active:
                value = value.to(torch.float32, copy=True)
                for adapter in active:
                    value += owner.get_delta_weight(adapter).to(torch.float32)
        params[plain].copy_(value)
        written.add(plain)
    return written
