"""benchmarks/decode_roofline.py's arithmetic: bytes and FLOPs of one decode step, and which bound wins."""

from types import SimpleNamespace

import pytest

from benchmarks.decode_roofline import decode_cost, roofline_seconds

SMOLLM2 = SimpleNamespace(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
                          head_dim=64)


def test_weights_are_read_once_per_step_whatever_the_batch():
    one, sixteen = (decode_cost(SMOLLM2, 134_515_008, b, 400, 4, 4) for b in (1, 16))
    assert one["weight_bytes"] == sixteen["weight_bytes"] == 4 * 134_515_008
    # KV: 2 (k, v) x 30 layers x 400 tokens x 3 heads x 64 x 4 bytes = 18.4 MB a row
    assert one["kv_bytes"] == pytest.approx(18_432_000, rel=1e-12) and sixteen["kv_bytes"] == 16 * one["kv_bytes"]
    # FLOPs: 2 per weight per row plus q.k and p.v: 4 x 30 x 400 x 9 x 64 a row
    assert one["flops"] == pytest.approx(2 * 134_515_008 + 27_648_000, rel=1e-12)
    assert sixteen["flops"] == pytest.approx(16 * one["flops"], rel=1e-12)
    assert decode_cost(SMOLLM2, 134_515_008, 16, 400, 2, 2)["bytes"] == pytest.approx(sixteen["bytes"] / 2, rel=1e-12)


def test_the_slower_of_memory_and_compute_bounds_the_step():
    cost = {"bytes": 1e9, "flops": 4e9}
    assert roofline_seconds(cost, bandwidth=10e9, flops=100e9) == (pytest.approx(0.1, rel=1e-12), "memory")
    assert roofline_seconds(cost, bandwidth=100e9, flops=10e9) == (pytest.approx(0.4, rel=1e-12), "compute")
