"""oneDNN's caches of compiled product kernels, bounded.

On a CPU that computes bf16 natively (AVX512-BF16, AMX), torch runs bf16 products through oneDNN, which compiles a
kernel ("primitive") for each product shape and keeps it in two least-recently-used caches: ideep's
(``LRU_CACHE_CAPACITY``) and oneDNN's own (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``), 1,024 entries each by default.
Decoding and training make new shapes all the time (a decode step attends over one more position than the last;
each micro-batch has its own token count), so both caches fill up, at about 0.3 MiB resident per shape: 2,000
bf16 products of new shapes grew a process by 620 MiB on a 2-core Zen 4 (torch 2.13), against 25 MiB with both
caches at 8 entries. A kernel is reused within a step (every layer has the same shapes), rarely across steps, so
a few hundred entries keep every hit that matters. Caps set in the environment by the user are kept.

Read when oneDNN first computes, not when torch loads, so :func:`bound` works until the first bf16 product.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

CAPACITY = 256  # entries per cache: a training micro-batch's distinct product shapes with room to spare
VARIABLES = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def bound(environ: MutableMapping[str, str] | None = None, capacity: int = CAPACITY) -> dict[str, str]:
    """Cap both caches at ``capacity`` entries where the environment does not set them; returns what is in effect."""
    environ = os.environ if environ is None else environ
    for name in VARIABLES:
        environ.setdefault(name, str(capacity))
    return {name: environ[name] for name in VARIABLES}
