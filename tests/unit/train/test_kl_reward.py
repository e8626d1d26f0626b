import torch

from ctu.config.schema import load_config
from ctu.train.policy import build_policy
from ctu.train.update import sequence_kl, to_sample


def test_kl_in_reward_is_zero_at_the_reference_and_positive_after_a_change():
    cfg = load_config(None, ["model.path=tiny-random", "trainer.kl_coef=0.1", "trainer.kl_in_reward=true"])
    policy = build_policy(cfg, device="cpu")
    samples = [to_sample([1, 5, 9], [7, 3, 2], [1, 1, 1], [0.0] * 3, 0.0),
               to_sample([1, 4], [8, 2, 11, 12], [1, 1, 0, 0], [0.0] * 4, 0.0)]
    assert all(abs(k) < 1e-6 for k in sequence_kl(policy, samples, cfg.trainer, 1.0))  # LoRA B starts at zero
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    kls = sequence_kl(policy, samples, cfg.trainer, 1.0)
    assert all(k > 0 for k in kls)
