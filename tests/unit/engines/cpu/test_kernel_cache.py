"""oneDNN's kernel caches bounded at the CLI's start: bf16 products of ever new shapes (a decode step attends over
one more position than the last) stop growing the process once the caches are full. Without the bound 300 new
shapes grew it by ~110 MiB (2-core Zen 4, torch 2.13); with it by the cache's few entries."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from ctu.engines.cpu import kernel_cache

SCRIPT = textwrap.dedent("""
    import ctypes, sys
    import torch
    from ctu.app.cli import main
    try:
        main(["--help"])  # the CLI's start, as `ctu train` runs it
    except SystemExit:
        pass

    def rss_mib():
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

    torch.set_num_threads(1)
    query = torch.randn(4, 3, 1, 64, dtype=torch.bfloat16)
    for length in range(8, 8 + {warm}):  # more shapes than the bounded caches hold: they are full
        query @ torch.randn(4, 3, 64, length, dtype=torch.bfloat16)
    before = rss_mib()
    for length in range(8 + {warm}, 8 + {warm} + 300):
        query @ torch.randn(4, 3, 64, length, dtype=torch.bfloat16)
    print(rss_mib() - before)
""")


def test_bound_keeps_what_the_user_set():
    env = {"LRU_CACHE_CAPACITY": "2048"}
    assert kernel_cache.bound(env, capacity=64) == {"LRU_CACHE_CAPACITY": "2048",
                                                    "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}


@pytest.mark.skipif(not sys.platform.startswith("linux") or not torch.ops.mkldnn._is_mkldnn_bf16_supported()
                    or os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper().startswith("AVX2"),
                    reason="bf16 products run through oneDNN on a CPU that computes bf16 natively (Linux, glibc)")
def test_new_product_shapes_stop_growing_the_process():
    env = {k: v for k, v in os.environ.items() if k not in kernel_cache.VARIABLES}
    script = SCRIPT.format(warm=kernel_cache.CAPACITY + 16)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    grown = float(out.stdout.split()[-1])
    assert grown < 30, f"300 new bf16 product shapes grew the process by {grown:.0f} MiB"
