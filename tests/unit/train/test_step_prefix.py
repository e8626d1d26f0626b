"""An optimizer step runs its rows' shared prompt once, for all its micro-batches, with the same gradients.

The quickstart's episodes are 60% system prompt (290 of ~490 tokens): a step that ran it in every row spent most
of its compute on a prefix whose only effect is through attention. These tests count what the decoder body
computes in one step and compare the step's weight change with one that runs every row whole.
"""

import pytest
import torch

import ctu.engines.hf.shared_prefix as shared_prefix
import ctu.train.update as update
from ctu.config.schema import load_config
from ctu.train.policy import build_policy
from tests.unit.train.test_update_semantics import assert_rel_close, prompt_shared_samples, run_update

PROMPT = 61  # prompt_shared_samples' common prompt; the rows' own turns follow it
BUDGET = 160  # a few rows a micro-batch: several micro-batches a step


@pytest.fixture
def whole_rows(monkeypatch):
    """Every row computed whole: no step prefix and no sharing inside a micro-batch (the reference)."""
    def off():
        monkeypatch.setattr(update, "step_prefix_length", lambda *a, **k: 0)
        monkeypatch.setattr(shared_prefix, "MIN_SHARED", 10**9)
    return off


def body_tokens(policy) -> list[int]:
    """Token positions the decoder body computes, pass by pass (its embedding layer's inputs)."""
    seen: list[int] = []
    embed = policy.model.get_base_model().get_input_embeddings()
    embed.register_forward_hook(lambda mod, args, out: seen.append(args[0].numel()))
    return seen


def sft_step(overrides=(), batch=None):
    from ctu.train.update import sft_update

    cfg = load_config(None, ["model.path=tiny-random", *overrides])
    torch.manual_seed(0)
    policy = build_policy(cfg, device="cpu")
    seen = body_tokens(policy)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    opt = torch.optim.SGD(policy.trainable_parameters(), lr=0.05)
    batch = batch or prompt_shared_samples()
    loss = sft_update(policy, opt, batch, BUDGET)
    delta = {n: p.detach() - before[n] for n, p in policy.model.named_parameters() if p.requires_grad}
    return loss, delta, seen, batch


def assert_same_change(a, b):
    scale = max(float(d.abs().max()) for d in a.values())
    assert scale > 0
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5 * scale)


def test_a_supervised_step_runs_the_shared_prompt_once_for_all_its_micro_batches():
    loss, _, seen, batch = sft_step()
    rows = sum(len(s.ids) - PROMPT for s in batch)
    assert len(seen) >= 3  # the prompt's pass and several micro-batches
    assert seen[0] == PROMPT  # the prompt, once, before the micro-batches
    # every micro-batch runs only its rows' own tokens (padded to its longest): the prompt is not run again
    assert sum(seen[1:]) < rows + 12 * (len(seen) - 1)
    assert sum(seen) < 0.6 * sum(len(s.ids) for s in batch)  # against every row run whole


def test_a_supervised_step_with_the_prompt_run_once_moves_the_weights_as_whole_rows_do(whole_rows):
    loss, delta, _, _ = sft_step()
    whole_rows()
    whole_loss, whole_delta, seen, batch = sft_step()
    assert sum(seen) >= sum(len(s.ids) for s in batch) and PROMPT not in seen  # the reference ran rows whole
    assert_rel_close(loss, whole_loss)
    assert_same_change(delta, whole_delta)


@pytest.mark.parametrize("extra", [[], ["trainer.kl_coef=0.3", "trainer.entropy_coef=0.01"],
                                   ["trainer.ppo_epochs=2", "trainer.mini_batches=2"]])
def test_a_policy_update_with_the_prompt_run_once_moves_the_weights_as_whole_rows_do(extra, whole_rows):
    batch = prompt_shared_samples()
    common = [f"trainer.micro_batch_tokens={BUDGET}", *extra]
    stats, delta, _, _ = run_update(common, batch)
    whole_rows()
    whole_stats, whole_delta, _, _ = run_update(common, batch)
    for key in ("loss", "pg_loss", "kl", "entropy", "grad_norm", "clip_fraction"):
        assert_rel_close(stats[key], whole_stats[key])
    assert_same_change(delta, whole_delta)


def test_rows_without_a_common_prompt_run_whole():
    batch = prompt_shared_samples()
    for i, row in enumerate(batch):  # every row parts from the others at its second token
        row.ids[1] = (row.ids[1] + i) % 200
    loss, _, seen, _ = sft_step(batch=batch)
    assert PROMPT not in seen  # no pass of the prompt alone: every micro-batch runs its rows whole
    assert loss > 0
