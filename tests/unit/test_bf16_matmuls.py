"""benchmarks/bf16_matmuls.py: the stand-in for native bf16 GEMMs that bf16 measurements on AVX2 CPUs run under
must give what torch's own bf16 kernel gives (bitwise but for rare 1-ulp differences of summation order), reach
the backward pass and autocast's casts, and leave every other op and dtype alone."""

import torch

from benchmarks.bf16_matmuls import BF16MatmulsInFP32


def ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many bf16 steps apart two bf16 tensors of the same sign are (their bit patterns' distance)."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


def test_bf16_matmuls_match_torchs_bf16_kernel_to_one_ulp():
    torch.manual_seed(0)
    a, b = torch.randn(32, 192).bfloat16(), torch.randn(192, 48).bfloat16()
    bias = torch.randn(48).bfloat16()
    batched = torch.randn(3, 16, 64).bfloat16(), torch.randn(3, 64, 8).bfloat16()
    real = [a @ b, torch.addmm(bias, a, b), torch.bmm(*batched)]
    with BF16MatmulsInFP32() as mode:
        emulated = [a @ b, torch.addmm(bias, a, b), torch.bmm(*batched)]
    assert mode.calls == 3
    for r, e in zip(real, emulated, strict=True):
        assert e.dtype == torch.bfloat16
        same_sign = (r.sign() == e.sign())
        assert (ulps_apart(r, e)[same_sign] <= 1).all() and same_sign.float().mean() > 0.99
        assert (r == e).float().mean() > 0.99  # differences are rare: the same products, the same fp32 sums


def test_autocast_forward_and_backward_go_through_it_and_fp32_is_untouched():
    torch.manual_seed(0)
    x = torch.randn(8, 64, requires_grad=True)
    w = torch.randn(32, 64, requires_grad=True)
    with BF16MatmulsInFP32() as mode:
        fp32 = x @ w.T
        assert mode.calls == 0 and fp32.dtype == torch.float32
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            y = torch.nn.functional.linear(x, w)
        assert mode.calls == 1 and y.dtype == torch.bfloat16
        y.float().square().sum().backward()
    assert mode.calls == 3  # the input's and the weight's gradients are bf16 matmuls too
    assert x.grad.dtype == w.grad.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        y_real = torch.nn.functional.linear(x, w)
    assert (y_real == y).float().mean() > 0.99
