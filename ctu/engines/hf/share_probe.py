"""What generation's thread-sharing check computes (:func:`ctu.engines.cpu.cpu_threads.check`).

A BLAS may sum a product in another order with fewer threads for some shapes only: on a 2-core AMD EPYC (Zen 3,
AVX2) MKL's fp32 products of 5-7 and 9-11 rows differ in the last bits on 1 and 2 threads, those of 1-4, 8 and
12-256 rows do not. A decode's batch shrinks as its rows finish and a prefill after a reused prefix may run a few
tokens, so a check at one batch size would pass where the run's numbers still depend on its thread count. The
probe therefore runs:

- a full batch of random prompts of different lengths, ``PROBE_TOKENS`` sampled tokens each, by the engine's own
  prefill, decode steps and sampling (attention, norms, sampling: what is not a product);
- each distinct linear weight of the model (its LoRA adapters' too) on every row count up to ``LINEAR_ROWS`` (the
  LM head up to the batch size: a prefill keeps one position a row), as a shrinking batch's decode steps and a
  short prefill's products run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ctu.engines.base import SamplingParams
from ctu.engines.hf.fused_linear import FusedMember, product

PROBE_TOKENS = 6
LINEAR_ROWS = 64


def decode_probe(engine: Any) -> Callable[[], list[torch.Tensor]]:
    """A function returning the probe's tokens, logprobs and products (tensors) at the calling thread's count."""
    net = engine._net
    g = torch.Generator().manual_seed(0)
    vocab = next(m for m in net.modules() if isinstance(m, torch.nn.Embedding)).num_embeddings
    batch = engine.max_batch_size
    full = [torch.randint(3, vocab, (8 + 3 * i,), generator=g).tolist() for i in range(batch)]
    params = SamplingParams(max_tokens=PROBE_TOKENS, temperature=1.0, seed=0)
    head = net.get_output_embeddings() if hasattr(net, "get_output_embeddings") else None
    weights: dict[tuple, tuple[torch.Tensor, torch.Tensor | None, int]] = {}
    for module in net.modules():
        if isinstance(module, torch.nn.Linear):
            rows = batch if module is head else LINEAR_ROWS
            # a decode copy's product by its packed weight (``packed_linear``: the plain one may be freed)
            owner = module.shared if isinstance(module, FusedMember) else module
            weight = owner.weight
            packed = getattr(owner, "packed", None)
            weights.setdefault((tuple(weight.shape), weight.dtype), (weight, packed, rows))
    inputs = {key: torch.randn((rows, w.shape[1]), generator=g).to(w.device, w.dtype)
              for key, (w, _, rows) in weights.items()}

    def compute() -> list[torch.Tensor]:
        done, _ = engine._generate_batch(full, params, torch.Generator(device=engine.device).manual_seed(0))
        out = [torch.tensor([t for c in done for t in c.token_ids]),
               torch.tensor([x for c in done for x in c.logprobs], dtype=torch.float64)]
        with torch.inference_mode():
            for key, (w, packed, rows) in weights.items():
                out.extend(product(inputs[key][:n], w, None, packed) for n in range(1, rows + 1))
        return out

    return compute
