"""The vLLM engine against a fake that behaves like vLLM (tests/fakes/fake_vllm.py); real GPU: tests/gpu."""

import asyncio

import pytest
import torch

from ctu.engines.base import SamplingParams
from tests.fakes import fake_vllm

PROMPT = [(5 * i + 11) % 300 + 1 for i in range(40)]  # two full 16-token blocks + 8: the prefix cache hits


def make(monkeypatch, **kw):
    fake_vllm.install(monkeypatch)
    from ctu.engines.vllm.engine import VLLMEngine

    kw.setdefault("seed", 1)
    return VLLMEngine("tiny-random", gpu_memory_utilization=0.3, **kw)


@pytest.fixture
def engine(monkeypatch):
    return make(monkeypatch)


def gen(engine, prompts, **kw):
    return asyncio.run(engine.generate(prompts, SamplingParams(**kw)))


def teacher_forced(model, prompt, completion, temperature):
    ids = torch.tensor([prompt + list(completion.token_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    scaled = logits / temperature if temperature > 0 else logits
    return torch.log_softmax(scaled, -1).gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1)


def assert_close(got, ref):
    torch.testing.assert_close(torch.tensor(got), ref, rtol=1e-4, atol=0)


def strong_update(model, scale=0.3, seed=0):
    """New weights far enough from the old ones that stale KV changes logprobs by much more than 0.05."""
    g = torch.Generator().manual_seed(seed)
    return [(n, p.detach() + scale * torch.randn(p.shape, generator=g)) for n, p in model.named_parameters()
            if "layers." in n and p.dim() == 2]


def test_constructor_arguments_are_real_vllm_ones(monkeypatch):
    engine = make(monkeypatch, max_model_len=64)
    assert engine.llm.kwargs["logprobs_mode"] == "processed_logprobs"
    assert engine.llm.kwargs["max_model_len"] == 64 and engine.llm.kwargs["enable_sleep_mode"] is True
    with pytest.raises(ValueError, match="maximum model length of 64"):
        gen(engine, [list(range(1, 70))], max_tokens=2)
    (c,) = gen(engine, [list(range(1, 60))], max_tokens=20, temperature=0.0)[0]
    assert len(c.token_ids) <= 5 and c.finish_reason == "length"
    with pytest.raises(TypeError, match="unexpected engine arguments"):
        fake_vllm.LLM("tiny-random", not_an_engine_arg=1)


def test_generate_n_logprobs_and_finish_reasons(engine):
    out = gen(engine, [[1, 2, 3], [1, 5]], temperature=1.0, max_tokens=4, n=2, seed=3)
    assert [len(x) for x in out] == [2, 2]
    for completions in out:
        for c in completions:
            assert len(c.token_ids) == len(c.logprobs) and all(lp <= 0 for lp in c.logprobs)
            assert c.finish_reason in ("stop", "length")
    assert gen(engine, [], max_tokens=2) == []


def test_logprobs_are_the_sampling_distributions_after_top_p(monkeypatch):
    """The sampled token's logprob under the distribution it was drawn from: log_softmax(logits / T) renormalised
    over the top-p set (the hf engine's meaning), for every T; vLLM's ``processed_logprobs``."""
    for temperature, top_p in ((1.0, 0.3), (0.7, 0.3), (0.7, 1.0), (0.0, 1.0)):
        engine = make(monkeypatch, sampling_temperature=temperature, sampling_top_p=top_p)
        (c,) = gen(engine, [PROMPT], temperature=temperature, top_p=top_p, max_tokens=6, seed=2)[0]
        ids = torch.tensor([PROMPT + list(c.token_ids)])
        with torch.no_grad():
            logits = engine.llm.hf(ids).logits[0, len(PROMPT) - 1:-1].float()
        scaled = logits / temperature if temperature > 0 else logits
        if 0 < top_p < 1:
            scaled = fake_vllm.apply_top_k_top_p(scaled, 0, top_p)
        want = torch.log_softmax(scaled, -1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        assert_close(c.logprobs, want)
        if top_p < 1:  # the untruncated logprob is lower by -log(the kept mass)
            assert (want - teacher_forced(engine.llm.hf, PROMPT, c, temperature)).min() > 0.5


def test_build_engine_passes_context_budget_lora_and_sampling(monkeypatch):
    from ctu.config.schema import load_config
    from ctu.rollout.components import build_engine

    fake_vllm.install(monkeypatch)
    config = load_config(None, ["engine.kind=vllm", "model.path=tiny-random", "env.max_context_tokens=1536",
                                "engine.weight_sync=adapter", "lora.rank=8", "sampling.temperature=1.0",
                                "sampling.top_p=0.9", "lora.alpha=24"])
    kwargs = build_engine(config).llm.kwargs
    assert kwargs["max_model_len"] == 1536 and kwargs["enable_lora"] is True and kwargs["max_lora_rank"] == 8
    assert kwargs["logprobs_mode"] == "processed_logprobs"
    assert build_engine(config).lora_alpha == 24


def test_the_fakes_processed_logprobs_are_renormalised_after_top_p_like_vllms(monkeypatch):
    fake_vllm.install(monkeypatch)
    llm = fake_vllm.LLM("tiny-random", logprobs_mode="processed_logprobs")
    params = fake_vllm.SamplingParams(temperature=1.0, top_p=0.3, max_tokens=4, seed=0, logprobs=0)
    (out,) = llm.generate([{"prompt_token_ids": PROMPT}], params)[0].outputs
    ids = [t for t in out.token_ids]
    got = torch.tensor([step[t].logprob for step, t in zip(out.logprobs, ids, strict=True)])
    ref = teacher_forced(llm.hf, PROMPT, type("C", (), {"token_ids": ids})(), 1.0)
    assert (got - ref).min() > 0.5  # renormalised over ~30% of the mass: log(1/0.3) ~ 1.2 nats higher


def test_update_weights_resets_the_prefix_cache(engine):
    """Stale KV of the shared prefix after load_weights would give the old weights' logprobs."""
    model = engine.llm.hf
    gen(engine, [PROMPT], temperature=0.0, max_tokens=4)  # fills the prefix cache with two blocks
    engine.update_weights(strong_update(model))
    hits = engine.llm.cache_hits
    (c,) = gen(engine, [PROMPT], temperature=0.0, max_tokens=4)[0]
    assert engine.llm.cache_hits == hits  # nothing served from before the update
    assert_close(c.logprobs, teacher_forced(model, PROMPT, c, 0.0))
    (again,) = gen(engine, [PROMPT], temperature=0.0, max_tokens=4)[0]
    assert engine.llm.cache_hits > hits and again == c  # the cache works again, with the new weights


def test_sleep_wake_and_update_while_asleep(engine):
    engine.sleep()
    assert engine.sleeping and engine.llm.sleep_level == 1
    with pytest.raises(RuntimeError, match="asleep"):
        gen(engine, [[1]], max_tokens=1)
    engine.update_weights(strong_update(engine.llm.hf))  # wakes first: weights cannot be loaded while offloaded
    assert not engine.sleeping
    (c,) = gen(engine, [PROMPT], temperature=0.0, max_tokens=3)[0]
    assert_close(c.logprobs, teacher_forced(engine.llm.hf, PROMPT, c, 0.0))


def test_update_weights_refuses_peft_names(engine):
    for bad in ("base_model.model.model.layers.0.mlp.up_proj.lora_A.default.weight",
                "model.layers.0.self_attn.q_proj.base_layer.weight"):
        with pytest.raises(ValueError, match="PEFT names"):
            engine.update_weights([(bad, torch.zeros(1))])


def peft_adapter(base, seed, rank=4):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft = get_peft_model(base, config)
    tensors = {k.replace(".default", ""): v.detach().clone() * 20 for k, v in peft.state_dict().items() if "lora_" in k}
    merged = {}
    for name, a in tensors.items():
        if ".lora_A." in name:
            b = tensors[name.replace(".lora_A.", ".lora_B.")]
            merged[name.split(".lora_A.")[0].removeprefix("base_model.model.") + ".weight"] = b @ a * (8 / rank)
    peft.unload()
    return tensors, {"r": rank, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}, merged


def merged_model(base, deltas):
    import copy

    model = copy.deepcopy(base)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, delta in deltas.items():
            params[name].add_(delta)
    return model


def test_adapter_sync_uses_a_new_lora_id_per_version(monkeypatch, tmp_path):
    engine = make(monkeypatch, enable_lora=True, max_lora_rank=8, lora_alpha=8)
    base = engine.llm.hf
    for version in (0, 1):
        tensors, config, deltas = peft_adapter(base, seed=version)
        if version == 0:  # (name, tensor) pairs with PEFT's ".default" adapter name; rank and modules inferred
            engine.update_adapter([(k.replace(".weight", ".default.weight"), v) for k, v in tensors.items()], version)
        else:
            engine.update_adapter(tensors, version=version, peft_config=config)
        assert engine.lora_request.lora_int_id == version + 1
        (c,) = gen(engine, [PROMPT], temperature=0.7, max_tokens=4, seed=1)[0]
        assert_close(c.logprobs, teacher_forced(merged_model(base, deltas), PROMPT, c, 0.7))
    with pytest.raises(ValueError, match="already loaded"):
        engine.update_adapter(tensors, version=1, peft_config=config)


def write_adapter(path, tensors, config):
    import json

    from safetensors.torch import save_file

    path.mkdir()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps(config))
    return str(path)


def test_the_fake_serves_a_reused_lora_id_from_its_cache(monkeypatch, tmp_path):
    fake_vllm.install(monkeypatch)
    llm = fake_vllm.LLM("tiny-random", enable_lora=True, max_lora_rank=8)
    first, config, _ = peft_adapter(llm.hf, seed=0)
    second, _, _ = peft_adapter(llm.hf, seed=1)
    paths = [write_adapter(tmp_path / "a", first, config), write_adapter(tmp_path / "b", second, config)]
    params = fake_vllm.SamplingParams(temperature=0.0, max_tokens=3, logprobs=0)

    def run(name, lora_id, path):
        request = fake_vllm.LoRARequest(name, lora_id, path)
        return llm.generate([{"prompt_token_ids": PROMPT}], params, lora_request=request)[0].outputs[0].logprobs

    a = run("v0", 1, paths[0])
    assert run("v1", 1, paths[1]) == a  # same id: vLLM's adapter cache serves the first adapter
    assert run("v1b", 2, paths[1]) != a  # a new id loads the new adapter


def test_every_completion_carries_the_version_of_the_weights_that_sampled_it(engine):
    """What asynchronous RL's staleness rule reads: None before any sync, then the version of the last load."""
    (before,) = gen(engine, [PROMPT], temperature=0.0, max_tokens=2)[0]
    assert before.version is None
    engine.update_weights(strong_update(engine.llm.hf), version=3)
    (after,) = gen(engine, [PROMPT], temperature=0.0, max_tokens=2)[0]
    assert after.version == 3
