import asyncio

import pytest
import torch

from ctu.engines.base import SamplingParams
from ctu.engines.hf.engine import HFEngine
from ctu.engines.hf.models import load_model, load_tokenizer


@pytest.fixture(scope="module")
def engine():
    torch.manual_seed(0)
    return HFEngine(load_model("tiny-random"), load_tokenizer("tiny-random"), max_batch_size=4)


PROMPTS = [[1, 520, 33, 88, 2, 198, 1, 520], [1, 77, 4000], [1, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]


def gen(engine, prompts, **kw):
    return asyncio.run(engine.generate(prompts, SamplingParams(**kw)))


def test_shapes_n_and_empty(engine):
    out = gen(engine, PROMPTS, temperature=1.0, max_tokens=5, n=3, seed=1)
    assert len(out) == 3 and all(len(c) == 3 for c in out)
    for completions in out:
        for c in completions:
            assert len(c.token_ids) == len(c.logprobs) <= 5 and c.finish_reason in ("stop", "length")
            assert all(lp <= 0 for lp in c.logprobs)
    assert gen(engine, [], max_tokens=3) == []
    with pytest.raises(ValueError, match="empty"):
        gen(engine, [[]], max_tokens=3)


def test_greedy_matches_transformers_generate_despite_left_padding(engine):
    out = gen(engine, PROMPTS, temperature=0.0, max_tokens=8)
    for prompt, (c,) in zip(PROMPTS, out, strict=True):
        ref = engine.model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                                    eos_token_id=sorted(engine.eos_ids), pad_token_id=engine.pad_id)
        expected = ref[0, len(prompt):].tolist()
        assert list(c.token_ids) == expected[: len(c.token_ids)]
        assert len(c.token_ids) == len(expected)


def test_seeded_sampling_is_reproducible(engine):
    a = gen(engine, PROMPTS, temperature=1.0, top_p=0.9, max_tokens=6, seed=7)
    b = gen(engine, PROMPTS, temperature=1.0, top_p=0.9, max_tokens=6, seed=7)
    c = gen(engine, PROMPTS, temperature=1.0, top_p=0.9, max_tokens=6, seed=8)
    assert a == b and a != c


def test_logprobs_equal_a_teacher_forced_forward_pass(engine):
    for temperature in (0.0, 0.7):
        out = gen(engine, PROMPTS, temperature=temperature, max_tokens=6, seed=3)
        for prompt, (c,) in zip(PROMPTS, out, strict=True):
            ids = torch.tensor([prompt + list(c.token_ids)], device=engine.model.device)
            with torch.no_grad():
                logits = engine.model(ids).logits[0, len(prompt) - 1:-1].float().cpu()
            scaled = logits / temperature if temperature > 0 else logits
            ref = torch.log_softmax(scaled, -1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
            assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)


def test_stop_tokens_are_included_and_max_tokens_gives_length(engine):
    (first,) = gen(engine, [PROMPTS[0]], temperature=0.0, max_tokens=4)[0]
    stop_at = first.token_ids[1]
    (c,) = gen(engine, [PROMPTS[0]], temperature=0.0, max_tokens=4, stop_token_ids=(stop_at,))[0]
    cut = first.token_ids.index(stop_at) + 1
    assert c.token_ids == first.token_ids[:cut] and c.finish_reason == "stop"
    (d,) = gen(engine, [PROMPTS[0]], temperature=0.0, max_tokens=1)[0]
    assert len(d.token_ids) == 1 and d.finish_reason in ("length", "stop")


def test_update_weights_changes_outputs_and_refuses_peft_names(engine):
    before = gen(engine, PROMPTS, temperature=0.0, max_tokens=5)
    name, param = next((n, p) for n, p in engine.model.named_parameters() if "embed_tokens" in n)
    saved = param.detach().clone()
    try:
        engine.update_weights([(name, torch.randn_like(param) * 0.5)])
        assert gen(engine, PROMPTS, temperature=0.0, max_tokens=5) != before
        with pytest.raises(ValueError, match="base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"):
            engine.update_weights([("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",
                                    torch.zeros(1))])
    finally:
        engine.update_weights([(name, saved)])
    assert gen(engine, PROMPTS, temperature=0.0, max_tokens=5) == before


