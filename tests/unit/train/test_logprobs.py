"""Chunked logprobs/entropy equal a full-logits reference (values and gradients), the entropy carries a
gradient, and no fp32 tensor as large as [rows, positions, vocab] is ever allocated."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ctu.train.policy import token_logprobs

VOCAB = 512


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=0.2, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def batch(prefix=24, suffixes=(9, 14, 5)):
    g = torch.Generator().manual_seed(3)
    head = torch.randint(3, VOCAB, (prefix,), generator=g).tolist()
    rows = [head + torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in suffixes]
    width = max(map(len, rows))
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    needed = torch.zeros((len(rows), width - 1))
    for i, r in enumerate(rows):
        ids[i, : len(r)], attn[i, : len(r)] = torch.tensor(r), 1
        needed[i, prefix - 1: len(r) - 1] = 1
    return ids, attn, needed


def reference(model, ids, attn, temperature):
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float() / temperature
    logp = torch.log_softmax(logits, -1)
    return logp.gather(-1, ids[:, 1:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


def close(actual, expected, msg=None):
    scale = max(1.0, float(expected.detach().abs().max()))
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5 * scale, msg=msg)


def grads_of(model, loss):
    model.zero_grad()
    loss.backward()
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return out


@pytest.mark.parametrize("chunk", [1, 3, 7, None, 10_000])
def test_chunked_logprobs_and_entropy_equal_the_full_reference_with_gradients(model, chunk):
    ids, attn, needed = batch()
    lp, ent = token_logprobs(model, ids, attn, temperature=0.7, with_entropy=True, needed=needed, chunk=chunk)
    ref_lp, ref_ent = reference(model, ids, attn, 0.7)
    close(lp * needed, ref_lp * needed)
    close(ent * needed, ref_ent * needed)
    ours = grads_of(model, ((lp + 0.3 * ent) * needed).sum())
    theirs = grads_of(model, ((ref_lp + 0.3 * ref_ent) * needed).sum())
    assert set(ours) == set(theirs)
    for name, grad in theirs.items():
        close(ours[name], grad, msg=name)


def test_the_entropy_carries_a_gradient(model):
    ids, attn, needed = batch()
    _, ent = token_logprobs(model, ids, attn, with_entropy=True, needed=needed)
    assert ent.requires_grad
    grads = grads_of(model, (ent * needed).sum())
    assert any(float(g.abs().max()) > 0 for g in grads.values())
    with torch.no_grad():
        assert not token_logprobs(model, ids, attn, with_entropy=True, needed=needed)[1].requires_grad


class LargestFloat(TorchDispatchMode):
    """The largest number of elements of any fp32 tensor over the vocabulary (logits-like) an op returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() >= 3 and t.shape[-1] == VOCAB:
                self.largest = max(self.largest, t.numel())
        return out


def test_no_full_fp32_logits_in_forward_or_backward(model):
    ids, attn, needed = batch(prefix=24, suffixes=(60, 70, 65))
    rows, positions = ids.shape[0], int(needed.any(0).sum())
    chunk = 4
    mode = LargestFloat()
    with mode:
        lp, ent = token_logprobs(model, ids, attn, with_entropy=True, needed=needed, chunk=chunk)
        ((lp - 0.1 * ent) * needed).sum().backward()
    model.zero_grad()
    assert positions > 8 * chunk
    assert mode.largest <= rows * chunk * VOCAB  # one chunk of logits at a time
    assert mode.largest < rows * positions * VOCAB / 4


