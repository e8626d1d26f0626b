"""Sampling from a model whose weights diverged (NaN or infinite logits) says so and names the learning-rate keys,
instead of torch's "probability tensor contains either `inf`, `nan` or element < 0"."""

import pytest
import torch

from ctu.engines.base import SamplingParams
from ctu.engines.hf.sampling import sample_next


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("per_row", [False, True])
def test_nan_logits_name_the_divergence(bad, per_row):
    logits = torch.zeros(2, 5)
    logits[1, 2] = bad
    generator = [torch.Generator().manual_seed(i) for i in range(2)] if per_row else torch.Generator().manual_seed(0)
    with pytest.raises(RuntimeError) as info:
        sample_next(logits, SamplingParams(temperature=1.0, max_tokens=4), generator)
    assert str(info.value).startswith("the model's next-token probabilities are not finite numbers")
    assert "trainer.lr" in str(info.value) and "trainer.sft_lr" in str(info.value)


def test_finite_logits_sample():
    tokens, logps = sample_next(torch.zeros(2, 5), SamplingParams(temperature=1.0, max_tokens=4),
                                torch.Generator().manual_seed(0))
    assert tokens.shape == (2,) and torch.isfinite(logps).all()
