"""This CPU's matmul rates in fp32 and bf16 (torch's CPU build), and what ``trainer.autocast=auto`` picks here.

    python benchmarks/cpu_precision.py [--threads 1] [--seconds 1]
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/cpu_precision.py   # as a Zen 3 (AVX2) runs

The shape is one of SmolLM2-135M's MLP matmuls in a training pass (512 tokens x 576 @ 576 x 1536). Figures measured
with it: README, "Precision by machine".
"""

from __future__ import annotations

import argparse
import time

import torch

from ctu.engines.cpu.precision import cpu_bf16_support, resolve_autocast


def gflops(dtype: torch.dtype, m: int, k: int, n: int, seconds: float) -> float:
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    a @ b  # warm up (oneDNN builds its kernel on first use)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or count < 2:
        a @ b
        count += 1
    return 2 * m * k * n * count / (time.perf_counter() - start) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    native, why = cpu_bf16_support()
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, {args.threads} thread(s)")
    rates = {str(d).removeprefix("torch."): gflops(d, 512, 576, 1536, args.seconds)
             for d in (torch.float32, torch.bfloat16)}
    for name, rate in rates.items():
        print(f"{name:>9}: {rate:8.1f} GFLOP/s  (512x576 @ 576x1536)")
    print(f"bf16/fp32: {rates['bfloat16'] / rates['float32']:.3g}x; native bf16: {native} ({why})")
    print(f"trainer.autocast=auto here: {resolve_autocast('auto', 'cpu')[1]}")


if __name__ == "__main__":
    main()
