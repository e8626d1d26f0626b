"""Real vLLM on CUDA: weight syncs as ctu does them, with the sleep level each sync mode uses.

- Adapter sync through ``LoRARequest`` (sleep level 1: the base is kept): what vLLM serves is the base plus the
  adapter (HF + the merged delta, teacher-forced), each version under a new id, and differs from the base by more
  than the bf16 tolerance (so a dropped adapter would show).
- Merged sync after a level-2 sleep (the weights discarded, nothing kept on the host): the engine refuses to serve
  until the weights are reloaded, then serves the new model; staged wake (weights, load, KV cache).

The models' weights are 15x HF's default scale, so their logprobs spread over many nats and another model's (or
the base's) differ by more than the bf16 parity tolerance (1 nat at T = 1)."""

import asyncio

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]

PROMPT = [(7 * i + 3) % 97 + 1 for i in range(40)]  # two full 16-token prefix-cache blocks and more


def save_sharp_model(path, seed=0):
    from tests.support.models import save_random_model

    return save_random_model(path, arch="qwen2", layers=2, hidden=128, seed=seed, initializer_range=0.3,
                             max_position_embeddings=4096)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharp-qwen2")
    return [save_sharp_model(root / f"seed{seed}", seed) for seed in (0, 1)]


def sample(engine, temperature=1.0, seed=0):
    from ctu.engines.base import SamplingParams

    params = SamplingParams(temperature=temperature, top_p=1.0, max_tokens=16, seed=seed)
    return asyncio.run(engine.generate([PROMPT], params))[0][0]


def scored(model, completion, temperature=1.0):
    from ctu.train.logprobs import token_logprobs

    ids = torch.tensor([PROMPT + list(completion.token_ids)], device="cuda")
    with torch.no_grad():
        out = token_logprobs(model, ids, torch.ones_like(ids), temperature)[0]
    return out[0, -len(completion.token_ids):].float().cpu()


def max_diff(completion, reference) -> float:
    return float((torch.tensor(completion.logprobs) - reference).abs().max())


def bf16_tolerance() -> float:
    from ctu.engines.checks.parity import default_parity_tolerance

    return default_parity_tolerance(["bfloat16"], 1.0)


def test_adapter_sync_through_lora_request_serves_base_plus_adapter(model_dirs):
    from ctu.engines.hf.models import load_model
    from ctu.engines.vllm.engine import VLLMEngine
    from tests.unit.engines.vllm.test_engine_vllm import merged_model, peft_adapter

    tolerance = bf16_tolerance()
    engine = VLLMEngine(model_dirs[0], gpu_memory_utilization=0.15, max_model_len=512, enforce_eager=True,
                        dtype="bfloat16", enable_lora=True, max_lora_rank=8, lora_alpha=8, sleep_level=1,
                        sampling_temperature=1.0, sampling_top_p=1.0)
    assert engine.sleep_mode  # CUDA: level 1 keeps the base on the host while the trainer updates
    base = load_model(model_dirs[0], dtype=torch.float32, device="cpu")
    base_cuda = load_model(model_dirs[0], dtype=torch.bfloat16, device="cuda")
    served = []
    for version in (1, 2):
        tensors, config, deltas = peft_adapter(base, seed=version)
        engine.sleep()
        engine.update_adapter(tensors, version=version, peft_config=config)  # wakes weights, then the KV cache
        assert not engine.sleeping and engine.weights_version == version
        assert engine.lora_request.lora_int_id == version + 1 and engine.lora_request.lora_name == f"ctu-v{version}"
        completion = sample(engine)
        with_adapter = merged_model(base, deltas).to(torch.bfloat16).cuda()
        assert max_diff(completion, scored(with_adapter, completion)) <= tolerance
        assert max_diff(completion, scored(base_cuda, completion)) > 2 * tolerance  # the adapter is served
        served.append(completion.token_ids)
    assert served[0] != served[1]  # version 2's adapter, not the cached version 1 (a new LoRA id)
    engine.close()


def test_merged_sync_after_a_level_2_sleep(model_dirs):
    from ctu.engines.hf.models import load_model
    from ctu.engines.vllm.engine import VLLMEngine

    tolerance = bf16_tolerance()
    engine = VLLMEngine(model_dirs[0], gpu_memory_utilization=0.15, max_model_len=512, enforce_eager=True,
                        dtype="bfloat16", sleep_level=2, sampling_temperature=1.0, sampling_top_p=1.0)
    first = load_model(model_dirs[0], dtype=torch.bfloat16, device="cuda")
    other = load_model(model_dirs[1], dtype=torch.bfloat16, device="cuda")
    before = sample(engine)
    assert max_diff(before, scored(first, before)) <= tolerance

    torch.cuda.synchronize()
    free_awake = torch.cuda.mem_get_info()[0]
    engine.sleep()
    assert torch.cuda.mem_get_info()[0] > free_awake  # weights and KV cache released
    engine.wake_up()
    with pytest.raises(RuntimeError, match="discarded"):  # what woke up is not the model
        sample(engine)
    assert engine.weights_version is None

    engine.sleep()
    engine.update_weights(other.state_dict().items(), version=7)
    assert not engine.sleeping and engine.weights_version == 7
    after = sample(engine)
    assert max_diff(after, scored(other, after)) <= tolerance
    assert max_diff(after, scored(first, after)) > 2 * tolerance  # the new weights, not the discarded ones
    engine.close()
