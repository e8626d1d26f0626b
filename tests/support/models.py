"""Random Hugging Face models with real tokenizers, saved as model directories for tests (no hub access)."""

from __future__ import annotations

from pathlib import Path

import torch


def save_random_model(path: str | Path, arch: str = "qwen2", layers: int = 2, hidden: int = 64,
                      intermediate: int | None = None, seed: int = 0, **config) -> str:
    """A seeded random ``arch`` (qwen2 | llama) model with the SmolLM2 tokenizer saved under ``path``."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from ctu.engines.hf.models import smollm2_tokenizer_dir

    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    settings = {"vocab_size": len(tok), "hidden_size": hidden, "intermediate_size": intermediate or 2 * hidden,
                "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 512, "tie_word_embeddings": True, "eos_token_id": tok.eos_token_id,
                **config}
    torch.manual_seed(seed)
    model_cls(config_cls(**settings)).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)
