"""VLLMEngine against real vLLM on CPU: tokens and logprobs = Hugging Face's, seeds, streamed weight reloads
(both routes) that the prefix cache does not hide, adapter sync = HF+peft, sleep/wake as no-ops."""

import asyncio
import copy
import os

import pytest
import torch

from ctu.engines.base import SamplingParams

pytestmark = pytest.mark.vllm_cpu
PROMPT = [(5 * i + 11) % 300 + 1 for i in range(40)]  # two full 16-token blocks + 8: the prefix cache hits


@pytest.fixture(scope="module")
def engine(tiny_llama):
    from ctu.engines.vllm.engine import VLLMEngine

    engine = VLLMEngine(tiny_llama, dtype="float32", seed=0, max_model_len=512, enforce_eager=True,
                        enable_lora=True, max_lora_rank=8, lora_alpha=8, sampling_temperature=0.7)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf(tiny_llama):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()


def gen(engine, prompts, seeds=None, **kw):
    return asyncio.run(engine.generate(prompts, SamplingParams(**kw), seeds=seeds))


def teacher_forced(model, prompt, token_ids, temperature=0.0):
    ids = torch.tensor([prompt + list(token_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    logits = logits / temperature if temperature > 0 else logits
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(token_ids)[:, None]).squeeze(-1)


def assert_logprobs(got, ref):
    torch.testing.assert_close(torch.tensor(got), ref, rtol=1e-3, atol=1e-5)


def moved(model, scale, seed):
    """``model`` with every 2-D layer weight moved far enough that stale prefix KV would show."""
    new = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in new.named_parameters():
            if "layers." in name and p.dim() == 2:
                p.add_(scale * torch.randn(p.shape, generator=g))
    return new


def test_the_kernel_library_for_this_cpu_is_the_one_loaded(engine):
    """vLLM loaded the library this CPU needs (``_C_AVX2`` on an AVX2 CPU or under CTU_VLLM_CPU_KERNEL=avx2), and
    only that one: an AVX2 machine runs the real-vLLM tier on its own kernels."""
    from pathlib import Path

    from tests.vllm_cpu.kernels import cpu_flags, forced, kernel_for

    maps = Path("/proc/self/maps").read_text()
    loaded = {name for name in ("_C", "_C_AVX512", "_C_AVX2") if f"/vllm/{name}.abi3.so" in maps}
    assert loaded == {kernel_for(cpu_flags(), forced())}, loaded


def test_greedy_tokens_and_logprobs_are_hugging_faces(engine, hf):
    engine.update_weights(hf.state_dict().items())  # earlier tests in this module may have moved them
    (c,) = gen(engine, [PROMPT], temperature=0.0, max_tokens=8)[0]
    assert len(c.token_ids) == 8 and c.finish_reason == "length"
    with torch.no_grad():
        greedy = hf.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False)[0, len(PROMPT):].tolist()
    assert list(c.token_ids) == greedy
    assert_logprobs(c.logprobs, teacher_forced(hf, PROMPT, c.token_ids))


def test_sampled_logprobs_are_log_softmax_over_t(engine, hf):
    engine.update_weights(hf.state_dict().items())
    (c,) = gen(engine, [PROMPT], temperature=0.7, max_tokens=6, seed=3)[0]
    assert_logprobs(c.logprobs, teacher_forced(hf, PROMPT, c.token_ids, 0.7))


def test_seeds_repeat_and_differ(engine):
    prompts = [[1, 2, 3]] * 3
    first = gen(engine, prompts, seeds=[10, 11, 10], temperature=1.0, max_tokens=12)
    again = gen(engine, prompts, seeds=[10, 11, 10], temperature=1.0, max_tokens=12)
    ids = [r[0].token_ids for r in first]
    assert ids == [r[0].token_ids for r in again] and ids[0] == ids[2] and ids[0] != ids[1]


def cached_prompt(engine):
    """Two full KV blocks + 8 tokens (the CPU backend's block size is not GPU's 16): the prefix cache hits."""
    block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    return [(5 * i + 11) % 300 + 1 for i in range(2 * block + 8)], block


def cached_tokens(engine, prompt):
    """How many prompt tokens vLLM served from its prefix cache for a repeat of ``prompt``."""
    request = engine._vllm.TokensPrompt(prompt_token_ids=prompt)
    out = engine.llm.generate([request], engine._vllm.SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    return out[0].num_cached_tokens


@pytest.mark.parametrize("via", ["iterator", "path"])
def test_a_weight_update_reaches_the_next_generation_despite_the_prefix_cache(engine, hf, via, monkeypatch):
    monkeypatch.setattr(engine, "weights_via", via)
    monkeypatch.setattr(engine, "shard_bytes", 1 << 20)  # path: several shards
    engine.update_weights(hf.state_dict().items())
    prompt, block = cached_prompt(engine)
    gen(engine, [prompt], temperature=0.0, max_tokens=4)
    assert cached_tokens(engine, prompt) >= 2 * block  # the prompt's blocks are cached now
    new = moved(hf, 0.3, seed=1 if via == "iterator" else 2)
    engine.update_weights((n, t) for n, t in new.state_dict().items())  # a generator: consumed once, as a stream
    (after,) = gen(engine, [prompt], temperature=0.0, max_tokens=4)[0]
    assert_logprobs(after.logprobs, teacher_forced(new, prompt, after.token_ids))
    assert (torch.tensor(after.logprobs) - teacher_forced(hf, prompt, after.token_ids)).abs().max() > 1e-2


def test_the_parity_probe_passes_after_a_sync(engine, hf):
    from ctu.engines.checks.parity import check_parity, check_versions, probe_parity
    from ctu.train.policy import token_logprobs

    new = moved(hf, 0.2, seed=3)
    engine.update_weights(new.state_dict().items(), version=5)
    check_versions([engine.weights_version], 5)  # stamped once reload_weights returned

    def score(ids, mask, temperature):
        return token_logprobs(new, ids, mask, temperature)[0]

    check_parity(probe_parity(engine, score, temperature=0.7), 1e-3)


def test_adapter_sync_is_hf_plus_peft_and_drops_the_old_directory(engine, hf):
    from peft import LoraConfig, get_peft_model

    engine.update_weights(hf.state_dict().items())
    paths = []
    for version in (0, 1):
        torch.manual_seed(version)
        config = LoraConfig(r=8, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        peft = get_peft_model(copy.deepcopy(hf), config)
        with torch.no_grad():
            for name, p in peft.named_parameters():
                if "lora_B" in name:
                    p.mul_(20)
        adapter = [(n, p.detach()) for n, p in peft.named_parameters() if "lora_" in n]
        engine.update_adapter(adapter, version=version)
        (c,) = gen(engine, [PROMPT], temperature=0.0, max_tokens=6)[0]
        assert_logprobs(c.logprobs, teacher_forced(peft, PROMPT, c.token_ids))
        assert (torch.tensor(c.logprobs) - teacher_forced(hf, PROMPT, c.token_ids)).abs().max() > 1e-2
        paths.append(engine.lora_request.lora_path)
    assert [os.path.isdir(p) for p in paths] == [False, True]
    engine.lora_request = None  # back to the base model for the other tests


def test_no_sleep_mode_on_cpu(engine):
    assert not engine.sleep_mode
    engine.sleep()
    assert not engine.sleeping
    assert gen(engine, [[1, 2, 3]], temperature=0.0, max_tokens=2)[0][0].token_ids
    engine.wake_up()


def test_max_lora_rank_outside_vllms_set_fails_before_vllm_starts(tiny_llama):
    from ctu.engines.vllm.engine import VLLMEngine

    with pytest.raises(ValueError, match="max_lora_rank must be one of"):
        VLLMEngine(tiny_llama, enable_lora=True, max_lora_rank=4)
