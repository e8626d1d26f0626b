"""Inside a real policy_update: gradient checkpointing cuts saved activations, LoRA dropout is active in the
gradient passes and inactive when scoring; checkpointing works with the shared prefix and peft."""

import pytest
import torch

from ctu.config.schema import load_config


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from tests.support.models import save_random_model

    return save_random_model(tmp_path_factory.mktemp("tiny-llama4"), "llama", layers=4, hidden=64, intermediate=256)


def setup(path, *overrides):
    from ctu.train.policy import build_policy

    config = load_config(None, [f"model.path={path}", "model.dtype=float32", *overrides])
    torch.manual_seed(1)
    policy = build_policy(config, device="cpu")
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return config, policy, opt, sched


def samples():
    from ctu.train.update import to_sample

    prompt = list(range(20, 80))  # a shared prefix longer than MIN_SHARED
    return [to_sample(prompt + [100 + i], [7 + i, 300 + i, 2, 41, 9, 12], [1] * 6, [-3.0] * 6, adv)
            for i, adv in enumerate((1.0, -1.0, 0.5, -0.5))]


def saved_elements(path, checkpointing: bool) -> tuple[int, dict]:
    from ctu.train.update import policy_update

    config, policy, opt, sched = setup(path, f"trainer.gradient_checkpointing={str(checkpointing).lower()}")
    count = [0]
    vocab = policy.model.get_output_embeddings().out_features

    def pack(t):  # the decoder's activations: not the lm_head chunk's logits, kept alike either way
        if t.dim() == 0 or t.shape[-1] != vocab:
            count[0] += t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stats = policy_update(policy, opt, sched, samples(), config.trainer, temperature=1.0)
    return count[0], stats


def test_gradient_checkpointing_cuts_saved_activations_in_policy_update(model_path):
    plain, plain_stats = saved_elements(model_path, checkpointing=False)
    checkpointed, stats = saved_elements(model_path, checkpointing=True)
    assert checkpointed < plain / 3, (checkpointed, plain)
    for key in ("loss", "pg_loss", "grad_norm"):  # same update, shared prefix and peft included
        torch.testing.assert_close(stats[key], plain_stats[key], rtol=1e-4, atol=1e-6 * max(1.0, abs(plain_stats[key])))


def test_lora_dropout_is_active_in_the_update_and_inactive_when_scoring(model_path):
    from ctu.train.update import collate, policy_update, score_logprobs

    config, policy, opt, sched = setup(model_path, "lora.dropout=0.5")
    dropouts = [m for n, m in policy.model.named_modules() if n.endswith("lora_dropout.default")]
    assert dropouts
    calls = []
    hooks = [m.register_forward_hook(lambda m, i, o: calls.append((m.training, torch.is_grad_enabled())))
             for m in dropouts]
    try:
        policy_update(policy, opt, sched, samples(), config.trainer, temperature=1.0)
    finally:
        for h in hooks:
            h.remove()
    assert any(training and grad for training, grad in calls)  # dropout on in the gradient passes
    assert not any(training for training, grad in calls if not grad)  # off when scoring
    with torch.no_grad():
        for p in policy.model.parameters():  # make the adapters matter, so dropout would show
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    b = collate(samples(), "cpu")
    first, second = score_logprobs(policy.model, b, 1.0), score_logprobs(policy.model, b, 1.0)
    assert torch.equal(first, second)
    policy.model.train()
    with torch.no_grad():
        from ctu.train.policy import token_logprobs

        noisy = token_logprobs(policy.model, b["ids"], b["attn"], needed=b["mask"])[0]
    policy.model.eval()
    assert not torch.equal(noisy * b["mask"], first * b["mask"])  # dropout would have changed the scores
