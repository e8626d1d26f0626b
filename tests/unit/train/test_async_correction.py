"""The behaviour-policy correction asynchronous runs rely on (trainer.tis_cap, required with max_staleness > 0):
each token's loss is weighed by min(pi_old / pi_sampler, cap), pi_sampler being the logprob the engine returned
with the token (Sample.sampler_logprobs), so tokens from older weights count by how likely the policy now finds them."""

import math

import pytest
import torch

from ctu.train.update import Sample, collate, score_logprobs
from tests.unit.train.test_update_semantics import run_update, samples


def current_logprobs(batch):
    """The trainer's logprobs of every sample's tokens before the update (run_update builds the same policy)."""
    from ctu.config.schema import load_config
    from ctu.train.policy import build_policy

    cfg = load_config(None, ["model.path=tiny-random"])
    torch.manual_seed(0)
    policy = build_policy(cfg, device="cpu")
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    out = []
    for s in batch:
        lp = score_logprobs(policy.model, collate([s], "cpu"), temperature=0.9)[0]
        out.append([float(x) if m else 0.0 for x, m in zip(lp.tolist(), s.mask, strict=True)])
    return out


@pytest.mark.parametrize(("offset", "weight"), [(0.0, 1.0), (0.5, math.exp(0.5)), (1.5, 2.0)])
def test_the_loss_weighs_tokens_by_the_capped_ratio_to_the_sampler(offset, weight):
    batch = samples(n=4)
    now = current_logprobs(batch)
    # the sampler (older weights) found every token exp(-offset) times as likely as the policy does now
    stale = [Sample(s.ids, s.mask, [lp - offset if m else 0.0 for lp, m in zip(lps, s.mask, strict=True)],
                    s.advantage) for s, lps in zip(batch, now, strict=True)]
    plain, _, _, _ = run_update([], [Sample(s.ids, s.mask, lps, s.advantage) for s, lps in zip(batch, now, strict=True)])
    corrected, _, _, _ = run_update(["trainer.tis_cap=2.0"], stale)
    uncorrected, _, _, _ = run_update([], stale)
    assert corrected["pg_loss"] == pytest.approx(weight * plain["pg_loss"], rel=1e-3)
    assert uncorrected["pg_loss"] == pytest.approx(plain["pg_loss"], rel=1e-4)  # without a cap: blind to the sampler
    assert corrected["sampler_trainer_logprob_diff"] == pytest.approx(offset, abs=1e-3)


@pytest.mark.parametrize("term", [["trainer.kl_coef=0.5"], ["trainer.entropy_coef=0.5"]])
def test_the_kl_and_entropy_terms_are_weighed_like_the_policy_gradient(term):
    """With zero advantages only the KL (or entropy) term moves the weights: a token the sampler found exp(2)
    times likelier than the policy does now counts by min(exp(-2), cap) there too, so the step shrinks by that
    weight; without the weight stale tokens would pull the policy towards (or away from) the reference at full
    strength."""
    batch = samples(n=4)
    now = current_logprobs(batch)
    fresh = [Sample(s.ids, s.mask, lps, 0.0) for s, lps in zip(batch, now, strict=True)]
    stale = [Sample(s.ids, s.mask, [lp + 2.0 if m else 0.0 for lp, m in zip(lps, s.mask, strict=True)], 0.0)
             for s, lps in zip(batch, now, strict=True)]
    on = ["trainer.tis_cap=2.0", "trainer.loss_aggregation=token_mean", *term]
    _, d_fresh, _, _ = run_update(on, fresh)
    _, d_stale, _, _ = run_update(on, stale)
    norm = lambda d: math.sqrt(sum(float(v.pow(2).sum()) for v in d.values()))  # noqa: E731
    assert norm(d_fresh) > 0
    assert norm(d_stale) == pytest.approx(math.exp(-2.0) * norm(d_fresh), rel=1e-2)
