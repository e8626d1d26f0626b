import itertools
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ctu.rl.advantages import compute_advantages, grpo_advantages, informative_groups, rloo_advantages
from ctu.rl.losses import aggregate, entropy_from_logits, kl_penalty, ppo_clip_loss, truncated_importance_weights

reward = st.floats(min_value=-5, max_value=5, allow_nan=False, allow_infinity=False)


@st.composite
def grouped_rewards(draw):
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    rewards, groups = [], []
    for g, n in enumerate(sizes):
        rewards += draw(st.lists(reward, min_size=n, max_size=n))
        groups += [f"task{g}"] * n
    perm = draw(st.permutations(range(len(rewards))))
    return [rewards[i] for i in perm], [groups[i] for i in perm]


@settings(max_examples=150, deadline=None)
@given(grouped_rewards(), st.sampled_from(["grpo", "dr_grpo", "rloo"]), reward)
def test_advantages_sum_to_zero_per_group_and_ignore_constant_shifts(data, name, shift):
    rewards, groups = data
    adv = compute_advantages(name, rewards, groups)
    for g in set(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        assert abs(float(adv[idx].sum())) < 1e-3
    shifted = compute_advantages(name, [r + shift for r in rewards], groups)
    assert torch.allclose(adv, shifted, atol=1e-3)


@given(grouped_rewards())
def test_std_normalised_grpo_is_scale_invariant_and_rloo_is_scaled_centring(data):
    rewards, groups = data
    for g in set(groups):  # eps keeps near-constant groups finite, so scale invariance needs a real spread
        values = [r for r, x in zip(rewards, groups, strict=True) if x == g]
        assume(len(values) < 2 or max(values) == min(values) or torch.tensor(values).std() > 1e-2)
    a = grpo_advantages(rewards, groups)
    b = grpo_advantages([3 * r for r in rewards], groups)
    assert torch.allclose(a, b, atol=1e-3)
    dr = grpo_advantages(rewards, groups, normalize_std=False)
    rl = rloo_advantages(rewards, groups)
    for g in set(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        n = len(idx)
        if n > 1:
            assert torch.allclose(rl[idx], dr[idx] * n / (n - 1), atol=1e-4)


@given(grouped_rewards(), reward, st.floats(0.1, 10))
def test_batch_baseline_centres_the_batch_and_reinforces_groups_that_always_succeed(data, shift, scale):
    rewards, groups = data
    adv = compute_advantages("reinforce_pp", rewards, groups)
    assert abs(float(adv.sum())) <= 1e-4 * len(rewards)
    assume(len(rewards) < 2 or torch.tensor(rewards, dtype=torch.float64).std() > 1e-2)
    moved = compute_advantages("reinforce_pp", [scale * r + shift for r in rewards], groups)
    assert torch.allclose(adv, moved, rtol=1e-3, atol=1e-3)


def test_a_group_that_always_succeeds_gets_credit_under_the_batch_baseline_but_not_grpo():
    rewards, groups = [1, 1, 1, 1, 0, 0, 1, 0], ["a"] * 4 + ["b"] * 4
    assert compute_advantages("grpo", rewards, groups)[:4].abs().max() == 0
    batch = compute_advantages("reinforce_pp", rewards, groups)
    assert torch.all(batch[:4] > 0) and torch.all(batch[[4, 5, 7]] < 0)
    mean, std = 5 / 8, torch.tensor(rewards, dtype=torch.float64).std().item()
    assert math.isclose(batch[0].item(), (1 - mean) / std, rel_tol=1e-5)


def test_dynamic_sampling_drops_groups_with_equal_rewards():
    assert informative_groups([1, 1, 0, 1, 0.5, 0.5], ["a", "a", "b", "b", "c", "c"]) == [2, 3]
    assert informative_groups([], []) == []
    with pytest.raises(ValueError):
        compute_advantages("ppo", [1.0], ["a"])


tensors = st.integers(1, 4).flatmap(lambda b: st.integers(1, 6).flatmap(lambda t: st.tuples(
    st.lists(st.floats(-3, 0, allow_nan=False), min_size=b * t, max_size=b * t),
    st.lists(st.floats(-3, 0, allow_nan=False), min_size=b * t, max_size=b * t),
    st.lists(st.floats(-2, 2, allow_nan=False), min_size=b, max_size=b),
    st.lists(st.integers(0, 1), min_size=b * t, max_size=b * t),
    st.just((b, t)))))


def unpack(data):
    lp, old, adv, mask, (b, t) = data
    return (torch.tensor(lp).view(b, t), torch.tensor(old).view(b, t), torch.tensor(adv),
            torch.tensor(mask, dtype=torch.float32).view(b, t))


@settings(max_examples=150, deadline=None)
@given(tensors, st.sampled_from(["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]))
def test_masked_tokens_never_change_the_loss(data, agg):
    lp, old, adv, mask = unpack(data)
    loss, _ = ppo_clip_loss(lp, old, adv, mask, aggregation=agg, clip_high=0.28, dual_clip=3.0)
    noise = torch.where(mask > 0, torch.zeros_like(lp), torch.full_like(lp, 1.7))
    loss2, _ = ppo_clip_loss(lp - noise, old + noise, adv, mask, aggregation=agg, clip_high=0.28, dual_clip=3.0)
    assert torch.allclose(loss, loss2, atol=1e-5)
    assert math.isfinite(float(loss))


@given(st.integers(1, 3), st.integers(1, 5))
def test_gradient_vanishes_at_ratio_one_with_zero_advantage(b, t):
    old = -torch.rand(b, t)
    lp = old.clone().requires_grad_(True)
    loss, metrics = ppo_clip_loss(lp, old, torch.zeros(b), torch.ones(b, t))
    loss.backward()
    assert torch.all(lp.grad == 0) and metrics["clip_fraction"] == 0.0
    lp2 = old.clone().requires_grad_(True)
    ppo_clip_loss(lp2, old, torch.ones(b), torch.ones(b, t))[0].backward()
    assert torch.all(lp2.grad < 0)  # positive advantage: the loss pushes logprobs up


@settings(max_examples=200, deadline=None)
@given(st.floats(-4, 4, allow_nan=False), st.floats(-3, 3, allow_nan=False).filter(lambda a: abs(a) > 1e-3),
       st.floats(0.05, 0.4), st.floats(0.05, 0.5))
def test_clipping_never_lets_the_objective_past_the_bounds(log_ratio, adv, low, high):
    lp = torch.tensor([[log_ratio]])
    loss, _ = ppo_clip_loss(lp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1), clip_low=low, clip_high=high)
    objective = -float(loss)
    bound = (1 + high) * adv if adv > 0 else (1 - low) * adv
    tol = 1e-5 + 1e-5 * abs(math.exp(log_ratio) * adv)  # float32 ratios
    assert objective <= bound + tol
    assert objective <= math.exp(log_ratio) * adv + tol  # pessimistic: never above the unclipped objective


def test_dual_clip_bounds_negative_advantage_loss():
    lp = torch.tensor([[3.0]])  # ratio e^3 ~ 20
    loss, _ = ppo_clip_loss(lp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), dual_clip=3.0)
    assert float(loss) == pytest.approx(3.0)


def test_aggregations_on_a_known_example_and_empty_masks():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert float(aggregate(per_token, mask, "token_mean")) == pytest.approx(7 / 3)
    assert float(aggregate(per_token, mask, "seq_mean_token_mean")) == pytest.approx((1.5 + 4) / 2)
    assert float(aggregate(per_token, mask, "seq_mean_token_sum_norm")) == pytest.approx((3 / 3 + 4 / 3) / 2)
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        assert float(aggregate(per_token, torch.zeros_like(mask), mode)) == 0.0
        assert float(aggregate(torch.zeros(0, 0), torch.zeros(0, 0), mode)) == 0.0


@given(st.lists(st.floats(-5, 0, allow_nan=False), min_size=1, max_size=10),
       st.lists(st.floats(-5, 0, allow_nan=False), min_size=1, max_size=10))
def test_kl_estimators(lp, ref):
    n = min(len(lp), len(ref))
    a, b = torch.tensor(lp[:n]), torch.tensor(ref[:n])
    assert torch.all(kl_penalty(a, b, "k2") >= 0) and torch.all(kl_penalty(a, b, "k3") >= -1e-6)
    assert torch.allclose(kl_penalty(a, a, "k3"), torch.zeros(n)) and torch.allclose(kl_penalty(a, a, "k1"), torch.zeros(n))


def test_truncated_importance_weights_and_entropy():
    w = truncated_importance_weights(torch.tensor([0.0, 1.0, -1.0]), torch.tensor([0.0, 0.0, 0.0]), cap=2.0)
    assert torch.allclose(w, torch.tensor([1.0, 2.0, math.exp(-1)]))
    uniform = entropy_from_logits(torch.zeros(2, 8))
    assert torch.allclose(uniform, torch.full((2,), math.log(8)))


@given(st.lists(st.integers(1, 300), max_size=40), st.integers(1, 600))
def test_micro_batches_cover_every_sample_once_within_budget(lengths, budget):
    from ctu.train.update import micro_batches

    batches = micro_batches(lengths, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= budget
    spans = sorted((min(lengths[i] for i in b), max(lengths[i] for i in b)) for b in batches)
    assert all(hi <= lo for (_, hi), (lo, _) in itertools.pairwise(spans)), "a row padded past another micro-batch's"


def test_micro_batches_pad_rows_only_to_lengths_near_their_own():
    """Rows packed in the order the episodes finished padded each short one to a long neighbour: one quickstart
    update (40 rows of 376-610 tokens over a 290-token shared prompt, 1024 tokens a micro-batch) computed 9,487
    tokens for 7,927 (16% padding); by length, 8,132 (2.5%) in 13 forwards instead of 15."""
    from ctu.train.update import micro_batches

    lengths = [100, 400] * 8
    batches = micro_batches(lengths, 800)
    assert sum(len(b) * max(lengths[i] for i in b) for b in batches) == sum(lengths)  # no padding at all
    assert len(batches) == 5


@given(st.lists(st.integers(1, 300), max_size=40), st.integers(1, 600), st.integers(0, 300))
def test_micro_batches_count_a_shared_prefix_once(lengths, budget, shared):
    from ctu.train.update import micro_batches

    shared = min([shared, *lengths])  # a prefix common to every row is no longer than the shortest row
    batches = micro_batches(lengths, budget, shared)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        computed = shared + (max(lengths[i] for i in b) - shared) * len(b)
        assert len(b) == 1 or computed <= budget
    assert len(batches) <= len(micro_batches(lengths, budget))  # never more forwards than without sharing


@given(grouped_rewards(), st.lists(st.booleans(), min_size=30, max_size=30),
       st.sampled_from(["grpo", "dr_grpo", "rloo", "reinforce_pp"]))
def test_errored_episodes_leave_the_baseline_and_lone_groups_contribute_nothing(data, flags, name):
    from ctu.rl.advantages import scored_advantages

    rewards, groups = data
    errored = flags[: len(rewards)]
    poisoned = [(-100.0 if bad else r) for r, bad in zip(rewards, errored, strict=True)]  # an errored reward is noise
    adv = scored_advantages(name, poisoned, groups, errored)
    assert not any(errored[i] for i in adv)
    clean = [i for i in range(len(rewards)) if not errored[i]]
    if name == "reinforce_pp":  # one baseline for the whole batch: every scored episode is trained on
        expected = compute_advantages(name, [rewards[i] for i in clean], [groups[i] for i in clean])
        assert sorted(adv) == clean
        for i, e in zip(clean, expected.tolist(), strict=True):
            assert abs(adv[i] - e) <= 1e-4 * max(1.0, abs(e))
        return
    for g in set(groups):
        members = [i for i in clean if groups[i] == g]
        if len(members) < 2:
            assert not any(i in adv for i in members)
        else:
            expected = compute_advantages(name, [rewards[i] for i in members], [g] * len(members))
            for i, e in zip(members, expected.tolist(), strict=True):
                assert abs(adv[i] - e) <= 1e-4 * max(1.0, abs(e))


@given(grouped_rewards(), st.lists(st.booleans(), min_size=30, max_size=30))
def test_rft_trains_on_the_scored_successes_only_with_equal_weight(data, flags):
    """``rft`` (rejection-sampling fine-tuning): an episode that reached the full reward is imitated (advantage 1),
    every other one, and every errored one, is left out of the update: no negative gradient, no baseline."""
    from ctu.rl.advantages import scored_advantages

    rewards, groups = data
    errored = flags[: len(rewards)]
    adv = scored_advantages("rft", rewards, groups, errored)
    assert sorted(adv) == [i for i, (r, bad) in enumerate(zip(rewards, errored, strict=True)) if not bad and r >= 1.0]
    assert all(a == 1.0 for a in adv.values())


def test_rft_keeps_a_success_of_a_lone_sample():
    assert scored_advantages_of("rft", [1.0, 0.0, 0.999], ["a", "b", "c"]) == {0: 1.0}


def scored_advantages_of(name, rewards, groups):
    from ctu.rl.advantages import scored_advantages

    return scored_advantages(name, rewards, groups, [False] * len(rewards))
