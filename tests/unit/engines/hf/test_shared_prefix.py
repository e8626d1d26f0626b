"""Shared-prefix forward passes equal plain ones: logprobs, gradients, and generated tokens."""

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ctu.engines.base import SamplingParams
from ctu.engines.hf.engine import HFEngine
from ctu.engines.hf.hf_api import disable_checkpointing, enable_checkpointing
from ctu.engines.hf.shared_prefix import MIN_SHARED, common_prefix_length
from ctu.train.policy import token_logprobs

VOCAB = 96


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=0.3, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@given(st.lists(st.lists(st.integers(0, 3), max_size=8), max_size=5))
def test_common_prefix_length_is_the_longest_shared_prefix(rows):
    n = common_prefix_length(rows)
    assert all(r[:n] == rows[0][:n] for r in rows)
    if rows and n < min(len(r) for r in rows):
        assert len({r[n] for r in rows}) > 1


def batch(prefix_len: int, suffixes: list[int], seed: int = 0):
    """Right-padded ids, attention mask and a loss mask on each row's last ``k`` tokens (suffix lengths)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, VOCAB) for _ in range(prefix_len)]
    rows = [prefix + [rng.randrange(3, VOCAB) for _ in range(n)] for n in suffixes]
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    needed = torch.zeros((len(rows), width - 1))
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
        needed[i, len(r) - 1 - min(4, len(r) - 1): len(r) - 1] = 1  # score the last tokens
    return ids, attn, needed


def assert_close(actual, expected, rel=1e-5, msg=None):
    """Equal up to float32 rounding, relative to the magnitude of the values compared: the absolute slack is
    ``rel`` times the largest magnitude in ``expected`` (a sum's rounding scales with its terms, not with the
    element), so near-zero elements of a large tensor do not demand digits fp32 never had."""
    expected = expected.detach()
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(actual.detach(), expected, rtol=rel * 10, atol=rel * max(scale, 1e-6), msg=msg)


def assert_same_greedy(model, prompt, tokens, reference, rel=1e-4):
    """Greedy ``tokens`` equal ``reference`` unless they part at a near tie: where they first differ, the two
    candidates' logits (recomputed for ``reference``) are within float rounding of each other. Kernels differ
    between CPUs, so an exact top-1 can flip only where two logits are that close."""
    if list(tokens) == list(reference):
        return
    k = next(i for i, (a, b) in enumerate(zip(tokens, reference, strict=False)) if a != b)
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(reference[:k])])).logits[0, -1].float()
    gap = float(logits[reference[k]] - logits[tokens[k]])
    assert abs(gap) <= rel * float(logits.abs().max()), f"greedy tokens part at {k} with a logit gap of {gap}"


def plain_logprobs(model, ids, attn):
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


@pytest.mark.parametrize("prefix_len,suffixes", [(40, [3, 9, 5, 12]), (MIN_SHARED, [2, 2]), (5, [7, 8]),
                                                 (30, [6]), (24, [0, 0, 0])])
def test_logprobs_and_gradients_equal_a_plain_forward(model, prefix_len, suffixes):
    ids, attn, needed = batch(prefix_len, suffixes)
    model.zero_grad()
    shared, _ = token_logprobs(model, ids, attn, needed=needed)
    (shared * needed).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    ref = plain_logprobs(model, ids, attn)
    (ref * needed).sum().backward()
    assert_close(shared * needed, ref * needed)
    assert (shared[:, needed.sum(0) == 0] == 0).all()  # positions no row scores are not computed
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert_close(grads[name], p.grad, msg=name)
    model.zero_grad()


def test_identical_rows_score_every_needed_position(model):
    ids, attn, _ = batch(30, [4, 4], seed=1)
    ids[1] = ids[0]
    needed = torch.ones((2, ids.shape[1] - 1))  # the whole sequence: nothing can be shared
    with torch.no_grad():
        out, entropy = token_logprobs(model, ids, attn, needed=needed, with_entropy=True)
        assert_close(out, plain_logprobs(model, ids, attn))
    assert (entropy > 0).all()


def test_gradient_checkpointing_falls_back_to_a_plain_pass(model):
    ids, attn, needed = batch(40, [3, 6])
    enable_checkpointing(model)
    model.train()
    try:
        out, _ = token_logprobs(model, ids, attn, needed=needed)
        with torch.no_grad():
            model.eval()
            ref = plain_logprobs(model, ids, attn)
        assert_close(out * needed, ref * needed)
    finally:
        disable_checkpointing(model)
        model.eval()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_generation_with_a_shared_prefix_equals_one_prompt_at_a_time(model, temperature):
    engine = HFEngine(model, tokenizer=None)
    rng = random.Random(3)
    prefix = [rng.randrange(3, VOCAB) for _ in range(MIN_SHARED + 10)]
    prompts = [prefix + [rng.randrange(3, VOCAB) for _ in range(n)] for n in (1, 7, 3, 12)]
    params = SamplingParams(temperature=temperature, max_tokens=6, seed=5)
    together = engine.generate_sync(prompts, params)
    for prompt, (c,) in zip(prompts, together, strict=True):
        # one row alone shares nothing: a plain left-padded prefill
        ids = torch.tensor([prompt + list(c.token_ids)])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:-1].float()
        scaled = logits / temperature if temperature > 0 else logits
        ref = torch.log_softmax(scaled, -1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        assert_close(torch.tensor(c.logprobs), ref, rel=1e-4)
        if temperature == 0:
            (alone,) = engine.generate_sync([prompt], params)[0]
            assert_same_greedy(model, prompt, c.token_ids, alone.token_ids)
