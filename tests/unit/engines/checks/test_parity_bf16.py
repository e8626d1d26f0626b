"""The default parity tolerance holds two bf16 paths apart at Qwen's real vocabulary (151,936) and still catches
weights that were not synced. CPU: a random Qwen2-shaped model whose lm_head is scaled so that logits reach the
magnitude of a real model's (std 8, top ~36: bf16 spacing there is 0.25)."""

import copy

import pytest
import torch

from ctu.config.schema import load_config
from ctu.engines.checks.parity import ParityError, check_parity, default_parity_tolerance, probe_parity
from ctu.engines.hf.engine import HFEngine
from ctu.engines.hf.models import load_tokenizer
from ctu.train.logprobs import COMPUTE_DTYPE_ATTR, token_logprobs
from ctu.train.sync import parity_dtypes, parity_tolerance

QWEN_VOCAB = 151_936


@pytest.fixture(scope="module")
def trainer_model():
    return random_qwen_vocab_model()


def random_qwen_vocab_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=QWEN_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                         max_position_embeddings=512)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # real-model logit magnitudes: std 8 over the vocabulary
        ids = torch.tensor([list(range(1, 41))])
        std = model(ids).logits.std()
        model.lm_head.weight.mul_(8.0 / std)
    setattr(model, COMPUTE_DTYPE_ATTR, torch.bfloat16)  # fp32 masters, bf16 autocast: the trainer's path
    return model


def scorer(model):
    def score(ids, mask, temperature):
        return token_logprobs(model, ids, mask, temperature)[0]
    return score


def bf16_engine(model) -> HFEngine:
    """The engine's path: bf16 weights, KV-cached decode (a Ray hf worker; vLLM also holds bf16 weights)."""
    return HFEngine(copy.deepcopy(model).to(torch.bfloat16), load_tokenizer("tiny-random"))


def test_default_tolerance_follows_the_dtype_and_temperature():
    assert default_parity_tolerance(["bfloat16"], 1.0) == pytest.approx(1.0, rel=1e-12)  # 4 x 0.25
    assert default_parity_tolerance(["float32", "bfloat16"], 0.5) == pytest.approx(2.0, rel=1e-12)  # the coarsest
    assert default_parity_tolerance(["float16"], 0.0) == pytest.approx(0.125, rel=1e-12)  # greedy: T = 1
    assert default_parity_tolerance(["float32"], 1.0) == pytest.approx(1e-2, rel=1e-12)
    with pytest.raises(ValueError, match="unknown dtype"):
        default_parity_tolerance(["int8"], 1.0)
    vllm = load_config(None, ["engine.kind=vllm", "model.dtype=bfloat16", "sampling.temperature=0.8"])
    assert parity_dtypes(vllm) == ("bfloat16", "bfloat16") and parity_tolerance(vllm) == pytest.approx(1.25, rel=1e-12)
    if not torch.cuda.is_available():  # "auto": fp32 only where the run is known to be on CPU
        assert parity_dtypes(load_config(None, [])) == ("float32", "float32")
        assert parity_dtypes(load_config(None, ["distributed.trainer_workers=2"])) == ("bfloat16", "bfloat16")
    fixed = load_config(None, ["engine.parity_tolerance=0.3"])
    assert parity_tolerance(fixed) == 0.3


def test_two_bf16_paths_stay_under_the_derived_tolerance_at_real_vocab(trainer_model):
    engine, score = bf16_engine(trainer_model), scorer(trainer_model)
    diffs = {(t, s): probe_parity(engine, score, temperature=t, tokens=16, seed=s) for t in (1.0, 0.7) for s in (0, 4)}
    for (t, _), diff in diffs.items():
        check_parity(diff, default_parity_tolerance(["bfloat16"], t))
    assert max(diffs.values()) > 0.1  # what the old fixed 0.1 nats stopped on: a false stop


def test_weights_that_were_not_synced_are_still_caught(trainer_model):
    engine = bf16_engine(trainer_model)  # keeps these weights
    updated = copy.deepcopy(trainer_model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the trainer moved on: every tensor changed by 10% of its spread
        for p in updated.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1 * p.std())
    tolerance = default_parity_tolerance(["bfloat16"], 1.0)
    for seed in (0, 4):
        diff = probe_parity(engine, scorer(updated), temperature=1.0, tokens=16, seed=seed)
        with pytest.raises(ParityError, match="engine.parity_tolerance"):
            check_parity(diff, tolerance)
