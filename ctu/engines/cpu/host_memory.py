"""The process's host memory: freed memory handed back between phases and after every micro-batch, and an opt-in
bound on glibc's heap.

torch's CPU tensors come from ``malloc``. glibc serves a request of at least ``M_MMAP_THRESHOLD`` bytes with its
own ``mmap`` and returns it to the system on ``free``; smaller ones come from the heap, whose freed chunks stay
resident until trimmed. The threshold starts at 128 KiB but is *dynamic*: every time an mmapped chunk is freed it
rises to that chunk's size (up to 32 MiB), so after the first large tensor is freed, activations and logit chunks
up to that size are carved out of the heap, and an update's differently sized temporaries leave it fragmented.

Measured on the quickstart's policy (``benchmarks/heap_bound.py``: SmolLM2-135M + LoRA, fp32, 1 thread, updates
of 4 synthetic episodes; README, "Quickstart: measured"): glibc's defaults 67-71 s an update and 2.18 GiB peak
RSS; :func:`trim_heap` after every micro-batch (on, always) 60-66 s and 1.98 GiB; the threshold fixed at 128 KiB
(:func:`bound_heap`, which also stops the dynamic rise) 99-117 s and 1.16 GiB: every freed tensor leaves, but
every new one faults its pages in again. So the bound is opt-in, ``CTU_HEAP_BOUND=1``, for a machine short of
memory and not of time; an explicit ``MALLOC_MMAP_THRESHOLD_`` in the environment wins over it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os

import torch

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD = 128 * 1024  # glibc's initial value, kept: tensors above it are mmapped and unmapped on free


def _libc():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def bound_heap(threshold: int = MMAP_THRESHOLD, force: bool = False) -> bool:
    """With ``CTU_HEAP_BOUND=1`` (or ``force``), fix glibc's mmap threshold: allocations above ``threshold`` bytes
    are mapped and unmapped when freed, not kept in the heap (about half the update's peak RSS, at ~1.7x its
    time). False where it does nothing: not asked for, not glibc, or ``MALLOC_MMAP_THRESHOLD_`` set by the user."""
    asked = force or os.environ.get("CTU_HEAP_BOUND", "").strip() == "1"
    if not asked or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None or not hasattr(libc, "malloc_trim"):  # musl, macOS: no such knob
        return False
    return bool(mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(threshold)))


def trim_heap() -> None:
    """Give the heap's free pages back (``malloc_trim``: whole free pages anywhere in the heap, not only its top),
    without a garbage collection: cheap enough after every micro-batch of an update."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is not None:
        trim(0)


def release_memory() -> None:
    """Hand freed memory back between phases. Generation runs in a worker thread and training in the main thread,
    so glibc keeps each phase's peak in its own arena; trimming keeps the process's peak at the largest phase
    instead of their sum (quickstart: 4.5 GB -> see README). On CUDA, torch's caching allocator keeps what the
    trainer freed (the fp32 load, every step's activations) reserved; vLLM allocates outside it, so the cache is
    emptied before an engine starts or wakes (:class:`ctu.train.sync.WeightSync`)."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    libc = _libc()
    if libc is not None:
        try:
            libc.malloc_trim(0)
        except AttributeError:  # not glibc
            pass
