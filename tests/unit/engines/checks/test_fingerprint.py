"""Weight fingerprints: the same values in another layout agree; one changed value does not; the trainer's stream
fingerprint equals the engine's after a faithful load and holds no tensor."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ctu.engines.checks.fingerprint import Accumulator, Fingerprint, FingerprintExtension, matches, mismatch, of_module


def hf_like(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) * 0.05 for name, shape in
            [("q", (8, 16)), ("k", (4, 16)), ("v", (4, 16)), ("gate", (24, 16)), ("up", (24, 16)), ("embed", (50, 16))]}


class Fused(torch.nn.Module):
    """vLLM's layout: q/k/v and gate/up concatenated, the vocabulary padded with zero rows."""

    def __init__(self, w):
        super().__init__()
        self.qkv = torch.nn.Parameter(torch.cat([w["q"], w["k"], w["v"]]))
        self.gate_up = torch.nn.Parameter(torch.cat([w["gate"], w["up"]]))
        self.embed = torch.nn.Parameter(torch.cat([w["embed"], torch.zeros(14, 16)]))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), dtype=st.sampled_from(["float32", "bfloat16"]))
def test_a_fused_padded_layout_of_the_same_values_matches_and_one_changed_value_does_not(seed, dtype):
    w = hf_like(seed)
    sent = Accumulator([dtype])
    list(sent.stream(w.items()))
    held = of_module(Fused({k: v.to(getattr(torch, dtype)) for k, v in w.items()}).to(getattr(torch, dtype)))
    assert held.dtype == dtype and matches(held, sent.fingerprint(dtype))
    w["up"][3, 5] += 0.01 * (1 if seed % 2 else -1)  # one weight of one tensor moved
    stale = of_module(Fused({k: v.to(getattr(torch, dtype)) for k, v in w.items()}).to(getattr(torch, dtype)))
    assert not matches(stale, held)
    assert mismatch([held], sent, 3) is None
    assert "engine 0 acknowledged the weights of version 3 but holds other ones" in mismatch([stale], sent, 3)


def test_unknown_fingerprints_are_not_compared():
    sent = Accumulator(["float32"])
    list(sent.stream(hf_like().items()))
    assert mismatch([None], sent, 1) is None and mismatch([], None, 1) is None
    other = Fingerprint(1, 1.0, 1.0, "float16")  # a dtype the trainer did not sum in
    assert mismatch([other], sent, 1) is None


def test_the_worker_extension_reads_the_model_its_worker_runs():
    model = Fused(hf_like())
    worker = type("Worker", (FingerprintExtension,), {})()
    worker.model_runner = type("Runner", (), {"get_model": lambda self: model})()
    assert Fingerprint.of(worker.ctu_fingerprint()) == of_module(model)


def test_an_engine_whose_parameters_hide_weights_is_not_compared():
    """vLLM's CPU kernels leave an empty parameter where each linear weight was (the weight packed for oneDNN, out
    of reach): fewer values than were sent, a fingerprint that says nothing about the load."""
    w = hf_like()
    sent = Accumulator(["float32"])
    list(sent.stream(w.items()))
    packed = Fused(w)
    packed.qkv = torch.nn.Parameter(torch.empty(0))  # what vLLM's CPU linear leaves behind
    held = of_module(packed)
    assert held.count < sent.fingerprint("float32").count
    assert mismatch([held], sent, 2) is None
