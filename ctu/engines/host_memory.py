"""The process's host memory: freed memory handed back between phases, and glibc's heap kept from holding it.

torch's CPU tensors come from ``malloc``. glibc serves a request of at least ``M_MMAP_THRESHOLD`` bytes with its
own ``mmap`` and returns it to the system on ``free``; smaller ones come from the heap, whose freed chunks stay
resident until trimmed. The threshold starts at 128 KiB but is *dynamic*: every time an mmapped chunk is freed it
rises to that chunk's size (up to 32 MiB), so after the first large tensor is freed, every activation, logit chunk
and gradient up to that size is carved out of the heap, and an update's many differently sized temporaries leave
it fragmented at the size of their sum. On the quickstart that was a whole GiB: one RL update's peak RSS 2.20 GiB
with glibc's defaults, 1.23 GiB with the threshold fixed at 128 KiB (same step, same numbers; README,
"Quickstart: measured"). :func:`bound_heap` fixes it (``mallopt(M_MMAP_THRESHOLD)``, which also turns the dynamic
adjustment off); an explicit ``MALLOC_MMAP_THRESHOLD_`` in the environment wins, and ``CTU_HEAP_BOUND=0`` leaves
glibc's defaults (``benchmarks/heap_bound.py`` compares the two).
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


def bound_heap(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold (allocations above ``threshold`` bytes are mapped and unmapped when freed, not
    kept in the heap). False where it does not apply: not glibc, ``MALLOC_MMAP_THRESHOLD_`` set by the user, or
    ``CTU_HEAP_BOUND=0``."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or os.environ.get("CTU_HEAP_BOUND", "").strip() == "0":
        return False
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None or not hasattr(libc, "malloc_trim"):  # musl, macOS: no such knob
        return False
    return bool(mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(threshold)))


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
