"""Properties of ``policy_update`` itself (tiny model, CPU): what one update means, independent of packing."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ctu.config.schema import load_config
from ctu.rl.losses import aggregate, aggregation_weights
from ctu.train.policy import build_policy
from ctu.train.update import policy_update, split_episodes, to_sample

AGGREGATIONS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


def samples(seed: int = 0, n: int = 6):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [1] + [rng.randrange(3, 200) for _ in range(rng.randrange(3, 9))]
        response = [rng.randrange(3, 200) for _ in range(rng.randrange(2, 12))]
        mask = [int(rng.random() < 0.8) for _ in response]
        mask[0] = 1
        lps = [-rng.random() * 3 for _ in response]
        out.append(to_sample(prompt, response, mask, lps, advantage=(-1) ** i * (0.5 + i / 4)))
    return out


def run_update(overrides, batch, seed=0, lr=0.05):
    cfg = load_config(None, ["model.path=tiny-random", "trainer.grad_clip=1000000.0", *overrides])
    torch.manual_seed(0)
    policy = build_policy(cfg, device="cpu")
    with torch.no_grad():  # move off the reference so that KL and ratios are not trivially 0 / 1
        g = torch.Generator().manual_seed(1)
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    opt = torch.optim.SGD(policy.trainable_parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    stats = policy_update(policy, opt, sched, batch, cfg.trainer, temperature=0.9, seed=seed)
    delta = {n: p.detach() - before[n] for n, p in policy.model.named_parameters() if p.requires_grad}
    return stats, delta, opt, sched


def assert_rel_close(a: float, b: float, rtol: float = 1e-4):
    assert abs(a - b) <= rtol * max(abs(a), abs(b), 1e-6), (a, b)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("kl", [0.0, 0.3])
def test_loss_gradients_and_stats_do_not_depend_on_the_micro_batch_budget(aggregation, kl):
    batch = samples()
    common = [f"trainer.loss_aggregation={aggregation}", f"trainer.kl_coef={kl}", "trainer.entropy_coef=0.01"]
    one, d_one, _, _ = run_update([*common, "trainer.micro_batch_tokens=100000"], batch)
    many, d_many, _, _ = run_update([*common, "trainer.micro_batch_tokens=20"], batch)
    for key in ("loss", "pg_loss", "kl", "entropy", "clip_fraction", "grad_norm", "trained_tokens"):
        assert_rel_close(one[key], many[key])
    if kl:
        assert one["kl"] > 0
    scale = max(float(d.abs().max()) for d in d_one.values())
    for name in d_one:
        torch.testing.assert_close(d_one[name], d_many[name], rtol=1e-4, atol=1e-5 * scale)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=9), min_size=1, max_size=6),
       st.sampled_from(AGGREGATIONS), st.integers(1, 4))
def test_aggregation_weights_sum_over_any_split_to_the_batch_aggregate(masks, mode, parts):
    width = max(len(m) for m in masks)
    per_token = torch.randn(len(masks), width)
    padded = torch.zeros(len(masks), width)
    for i, m in enumerate(masks):
        padded[i, : len(m)] = torch.tensor(m, dtype=torch.float)
    expected = aggregate(per_token, padded, mode, norm_length=width)
    weights = aggregation_weights([torch.tensor(m, dtype=torch.float) for m in masks], mode, norm_length=width)
    rows = list(range(len(masks)))
    total = sum(float((per_token[i, : len(masks[i])] * weights[i]).sum())
                for chunk in (rows[k::parts] for k in range(parts)) for i in chunk)
    assert abs(total - float(expected)) <= 1e-5 * max(1.0, abs(float(expected)))


def test_mini_batches_are_optimizer_steps_over_episodes_and_the_scheduler_counts_them():
    batch = samples(n=8)
    stats, _, opt, sched = run_update(["trainer.mini_batches=4", "trainer.ppo_epochs=2",
                                       "trainer.micro_batch_tokens=100000"], batch)
    assert stats["updates"] == 8
    assert sched.last_epoch == 8  # one scheduler step per optimizer step that happened


def check_split(split, n: int, parts: int, seed: int) -> None:
    """What ``split_episodes`` promises: a partition into near-equal parts, decided by the run's seed, and
    reshuffled every epoch (each call draws on the same ``rng``)."""
    rng = random.Random(seed)
    first = split(n, parts, rng)
    assert sorted(i for p in first for i in p) == list(range(n))
    assert len(first) == min(parts, n) and max(map(len, first)) - min(map(len, first)) <= 1
    assert split(n, parts, random.Random(seed)) == first  # the run's seed decides
    if n >= 8 and parts >= 2:  # the next epochs reshuffle (held for every n, parts, seed drawn here)
        assert any(split(n, parts, rng) != first for _ in range(3))


@given(st.integers(1, 40), st.integers(1, 8), st.integers(0, 1000))
def test_split_episodes_partitions_and_reshuffles_with_the_seed(n, parts, seed):
    check_split(split_episodes, n, parts, seed)


def _no_shuffle(n, parts, rng):
    return split_episodes(n, parts, random.Random(0))  # ignores the run's rng: every epoch the same split


def _global_random(n, parts, rng):
    return split_episodes(n, parts, random)  # the process's RNG, not the run's seed


def _uneven(n, parts, rng):
    out = split_episodes(n, parts, rng)
    return [out[0] + out[1], *out[2:]] if len(out) > 1 else out  # one part too many episodes


@pytest.mark.parametrize("broken", [_no_shuffle, _global_random, _uneven])
def test_the_split_property_fails_on_broken_splits(broken):
    random.seed(123)
    with pytest.raises(AssertionError):
        for seed in range(5):
            check_split(broken, 16, 4, seed)


def test_epochs_reshuffle_the_episodes():
    rng = random.Random(0)
    splits = [split_episodes(16, 4, rng) for _ in range(4)]
    assert any(s != splits[0] for s in splits[1:])


def test_nothing_to_train_is_a_recorded_step_not_a_crash():
    empty = [to_sample([1, 5], [7, 3], [0, 0], [0.0, 0.0], 1.0)]
    for batch in ([], empty):
        stats, delta, _, sched = run_update([], batch)
        assert stats["updates"] == 0 and stats["loss"] == 0.0 and stats["trained_tokens"] == 0
        assert sched.last_epoch == 1  # the schedule counts planned steps (one here), trained or not
        assert all(float(d.abs().max()) == 0 for d in delta.values())


def test_the_entropy_bonus_changes_the_gradient():
    batch = [to_sample(s.ids[:2], s.ids[2:], s.mask[1:], s.sampler_logprobs[1:], 0.0) for s in samples()]
    _, without, _, _ = run_update(["trainer.entropy_coef=0.0"], batch)
    _, with_bonus, _, _ = run_update(["trainer.entropy_coef=0.5"], batch)
    assert max(float(d.abs().max()) for d in without.values()) == 0  # zero advantages: no policy gradient
    assert max(float(d.abs().max()) for d in with_bonus.values()) > 0


def test_an_on_policy_update_skips_the_scoring_pass_and_moves_the_weights_the_same(monkeypatch):
    """One epoch and one optimizer step without dropout: the gradient pass's own (detached) logprobs are the old
    policy's, so the separate eval-mode scoring forward is skipped, with the same update and stats."""
    import ctu.train.update as update

    batch = samples()
    common = ["trainer.entropy_coef=0.01", "trainer.micro_batch_tokens=40"]
    calls = []
    real = update.score_logprobs
    monkeypatch.setattr(update, "score_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    fast, d_fast, _, _ = run_update(common, batch)
    assert calls == []  # no scoring forward at all
    monkeypatch.setattr(update, "on_policy", lambda *a: False)
    scored, d_scored, _, _ = run_update(common, batch)
    assert calls  # the old path scores every micro-batch
    for key in ("loss", "pg_loss", "entropy", "grad_norm", "trained_tokens", "sampler_trainer_logprob_diff"):
        assert_rel_close(fast[key], scored[key])
    assert fast["clip_fraction"] == 0.0
    scale = max(float(d.abs().max()) for d in d_fast.values())
    for name in d_fast:
        torch.testing.assert_close(d_fast[name], d_scored[name], rtol=1e-4, atol=1e-5 * scale)
    calls.clear()
    monkeypatch.undo()
    monkeypatch.setattr(update, "score_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    run_update([*common, "trainer.mini_batches=2"], batch)  # the second optimizer step is off policy
    assert calls


def test_with_a_kl_penalty_on_policy_scores_only_the_reference(monkeypatch):
    """KL in the loss needs the reference's logprobs, not a second scoring of the policy: one scoring forward per
    micro-batch (the reference's), and the same update as with the policy scored too."""
    import ctu.train.update as update

    batch = samples()
    common = ["trainer.kl_coef=0.3", "trainer.micro_batch_tokens=40"]
    calls = []
    real = update.score_logprobs
    monkeypatch.setattr(update, "score_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    fast, d_fast, _, _ = run_update(common, batch)
    n_fast = len(calls)
    monkeypatch.setattr(update, "on_policy", lambda *a: False)
    scored, d_scored, _, _ = run_update(common, batch)
    assert n_fast and len(calls) - n_fast == 2 * n_fast  # policy + reference when off policy
    for key in ("loss", "pg_loss", "kl", "entropy", "grad_norm"):
        assert_rel_close(fast[key], scored[key])
    assert fast["kl"] > 0
    scale = max(float(d.abs().max()) for d in d_fast.values())
    for name in d_fast:
        torch.testing.assert_close(d_fast[name], d_scored[name], rtol=1e-4, atol=1e-5 * scale)


def prompt_shared_samples(n: int = 8, seed: int = 0):
    """Episodes shaped like the quickstart's: a long system prompt common to all, then short turns."""
    rng = random.Random(seed)
    system = [1] + [rng.randrange(3, 200) for _ in range(60)]
    out = []
    for i in range(n):
        prompt = system + [rng.randrange(3, 200) for _ in range(rng.randrange(3, 8))]
        response = [rng.randrange(3, 200) for _ in range(rng.randrange(4, 12))]
        out.append(to_sample(prompt, response, [1] * len(response), [-1.0] * len(response), advantage=(-1) ** i))
    return out


def test_a_shared_prompt_is_counted_once_when_packing_and_the_update_is_the_same():
    from ctu.train.update import pack

    batch = prompt_shared_samples()
    cfg = load_config(None, ["model.path=tiny-random"])
    policy = build_policy(cfg, device="cpu")
    budget = 160  # ~2 rows of ~80 tokens each without sharing; the 61-token prompt counted once: 6+ rows
    packed = pack(policy.model, batch, budget, grad=True, training=True, share=True)
    assert len(packed) <= 2 < len(batch) // 2  # the old rows x longest packing needs 4+ micro-batches here
    assert len(pack(policy.model, batch, budget, grad=True, training=True)) >= 4  # off by default (memory)
    for b in packed:
        longest = max(len(batch[i].ids) for i in b)
        assert 61 + (longest - 61) * len(b) <= budget or len(b) == 1
    one, d_one, _, _ = run_update(["trainer.micro_batch_tokens=100000"], batch)
    packed_stats, d_packed, _, _ = run_update([f"trainer.micro_batch_tokens={budget}", "trainer.pack_shared_prefix=true"],
                                              batch)
    for key in ("loss", "pg_loss", "entropy", "grad_norm", "trained_tokens"):
        assert_rel_close(one[key], packed_stats[key])
    scale = max(float(d.abs().max()) for d in d_one.values())
    for name in d_one:
        torch.testing.assert_close(d_one[name], d_packed[name], rtol=1e-4, atol=1e-5 * scale)


def test_packing_shares_nothing_where_the_pass_cannot_share():
    from ctu.engines.hf.hf_api import enable_checkpointing
    from ctu.train.update import pack

    batch = prompt_shared_samples()
    cfg = load_config(None, ["model.path=tiny-random"])
    policy = build_policy(cfg, device="cpu")
    enable_checkpointing(policy.model)
    plain = [len(b) for b in pack(policy.model, batch, 160, grad=True, training=True, share=True)]
    assert max(plain) <= 2  # checkpointed gradient passes run every row whole
    assert len(pack(policy.model, batch, 160, grad=False, training=False, share=True)) <= 2  # scoring still shares


def test_the_lr_schedule_counts_every_planned_optimizer_step_even_with_fewer_episodes():
    """trainer.mini_batches=3 over 2 episodes: 2 optimizer steps, and the scheduler still advances 3 (one per
    planned step), so the learning-rate schedule of later steps does not depend on how many episodes came."""
    stats, _, _, sched = run_update(["trainer.mini_batches=3", "trainer.tasks_per_step=3",
                                     "trainer.samples_per_task=2"], samples(n=2))
    assert stats["updates"] == 2 and stats["planned_updates"] == 3
    assert sched.last_epoch == 3
