"""The head of a prefill's last position: ``logits_to_keep=1`` hands the lm_head a strided slice of the hidden
states (every row's last position). torch's CPU ``linear`` in bf16 does not fold such a 3-D input into one product:
it expands the head's weight to one copy per row and runs a batched product (32 rows x SmolLM2's 49,152 x 576 head:
1.7 GiB and ~5 s, against 0.02 s for the same product of a contiguous input). The quickstart's evaluations peaked
there (3.8 GiB of its 60 test tasks at 32 in flight, 2.2 without it); the engine's heads take contiguous inputs."""

from __future__ import annotations

import threading
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ctu.engines.base import SamplingParams
from ctu.engines.hf.engine import HFEngine


def rss_gib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**30


def smollm2_shaped(layers: int = 1) -> LlamaForCausalLM:
    """SmolLM2-135M's widths and vocabulary (tied head), ``layers`` deep, random."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                         max_position_embeddings=2048)
    return LlamaForCausalLM(config).eval()


def test_a_32_row_bf16_prefill_adds_no_copy_of_the_head_per_row():
    engine = HFEngine(smollm2_shaped(), decode_dtype="bfloat16")
    prompts = [[1 + (7 * i + j) % 4000 for j in range(66)] for i in range(32)]
    params = SamplingParams(max_tokens=2, temperature=0.0)
    engine.generate_sync(prompts[:2], params)  # the decode copy is made (its size is not the prefill's)
    peak, start, done = [0.0], rss_gib(), threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_gib())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        out = engine.generate_sync(prompts, params)
    finally:
        done.set()
        sampler.join()
    assert len(out) == 32 and all(len(c[0].token_ids) == 2 for c in out)
    # a copy of the bf16 head per row is 32 x 54 MiB = 1.7 GiB; the batch's KV and activations are ~0.1 GiB
    assert peak[0] - start < 0.6, f"the prefill rose {peak[0] - start:.2f} GiB"