def test_a_models_logit_budget_bounds_its_chunks_with_the_same_numbers(model):
    """``trainer.logit_chunk_mib`` reaches every pass as the model's budget (``LOGIT_BUDGET_ATTR``): chunks of at
    most that many fp32 logits, in forward and backward, and the same logprobs, entropies and gradients."""
    from ctu.train.logprobs import LOGIT_BUDGET_ATTR

    ids, attn, needed = batch(prefix=24, suffixes=(60, 70, 65))
    rows = ids.shape[0]
    expected = token_logprobs(model, ids, attn, with_entropy=True, needed=needed)
    grads = grads_of(model, ((expected[0] - 0.1 * expected[1]) * needed).sum())
    setattr(model, LOGIT_BUDGET_ATTR, rows * 4 * VOCAB)
    try:
        mode = LargestFloat()
        with mode:
            lp, ent = token_logprobs(model, ids, attn, with_entropy=True, needed=needed)
            chunked = grads_of(model, ((lp - 0.1 * ent) * needed).sum())
    finally:
        delattr(model, LOGIT_BUDGET_ATTR)
    assert mode.largest <= rows * 4 * VOCAB < rows * int(needed.any(0).sum()) * VOCAB
    close(lp, expected[0])
    close(ent, expected[1])
    for name, g in grads.items():
        close(chunked[name], g, msg=name)


def test_build_policy_gives_the_model_trainer_logit_chunk_mib():
    from ctu.config.schema import load_config
    from ctu.train.logprobs import LOGIT_BUDGET, LOGIT_BUDGET_ATTR
    from ctu.train.policy import build_policy

    default = build_policy(load_config(None, ["model.path=tiny-random"]), device="cpu")
    assert getattr(default.model, LOGIT_BUDGET_ATTR) == LOGIT_BUDGET  # 128 MiB of fp32 logits
    small = build_policy(load_config(None, ["model.path=tiny-random", "trainer.logit_chunk_mib=32"]), device="cpu")
    assert getattr(small.model, LOGIT_BUDGET_ATTR) == 32 * 2**20 // 4


def saved_logit_elements(model, ids, attn, needed, chunk):
    """(lm_head calls over one forward and backward, fp32 vocab-sized elements autograd saves for backward, each
    tensor counted once however many ops save it)."""
    calls, saved = [0], {}

    def count(*_):
        calls[0] += 1

    def pack(t):
        if t.dtype == torch.float32 and t.dim() >= 3 and t.shape[-1] == VOCAB:
            saved[t.untyped_storage().data_ptr()] = t.numel()
        return t

    hook = model.get_output_embeddings().register_forward_hook(count)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp, ent = token_logprobs(model, ids, attn, with_entropy=True, needed=needed, chunk=chunk)
        grads_of(model, ((lp - 0.1 * ent) * needed).sum())
    finally:
        hook.remove()
    return calls[0], sum(saved.values())


def test_one_chunk_keeps_its_logits_for_backward_and_several_recompute_theirs(model):
    """Recomputing a chunk's logits in backward only bounds memory when there are several chunks: with one, its
    backward holds as much either way, so it keeps them (one lm_head call, not two, for the same gradients);
    with several, each backward recomputes its own and nothing vocab-sized is kept between them."""
    ids, attn, needed = batch(prefix=24, suffixes=(60, 70, 65))
    rows, positions = ids.shape[0], int(needed.any(0).sum())
    calls, saved = saved_logit_elements(model, ids, attn, needed, chunk=positions)
    assert calls == 1
    assert saved <= 2 * rows * positions * VOCAB  # the chunk's log-softmax and its exp (the entropy)
    calls, saved = saved_logit_elements(model, ids, attn, needed, chunk=8)
    chunks = -(-positions // 8)
    assert calls == 2 * chunks
    assert saved <= 2 * rows * 8 * VOCAB  # the recompute's own, one chunk at a time


def test_the_head_gets_each_chunk_contiguous(model):
    """A chunk of several rows is a strided slice of the hidden states; torch's CPU bf16 ``linear`` expands the head's
    weight to a copy per row for such an input (tests/unit/engines/hf/test_head_memory.py), so a bf16 model's
    scoring passes hand the head each chunk as a contiguous tensor."""
    ids, attn, needed = batch()
    seen = []
    hook = model.get_output_embeddings().register_forward_pre_hook(lambda m, args: seen.append(args[0].is_contiguous()))
    try:
        token_logprobs(model, ids, attn, needed=needed, chunk=3)
    finally:
        hook.remove()
    assert len(seen) > 1 and all(seen)
