"""``trainer.sft_replay``: gold demonstrations replayed in every RL update as successful episodes (PPO-ptx's
supervised term, written as a policy-gradient row with a fixed advantage)."""

import dataclasses

import pytest
import torch

from ctu.config.schema import ConfigError, load_config
from ctu.train.demos import replayed_demos
from ctu.train.policy import build_policy, token_logprobs
from ctu.train.update import collate, policy_update, to_sample

DEMO = to_sample([1, 5, 9, 13], [21, 34, 55, 89, 144], [1, 1, 0, 1, 1], [0.0] * 5, 0.0)


def gradients(cfg, fn):
    torch.manual_seed(0)
    policy = build_policy(cfg, device="cpu")
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    fn(policy)
    return torch.cat([p.grad.flatten() for p in policy.trainable_parameters()])


class Keep(torch.optim.SGD):
    """An optimizer whose step keeps the gradients (policy_update zeroes them after the step)."""

    def step(self, closure=None):
        self.kept = [p.grad.clone() for g in self.param_groups for p in g["params"]]

    def zero_grad(self, set_to_none=True):
        if not hasattr(self, "kept"):
            super().zero_grad(set_to_none)


def test_a_replayed_demo_is_the_supervised_loss_scaled_by_its_advantage():
    cfg = load_config(None, ["model.path=tiny-random", "trainer.grad_clip=1000000.0"])
    demo = replayed_demos([DEMO], 1, advantage=0.7, seed=0)[0]

    def update(policy):
        opt = Keep(policy.trainable_parameters(), lr=0.0)
        policy_update(policy, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0), [demo], cfg.trainer, 1.0)
        for p, g in zip(policy.trainable_parameters(), opt.kept, strict=True):
            p.grad = g

    def supervised(policy):
        b = collate([DEMO], "cpu")
        logp, _ = token_logprobs(policy.model, b["ids"], b["attn"], needed=b["mask"])
        (-(logp * b["mask"]).sum() / b["mask"].sum() * 0.7).backward()

    rl, sft = gradients(cfg, update), gradients(cfg, supervised)
    assert torch.allclose(rl, sft, rtol=1e-4, atol=1e-7 * float(sft.abs().max()))


def test_a_replayed_demo_counts_no_sampler_mismatch():
    """Its sampler logprobs are unknown (no engine sampled it): the mismatch stat covers sampled episodes only."""
    cfg = load_config(None, ["model.path=tiny-random"])
    torch.manual_seed(0)
    policy = build_policy(cfg, device="cpu")
    opt = torch.optim.SGD(policy.trainable_parameters(), lr=0.0)
    stats = policy_update(policy, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0),
                          replayed_demos([DEMO], 1, advantage=1.0, seed=0), cfg.trainer, 1.0)
    assert stats["sampler_trainer_logprob_diff"] == 0.0 and stats["trained_tokens"] == 4


def test_draws_are_seeded_without_replacement_and_marked():
    pool = [dataclasses.replace(DEMO, ids=DEMO.ids + [i]) for i in range(10)]
    first, again = replayed_demos(pool, 4, 1.5, seed=3), replayed_demos(pool, 4, 1.5, seed=3)
    assert [s.ids for s in first] == [s.ids for s in again]
    assert len({tuple(s.ids) for s in first}) == 4
    assert {s.advantage for s in first} == {1.5} and all(s.replayed for s in first)
    assert not any(s.replayed for s in pool) and {s.advantage for s in pool} == {0.0}  # the pool is not touched
    assert len(replayed_demos(pool, 50, 1.0, seed=0)) == 10
    assert [s.ids for s in replayed_demos(pool, 4, 1.5, seed=4)] != [s.ids for s in first]


@pytest.mark.parametrize("overrides, field", [(["trainer.sft_replay=-1"], "trainer.sft_replay"),
                                              (["trainer.sft_replay=4", "trainer.sft_replay_advantage=0"],
                                               "trainer.sft_replay_advantage")])
def test_bad_replay_settings_are_one_line_errors_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as err:
        load_config(None, ["model.path=tiny-random", *overrides])
    assert "\n" not in str(err.value)


def test_a_run_that_replays_demos_says_so_once_at_start():
    """The quickstart replays gold demos in every update: a user who sets trainer.sft_steps=0 for "RL alone" must
    be told that demonstrations still reach the update, and how to turn them off."""
    from ctu.train.demos import replay_note

    cfg = load_config("configs/quickstart.yaml", ["trainer.sft_steps=0"])
    note = replay_note(cfg.trainer)
    assert cfg.trainer.sft_replay > 0 and note.count("\n") == 0 and "1.5" in note
    assert f"trainer.sft_replay={cfg.trainer.sft_replay}:" in note
    assert "trainer.sft_replay=0" in note  # how to get RL alone
    assert replay_note(load_config("configs/quickstart.yaml", ["trainer.sft_replay=0"]).trainer) is None
