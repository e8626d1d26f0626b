"""bf16 numerics at fp32 speed on a CPU without native bf16 (AVX2: Zen 3, most laptops), for measurements only.

On such a CPU torch runs bf16 matmuls ~45-60x slower than fp32 (``benchmarks/cpu_precision.py``), so a bf16 RL run
(``CTU_NATIVE_BF16=1``: ``trainer.autocast=auto`` then picks bf16 as on Zen 4) would take days. Everything else in
bf16 (SDPA, norms, activations, softmax) runs at normal speed. :class:`BF16MatmulsInFP32` is a dispatch mode that
leaves every op to its real kernel except the matmul family (``mm``, ``addmm``, ``bmm``, ``baddbmm``) on bf16
operands, which it computes as oneDNN's bf16 GEMM does: the bf16 operands widened to fp32 (exact), products and
their sums in fp32 (a product of two bf16 values is exact in fp32), the result rounded once to bf16. Only the
summation order differs from the native kernel (AVX512-BF16's ``vdpbf16ps`` pairs), the size of difference any two
GEMM kernels have. The mode sits below autocast and autograd, so forward, backward and gradient-checkpoint
recomputation all see it; it is thread-local, which covers the trainer's passes (the in-process engine decodes
in ``model.dtype``, fp32 on CPU, in its own thread, as it does on Zen 4).

    python benchmarks/bf16_matmuls.py          # its agreement with the real (slow) bf16 kernels, and speed

``benchmarks/rl_levers.py --bf16-matmuls-in-fp32`` runs under it. Not part of ctu's runtime.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
_MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}


class BF16MatmulsInFP32(TorchDispatchMode):
    """bf16 matmuls computed in fp32 from their bf16 operands and rounded to bf16; every other op untouched."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _MATMULS and any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args):
            self.calls += 1
            wide = [a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a for a in args]
            return func(*wide, **kwargs).to(torch.bfloat16)
        return func(*args, **kwargs)


def _check() -> None:
    """A small Llama's loss and gradients under bf16 autocast: real kernels vs this mode vs fp32, and step times."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=8192, max_position_embeddings=512)
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 256))

    def step(autocast: bool, mode: BF16MatmulsInFP32 | None):
        model.zero_grad(set_to_none=True)
        began = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), (mode or contextlib.nullcontext()):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        return loss.item(), grads, time.perf_counter() - began

    real = step(True, None)
    mode = BF16MatmulsInFP32()
    emulated = step(True, mode)
    fp32 = step(False, None)

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    print(f"loss: bf16 {real[0]:.5f}, emulated {emulated[0]:.5f}, fp32 {fp32[0]:.5f}")
    print(f"gradient relative difference: emulated vs bf16 {rel(emulated[1], real[1]):.4f}, "
          f"fp32 vs bf16 {rel(fp32[1], real[1]):.4f}")
    print(f"step time: bf16 {real[2]:.2f}s, emulated {emulated[2]:.2f}s ({mode.calls} matmuls), fp32 {fp32[2]:.2f}s")


if __name__ == "__main__":
    _check()
