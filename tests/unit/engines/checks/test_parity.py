"""The post-sync parity probe: engine logprobs vs the trainer's teacher-forced ones on a fixed probe."""

import pytest
import torch

from ctu.engines.checks.parity import PROBE_PROMPT, ParityError, check_parity, probe_parity
from ctu.train.policy import token_logprobs
from tests.fakes import fake_vllm
from tests.unit.engines.vllm.test_engine_vllm import make, strong_update


def scorer(model):
    def score(ids, mask, temperature):
        return token_logprobs(model, ids.to(model.device), mask.to(model.device), temperature)[0]
    return score


def test_hf_engine_sharing_the_trainers_model_has_parity():
    from ctu.engines.hf.engine import HFEngine
    from ctu.engines.hf.models import load_model, load_tokenizer

    model = load_model("tiny-random")
    engine = HFEngine(model, load_tokenizer("tiny-random"))
    for temperature in (0.0, 0.7):
        diff = probe_parity(engine, scorer(model), temperature=temperature, tokens=16, seed=3)
        assert diff < 1e-4
        check_parity(diff, 0.05)


def test_vllm_after_a_correct_sync_has_parity(monkeypatch):
    engine = make(monkeypatch)
    trainer = engine.llm.hf
    probe_parity(engine, scorer(trainer), temperature=0.9)  # caches the probe prompt's blocks
    engine.update_weights(strong_update(trainer))
    diff = probe_parity(engine, scorer(trainer), temperature=0.9)
    assert diff < 1e-3
    check_parity(diff, 0.05)


def test_vllm_that_keeps_stale_prefix_kv_fails_the_probe(monkeypatch):
    """An engine that does not reset vLLM's prefix cache after loading weights is caught and stops the run."""
    engine = make(monkeypatch)
    trainer = engine.llm.hf
    probe_parity(engine, scorer(trainer), temperature=0.9)
    monkeypatch.setattr(engine.llm, "reset_prefix_cache", lambda *a, **k: None)  # forgetful engine
    engine.update_weights(strong_update(trainer))
    diff = probe_parity(engine, scorer(trainer), temperature=0.9)
    assert diff > 0.2  # stale KV of the probe prompt: far above the 0.05 tolerance
    with pytest.raises(ParityError, match=r"differ from the trainer's by .* > engine.parity_tolerance=0.05 after sync"):
        check_parity(diff, 0.05)


def test_check_parity_bounds_and_nan():
    check_parity(0.05, 0.05)
    with pytest.raises(ParityError, match="not using the new weights"):
        check_parity(0.0500001, 0.05)
    with pytest.raises(ParityError):
        check_parity(float("nan"), 0.05)


def test_probe_prompt_spans_full_prefix_cache_blocks():
    assert len(PROBE_PROMPT) > 2 * fake_vllm.BLOCK_SIZE
    assert torch.tensor(PROBE_PROMPT).min() > 0
