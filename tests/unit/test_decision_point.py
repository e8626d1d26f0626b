"""benchmarks/decision_point.py: which token decides a write request, and the probabilities it reads there."""

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.decision_point import decision, turn_starts
from ctu.train.update import to_sample


def test_turns_start_where_the_mask_turns_on():
    assert turn_starts([0, 0, 1, 1, 0, 0, 1, 0, 1]) == [2, 6, 8]
    assert turn_starts([1, 1, 0]) == [0]
    assert turn_starts([0, 0]) == []


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


def test_the_decision_is_the_second_turns_first_token_read_from_the_models_logits(model):
    # prompt [5, 6], lookup turn [7, 8], observation [9], the deciding turn [10, 11], observation [12]
    sample = to_sample([5, 6], [7, 8, 9, 10, 11, 12], [1, 1, 0, 1, 1, 0], [0.0] * 6, 0.0)
    got = decision(model, sample, temperature=2.0)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([sample.ids])).logits[0]
    at = sample.ids.index(10) - 1  # the position whose next token is 10
    logp = torch.log_softmax(logits, dim=-1)
    assert got["token"] == 10 and got["turn_tokens"] == 2
    assert got["p"] == pytest.approx(math.exp(float(logp[at, 10])), rel=1e-5)
    assert got["p_tempered"] == pytest.approx(float(torch.softmax(logits[at] / 2.0, dim=-1)[10]), rel=1e-5)
    assert got["turn_logp"] == pytest.approx(float(logp[at, 10] + logp[at + 1, 11]), rel=1e-5)
    assert got["top"] == int(logits[at].argmax())


def test_a_sample_with_one_turn_has_no_decision(model):
    sample = to_sample([5, 6], [7, 8, 9], [1, 1, 0], [0.0] * 3, 0.0)
    with pytest.raises(ValueError, match="lookup turn"):
        decision(model, sample, temperature=1.0)
