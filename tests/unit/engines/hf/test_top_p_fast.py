"""Top-p sampling without sorting the whole vocabulary gives the very same tokens and logprobs as a stable sort of
every row (the nucleus is looked for among the tokens above a floor, then above a floor of the row's own). That the
draws follow the truncated distribution is tests/unit/engines/hf/test_sampling.py's."""

import pytest
import torch

from ctu.engines.base import SamplingParams
from ctu.engines.hf.sampling import sample_next


def logits_of(kind, rows=16, vocab=49152, seed=0):
    g = torch.Generator().manual_seed(seed)
    if kind == "peaked":  # a trained model: a few likely tokens, a long tail
        return torch.randn(rows, vocab, generator=g) * 3.0 + 12.0 * (torch.rand(rows, vocab, generator=g) > 0.9995)
    if kind == "flat":  # a random model: the nucleus holds most of the vocabulary
        return torch.randn(rows, vocab, generator=g) * 0.1
    if kind == "mixed":  # rows of both: only the flat ones need the full sort
        return torch.where(torch.arange(rows)[:, None] % 3 == 0, logits_of("flat", rows, vocab, seed),
                           logits_of("peaked", rows, vocab, seed))
    if kind == "wide":  # a nucleus of ~1000 tokens (seen in decoding the mini tasks with SmolLM2-135M at T=0.9)
        return torch.randn(rows, vocab, generator=g) * 0.5 + 9.0 * (torch.arange(vocab) < 1000)
    if kind == "wider":  # 6000 tokens of ~1.6e-4: found above the floor
        return torch.randn(rows, vocab, generator=g) * 0.5 + 9.0 * (torch.arange(vocab) < 6000)
    if kind == "ties":  # equal probabilities straddle the nucleus edge
        x = torch.full((rows, vocab), -20.0)
        x[:, :40] = 5.0
        return x
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["peaked", "flat", "mixed", "wide", "wider", "ties"])
@pytest.mark.parametrize("temperature,top_p", [(0.9, 0.95), (1.0, 0.5), (0.7, 0.999)])
@pytest.mark.parametrize("per_row", [False, True])
def test_same_tokens_and_logprobs_as_the_full_sort(kind, temperature, top_p, per_row):
    logits = logits_of(kind)
    params = SamplingParams(max_tokens=1, temperature=temperature, top_p=top_p)
    for draw in range(3):
        def gens(draw=draw):
            if per_row:
                return [torch.Generator().manual_seed(100 * draw + r) for r in range(logits.shape[0])]
            return torch.Generator().manual_seed(draw)

        tokens, logprobs = sample_next(logits, params, gens())
        want_tokens, want_logprobs = sample_next(logits, params, gens(), floor=0.0)  # every row sorted whole
        assert torch.equal(tokens, want_tokens)
        assert torch.equal(logprobs, want_logprobs)


def test_a_narrow_nucleus_sorts_no_full_row(monkeypatch):
    """Sorting 16 x 49152 probabilities was ~15% of a decode step (torch.profiler, SmolLM2-135M, batch 16): narrow
    nuclei sort only the tokens above the floor; flat rows (a nucleus of most of the vocabulary) sort about it."""
    sizes = []
    real_sort = torch.Tensor.sort

    def sort(self, *args, **kwargs):
        sizes.append(self.numel())
        return real_sort(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "sort", sort)
    params = SamplingParams(max_tokens=1, temperature=0.9, top_p=0.95)
    # (the candidates' probabilities sorted once, and their ids put in token order)
    for kind, most in (("peaked", 16 * 500), ("wide", 16 * 2500), ("mixed", 6 * 49152 + 10 * 500)):
        sizes.clear()
        sample_next(logits_of(kind), params, torch.Generator().manual_seed(0))
        assert sum(sizes) < most, kind
