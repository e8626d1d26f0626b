"""``trainer.autocast: bfloat16``: the trainer's passes (warm start, RL gradient pass, the update's scoring) run bf16
matmuls over fp32 weights, while the in-process engine sharing the model keeps decoding in the model's dtype
(fp32 on a CPU, where bf16 decode is slower but bf16 training matmuls are faster). The weights never change dtype."""

import pytest
import torch

from ctu.config.schema import ConfigError, load_config
from tests.unit.train.test_autocast import MatmulDtypes


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from tests.support.models import save_random_model

    return save_random_model(tmp_path_factory.mktemp("tiny-qwen2-tac"), "qwen2", layers=2, hidden=64, intermediate=128)


def policy_for(path, *overrides):
    from ctu.train.policy import build_policy

    config = load_config(None, [f"model.path={path}", "model.dtype=float32", *overrides])
    torch.manual_seed(1)
    policy = build_policy(config, device="cpu")
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn_like(p) * 0.05)
    return policy, config


IDS = torch.tensor([[5, 17, 33, 2, 90, 41, 7, 12, 60, 3], [8, 17, 33, 2, 91, 40, 6, 11, 61, 4]])


def test_gradient_passes_run_bf16_matmuls_the_engine_and_no_grad_scoring_stay_fp32(model_path):
    from ctu.engines.base import SamplingParams
    from ctu.engines.hf.engine import HFEngine
    from ctu.train.logprobs import token_logprobs

    policy, _ = policy_for(model_path, "trainer.autocast=bfloat16")
    dtypes = {p.dtype for p in policy.model.parameters()}
    assert dtypes == {torch.float32}, dtypes
    with MatmulDtypes() as mode:
        logp, _ = token_logprobs(policy.model, IDS, torch.ones_like(IDS))
        logp.sum().backward()
    assert torch.bfloat16 in mode.seen and logp.dtype == torch.float32, mode.seen
    grads = [p.grad for p in policy.trainable_parameters()]
    assert all(g is not None and g.dtype == torch.float32 for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)
    engine = HFEngine(policy.model, tokenizer=policy.tokenizer, kv_reuse=False)
    with MatmulDtypes() as mode:
        engine.generate_sync([[5, 17, 33, 2]], SamplingParams(temperature=1.0, max_tokens=4, seed=3))
    assert mode.seen == {torch.float32}, mode.seen
    with torch.no_grad(), MatmulDtypes() as mode:  # the parity probe's scoring: as the engine computes
        token_logprobs(policy.model, IDS, torch.ones_like(IDS))
    assert mode.seen == {torch.float32}, mode.seen
    with torch.no_grad(), MatmulDtypes() as mode:  # the update's own scoring: as its gradient pass computes
        token_logprobs(policy.model, IDS, torch.ones_like(IDS), train=True)
    assert torch.bfloat16 in mode.seen, mode.seen


def test_bf16_training_logprobs_are_the_fp32_ones_to_bf16_precision(model_path):
    from ctu.train.logprobs import token_logprobs

    fp32, _ = policy_for(model_path)
    bf16, _ = policy_for(model_path, "trainer.autocast=bfloat16")
    with torch.enable_grad():  # a gradient pass
        a = token_logprobs(fp32.model, IDS, torch.ones_like(IDS))[0].detach()
        b = token_logprobs(bf16.model, IDS, torch.ones_like(IDS))[0].detach()
    assert not torch.equal(a, b)  # the pass really ran in another precision
    scale = float(a.abs().max())
    assert float((a - b).abs().max()) <= 0.05 * scale, (a, b)  # bf16 keeps ~3 significant digits


def test_auto_without_native_bf16_and_a_bad_value_names_the_key(model_path):
    from ctu.train.logprobs import token_logprobs

    policy, config = policy_for(model_path)  # the test run pins CTU_NATIVE_BF16=0: auto is fp32 on every CPU
    assert config.trainer.autocast == "auto"
    with MatmulDtypes() as mode:
        token_logprobs(policy.model, IDS, torch.ones_like(IDS))[0].sum().backward()
    assert mode.seen == {torch.float32}, mode.seen
    with pytest.raises(ConfigError, match="trainer.autocast"):
        load_config(None, ["trainer.autocast=fp8"])