def test_logprobs_are_the_truncated_distributions_it_sampled_from(engine):
    """With top_p < 1 the logprob is the sampling distribution's: log_softmax(logits / T) renormalised over the
    top-p set, not the untruncated one (the trainer's importance weights divide by it)."""
    temperature, top_p = 0.7, 0.3
    out = gen(engine, PROMPTS, temperature=temperature, top_p=top_p, max_tokens=5, seed=11)
    for prompt, (c,) in zip(PROMPTS, out, strict=True):
        ids = torch.tensor([prompt + list(c.token_ids)], device=engine.model.device)
        with torch.no_grad():
            logits = engine.model(ids).logits[0, len(prompt) - 1:-1].float().cpu() / temperature
        chosen = torch.tensor(c.token_ids)[:, None]
        full = torch.log_softmax(logits, -1).gather(-1, chosen).squeeze(-1)
        probs = torch.softmax(logits, -1)
        sorted_probs, order = probs.sort(-1, descending=True)
        kept = torch.zeros_like(probs).scatter(-1, order, (sorted_probs.cumsum(-1) - sorted_probs <= top_p).float())
        truncated = torch.log(probs * kept / (probs * kept).sum(-1, keepdim=True)).gather(-1, chosen).squeeze(-1)
        assert bool(kept.gather(-1, chosen).all())  # every sampled token lies inside the top-p set
        torch.testing.assert_close(torch.tensor(c.logprobs), truncated, rtol=1e-4, atol=1e-5)
        assert ((truncated - full) > 0.5).all()  # the untruncated one is ~log(1/0.3) lower


def test_per_request_seeds_do_not_depend_on_the_rest_of_the_batch(engine):
    params = SamplingParams(temperature=1.0, max_tokens=6, n=2)
    together = asyncio.run(engine.generate(PROMPTS, params, seeds=[11, 12, 13]))
    alone = [asyncio.run(engine.generate([p], params, seeds=[s]))[0] for p, s in zip(PROMPTS, [11, 12, 13], strict=True)]
    assert [[c.token_ids for c in r] for r in together] == [[c.token_ids for c in r] for r in alone]
    same = asyncio.run(engine.generate([PROMPTS[0], PROMPTS[0]], params, seeds=[11, 99]))
    assert same[0][0].token_ids == together[0][0].token_ids and same[0][0].token_ids != same[1][0].token_ids
    assert together[0][0].token_ids != together[0][1].token_ids  # completion j gets seed + j


def test_every_cpu_generation_gives_the_heap_back(engine, monkeypatch):
    """A call's batch KV is freed when it returns; on CPU the engine trims glibc's heap then, so the holes the KV
    leaves between the stored conversations' KV go back to the OS (the rollout phase was the quickstart's peak)."""
    import ctu.engines.hf.engine as hf

    calls = []
    monkeypatch.setattr(hf, "trim_heap", lambda: calls.append(1))
    gen(engine, PROMPTS, temperature=0.0, max_tokens=2)
    gen(engine, PROMPTS[:1], temperature=0.0, max_tokens=2)
    assert len(calls) == 2


def test_update_weights_streams_one_tensor_at_a_time(engine):
    """A merged sync is a stream (a copy of the whole model in flight would double the engine's weight memory at
    every sync): by the time a tensor is asked for, the one two before it is gone. A refused name still stops the
    load, and the engine then serves no version (what it holds is part old, part new)."""
    import gc
    import weakref

    named = [(n, p.detach().clone()) for n, p in engine.model.named_parameters()][:6]
    alive = []

    def stream():
        for i, (name, tensor) in enumerate(named):
            gc.collect()
            if i >= 2:
                alive.append(alive_refs[i - 2]() is not None)
            copy = tensor.clone()
            alive_refs.append(weakref.ref(copy))
            yield name, copy

    alive_refs: list = []
    version = engine.weights_version
    try:
        named_tensors = stream()
        engine.update_weights(named_tensors, version=7)
        del named_tensors
        assert alive and not any(alive) and engine.weights_version == 7
        with pytest.raises(ValueError, match="lora_A"):
            engine.update_weights([named[0], ("base_model.model.x.lora_A.default.weight", torch.zeros(1))], version=8)
        assert engine.weights_version is None
    finally:
        engine.update_weights(named, version=version)
