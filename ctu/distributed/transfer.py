"""Weights through Ray's object store in the compute dtype, with one host copy before the store and none after.

A sync packs a stream of ``(name, tensor)`` (:func:`pack`): each tensor is cast/copied once, straight to a CPU
tensor in the wire dtype (bf16 on CUDA: half of fp32), and kept as a flat uint8 numpy view. Pickle protocol 5
sends numpy buffers out of band, so ``ray.put`` writes them into the object store without another copy, and
``ray.get`` on the same node maps them back read-only without copying (:func:`unpack` makes tensor views of them).
The engine's load into its own parameters is then the only copy on the receiving side.

Before (fp32 tensors returned from trainer rank 0 to the driver, re-put by the pool, pickled as torch storages at
every hop): ~11 full host copies of fp32 weights per sync; see the README's memory section for the measured
numbers (tests/e2e/test_weight_transfer.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from ctu.engines.checks.fingerprint import Accumulator

_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
                               torch.int32, torch.uint8, torch.bool)}


@dataclass(frozen=True)
class Packed:
    """Weights ready for the object store: one flat uint8 array per tensor and its (name, dtype, shape)."""

    index: tuple[tuple[str, str, tuple[int, ...]], ...]
    arrays: tuple  # numpy uint8 arrays (read-only when they come out of the object store)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)


def pack(named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None,
         sums: Accumulator | None = None) -> Packed:
    """One CPU copy per tensor, cast to ``dtype`` in the same step (None: as it comes; integer/bool buffers are
    never cast). The stream is consumed one tensor at a time. ``sums``: fingerprints the packed values, what an
    engine loads (:mod:`ctu.engines.checks.fingerprint`)."""
    index, arrays = [], []
    for name, tensor in named_tensors:
        t = torch.as_tensor(tensor).detach()
        wire = dtype if dtype is not None and t.is_floating_point() else t.dtype
        host = torch.empty(t.shape, dtype=wire, device="cpu", pin_memory=False)
        host.copy_(t)  # the one copy: device -> host and cast together
        if sums is not None:
            sums.add(host)
        index.append((name, str(wire), tuple(t.shape)))
        arrays.append(host.reshape(-1).view(torch.uint8).numpy())
    return Packed(tuple(index), tuple(arrays))


def unpack(packed: Packed) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views of the packed bytes (no copy; read-only when they came from the object store:
    the receiver copies them into its own parameters)."""
    for (name, dtype, shape), array in zip(packed.index, packed.arrays, strict=True):
        with warnings.catch_warnings():  # a read-only store buffer: only ever read here
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.from_numpy(array)
        yield name, flat.view(_DTYPES[dtype]).reshape(shape)


def wire_dtype(config) -> torch.dtype:
    """The dtype weights travel in: the policy's compute dtype (``model.dtype``; auto: bf16 on CUDA, else fp32)."""
    if config.model.dtype != "auto":
        return getattr(torch, config.model.dtype)
    return torch.bfloat16 if torch.cuda.is_available() else torch.float32


class PackedRef:
    """Weights already in the object store (put by trainer rank 0): passed on to rollout workers as the ref
    itself (:meth:`ctu.distributed.ray_pool.RayPool.update_weights`), or iterated where one process needs them.
    ``sums``: the fingerprint sums of the packed values (an :class:`Accumulator`'s ``sums``, computed as rank 0
    packed them), which the sync compares with the engines' own; None: unknown."""

    def __init__(self, ref, sums: dict[str, list] | None = None):
        self.ref = ref
        self.sums = sums

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        import ray

        return unpack(ray.get(self.ref))
