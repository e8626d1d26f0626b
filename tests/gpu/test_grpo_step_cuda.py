"""LoRA GRPO steps on CUDA with a random Qwen2-shaped model: the bf16 mixed-precision loss matches an fp32
CPU reference of the same model and samples, and an update at lr 3e-7 moves the fp32 master weights."""

import math

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from ctu.engines.models import smollm2_tokenizer_dir

    path = tmp_path_factory.mktemp("qwen2-tiny")
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def step(path, device, dtype, lr, steps=1):
    from ctu.config.schema import load_config
    from ctu.train.policy import assert_precision_policy, build_policy
    from ctu.train.update import policy_update, to_sample

    config = load_config(None, [f"model.path={path}", f"model.dtype={dtype}", "trainer.kl_coef=0.01"])
    torch.manual_seed(0)
    policy = build_policy(config, device=device)
    compute = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    assert assert_precision_policy(policy.model, compute, policy.reference) == compute
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    samples = [to_sample([1, 5, 9, 13], [7, 3, 2], [1, 1, 1], [-1.0] * 3, adv) for adv in (1.0, -1.0, 0.5, -0.5)]
    stats = [policy_update(policy, opt, sched, samples, config.trainer, temperature=1.0) for _ in range(steps)]
    assert_precision_policy(policy.model, compute, policy.reference)
    return policy, opt, before, stats


def test_lora_grpo_step_bf16_matches_an_fp32_reference(model_path):
    _, _, _, (gpu,) = step(model_path, "cuda", "bfloat16", lr=1e-4)
    _, _, _, (cpu,) = step(model_path, "cpu", "float32", lr=1e-4)
    assert gpu["updates"] >= 1 and math.isfinite(gpu["grad_norm"])
    for key in ("loss", "pg_loss", "kl", "entropy"):
        # bf16 compute: ~3 significant digits per op; the entropy (~ln 49152 ≈ 10.8) sets the scale
        assert math.isclose(gpu[key], cpu[key], rel_tol=2e-2, abs_tol=2e-2 * max(1.0, abs(cpu["entropy"]) / 10)), key
    assert math.isclose(gpu["grad_norm"], cpu["grad_norm"], rel_tol=0.1)


def test_bf16_mixed_precision_lr_3e_7_moves_the_fp32_master_weights(model_path):
    policy, opt, before, _ = step(model_path, "cuda", "bfloat16", lr=3e-7, steps=2)  # 2: lora_A needs B != 0
    moved = touched = 0
    for n, p in policy.model.named_parameters():
        if p.requires_grad:
            assert p.dtype == torch.float32
            had_gradient = opt.state[p]["exp_avg"] != 0
            touched += int(had_gradient.sum())
            moved += int(((p.detach() != before[n]) & had_gradient).sum())
    assert touched > 0 and moved / touched > 0.95
    merged = dict(policy.merged_named_tensors())
    q = next(n for n in merged if n.endswith("q_proj.weight"))
    assert merged[q].dtype == torch.float32  # merged in fp32; the receiver casts once
