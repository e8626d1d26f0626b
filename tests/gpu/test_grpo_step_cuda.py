"""LoRA GRPO steps on CUDA with a random Qwen2-shaped model: the bf16 mixed-precision loss and gradient norm match
an fp32 CPU reference of the same model and samples, and an update at lr 3e-7 moves the fp32 master weights.

The samples are four different responses: four copies of one sample with advantages summing to zero (this file's
first version) have an exactly zero policy gradient, so both norms were rounding noise (1.7e-10 in bf16 vs 6.9e-8
in fp32 on an H200) and Adam's step at lr 3e-7 fell below the weights' resolution."""

import math

import pytest
import torch

DEVICE = "cuda"
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from ctu.engines.hf.models import smollm2_tokenizer_dir

    path = tmp_path_factory.mktemp("qwen2-tiny")
    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def batch():
    """Four different 24-token prompts and 16-token responses; advantages that do not cancel."""
    from ctu.train.update import to_sample

    g = torch.Generator().manual_seed(0)
    out = []
    for adv in (1.0, -1.0, 0.5, -0.25):
        ids = torch.randint(10, 40000, (40,), generator=g).tolist()
        out.append(to_sample(ids[:24], ids[24:], [1] * 16, [-10.0] * 16, adv))
    return out


def step(path, device, dtype, lr, steps=1):
    from ctu.config.schema import load_config
    from ctu.train.policy import assert_precision_policy, build_policy
    from ctu.train.update import policy_update

    config = load_config(None, [f"model.path={path}", f"model.dtype={dtype}", "trainer.kl_coef=0.01",
                                "trainer.grad_clip=.inf"])  # the norm is compared: a binding clip would hide it
    torch.manual_seed(0)
    policy = build_policy(config, device=device)
    compute = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    assert assert_precision_policy(policy.model, compute, policy.reference) == compute
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    stats, before = [], {}
    for _ in range(steps):  # `before`: the weights before the last step
        before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
        stats.append(policy_update(policy, opt, sched, batch(), config.trainer, temperature=1.0))
    assert_precision_policy(policy.model, compute, policy.reference)
    return policy, opt, before, stats


def test_lora_grpo_step_bf16_matches_an_fp32_reference(model_path):
    _, _, _, (gpu,) = step(model_path, DEVICE, "bfloat16", lr=1e-4)
    _, _, _, (cpu,) = step(model_path, "cpu", "float32", lr=1e-4)
    assert gpu["updates"] >= 1 and math.isfinite(gpu["grad_norm"])
    assert cpu["grad_norm"] > 1e-4  # a real gradient, far above rounding noise
    for key in ("loss", "pg_loss", "kl", "entropy"):
        # bf16 compute: ~3 significant digits per op; the entropy (~ln 49152 ≈ 10.8) sets the scale
        assert math.isclose(gpu[key], cpu[key], rel_tol=2e-2, abs_tol=2e-2 * max(1.0, abs(cpu["entropy"]) / 10)), key
    assert math.isclose(gpu["grad_norm"], cpu["grad_norm"], rel_tol=0.1), (gpu["grad_norm"], cpu["grad_norm"])


def test_bf16_mixed_precision_lr_3e_7_moves_the_fp32_master_weights(model_path):
    """Adam's last step moves every weight whose step is at least one fp32 ulp (|w| 2^-23), many of which bf16
    weights (ulp |w| 2^-7) could not have moved (lora_A: lr 3e-7 against weights of ~1e-2; lora_B starts at 0)."""
    lr = 3e-7
    policy, opt, before, _ = step(model_path, DEVICE, "bfloat16", lr=lr, steps=2)  # 2: lora_A needs B != 0
    big = moved = bf16_stuck = 0
    for n, p in policy.model.named_parameters():
        if not p.requires_grad:
            continue
        assert p.dtype == torch.float32
        state = opt.state[p]
        t = float(state["step"])
        m_hat = state["exp_avg"] / (1 - 0.9 ** t)
        v_hat = state["exp_avg_sq"] / (1 - 0.999 ** t)
        delta = (lr * m_hat / (v_hat.sqrt() + 1e-8)).abs()  # torch's AdamW step, weight decay 0
        w = before[n].abs()
        sure = delta > 2 * w * 2.0**-23 + 1e-30  # at least two fp32 ulps of this weight: an fp32 master must move
        big += int(sure.sum())
        moved += int(((p.detach() != before[n]) & sure).sum())
        bf16_stuck += int((sure & (delta < w * 2.0**-9)).sum())  # under half a bf16 ulp: bf16 would round it away
    assert big > 1000 and moved / big > 0.99, (moved, big)
    assert bf16_stuck > big / 4, (bf16_stuck, big)  # about precision: lora_A moves below bf16 resolution (47% on CPU)
    merged = dict(policy.merged_named_tensors())
    q = next(n for n in merged if n.endswith("q_proj.weight"))
    assert merged[q].dtype == torch.float32  # merged in fp32; the receiver casts once
