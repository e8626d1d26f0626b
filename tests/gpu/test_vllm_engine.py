"""Real vLLM on CUDA with a small random Qwen2-shaped model saved from a config (no downloads)."""

import asyncio

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from ctu.engines.hf.models import smollm2_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("qwen2-tiny")
    Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def test_generate_logprobs_sleep_and_weight_update(model_dir):
    from transformers import AutoModelForCausalLM

    from ctu.engines.base import SamplingParams
    from ctu.engines.vllm.engine import VLLMEngine

    engine = VLLMEngine(model_dir, gpu_memory_utilization=0.3, max_model_len=1024, enforce_eager=True)
    prompt = [1, 520, 33, 88]
    (out,) = asyncio.run(engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8)))
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda()
    ids = torch.tensor([prompt + list(out[0].token_ids)]).cuda()
    with torch.no_grad():
        logits = hf(ids).logits[0, len(prompt) - 1:-1].float()
    ref = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1).cpu()
    assert torch.allclose(torch.tensor(out[0].logprobs), ref, atol=5e-2)
    engine.sleep()
    name, param = next((n, p) for n, p in hf.named_parameters() if n == "model.embed_tokens.weight")
    engine.update_weights([(name, torch.randn_like(param))])  # wakes the engine first
    assert not engine.sleeping
    (after,) = asyncio.run(engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8)))
    assert after[0].token_ids != out[0].token_ids


def test_parity_probe_after_sync_sees_new_weights_despite_the_prefix_cache(model_dir):
    """The probe prompt spans full 16-token blocks: stale prefix KV after load_weights would fail the probe."""
    from transformers import AutoModelForCausalLM

    from ctu.engines.checks.parity import check_parity, probe_parity
    from ctu.engines.vllm.engine import VLLMEngine
    from ctu.train.policy import token_logprobs

    engine = VLLMEngine(model_dir, gpu_memory_utilization=0.3, max_model_len=512, enforce_eager=True, dtype="float32",
                        sampling_temperature=0.9, sampling_top_p=1.0)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda()

    def score(ids, mask, temperature):
        return token_logprobs(hf, ids.cuda(), mask.cuda(), temperature)[0]

    check_parity(probe_parity(engine, score, temperature=0.9), 0.05)
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 2:
                p.add_(0.3 * torch.randn_like(p))
    engine.update_weights(list(hf.state_dict().items()))
    check_parity(probe_parity(engine, score, temperature=0.9), 0.05)
