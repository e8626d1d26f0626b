"""One LoRA GRPO step in bf16 on CUDA with a random Qwen2-shaped model: uniform dtype, finite loss."""

import math

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_lora_grpo_step_bf16(tmp_path):
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from ctu.config import load_config
    from ctu.models import smollm2_tokenizer_dir
    from ctu.train.policy import assert_uniform_dtype, build_policy
    from ctu.train.trainer import _schedule
    from ctu.train.update import policy_update, to_sample

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    config = load_config(None, [f"model.path={tmp_path}", "model.dtype=bfloat16", "trainer.kl_coef=0.01"])
    policy = build_policy(config, device="cuda")
    assert assert_uniform_dtype(policy.model) == torch.bfloat16
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(config.trainer, 1))
    samples = [to_sample([1, 5, 9, 13], [7, 3, 2], [1, 1, 1], [-1.0] * 3, adv) for adv in (1.0, -1.0, 0.5, -0.5)]
    stats = policy_update(policy, opt, sched, samples, config.trainer, temperature=1.0)
    assert math.isfinite(stats["loss"]) and stats["updates"] >= 1 and math.isfinite(stats["grad_norm"])
    assert assert_uniform_dtype(policy.model) == torch.bfloat16
